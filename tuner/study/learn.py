"""What a study learns from its own trials, between trials: time scales (measured/predicted),
the memory guard (what fits), the launch cost; and from those, each trial's time limit and the
pruner that stops a trial far slower than the best."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import optuna

from tuner.fit.online import MemoryGuard, MemoryObservation, time_scales
from tuner.results import Status, TrialRecord

FIRST_LAUNCH_S = 240.0
"""Launch cost assumed before the study has measured one (a host's first launch compiles and
loads caches, so it is the slowest)."""
LAUNCH_MARGIN = 1.5
"""Later launches get the slowest launch seen times this."""
MEASURE_MARGIN = 3.0
"""The measured steps get their predicted time (scaled by what the study learned) times this."""
MIN_TIMEOUT_S = 60.0
SLOW_RATIO = 0.5
"""A trial whose measured step runs below this fraction of the best finished trial's
throughput is stopped (PRUNED_SLOW)."""
PHASES = ("generation", "old_log_prob", "update_actor", "step")
MEASURED_SOURCES_EXCLUDED = ("", "estimate", "tuner", "reference")
"""Rows with these sources are not measurements: nothing is learned from them."""


def measured(rec: TrialRecord) -> bool:
    return rec.source not in MEASURED_SOURCES_EXCLUDED and "not re-run" not in rec.reason


@dataclass(kw_only=True)
class StudyLearner:
    """The study's running corrections to the cost model, refit after each measured trial."""

    capacity_gib: float
    headroom_gib: float | None = None
    guard: MemoryGuard = field(init=False)
    launches: list[float] = field(default_factory=list)
    pairs: list[tuple[str, float | None, float | None]] = field(default_factory=list)
    scales: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.guard = MemoryGuard(self.capacity_gib, headroom_gib=self.headroom_gib)

    def observe(self, rec: TrialRecord) -> None:
        """Learn from one finished trial (estimates and copies teach nothing)."""
        if not measured(rec):
            return
        if rec.launch_s:
            self.launches.append(rec.launch_s)
        pred_mem = rec.pred_device_mem_gib
        # A verl row has no measure of what is predicted (the training phases' device total):
        # verl's perf/max_memory_* are the actor's allocator alone (no CUDA context, NCCL or
        # vLLM) and the sampled device peak includes the rollout engine's reservation. The
        # guard learns from runners that measure the predicted quantity.
        if rec.source == "verl":
            pred_mem = None
        if pred_mem is not None and rec.status in (Status.OK, Status.OOM):
            seen = rec.peak_mem_device_gib or rec.peak_mem_reserved_gib or rec.peak_mem_gib
            if rec.status is Status.OOM:
                self.guard.observe(
                    MemoryObservation(predicted_gib=pred_mem, measured_gib=None, oom=True)
                )
            elif seen is not None:
                self.guard.observe(
                    MemoryObservation(predicted_gib=pred_mem, measured_gib=seen, oom=False)
                )
        if rec.status is Status.OK:
            for ph in PHASES[:-1]:
                self.pairs.append((ph, getattr(rec, f"pred_{ph}_s"), getattr(rec, f"{ph}_s")))
            # the runner's own measure: its throughput (a time ratio is the inverse)
            if rec.pred_tokens_per_s_per_gpu and rec.tokens_per_s_per_gpu:
                self.pairs.append(("step", rec.tokens_per_s_per_gpu, rec.pred_tokens_per_s_per_gpu))
            self.scales = time_scales(self.pairs)

    @property
    def time_scale(self) -> float:
        """Measured/predicted time of what the runner measures; 1 until a trial is measured."""
        return self.scales.get("step", 1.0)

    @property
    def launch_cost_s(self) -> float:
        return max(self.launches) * LAUNCH_MARGIN if self.launches else FIRST_LAUNCH_S

    def timeout_s(self, predicted_measured_s: float, cap_s: float) -> float:
        """Launch cost + the measured steps' predicted time, scaled, with a margin; at most
        `cap_s` (--trial-timeout)."""
        if not math.isfinite(predicted_measured_s) or predicted_measured_s <= 0:
            return cap_s
        t = self.launch_cost_s + predicted_measured_s * self.time_scale * MEASURE_MARGIN
        return min(cap_s, max(MIN_TIMEOUT_S, t))

    def fit(self, predicted_device_gib: float) -> tuple[float, str]:
        """(the guard's corrected device prediction, why it does not fit: '' if it fits)."""
        return (
            float(self.guard.corrected_gib(predicted_device_gib)),
            str(self.guard.unfit(predicted_device_gib)),
        )

    @property
    def effective_headroom_gib(self) -> float | None:
        h = getattr(self.guard, "headroom_gib", self.headroom_gib)
        return None if h is None else float(h)


class SlowerThanBestPruner(optuna.pruners.BasePruner):
    """Prune a trial whose last reported step throughput is below `ratio` times the best
    finished trial's value (the objective, tokens/s/GPU). Nothing is pruned before a trial has
    finished ok."""

    def __init__(self, ratio: float = SLOW_RATIO) -> None:
        if not 0 < ratio < 1:
            raise ValueError(f"ratio must lie in (0, 1), got {ratio}")
        self.ratio = ratio

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        value = trial.intermediate_values[step]
        try:
            best = study.best_value
        except ValueError:
            return False
        return value < self.ratio * best


def should_stop_for(trial: optuna.Trial) -> Any:
    """TrialSpec.should_stop for one Optuna trial: report the step, ask the pruner."""

    def should_stop(step: int, tokens_per_s_per_gpu: float) -> bool:
        trial.report(tokens_per_s_per_gpu, step)
        return bool(trial.should_prune())

    return should_stop
