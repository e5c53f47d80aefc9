"""Candidate + workload -> a runnable bash script with every verl override of the row."""

from __future__ import annotations

import errno
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner import verl_command, versions
from tuner.errors import UserError
from tuner.fileio import write_atomic
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.results.record import parse_extra
from tuner.space import Candidate
from tuner.space.placement import placement_label
from tuner.verl_settings import VerlSettings
from tuner.workload import Workload


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    name: str
    """File name: model, degrees and hardware (`qwen3-30b-moe_tp4-pp2-ep8_h100x32.sh`)."""
    text: str


def recipe_name(c: Candidate, m: ModelSpec, cl: Cluster) -> str:
    lay = c.layout.notation
    degrees = "-".join(_split_degrees(lay)) + f"-rtp{c.rollout_tp}"
    if c.rollout_gpus:  # split placement: the rollout's GPUs, one step off-policy
        degrees += f"-split-r{c.rollout_gpus}"
    return f"{slug(m.name)}_{degrees}_{cl.label}.sh"


def _split_degrees(notation: str) -> list[str]:
    import re

    return re.findall(r"[a-z]+\d+", notation)


def slug(name: str) -> str:
    """`name` as one file-name part: letters, digits, `-`, `_` and `.` only, with no leading or
    trailing `-` and no leading `.`, so never `.` or `..` (a model named `..` had its recipes
    written to the folder above recipes/) nor a hidden file; `-` where nothing is left."""
    out = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in name.lower())
    return out.strip("-").lstrip(".") or "-"


def model_folder(recipes_dir: Path | str, model_name: str) -> Path:
    """The folder under `recipes_dir` that a model's recipes are written to (`write`): always
    a folder of its own directly inside `recipes_dir`."""
    return Path(recipes_dir) / slug(model_name)


NAME_MAX = 255
"""The longest file name (bytes) the file systems a recipe is written to take (ext4, xfs,
NFS)."""
MAX_NUMBERED = 99
"""The most numbered names (`<name>-<suffix>-2.sh` .. `-99.sh`) `write` tries before it stops:
each is another study's recipe of the same row's name, which is not a real case past a few."""


def check_name_lengths(m: ModelSpec, cl: Cluster, suffix: str = "") -> None:
    """UserError when a recipe name of model `m` on `cl` with this `write` suffix could be
    longer than NAME_MAX bytes (its degrees as long as the space allows): a model folder of a
    240-byte name made every name too long, and `write` then tried `-2`, `-3`, ... for ever
    (issue 38). Checked before a study writes anything."""
    from tuner.space.choices import CP_CHOICES, MAX_PP, MAX_VPP

    g = cl.num_gpus
    degrees = f"tp{g}-pp{MAX_PP}-vpp{MAX_VPP}-cp{max(CP_CHOICES)}-ep{g}-etp{g}-rtp{g}-split-r{g}"
    stem = f"{slug(m.name)}_{degrees}_{cl.label}"
    shown = m.name if len(m.name) <= 40 else m.name[:37] + "..."
    longest = f"{stem}-{suffix}-{MAX_NUMBERED}.sh" if suffix else f"{stem}.sh"
    _check_name(longest, f"the recipe file names of model {shown!r} could be", bool(suffix), True)


def _check_name(name: str, what: str, suffix: bool, study: bool = False) -> None:
    """UserError when the file name `name` is longer than NAME_MAX bytes; `what` starts the
    sentence, `suffix`: the name carries a study's suffix (a shorter --study helps); `study`:
    a study's recipes (--recipes 0 writes none)."""
    size = len(name.encode())
    if size <= NAME_MAX:
        return
    fix = "name the model's folder shorter"
    if suffix:
        fix += " or the study (--study)"
    raise UserError(
        f"{what} {size} bytes, more than the {NAME_MAX} a file name can have: {fix} by "
        f"{size - NAME_MAX} bytes" + (", or pass --recipes 0" if study else "")
    )


def shell_word(key: str, value: Any) -> str:
    """The override `key=value` as one shell word that passes verl exactly that text: single
    quotes (shlex), so `$(...)`, backticks and Hydra's own `${oc.env:HOME}` in a value reach verl
    as written. Only a recipe variable (verl_command.EnvVar: MODEL_PATH, TRAIN_FILE, ...) is
    expanded, in double quotes of its own."""
    if isinstance(value, verl_command.EnvVar):
        return shlex.quote(f"{key}=") + f'"${{{value.name}}}"'
    return shlex.quote(f"{key}={verl_command.format_value(value)}")


