"""The trial record: one typed row (`TrialRecord`), its CSV columns and their text form, and rows
of older schemas read in the current one's meaning (`upgrade_row`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from tuner.errors import UserError
from tuner.measures import MEASURES, TrialMeasures
from tuner.results.result import Status
from tuner.space import CANDIDATE_FIELDS, KNOB_COLUMN_TYPES, LAYOUT_DEGREES

SCHEMA_VERSION = 3
"""3: one meaning per column: `mfu_update_pct` (the tuner's FLOP formula over the actor update)
and `verl_mfu_actor_pct` (verl's own counter) in place of `mfu_pct`, which meant one of three
things by source; a megatron row's `old_log_prob_s` is the whole step's, as its `update_actor_s`
(the mini-batches' measured time kept in `extra` as `old_log_prob_s_run`). 2: one typed
TrialRecord per row (units in names, pred_* apart, device memory three ways, launch/measured
wall time, prompt mean, storage); 1: the first leaderboards. Rows of 1 and 2 are read in 3's
meaning (`upgrade_row`)."""
READ_VERSIONS = ("1", "2", str(SCHEMA_VERSION))


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRecord(TrialMeasures):
    """Everything known about one trial: what was tried, what the cost model predicted when it
    was proposed, what was measured (TrialMeasures: its columns follow `infer_parallel`), and
    where it came from. The Optuna storage keeps it
    (`to_dict`, JSON) and the CSV leaderboard is a view of it (`to_row`, one column a field).
    Times in seconds, memory in GiB; predictions only in `pred_*` fields, never mixed with
    measured ones."""

    study: str
    """The study's name (the CSV's file name)."""
    trial: int
    """Optuna trial number."""
    status: Status
    reason: str = ""
    """Why it failed or was pruned; a short line."""
    source: str = ""
    """Where the numbers come from: estimate, megatron, verl, tuner (pruned before launch)."""
    runner: str = ""
    """The runner the study used (--runner)."""
    model: str = ""
    """What the user passed for --model."""
    gpu: str = ""
    num_gpus: int = 0
    gpus_per_node: int = 0
    backend: str = ""
    """What ran, e.g. `megatron+vllm` or `estimate (cost model)`."""
    train_parallel: str = ""
    """Layout notation, e.g. `tp4pp2`."""
    infer_parallel: str = ""
    """Rollout layout, e.g. `tp2`."""
    pred_tokens_per_s_per_gpu: float | None = None
    """Predicted throughput of what the runner measures (the raw cost model)."""
    pred_step_s: float | None = None
    """The study's predicted step when proposed: its phases summed (generation, old_log_prob
    and the update as scaled; the reference pass, weight sync and critic the cost model's)."""
    pred_generation_s: float | None = None
    """The study's prediction when proposed: the cost model's x pred_generation_scale (so too
    old_log_prob and update_actor; pred_ref_s is the cost model's)."""
    pred_old_log_prob_s: float | None = None
    pred_ref_s: float | None = None
    pred_update_actor_s: float | None = None
    pred_peak_mem_gib: float | None = None
    """Predicted PyTorch peak of what the runner measures (raw model)."""
    pred_device_mem_gib: float | None = None
    """Predicted device total at the peak (raw model; the peak where not modelled)."""
    pred_device_mem_corrected_gib: float | None = None
    """The device prediction after the study's memory guard corrected it, when proposed."""
    pred_host_mem_gib: float | None = None
    """Predicted host memory (CPU RAM) of one node: a fitted estimate
    (tuner.estimate.host_memory); verl's measure is `cpu_memory_used_gb` in extra."""
    pred_headroom_gib: float | None = None
    """Headroom the fit decision kept free, when proposed."""
    pred_time_scale: float | None = None
    """Measured/predicted time of what the runner measures (its throughput against the cost
    model's) the study had learned when this trial was proposed: it scales the trial's time
    limit, not the pred_*_s columns (the pred_<phase>_scale do)."""
    pred_generation_scale: float | None = None
    """Measured/predicted generation time the study had learned from its earlier rows that timed
    generation in the same launch mode (enforce_eager or CUDA graphs: StudyLearner.scales_for),
    when this trial was proposed, applied to pred_generation_s (1: none of that mode yet; empty
    in rows from before it was applied, whose pred_generation_s is the cost model's)."""
    pred_old_log_prob_scale: float | None = None
    """The same for old_log_prob (pred_old_log_prob_s)."""
    pred_update_actor_scale: float | None = None
    """The same for the actor update (pred_update_actor_s)."""
    pred_peak_phase: str = ""
    pred_fits: bool | None = None
    """Whether the candidate was predicted to fit (after the memory guard)."""
    pred_bottleneck: str = ""
    pred_versions: str = ""
    """The software versions the cost model's prediction assumes."""
    workload: str = ""
    algorithm: str = ""
    max_prompt_len: int | None = None
    max_response_len: int | None = None
    prompt_mean_len: float | None = None
    """Mean prompt length in tokens the workload assumes."""
    response_mean_len: float | None = None
    """Mean response length in tokens the workload assumes."""
    bs: int | None = None
    """Prompts per step (data.train_batch_size)."""
    mini_bs: int | None = None
    n: int | None = None
    """Responses per prompt."""
    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    dp: int | None = None
    knobs: dict[str, Any] = field(default_factory=dict)
    """The candidate's other knobs (space.CANDIDATE_FIELDS), one CSV column each."""
    hardware: str = ""
    """What it ran on, e.g. `4x NVIDIA H200`; `cost model` for estimates."""
    versions: str = ""
    """Software versions of the measurement."""
    verl_bridge: str = ""
    """verl runner: the Megatron bridge the trials used (`megatron-bridge` or `mbridge`)."""
    verl_overrides: str = ""
    """verl runner: the user's extra Hydra overrides (`--verl-override`), as shell words."""
    verl_env: str = ""
    """verl runner: the trial's environment beyond the tuner's own (NAME=VALUE shell words)."""
    recipe: str = ""
    """Path of the recipe script written for it, if any."""
    log_path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    """Runner-specific measures, as k=v pairs in the CSV."""
    origin: str = ""
    """Why it was tried: `estimator`, `reference ...` (warm start) or empty (the sampler)."""
    storage: str = ""
    """The Optuna storage that holds this record (the CSV belongs to it)."""
    worker: str = ""
    """host:pid of the tuner process that ran it."""
    started_at: str = ""
    finished_at: str = ""
    duration_s: float | None = None
    """Wall time of the whole trial in the tuner, launch included."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe flat dict (knobs flattened), full precision: what the storage keeps."""
        d: dict[str, Any] = {}
        for name in _RECORD_FIELDS:
            v = getattr(self, name)
            if name == "knobs":
                d.update(v)
            elif name == "status":
                d[name] = v.value
            else:
                d[name] = dict(v) if isinstance(v, dict) else v
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrialRecord:
        """Inverse of `to_dict`; missing keys take defaults, unknown keys that are not knobs are
        ignored, so records of older schemas load (in schema 3's meaning: `upgrade_row`)."""
        kw: dict[str, Any] = {}
        knobs: dict[str, Any] = {}
        for k, v in upgrade_row(d).items():
            if k in _PARSE:
                kw[k] = v if not isinstance(v, str) else _PARSE[k](v)
            elif k in CANDIDATE_FIELDS and v not in ("", None):
                knobs[k] = _knob_value(v)
        if "status" in kw and not isinstance(kw["status"], Status):
            kw["status"] = Status(kw["status"])
        for k in ("extra", "knobs"):
            if k in kw and not isinstance(kw[k], dict):
                kw.pop(k)
        try:
            return cls(**kw, knobs={**kw.pop("knobs", {}), **knobs})
        except TypeError as e:
            raise ValueError(f"not a trial record ({e})") from None

    def to_row(self) -> dict[str, str]:
        """The CSV row: every column of COLUMNS, as text."""
        return row_of(self.to_dict())

    @classmethod
    def from_row(cls, row: dict[str, str]) -> TrialRecord:
        """A record from a CSV row of schema 1, 2 or 3 (text values)."""
        version = row.get("schema_version") or "1"
        if version not in READ_VERSIONS:
            raise UserError(
                f"leaderboard row of schema {version}: this verl-tuner reads schemas "
                f"{', '.join(READ_VERSIONS)}; upgrade verl-tuner"
            )
        d: dict[str, Any] = {k: v for k, v in row.items() if k and v not in ("", None)}
        d["extra"] = _PARSE["extra"](d.get("extra", ""))
        return cls.from_dict(d)


OLD_LOG_PROB_RUN = "old_log_prob_s_run"
"""`extra` key of a megatron row: old_log_prob's measured time over the mini-batches run (the
row's `old_log_prob_s` is scaled to the whole step, as its `update_actor_s`)."""
BOTH_PHASES_MFU = "mfu_both_phases_pct"
"""`extra` key of a schema-2 megatron row read in schema 3: its old `mfu_pct`, both phases'
FLOPs over both phases' time."""


def upgrade_row(d: dict[str, Any]) -> dict[str, Any]:
    """A row (a CSV's text, with `schema_version`) or a record (`to_dict` from a storage) of
    schema 1 or 2 in schema 3's meaning, in the same form; a schema-3 one comes back as it was,
    so applying it twice changes nothing.

    - schema 1 kept `origin` and `launch_s` in `extra`: they go to their columns.
    - `mfu_pct` by source: `estimate` -> `mfu_update_pct` (the cost model's update MFU);
      `verl` and `reference` -> `verl_mfu_actor_pct` (verl's counter); `megatron` ->
      `mfu_update_pct`: a worker that measured the update alone (`measured=actor update`) logged
      the update's; one that measured old_log_prob + update logged both phases' FLOPs (4/3 of
      the update's, same samples) over both phases' time (old_log_prob + `update_s_run`, the
      mini-batches run), so the update's is 3/4 x mfu x both / update (the old value kept in
      `extra` as mfu_both_phases_pct).
    - a megatron row's `old_log_prob_s` timed the mini-batches run: scaled to the step by
      `mini_batches_per_step / mini_batches_run`, as its `update_actor_s` always was, the
      measured value kept in `extra` as old_log_prob_s_run."""
    text = "schema_version" in d
    old = str(d["schema_version"]) in ("1", "2") if text else "mfu_pct" in d
    if not old:
        return d
    out = dict(d)
    raw_extra = out.get("extra")
    extra = dict(raw_extra) if isinstance(raw_extra, dict) else parse_extra(raw_extra or "")

    def num(v: Any) -> float | None:
        if isinstance(v, bool) or v is None:
            return None
        x = number(v) if isinstance(v, str) else float(v)
        return x if x is not None and math.isfinite(x) else None

    def put(key: str, v: float) -> None:
        if num(out.get(key)) is None:
            out[key] = fmt(v) if text else v

    def keep(key: str, v: float) -> None:  # a CSV's `extra` holds text, a record's numbers
        extra[key] = fmt(v) if text else v

    if text and str(d["schema_version"]) == "1":  # schema 1 kept these in `extra`
        for k in ("origin", "launch_s"):
            if k in extra and out.get(k) in ("", None):
                out[k] = str(extra.pop(k))
    source = str(out.get("source") or "")
    mfu_cell = out.pop("mfu_pct", None)
    mfu = num(mfu_cell)
    logp = num(out.get("old_log_prob_s"))
    run, per_step = num(extra.get("mini_batches_run")), num(extra.get("mini_batches_per_step"))
    megatron = source == "megatron"
    if megatron and logp is not None and run and per_step and OLD_LOG_PROB_RUN not in extra:
        keep(OLD_LOG_PROB_RUN, logp)
        out["old_log_prob_s"] = fmt(logp * per_step / run) if text else logp * per_step / run
    if mfu is not None:
        if source in ("verl", "reference"):
            put("verl_mfu_actor_pct", mfu)
        elif source == "megatron":
            upd_run = num(extra.get("update_s_run"))
            if str(extra.get("measured", "")).strip() == "actor update":
                put("mfu_update_pct", mfu)
            else:
                keep(BOTH_PHASES_MFU, mfu)
                if upd_run and logp is not None:
                    put("mfu_update_pct", 0.75 * mfu * (logp + upd_run) / upd_run)
        elif source == "estimate":
            put("mfu_update_pct", mfu)
        else:
            keep("mfu_pct", mfu)
    elif text and str(mfu_cell or "").strip():  # not a number: kept for the readers to refuse
        verl = source in ("verl", "reference")
        out["verl_mfu_actor_pct" if verl else "mfu_update_pct"] = mfu_cell
    out["extra"] = extra if isinstance(raw_extra, dict) or not text else fmt(extra)
    if text:
        out["schema_version"] = SCHEMA_VERSION_CELL
    return out


def _parse_float(v: str) -> float | None:
    return number(v)


def _parse_int(v: str) -> int | None:
    x = number(v)
    return None if x is None else int(x)


def _parse_bool(v: str) -> bool | None:
    s = v.strip().lower()
    return None if not s else s in ("true", "1", "yes")


def parse_extra(v: str) -> dict[str, Any]:
    """A CSV cell of `extra` (`k=v;k=v`) as a dict of text values."""
    out: dict[str, Any] = {}
    for part in v.split(";") if v else ():
        k, sep, x = part.partition("=")
        if sep:
            out[k] = x
    return out


def _knob_value(v: Any) -> Any:
    if not isinstance(v, str):
        return v
    s = v.strip()
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    for typ in (int, float):
        try:
            return typ(s)
        except ValueError:
            pass
    return s


def _parser_of(annotation: str) -> Any:
    a = annotation.replace(" ", "")
    if a.startswith("float"):
        return _parse_float
    if a == "int":
        return lambda v: _parse_int(v) or 0
    if a.startswith("int"):
        return _parse_int
    if a.startswith("bool"):
        return _parse_bool
    if a.startswith("dict"):
        return parse_extra
    if a == "Status":
        return Status
    return str


def _type_of(annotation: str) -> type:
    """A record field's value type as a CSV cell holds it (`extra` and the status are text)."""
    base = annotation.replace(" ", "").split("|")[0]
    return {"int": int, "float": float, "bool": bool}.get(base, str)


MEASURES_AFTER = "infer_parallel"
"""The record's field the measures (TrialMeasures, a base class: first among its dataclass
fields) follow in the leaderboard's columns and the storage's records."""


def _in_column_order(names: list[str]) -> tuple[str, ...]:
    own = [n for n in names if n not in MEASURES]
    at = own.index(MEASURES_AFTER) + 1
    return (*own[:at], *MEASURES, *own[at:])


_RECORD_FIELDS: tuple[str, ...] = _in_column_order([f.name for f in fields(TrialRecord)])
"""The record's fields in the leaderboard's order."""
_TYPES: dict[str, str] = {f.name: str(f.type) for f in fields(TrialRecord)}
_PARSE: dict[str, Any] = {n: _parser_of(t) for n, t in _TYPES.items()}
COLUMN_TYPES: dict[str, type] = {
    "schema_version": int,
    **{
        c: t
        for n in _RECORD_FIELDS
        for c, t in (KNOB_COLUMN_TYPES.items() if n == "knobs" else ((n, _type_of(_TYPES[n])),))
    },
}
"""Every leaderboard column with the type of its cells, in the file's order: the record's fields
in order (the measures after `infer_parallel`), the knobs (tuner.space.KNOB_COLUMN_TYPES) in
place of `knobs`."""
COLUMNS: tuple[str, ...] = tuple(COLUMN_TYPES)
"""The leaderboard's columns: the record's fields in order, the knobs in place of `knobs`."""
MEASURE_COLUMNS = MEASURES
"""The measured columns (TrialMeasures)."""
PRED_COLUMNS = tuple(f for f in _RECORD_FIELDS if f.startswith("pred_"))
NUMERIC = frozenset(c for c, t in COLUMN_TYPES.items() if t in (int, float))
"""The columns of numbers (counts and measures, knobs included): a text table formats them."""
SCHEMA_VERSION_CELL = str(SCHEMA_VERSION)
"""The `schema_version` cell of a row this version writes."""
AT_LEAST_ONE = frozenset(
    ("num_gpus", "gpus_per_node", *LAYOUT_DEGREES, "dp", "bs", "mini_bs", "n")
    + ("max_prompt_len", "max_response_len")
)
"""Counts a row holds as 1 or more where it holds them: GPUs, parallel degrees, batch sizes and
lengths. Every other number of a row is 0 or more (no time, memory, rate or count is negative);
`tune show` showed a row of 0 GPUs or a negative throughput as if measured (issue 38 item 4)."""


def row_problem(row: dict[str, str]) -> str | None:
    """What a row of ours (text, in schema 3's meaning: `upgrade_row`) holds that no row can:
    a schema this version does not read, a status that is none of `Status`, a number that is
    not its column's type (tuner.cells: a count that is no whole number, a switch that is not
    true or false), a negative number, a count below 1 (AT_LEAST_ONE): a sentence naming the
    first such cell and what to do, None where there is none."""
    from tuner.cells import cell_value

    version = (row.get("schema_version") or "").strip()
    if version not in READ_VERSIONS:
        return (
            f"schema_version {version!r} is not one this verl-tuner reads "
            f"({', '.join(READ_VERSIONS)}): upgrade verl-tuner, or fix the cell"
        )
    fix = "fix the cell or delete that row"
    status = (row.get("status") or "").strip()
    if status not in set(Status):
        return f"status {status!r} is not one of {', '.join(Status)}: {fix}"
    for col, text in row.items():
        typ = COLUMN_TYPES.get(col)
        cell = (text or "").strip()
        if typ not in (int, float, bool) or not cell:
            continue
        try:
            value = cell_value(cell, typ)
        except ValueError as e:
            return f"{col} {e}: {fix}"
        if typ is not bool and value < (1 if col in AT_LEAST_ONE else 0):
            least = "below 1" if col in AT_LEAST_ONE else "negative"
            return f"{col} {cell!r} is {least}: {fix}"
    return None


COLOCATED_ONLY_OMITTED = ("rollout_gpus",)
"""Columns a leaderboard holds only where one of its rows sets them: the placement (issue 29),
so a study without `--allow-off-policy` writes the file it wrote before placement existed (its
rows are all colocated, 0) and the committed leaderboards read and write back unchanged. A
colocated record's row leaves them out too (`row_of`)."""


def row_of(d: dict[str, Any]) -> dict[str, str]:
    """A CSV row (every column, text) from a record's `to_dict()`; a colocated record's without
    COLOCATED_ONLY_OMITTED."""
    row = {c: fmt(d.get(c)) for c in COLUMNS}
    row["schema_version"] = SCHEMA_VERSION_CELL
    for c in COLOCATED_ONLY_OMITTED:
        if row[c] in ("", "0"):
            del row[c]
    return row


def fmt(v: Any) -> str:
    """A value as its leaderboard cell: None empty, a float to 6 significant digits (a
    non-finite one empty), a dict as `k=v;...` (`extra`), anything else as str()."""
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else ""  # a leaderboard's numbers are finite
    if isinstance(v, dict):
        return ";".join(f"{k}={fmt(x)}" for k, x in v.items())
    return str(v)


def number(v: str | None) -> float | None:
    if v is None or v == "":
        return None
    try:
        x = float(v)
    except ValueError:
        return None
    return None if math.isnan(x) else x
