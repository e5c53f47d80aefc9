"""Reading a verl run: step metrics from its `file` logger (JSON lines) or, failing that, from
its `console` logger lines, and the cause of a failure from its log. Pure text in, records out.

verl 0.9's `FileLogger` (verl/utils/tracking.py) writes one line per `Tracking.log` call:
`{"step": <int>, "data": {<metric>: <number>, ...}}`; its `LocalLogger` prints
`step:<n> - <metric>:<value> - ...` (verl/utils/logger/aggregate_logger.py). The trainer logs
`perf/throughput` (tokens/s/GPU), `perf/time_per_step`, `timing_s/<phase>` (gen, old_log_prob,
ref, update_actor, update_weights, ...), `perf/max_memory_allocated_gb` and
`perf/max_memory_reserved_gb` (GiB: bytes / 1024**3), `perf/mfu/actor` (a fraction) and
`perf/total_num_tokens`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.results import Status

MEASURED_STEP = 3
"""The step the leaderboards report (the reference runs measure the 3rd step)."""

FIELDS = {
    "tokens_per_s_per_gpu": "perf/throughput",
    "step_s": "perf/time_per_step",
    "generation_s": "timing_s/gen",
    "old_log_prob_s": "timing_s/old_log_prob",
    "ref_s": "timing_s/ref",
    "update_actor_s": "timing_s/update_actor",
    "reshard_s": "timing_s/update_weights",
    "peak_mem_gib": "perf/max_memory_allocated_gb",
    "peak_mem_reserved_gib": "perf/max_memory_reserved_gb",
}
"""TrialResult field -> verl metric (same units)."""
SPLIT_GENERATION = "timing_s/generate_async"
"""verl 0.9.1's one-step-off-policy trainer (experimental/one_step_off_policy/ray_trainer.py):
the whole generation, overlapped with the previous step's training; its `timing_s/gen` is only
the wait for it (kept in `extra` as gen_wait_s). A split row's generation_s is this where the
trainer waited for it, a bound where it did not (GEN_WAIT_NONE_S)."""
GEN_WAIT_NONE_S = 1e-3
"""A split step's wait for its generation (`timing_s/gen`) at or below this is the await's own
overhead (4-7e-5 s in results/split4k-h200-x2 trial 1): the generation had ended before the
trainer asked for it, and its `generate_async` does not say when. verl 0.9.1 starts the next
generation as an asyncio task (experimental/one_step_off_policy/ray_trainer.py `_fit_generate`:
asyncio.create_task) whose timer (`_async_gen_next_batch`: marked_timer generate_async) closes
when the task resumes, and the trainer computes the reference and the update synchronously in
the same event loop (`fit_step`), so the task resumes only at the trainer's next await: such a
step's generate_async is the training's time, not vLLM's (there: 32.5 s against ref + update
31.8 s, step after step). Its generation took at most that: the row keeps it in `extra` as
generation_at_most_s, not as a measured generation_s. Where the trainer waited, the loop was
idle and the timer closed when vLLM finished: the generation is measured."""
SPLIT_SYNC = "timing_s/sync_rollout_weights"
"""The same trainer's weight sync to the rollout's GPUs, around `timing_s/update_weights`: a
split row's reshard_s."""
ACTOR_PREFIX = "actor/"
"""verl 0.9.1's engine workers log the actor's memory as `perf/max_memory_*_gb`
(workers/engine_workers.py) and the trainer renames every actor metric with this prefix
(trainer/ppo/ray_trainer.py, `_update_actor`: rename_dict(actor_output, "actor/")), so the
step's metrics hold `actor/perf/max_memory_allocated_gb`; the legacy workers log them bare."""
EXTRA = {
    "total_num_tokens": "perf/total_num_tokens",
    "response_length_mean": "response_length/mean",
    "response_length_max": "response_length/max",
    "response_clip_ratio": "response_length/clip_ratio",
    "prompt_length_mean": "prompt_length/mean",
    "reward_s": "timing_s/reward",
    "adv_s": "timing_s/adv",
    "values_s": "timing_s/values",
    "update_critic_s": "timing_s/update_critic",
    "cpu_memory_used_gb": "perf/cpu_memory_used_gb",
}
"""Measures kept in the row's `extra` column."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CONSOLE = re.compile(r"(?:^|\)\s)step:(\d+) - (.*)$")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        x = float(v)
        return None if math.isnan(x) else x
    return None


def read_jsonl(path: Path) -> dict[int, dict[str, float]]:
    """Step -> metrics from verl's file logger; a torn last line (a killed run) is skipped and
    lines of the same step are merged."""
    steps: dict[int, dict[str, float]] = {}
    try:
        text = path.read_text(errors="replace")
    except (FileNotFoundError, IsADirectoryError):
        return steps
    for line in text.splitlines():
        try:
            rec = json.loads(line)
            step, data = int(rec["step"]), rec["data"]
        except (ValueError, KeyError, TypeError):
            continue
        if not isinstance(data, dict):
            continue
        row = steps.setdefault(step, {})
        for k, v in data.items():
            x = _number(v)
            if x is not None:
                row[str(k)] = x
    return steps


def read_console(text: str) -> dict[int, dict[str, float]]:
    """Step -> metrics from verl's console logger lines (Ray may prefix them with the actor)."""
    steps: dict[int, dict[str, float]] = {}
    for line in strip_ansi(text).splitlines():
        m = _CONSOLE.search(line)
        if not m:
            continue
        row = steps.setdefault(int(m.group(1)), {})
        for part in m.group(2).split(" - "):
            key, sep, val = part.rpartition(":")
            if not sep:
                continue
            try:
                x = float(val)
            except ValueError:
                continue
            if not math.isnan(x):
                row[key.strip()] = x
    return steps