def _one_line(text: str) -> str:
    """A comment line's text with its line breaks written as `\\n`: a value read from a CSV
    cell or a config.json (a model name, a row's source) cannot end the comment and put a
    command of its own on the next line."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def experiment_name(c: Candidate, m: ModelSpec, cl: Cluster) -> str:
    """`trainer.experiment_name` of a recipe and of the verl runner's trial (the recipe name)."""
    return recipe_name(c, m, cl)[: -len(".sh")]


REWARD_FN_DEFAULT = (
    'if [[ -z "${REWARD_FN:-}" ]]; then',
    '    REWARD_FN="$(dirname "${TRAIN_FILE}")/reward.py"',
    '    [[ -f "${REWARD_FN}" ]] || REWARD_FN=null',
    "fi",
)
"""REWARD_FN, unless set: the tuner's synthetic reward.py beside TRAIN_FILE if there is one,
else null (verl's built-in scorer for each row's data_source). The verl runner does the same."""


def drawn_responses(extra: str) -> bool:
    """Whether a row's responses were drawn from the workload's length model (its `extra` cell
    says response_mode=drawn: the verl runner on its synthetic data)."""
    return parse_extra(extra).get("response_mode") == "drawn"


def render(
    c: Candidate,
    m: ModelSpec,
    cl: Cluster,
    w: Workload,
    *,
    origin: str = "",
    steps: int = 3,
    settings: VerlSettings | None = None,
    pinned: Sequence[tuple[str, Any]] = (),
    runner: str = "",
    drawn: bool = False,
) -> Recipe:
    """A bash script that runs verl's main_ppo with the candidate's overrides.

    MODEL_PATH, TRAIN_FILE and NNODES come from the environment (REWARD_FN too, optionally);
    TOTAL_STEPS defaults to `steps` (3, as the tuner measures). `settings`: the verl runner's
    bridge, extra overrides and environment the row ran with (exported as they ran). With those
    set as the verl runner set them, the script runs the runner's command with the same
    overrides. `pinned`: the knobs the row's runner (`runner`) fixed instead of measuring (see
    tuner.runners.pinned_knobs): a comment block names each with the value the script sets, and
    says that generation was not measured. `drawn`: the row's responses were drawn from the
    workload's length model on the study's synthetic data (its `extra` says
    response_mode=drawn): a comment says what the trial added to run them."""
    ov = verl_command.overrides(
        c,
        m,
        cl,
        w,
        steps=verl_command.EnvVar("TOTAL_STEPS"),
        experiment=experiment_name(c, m, cl),
        settings=settings,
    )
    hf = m.hf_id or m.name
    run_env = {**verl_command.ENV, **(settings.environment() if settings else {})}
    env = [f"export {k}={shlex.quote(v)}" for k, v in run_env.items()]
    response = (
        f"fixed {w.response_len}-token responses (ignore_eos)"
        if verl_command.fixed_response_length(w)
        else f"responses up to {w.response_len} tokens"
    )
    lines = [
        "#!/usr/bin/env bash",
        f"# verl-tuner recipe: {m.name} on {cl.num_gpus}x {cl.gpu.name} "
        f"({cl.num_nodes} node(s) of {cl.local_gpus}), actor {c.layout.notation}, "
        f"rollout tp{c.rollout_tp}",
        f"# workload: {w.algorithm}, prompts up to {w.prompt_len} tokens, {response}, "
        f"{w.batch_size} prompts x {w.n}, mini batch {w.mini_batch_size}",
        f"# workload lengths: mean prompt {w.mean_prompt_len:.0f} tokens, mean response "
        f"{w.mean_response_len:.0f} tokens, clip fraction {w.clip_fraction:g} "
        f"(tune --prompt-mean {round(w.mean_prompt_len)} "
        f"--response-mean {round(w.mean_response_len)})",
        f"# assumes {versions.summary()}",
    ]
    if c.rollout_gpus:
        lines += [
            f"# placement: {placement_label(c.rollout_gpus, cl.num_gpus)}: vLLM on "
            f"{c.rollout_gpus} GPU(s) of its own, the actor on {cl.num_gpus - c.rollout_gpus} "
            "(verl.experimental.one_step_off_policy)",
            "# ONE STEP OFF-POLICY: each step trains on rollouts of the weights one step old "
            "(verl's rollout_correction bypass); NNODES is not read, the pools' nodes are set",
        ]
    if origin:
        lines.append(f"# origin: {origin}")
    if drawn:
        lines += [
            "# responses: the row's were drawn from the workload's length model on verl-tuner's "
            "synthetic data, each capped by tuner/verl_agent_loop.py; to run them on that data, "
            "add actor_rollout_ref.rollout.agent.agent_loop_config_path=<its folder>/"
            "agent_loops.yaml actor_rollout_ref.rollout.ignore_eos=True data.shuffle=False and "
            "put verl-tuner on PYTHONPATH; on your own data the model stops where it stops",
        ]
    lines += pinned_lines(c, pinned, runner)
    if settings is not None:
        said = [f"bridge {settings.bridge}"]
        if settings.env:
            said.append("environment " + shlex.join(f"{k}={v}" for k, v in settings.env))
        if settings.overrides:
            said.append(f"{len(settings.overrides)} extra override(s), last below")
        lines.append("# verl settings of the row: " + ", ".join(said))
    lines += [
        "# usage: MODEL_PATH=/path/to/model TRAIN_FILE=/path/to/train.parquet NNODES=N "
        "bash this.sh [extra overrides]",
        "# step metrics: ${VERL_FILE_LOGGER_ROOT:-$PWD}/"
        f"{verl_command.PROJECT}/{experiment_name(c, m, cl)}.jsonl (verl's file logger)",
        "set -euo pipefail",
        "MODEL_PATH=${MODEL_PATH:?"
        + shlex.quote(_one_line(f"set MODEL_PATH to a local copy of {hf}"))
        + "}",
        "TRAIN_FILE=${TRAIN_FILE:?set TRAIN_FILE to a parquet file of prompts}",
        *REWARD_FN_DEFAULT,
        f"NNODES=${{NNODES:-{cl.num_nodes}}}",
        f"TOTAL_STEPS=${{TOTAL_STEPS:-{steps}}}",
        f'export {verl_command.METRICS_ROOT_ENV}="${{{verl_command.METRICS_ROOT_ENV}:-$PWD}}"',
        *env,
        "",
        " ".join(verl_command.entrypoint_of(c)) + " \\",
        *[f"    {shell_word(k, v)} \\" for k, v in ov.items()],
        '    "$@"',
        "",
    ]
    lines = [_one_line(line) if line.startswith("#") else line for line in lines]
    return Recipe(name=recipe_name(c, m, cl), text="\n".join(lines))


