"""The verl command a candidate means: one mapping from tuner knobs and the workload to verl 0.9
Hydra overrides of `ppo_megatron_trainer`, used by both the verl runner and recipes, so a recipe
reproduces exactly what a trial ran.

Every key is checked against the installed verl's own config by tests/test_verl_command.py: a
key without `+` must exist in `ppo_megatron_trainer`, a key with `+` must not (Hydra adds it).
A split candidate (rollout_gpus > 0, `--allow-off-policy`) runs verl's one-step-off-policy
trainer instead (SPLIT_ENTRYPOINT), whose overrides compose against its
`one_step_off_ppo_megatron_trainer` (tests/test_verl_split.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.space import ACTOR, KNOBS, REF, ROLLOUT, TF_CONFIG, Candidate, knob_overrides
from tuner.space.placement import pool_counts
from tuner.verl_settings import VerlSettings, bare_key
from tuner.workload import ALGORITHMS, Workload

CONFIG_NAME = "ppo_megatron_trainer"
ENTRYPOINT = ("python3", "-m", "verl.trainer.main_ppo", f"--config-name={CONFIG_NAME}")
"""The recipe's command; runners may swap `python3` for their interpreter."""
SPLIT_CONFIG_NAME = "one_step_off_ppo_megatron_trainer"
"""verl 0.9.1's config of the split placement (verl/experimental/one_step_off_policy/config/):
`ppo_megatron_trainer` plus the rollout's pool (`rollout.nnodes`, `rollout.n_gpus_per_node`),
`free_cache_engine: False`, `calculate_log_probs: True`, `checkpoint_engine.backend: nccl` and
`algorithm.rollout_correction.bypass_mode: True`."""
SPLIT_ENTRYPOINT = (
    "python3",
    "-m",
    "verl.experimental.one_step_off_policy.main_ppo",
    f"--config-name={SPLIT_CONFIG_NAME}",
)
"""The command of a split candidate (rollout_gpus > 0): verl's one-step-off-policy trainer."""
SPLIT_SEARCHPATH = "pkg://verl.trainer.config"
"""Where the split config finds `ppo_megatron_trainer`. Its own `hydra.searchpath` is
`file://verl/trainer/config`, relative to the working directory (found only when started from
verl's site folder); the tuner passes the package path instead, so it starts from any folder."""


def entrypoint_of(c: Candidate) -> tuple[str, ...]:
    """The verl command (before the overrides) that runs candidate `c`."""
    return SPLIT_ENTRYPOINT if c.rollout_gpus else ENTRYPOINT


def config_name_of(c: Candidate) -> str:
    """The Hydra config `c`'s overrides compose against."""
    return SPLIT_CONFIG_NAME if c.rollout_gpus else CONFIG_NAME


def split_overrides(c: Candidate, cl: Cluster) -> dict[str, Any]:
    """A split candidate's placement (nothing for a colocated one): the search path, the
    hybrid engine off (one_step_off_policy/ray_trainer.py asserts it), the two pools' sizes
    (placement.pool_counts: the trainer's replace trainer_overrides'), and the NCCL checkpoint
    engine and the rollout-correction bypass its config sets, written out so the recipe says
    what runs."""
    if not c.rollout_gpus:
        return {}
    return {
        "hydra.searchpath": [SPLIT_SEARCHPATH],
        "actor_rollout_ref.hybrid_engine": False,
        **pool_counts(c.rollout_gpus, cl),
        f"{ROLLOUT}.checkpoint_engine.backend": "nccl",
        "algorithm.rollout_correction.bypass_mode": True,
    }


PROJECT = "verl-tuner"
"""`trainer.project_name`; verl's file logger writes `<root>/<project>/<experiment>.jsonl`."""
METRICS_ROOT_ENV = "VERL_FILE_LOGGER_ROOT"
"""verl's file logger (verl.utils.tracking.FileLogger) writes under this directory; it creates
`<root>/<project>/` itself, so the root may be a path that exists only on the cluster."""
CRITIC = "critic"

# Environment the recipes export. verl 0.9 itself sets CUDA_DEVICE_MAX_CONNECTIONS=1 for Megatron
# on Hopper/Ampere (and must not on Blackwell), and vLLM's V1 engine is its only engine, so none.
ENV: dict[str, str] = {}


def uses_reference_model(w: Workload) -> bool:
    """GRPO and PPO keep a KL loss against a frozen reference; DAPO drops it."""
    return w.algorithm in ("grpo", "ppo")


def fixed_response_length(w: Workload) -> bool:
    """Responses of exactly `response_len` tokens (vLLM ignores EOS) when the workload says the
    mean response is the maximum; otherwise the model stops where it stops."""
    return w.response_mean == w.response_len


def metrics_path(root: Path, experiment: str) -> Path:
    """Where verl's `file` logger writes the step metrics (JSON lines) under METRICS_ROOT_ENV."""
    return root / PROJECT / f"{experiment}.jsonl"