@dataclass(frozen=True, kw_only=True, slots=True)
class StepMeasures:
    """The measured steps' numbers in TrialResult's units."""

    step: int
    """The first measured step."""
    fields: dict[str, float]
    """TrialResult field -> value (verl_mfu_actor_pct in percent)."""
    extra: dict[str, float] = field(default_factory=dict)
    count: int = 1
    """How many steps were measured (`step` .. `step + count - 1`)."""


PEAK_FIELDS = ("peak_mem_gib", "peak_mem_reserved_gib")
"""Fields whose value over several measured steps is their largest, not their mean."""
VERL_THROUGHPUT = "verl_throughput"
"""verl's own `perf/throughput` in a row's `extra`: tokens/s over the GPUs of verl's resource
pools, `compute_throughout_metrics` in verl/trainer/ppo/metric_utils.py dividing by
`resource_pool_manager.get_n_gpus()`, which in the one-step-off trainer is the trainer's pool
alone. The row's `tokens_per_s_per_gpu` is the project's own figure (`throughput`)."""


def throughput(tokens: float, step_s: float, num_gpus: int) -> float:
    """The leaderboard's tokens/s/GPU: the step's tokens over its time and every GPU the study
    uses, whatever the placement (a split's rollout GPUs count as much as its trainer's)."""
    return tokens / step_s / num_gpus if step_s > 0 and num_gpus > 0 else 0.0