def pinned_lines(c: Candidate, pinned: Sequence[tuple[str, Any]], runner: str) -> list[str]:
    """The recipe's comment block on what its row did not measure: each pinned knob with the
    value the script sets (the candidate's, else the pin), and whether generation was run (it
    was where the pins leave rollout_tp free: tuner.runners.megatron_generation)."""
    if not pinned:
        return []
    who = f"--runner {runner}" if runner else "the row's runner"
    generated = "rollout_tp" not in {name for name, _ in pinned}
    ran = "measured generation with vLLM but" if generated else "ran no generation (vLLM) and"
    lines = [
        f"# NOT MEASURED: {who} {ran} pinned these knobs instead of",
        "# searching them; the values below are what this script sets, not a measured choice",
        "# (confirm them with --runner verl):",
    ]
    for name, pin in pinned:
        value = getattr(c, name, pin)
        lines.append(f"#   {name}={value}  (pinned, not measured)")
    if not generated:
        lines.append(
            "# generation was not measured: the row's generation time is the cost model's "
            "prediction"
        )
    return lines


SETUP_COLUMNS = (
    "model",
    "gpu",
    "num_gpus",
    "gpus_per_node",
    "algorithm",
    "max_prompt_len",
    "max_response_len",
    "bs",
    "mini_bs",
    "n",
    "prompt_mean_len",
    "response_mean_len",
)
"""Row columns besides the candidate and the verl settings that a recipe is made of."""