def workload_overrides(w: Workload) -> dict[str, Any]:
    kl = uses_reference_model(w)
    out: dict[str, Any] = {
        "algorithm.adv_estimator": "gae" if w.algorithm == "ppo" else "grpo",
        "algorithm.use_kl_in_reward": False,
        "data.max_prompt_length": w.prompt_len,
        "data.max_response_length": w.response_len,
        "data.train_batch_size": w.batch_size,
        "data.filter_overlong_prompts": False,
        f"{ACTOR}.ppo_mini_batch_size": w.mini_batch_size,
        f"{ACTOR}.use_kl_loss": kl,
        f"{ACTOR}.optim.lr": 1e-6,
        f"{ROLLOUT}.name": "vllm",
        f"{ROLLOUT}.n": w.n,
        f"{ROLLOUT}.enable_chunked_prefill": True,
        f"{ROLLOUT}.ignore_eos": fixed_response_length(w),
    }
    if kl:
        out[f"{ACTOR}.kl_loss_coef"] = 0.001
        out[f"{ACTOR}.kl_loss_type"] = "low_var_kl"
    if w.algorithm == "dapo":
        out[f"{ACTOR}.clip_ratio_low"] = 0.2
        out[f"{ACTOR}.clip_ratio_high"] = 0.28
        out[f"{ACTOR}.loss_agg_mode"] = "token-mean"
    return out


def extra_megatron_overrides(c: Candidate, m: ModelSpec) -> dict[str, Any]:
    """Fixed settings that are not knobs: the MoE router in fp32, as the reference recipes run
    it (verl 0.9 does not declare it, hence the `+`; the ref's transformer config follows the
    actor's). Fusions, dispatcher and the rest are knobs (tuner.space.KNOBS)."""
    out: dict[str, Any] = {}
    if m.is_moe:
        out[f"+{ACTOR}.{TF_CONFIG}.moe_router_dtype"] = "fp32"
    return out


def critic_overrides(actor: dict[str, Any], model_path: str) -> dict[str, Any]:
    """PPO's critic: the same model and Megatron layout as the actor (verl's critic defaults to
    no parallelism at all), and the actor's micro-batch sizing."""
    out: dict[str, Any] = {f"{CRITIC}.model.path": model_path}
    for key, v in actor.items():
        plus = "+" if key.startswith("+") else ""
        bare = key.lstrip("+")
        for suffix in ("megatron.", "ppo_max_token_len_per_gpu", "ppo_micro_batch_size_per_gpu"):
            if bare.startswith(f"{ACTOR}.{suffix}"):
                out[plus + CRITIC + bare[len(ACTOR) :]] = v
    return out


class Raw(str):
    """Hydra text given by the user (`--verl-override`): written as it is, never re-quoted."""


class EnvVar(str):
    """A placeholder `${NAME}` for one of a recipe's own environment variables (`RECIPE_ENV`):
    the one kind of value the recipe's shell expands. Any other text, `${...}` in it or not,
    reaches verl as written (recipes.render)."""

    def __new__(cls, name: str) -> EnvVar:
        if name not in RECIPE_ENV:
            raise ValueError(f"{name} is not a recipe variable ({', '.join(RECIPE_ENV)})")
        return super().__new__(cls, "${" + name + "}")

    @property
    def name(self) -> str:
        return self[2:-1]


RECIPE_ENV = ("MODEL_PATH", "TRAIN_FILE", "REWARD_FN", "NNODES", "TOTAL_STEPS")
"""The environment variables a recipe documents and expands (its usage line and header)."""


def trainer_overrides(
    cl: Cluster, *, steps: int | str, nnodes: str | int, experiment: str
) -> dict[str, Any]:
    return {
        "trainer.logger": ["console", "file"],
        "trainer.project_name": PROJECT,
        "trainer.experiment_name": experiment,
        "trainer.n_gpus_per_node": cl.local_gpus,
        "trainer.nnodes": nnodes,
        "trainer.total_training_steps": steps,
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
        "trainer.resume_mode": "disable",
    }


def tuner_keys() -> dict[str, str]:
    """Every key the tuner itself sets (bare, without `+`) -> what sets it: a knob, the workload,
    the data or the trainer. A `--verl-override` of one of them is refused: the row would not
    say what ran."""
    out: dict[str, str] = {}
    for k in KNOBS:
        for key in k.verl_keys:
            out[bare_key(key)] = f"the knob {k.name} (the search sets it)"
    for algo in ALGORITHMS:
        for key in workload_overrides(Workload().with_overrides(algorithm=algo)):
            out.setdefault(bare_key(key), "the workload (use tune's workload options)")
    for key in ("data.train_files", "data.val_files", "actor_rollout_ref.model.path"):
        out[key] = "the study (--model-path, --train-file)"
    out["reward.custom_reward_function.path"] = "the study (--reward-fn)"
    for key in critic_overrides(dict.fromkeys(out), ""):  # PPO's critic copies the actor's
        out.setdefault(bare_key(key), "the critic's copy of the actor's layout")
    from tuner.hardware import get_gpu

    one = Cluster(gpu=get_gpu("h100"), num_gpus=1)
    for key in trainer_overrides(one, steps=3, nnodes=1, experiment=""):
        out[key] = "the tuner's 3-step trial"
    from tuner.space import ParallelLayout

    two = Cluster(gpu=get_gpu("h100"), num_gpus=2)
    split = Candidate(layout=ParallelLayout(world=1), rollout_gpus=1)
    for key in split_overrides(split, two):
        out.setdefault(bare_key(key), "the placement (--allow-off-policy searches it)")
    return out