def measures(
    steps: dict[int, dict[str, float]],
    step: int = MEASURED_STEP,
    *,
    last: int | None = None,
    num_gpus: int | None = None,
) -> StepMeasures | None:
    """The measures of steps `step` .. `last` (default: `step` alone): each phase's mean over the
    steps logged in that window, the peaks their largest; None if `step` itself was not logged.
    With `num_gpus` (the study's GPUs) the throughput is the project's: the window's
    `perf/total_num_tokens` over its time and `num_gpus`; verl's own figure goes to `extra` as
    VERL_THROUGHPUT. Without it, or without verl's token count, verl's figure is the row's."""
    first = steps.get(step)
    if not first or "perf/throughput" not in first:
        return None
    window = [
        steps[s]
        for s in range(step, max(step, last or step) + 1)
        if "perf/throughput" in steps.get(s, {})
    ]
    per_step = [_step_fields(d) for d in window]
    out = _over_steps(per_step, largest=PEAK_FIELDS)
    extra = _over_steps(
        [{f: v for f, k in EXTRA.items() if (v := _metric(d, k)) is not None} for d in window],
        largest=("response_length_max",),
    )
    for key in ("gen_wait_s", "generation_at_most_s"):  # a split step's: not row fields
        if key in out:
            extra[key] = out.pop(key)
    verl_tps = out.get("tokens_per_s_per_gpu")
    tokens = [d.get("perf/total_num_tokens") for d in window]
    times = [fields.get("step_s") for fields in per_step]
    if num_gpus and all(t is not None for t in tokens) and all(t is not None for t in times):
        out["tokens_per_s_per_gpu"] = throughput(
            sum(t for t in tokens if t is not None),
            sum(t for t in times if t is not None),
            num_gpus,
        )
        if verl_tps is not None:
            extra[VERL_THROUGHPUT] = round(verl_tps, 3)
    if len(window) > 1 and all(t is not None for t in times):
        step_s = [t for t in times if t is not None]
        extra["step_s_min"], extra["step_s_max"] = min(step_s), max(step_s)
    return StepMeasures(step=step, fields=out, extra=extra, count=len(window))


def _over_steps(rows: list[dict[str, float]], *, largest: tuple[str, ...]) -> dict[str, float]:
    """Each key of the steps' `rows`: its mean over the steps that have it, or its largest
    for the keys in `largest` (peaks)."""
    out: dict[str, float] = {}
    for key in {k for row in rows for k in row}:
        values = [row[key] for row in rows if key in row]
        out[key] = max(values) if key in largest else sum(values) / len(values)
    return out


def _step_fields(data: dict[str, float]) -> dict[str, float]:
    """One step's TrialResult fields (a split step's generation is its whole generation, its
    wait kept as gen_wait_s; where it did not wait, only a bound: GEN_WAIT_NONE_S)."""
    out = {f: v for f, k in FIELDS.items() if (v := _metric(data, k)) is not None}
    if "step_s" not in out and "timing_s/step" in data:
        out["step_s"] = data["timing_s/step"]
    if SPLIT_GENERATION in data:  # one-step-off: `gen` is the wait, the generation is this
        wait = out.pop("generation_s", None)
        if wait is not None:
            out["gen_wait_s"] = wait
        if wait is not None and wait <= GEN_WAIT_NONE_S:
            out["generation_at_most_s"] = data[SPLIT_GENERATION]
        else:
            out["generation_s"] = data[SPLIT_GENERATION]
        if SPLIT_SYNC in data:
            out["reshard_s"] = data[SPLIT_SYNC]
    if "perf/mfu/actor" in data:
        out["verl_mfu_actor_pct"] = 100.0 * data["perf/mfu/actor"]
    return out


def _metric(data: dict[str, float], key: str) -> float | None:
    """A step's metric by its bare name, or as the trainer prefixed it (ACTOR_PREFIX)."""
    return data.get(key, data.get(ACTOR_PREFIX + key))


def last_step(steps: dict[int, dict[str, float]]) -> int:
    """The last training step logged (0 when none)."""
    return max((s for s, d in steps.items() if "perf/throughput" in d), default=0)


def step_times(steps: dict[int, dict[str, float]]) -> dict[int, float]:
    """Step -> verl's `timing_s/step` of it, for the steps that logged one."""
    return {s: d["timing_s/step"] for s, d in steps.items() if "timing_s/step" in d}