def recipe_key(row: dict[str, str]) -> tuple[object, ...]:
    """What a row's recipe is made of: its candidate, its verl settings and its model, GPUs and
    workload. Rows of one key give the same script but for the comment naming the row; a row
    that cannot be read as a candidate is its own key."""
    try:
        cand = Candidate.from_record(row, int(row["num_gpus"]))
        settings = VerlSettings.from_record(row)
    except (KeyError, ValueError, TypeError, UserError):
        return ("row", row.get("study", ""), row.get("trial", ""))
    return (cand, settings, *(row.get(k, "") for k in SETUP_COLUMNS))


def distinct(rows: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    """The rows in order, each candidate once (the first row of each `recipe_key`): a study
    copies a repeated candidate's result into a new trial, and two recipes that differ only in
    the comment naming their trial are one."""
    seen: set[tuple[object, ...]] = set()
    out = []
    for r in rows:
        key = recipe_key(r)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def owner_of(csv_path: Path, row: dict[str, str]) -> str:
    """The leaderboard row a recipe is made from, as its `# origin:` line names it first."""
    return f"{csv_path.name} trial {row['trial']}"


def origin_of(csv_path: Path, row: dict[str, str]) -> str:
    """The comment line naming the leaderboard row a recipe comes from."""
    tput = row.get("tokens_per_s_per_gpu") or ""
    what = f", {float(tput):.0f} tokens/s/GPU" if tput else ""
    return f"{owner_of(csv_path, row)} (source={row['source']}, {row['status']}{what})"


def suffix_of(study: str, trial: str) -> str:
    """`write`'s suffix for the recipe of `study`'s trial `trial`: a second study of the same
    model and GPUs gets names of its own."""
    return f"{slug(study)}-t{slug(trial)}"


def write(recipe: Recipe, directory: Path, *, suffix: str = "", owner: str = "") -> Path:
    """Write atomically under the recipe's name, and return the path. With `suffix`, a file of
    that name holding another recipe is kept unless its `# origin:` line names `owner` (the
    same row, `owner_of`): the recipe goes to `<name>-<suffix>.sh`, kept the same way, then
    `<name>-<suffix>-2.sh`, ... up to `-MAX_NUMBERED`. So one study's recipes never replace
    another's (issue 30). A name longer than a file name can be is a UserError before anything
    is written (it tried `-2`, `-3`, ... for ever: issue 38)."""
    path = directory / recipe.name
    if suffix:
        stem = recipe.name[: -len(".sh")]
        names = [
            recipe.name,
            f"{stem}-{suffix}.sh",
            *(f"{stem}-{suffix}-{i}.sh" for i in range(2, MAX_NUMBERED + 1)),
        ]
        _check_name(names[-1], f"the recipe file name {stem[:40]!r}... is", True)
        directory.mkdir(parents=True, exist_ok=True)
        free = (p for p in (directory / n for n in names) if _may_replace(p, recipe, owner))
        found = next(free, None)
        if found is None:
            raise UserError(
                f"{directory}: {recipe.name} and its {MAX_NUMBERED} numbered names are each "
                "another row's recipe: move old recipes aside or pass another --recipes-dir"
            )
        path = found
    else:
        _check_name(recipe.name, f"the recipe file name {recipe.name[:40]!r}... is", False)
    # executable as the user's umask allows (0755 under 022); one temporary file per writer:
    # workers of one study write the same best recipe at once
    return write_atomic(path, recipe.text, executable=True)


def _may_replace(path: Path, recipe: Recipe, owner: str) -> bool:
    """Whether `recipe` may be written at `path`: nothing there, the same text, or a recipe of
    the same row (`owner`). Something there that is not a readable text file (a folder, a file
    this user may not read, binary) is kept: False. Any other error (a name too long, an I/O
    error) is raised: the next name would fail alike (a `-2`, `-3`, ... without end)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return True
    except UnicodeDecodeError:
        return False
    except OSError as e:
        if e.errno in (errno.EISDIR, errno.EACCES, errno.EPERM, errno.ELOOP):
            return False
        raise
    if text == recipe.text:
        return True
    mark = f"# origin: {_one_line(owner)} ("
    return bool(owner) and any(line.startswith(mark) for line in text.splitlines())