def set_once(*parts: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """The overrides of each (source, overrides) part, in order, where no verl key (its `+`
    dropped) is set by two of them: a key set twice would run the later value while the row and
    the recipe credit the earlier source (a knob's key that the workload also fixes). ValueError
    naming the key and both sources otherwise."""
    out: dict[str, Any] = {}
    by: dict[str, str] = {}
    for source, part in parts:
        for key, v in part.items():
            bare = bare_key(key)
            if bare in by:
                raise ValueError(
                    f"verl key {bare} is set by {by[bare]} and by {source}: one of them must "
                    "leave it (a knob's key is the knob's alone)"
                )
            by[bare] = source
            out[key] = v
    return out


def overrides(
    c: Candidate,
    m: ModelSpec,
    cl: Cluster,
    w: Workload,
    *,
    steps: int | str = 3,
    model_path: str = EnvVar("MODEL_PATH"),
    train_file: str = EnvVar("TRAIN_FILE"),
    reward_fn: str = EnvVar("REWARD_FN"),
    nnodes: str | int = EnvVar("NNODES"),
    experiment: str = "tune",
    settings: VerlSettings | None = None,
) -> dict[str, Any]:
    """Every override, in a stable order: data, workload, knobs, megatron extras, trainer, then
    the study's verl settings (bridge, `--verl-override`) when given.

    `reward_fn` is a Python file with `compute_score(data_source, solution_str, ground_truth,
    extra_info)`, or `null` for verl's built-in scorer of each row's data_source."""
    knobs = set_once(
        ("the knobs", knob_overrides(c, m)), ("the MoE router", extra_megatron_overrides(c, m))
    )
    study = {
        "data.train_files": train_file,
        "data.val_files": train_file,
        "actor_rollout_ref.model.path": model_path,
        "reward.custom_reward_function.path": reward_fn,
    }
    critic = critic_overrides(knobs, model_path) if w.algorithm == "ppo" else {}
    split = split_overrides(c, cl)
    trainer = trainer_overrides(cl, steps=steps, nnodes=nnodes, experiment=experiment)
    # a split's two pools (split_overrides) size the trainer instead of the whole cluster: its
    # counts take the trainer's keys' places, the placement keeps the rest
    trainer = {k: split.pop(k, v) for k, v in trainer.items()}
    out = set_once(
        ("the study", study),
        ("the workload", workload_overrides(w)),
        ("the knobs", knobs),
        ("the critic", critic),
        ("the trainer", trainer),
        ("the placement", split),
    )
    if not uses_reference_model(w):
        for key in [k for k in out if k.startswith(f"{REF}.")]:
            out.pop(key)
    if settings is not None:
        given = settings.hydra_overrides(critic=w.algorithm == "ppo")
        out.update({k: Raw(v) for k, v in given.items()})
    return out


_PLAIN = re.compile(r"[\w/\-+.@%]*|\$\{[^}]*\}")
"""Values Hydra's override grammar takes unquoted (and whole `${VAR}` placeholders)."""


def format_value(v: Any) -> str:
    if isinstance(v, Raw):
        return str(v)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, list | tuple):
        return "[" + ",".join(format_value(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    s = str(v)
    if isinstance(v, str) and not _PLAIN.fullmatch(s):
        return quoted(s)
    return s


def quoted(s: str) -> str:
    """`s` as a quoted string of Hydra's override grammar: a string whatever it looks like."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


RUNTIME_ENV_VARS = "+ray_kwargs.ray_init.runtime_env.env_vars"
"""Where verl 0.9.1's ray.init() takes environment for every worker of the job: main_ppo.run_ppo
merges `ray_kwargs.ray_init.runtime_env` over its own PPO runtime env (trainer/main_ppo.py; the
schema declares only `runtime_env.py_executable`, hence the `+`)."""


def runtime_env_args(env: dict[str, str]) -> list[str]:
    """`env` as overrides of verl's job runtime env, each value a quoted string (Ray takes
    strings only; Hydra would read `0` as an int)."""
    return [f"{RUNTIME_ENV_VARS}.{k}={quoted(v)}" for k, v in env.items()]


def override_args(ov: dict[str, Any]) -> list[str]:
    return [f"{k}={format_value(v)}" for k, v in ov.items()]


def command(
    ov: dict[str, Any], python: str = ENTRYPOINT[0], entrypoint: tuple[str, ...] = ENTRYPOINT
) -> list[str]:
    return [python, *entrypoint[1:], *override_args(ov)]