def split_wall_time(
    steps: dict[int, dict[str, float]], measured_step: int, duration_s: float, extra: dict
) -> dict[str, float]:
    """The trial's wall time in start-up (launch to the first step: Ray, the vLLM server,
    Megatron, weights; teardown included), warm-up steps and the measured steps (`measured_step`
    and every later one), from verl's `timing_s/step` of each step. `launch_s` and `measured_s`
    fields; warm-up and the first step's phases (FIRST_STEP_PHASES, what it spent beyond a
    steady step) into `extra`."""
    times = step_times(steps)
    if measured_step not in times:
        return {}
    warmup = sum(t for s, t in times.items() if s < measured_step)
    extra["warmup_s"] = round(warmup, 1)
    first = min(times)
    if first < measured_step:
        extra["step1_s"] = round(times[first], 2)
        timed = 0.0
        for name, key in FIRST_STEP_PHASES.items():
            if key in steps[first]:
                extra[f"step1_{name}_s"] = round(steps[first][key], 2)
                timed += steps[first][key]
        extra["step1_untimed_s"] = round(max(0.0, times[first] - timed), 2)
    out = {"measured_s": sum(t for s, t in times.items() if s >= measured_step)}
    if duration_s > 0:
        out["launch_s"] = max(0.0, duration_s - sum(times.values()))
    return out


FIRST_STEP_PHASES = {
    "gen": "timing_s/gen",
    "old_log_prob": "timing_s/old_log_prob",
    "ref": "timing_s/ref",
    "update_actor": "timing_s/update_actor",
    "update_weights": "timing_s/update_weights",
}
"""The first step's phases a row keeps (`step1_<name>_s` in `extra`), verl 0.9.1's timers of the
step (trainer/ppo/ray_trainer.py `fit`: `marked_timer`), beside `step1_untimed_s`, the step less
them: the first step against a steady one, phase by phase (scripts/launch_cost.py)."""


# --------------------------------------------------------------------------------------------
# Failures
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Failure:
    status: Status
    kind: str
    """oom, host-oom, nccl-timeout, nccl-error, worker-died, config-error, error."""
    reason: str
    phase: str = ""
    """Where it happened: gen, old_log_prob, ref, update_actor, update_weights, init, or ''."""


PHASE_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Most specific first: a ref log-prob runs through the same infer path as old log-probs.
    ("ref", ("compute_ref_log_prob", "_compute_ref_log_prob")),
    ("update_weights", ("update_weights", "checkpoint_engine", "sync_rollout_weights")),
    ("update_actor", ("update_actor", "train_mini_batch", "train_batch", "update_policy")),
    ("old_log_prob", ("compute_log_prob", "_compute_old_log_prob", "infer_batch")),
    (
        "gen",
        (
            "generate_sequences",
            "vLLMHttpServer",
            "launch_server",
            "AsyncLLM",
            "EngineCore",
            "KV cache",
            "kv cache",
            "cache blocks",
            "gpu_memory_utilization",
        ),
    ),
    ("init", ("init_model", "_build_model", "build_model", "__init__")),
)

_CUDA_OOM = re.compile(
    r"CUDA out of memory|torch\.(?:cuda\.)?OutOfMemoryError:|CUDA [Ee]rror: out of memory"
    r"|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED"
)
_KV_OOM = re.compile(
    r"larger than the available KV cache memory|No available memory for the cache blocks"
    r"|insufficient (?:GPU )?memory for (?:the )?KV cache"
)
_HOST_OOM = re.compile(
    r"NODE_OUT_OF_MEMORY|Task was killed due to the node running low on memory"
    r"|ray\.exceptions\.OutOfMemoryError"
)
_NCCL_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*[Tt]imeout"
    r"|NCCL.*timed out|DistStoreError: .*[Tt]imeout"
)
_NCCL_ERROR = re.compile(
    r"NCCL error in:|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|ncclRemoteError"
    r"|NCCL communicator was aborted|NCCL error"
)
_NCCL_ERROR_CLASS = re.compile(r"DistBackendError")
_WORKER_DIED = re.compile(
    r"ActorDiedError|RayActorError|WorkerCrashedError|The actor died unexpectedly"
    r"|A worker died or was killed|ActorUnavailableError"
    r"|Worker exit type: (?:SYSTEM_ERROR|USER_ERROR)"
)
_WORKER_DIED_MSG = re.compile(
    r"ActorDiedError:|The actor died unexpectedly|WorkerCrashedError:|RayActorError:"
)
_CONFIG = re.compile(
    r"Could not override '|Could not append to config|Key '[^']*' is not in struct"
    r"|omegaconf\.errors\.\w+|hydra\.errors\.(?!InstantiationException)\w+"
    r"|ConfigCompositionException|MissingMandatoryValue"
    r"|Error merging override|in validate_config|LexerNoViableAltException"
)
_EXC_LINE = re.compile(
    r"^(?:[\w.]+\.)?(?:(?:[A-Z]\w*)?(?:Error|Exception|Exit)|KeyboardInterrupt)(?:\(\w+\))?(?::|$).*"
)
_LOG_PREFIX = re.compile(
    r"^(?:\(\w+ pid=\d+(?:, ip=[\d.]+)?\)\s*)+"
    r"(?:(?:ERROR|WARNING|INFO|DEBUG) \S+ \S+ \[[^\]]+\]\s*)?"
)
"""Ray's `(Actor pid=N)` prefixes, nested (vLLM's workers under its server), and vLLM's own
`ERROR <date> <time> [file:line]` header."""


def _block_before(lines: list[str], i: int) -> list[str]:
    """The traceback that ends at line i: back to the nearest 'Traceback' header."""
    for j in range(i, -1, -1):
        if _LOG_PREFIX.sub("", lines[j]).startswith("Traceback (most recent call last)"):
            return lines[j : i + 1]
    return []  # a line outside any traceback (vLLM's allocator prints its own)


def _phase(block: list[str]) -> str:
    text = "\n".join(block)
    for phase, markers in PHASE_MARKERS:
        if any(mk in text for mk in markers):
            return phase
    return ""


def _first(lines: list[str], pattern: re.Pattern[str]) -> int | None:
    for i, line in enumerate(lines):
        if pattern.search(line):
            return i
    return None


def _short(line: str, limit: int = 200) -> str:
    line = _LOG_PREFIX.sub("", line.strip())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _oom_detail(line: str) -> str:
    m = re.search(
        r"Tried to allocate ([\d.]+ [GMK]i?B).*?GPU (\d+) has a total capacity of "
        r"([\d.]+ [GMK]i?B) of which ([\d.]+ [GMK]i?B) is free",
        line,
    )
    if m:
        return (
            f"tried to allocate {m.group(1)} on GPU {m.group(2)} ({m.group(4)} of "
            f"{m.group(3)} free)"
        )
    return _short(line, 160)


def _exception_lines(text: str) -> list[str]:
    """The log's lines that look like a raised exception, shortened, in order."""
    lines = (_short(ln) for ln in strip_ansi(text).splitlines())
    return [s for s in lines if _EXC_LINE.match(s) and not s.startswith("Set the environment")]


def last_exception(text: str) -> str:
    """The last line that looks like a raised exception, else the last line of the log."""
    found = _exception_lines(text)
    if found:
        return found[-1]
    tail = [s for s in (ln.strip() for ln in strip_ansi(text).splitlines()) if s]
    return _short(tail[-1]) if tail else ""


_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '[\w.]+'")
_WRAPPERS = re.compile(
    r"^(?:ray\.exceptions\.)?(?:RayTaskError|RayActorError|ActorDiedError|RaySystemError)"
    r"|^(?:hydra\.errors\.)?InstantiationException|^SystemExit|^KeyboardInterrupt"
)
"""Exceptions that carry another one: the cause is the one they carry."""


def root_exception(text: str) -> str:
    """The first raised exception that is not a wrapper of another (Ray re-raises a worker's
    error in the driver, often more than once); the last exception line when all are."""
    found = _exception_lines(text)
    for s in found:
        if not _WRAPPERS.match(s):
            return s
    return found[-1] if found else ""


def classify(text: str) -> Failure | None:
    """What went wrong, from a run's log; None when the log shows no known failure.

    The first cause wins over its consequences: a CUDA OOM on one rank kills its worker and
    times out the collectives of the others, so OOM is looked for before NCCL and worker death."""
    lines = strip_ansi(text).splitlines()
    i = _first(lines, _CONFIG)
    if i is not None:
        detail = _config_detail(lines, i)
        return Failure(status=Status.FAILED, kind="config-error", reason=f"config error: {detail}")
    i = _first(lines, _MISSING_MODULE)
    if i is not None:
        m = re.search(r"No module named '([\w.]+)'", lines[i])
        name = m.group(1) if m else "?"
        phase = _phase(_block_before(lines, i)) or "start-up"
        return Failure(
            status=Status.FAILED,
            kind="missing-module",
            phase=phase,
            reason=f"verl could not import {name} in {phase} ({_short(lines[i], 120)}): "
            "install it where the trials run",
        )
    i = _first(lines, _CUDA_OOM)
    if i is not None:
        # the traceback that ends there, else what the driver's wrappers name after it
        phase = _phase(_block_before(lines, i)) or _phase(lines[i:]) or "unknown phase"
        return Failure(
            status=Status.OOM,
            kind="oom",
            phase=phase,
            reason=f"CUDA OOM in {phase}: {_oom_detail(lines[i])}",
        )
    i = _first(lines, _KV_OOM)
    if i is not None:
        return Failure(
            status=Status.OOM,
            kind="oom",
            phase="gen",
            reason=f"vLLM KV cache does not fit in gen: {_short(lines[i], 160)}",
        )
    i = _first(lines, _HOST_OOM)
    if i is not None:
        return Failure(
            status=Status.OOM,
            kind="host-oom",
            phase=_phase(_block_before(lines, i)),
            reason="host memory: Ray's memory monitor killed a worker (CPU RAM, e.g. offload)",
        )
    i = _first(lines, _NCCL_TIMEOUT)
    if i is not None:
        return Failure(
            status=Status.FAILED,
            kind="nccl-timeout",
            reason=f"NCCL timeout: {_short(_after_rank(lines[i]), 180)}",
        )
    i = _first(lines, _NCCL_ERROR)
    i = i if i is not None else _first(lines, _NCCL_ERROR_CLASS)
    if i is not None:
        return Failure(
            status=Status.FAILED, kind="nccl-error", reason=f"NCCL error: {_short(lines[i], 180)}"
        )
    i = _first(lines, _WORKER_DIED_MSG)
    i = i if i is not None else _first(lines, _WORKER_DIED)
    if i is not None:
        detail = next(
            (ln.strip() for ln in lines[i:] if "Worker exit type" in ln or "exit detail" in ln),
            lines[i],
        )
        return Failure(
            status=Status.FAILED,
            kind="worker-died",
            phase=_phase(_block_before(lines, i)),
            reason=f"Ray worker died: {_short(detail, 180)}",
        )
    return None


def _after_rank(line: str) -> str:
    m = re.search(r"Watchdog caught.*", line)
    return m.group(0) if m else line


def _config_detail(lines: list[str], i: int) -> str:
    """Hydra prints the override then the omegaconf reason on the next lines; a failed
    validation ends in an exception line."""
    if lines[i].startswith("Could not") or lines[i].startswith("Key '"):
        more = [ln.strip() for ln in lines[i + 1 : i + 4] if ln.strip()]
        why = next((m for m in more if m.startswith("Key '") or "Error" in m), "")
        return _short(f"{lines[i].strip()} {why}".strip(), 200)
    return last_exception("\n".join(lines[i:]))
