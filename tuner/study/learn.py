"""What a study learns from its own trials, between trials: time scales (measured/predicted),
the memory guard (what fits), the launch cost; and from those, the phase times predicted for
the next proposals, each trial's time limit and the pruner that stops a trial far slower than
the best."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import optuna

from tuner.estimate import Estimate
from tuner.estimate.time import bottleneck_of
from tuner.fit.online import MemoryGuard, MemoryObservation, time_scales
from tuner.results import Status, TrialRecord

FIRST_LAUNCH_S = 550.0
"""Launch cost (start-up + teardown, `launch_s`) assumed before the study has measured one: the
longest measured, 368 s (results/verl4k-h100-x1, start-ups 257-368 s on one H100; 252-306 s on
2 x H100 in results/tail4k-h100-x2, scripts/launch_cost.out.txt), times LAUNCH_MARGIN. It was
240 s, under every measured start-up: tail4k-h100-x1's first trial (1 GPU, Qwen3-1.7B) was
stopped at its 411-s limit after step 1, with verl still running."""
LAUNCH_MARGIN = 1.5
"""Later launches get the slowest launch seen times this."""
MEASURE_MARGIN = 3.0
"""The measured steps get their predicted time (scaled by what the study learned) times this."""
MIN_TIMEOUT_S = 60.0
SLOW_RATIO = 0.5
"""A trial whose measured step runs below this fraction of the best finished trial's
throughput is stopped (PRUNED_SLOW)."""
PHASES = ("generation", "old_log_prob", "update_actor", "step")
SCALED_PHASES = PHASES[:-1]
"""Phases whose predicted time a study multiplies by the scale it learned (a row's
pred_<phase>_s, with pred_<phase>_scale); the reference pass, the weight sync (reshard) and the
critic stay the cost model's."""
MEASURED_SOURCES_EXCLUDED = ("", "estimate", "tuner", "reference")
"""Rows with these sources are not measurements: nothing is learned from them."""
RUN_WORDS = {
    "generation": ("generation", "rollout"),
    "old_log_prob": ("old_log_prob",),
    "update_actor": ("update",),
}
"""Words in a row's `extra` `measured` (what a runner that runs part of the step ran, e.g. the
megatron runner's `old_log_prob + actor update`) that name each phase."""


EAGER_GENERATION = "generation_eager"
"""The learner's key of generation with `enforce_eager`: its own scale, learned from eager rows
only. Eager decode is host-bound (every op launched from Python: tuner.estimate.generation
eager_ops x Profile.eager_op_host_s) where a CUDA-graph step is GPU-bound, so the two modes'
errors differ in size and sign (results/verl4k-h100-x1.csv: graph rows measured 0.65-0.71 x the
model, the eager row 2.9 x) and one scale cannot serve both. A row's pred_generation_scale is
the scale of its own mode: an eager row's is this key's (EAGER_PRIOR before an eager row was
measured), so raw_prediction gives the cost model's time for rows of either mode."""
EAGER_PRIOR = 1.0
"""The eager generation scale before an eager row is measured: the cost model's, not the graph
rows' scale. The graph scale corrects the GPU side of a step, which an eager step hides under
its host launches; on verl4k-h100-x1's eager trial 6 the graph scale (0.68) missed by 77%, the
cost model by 66% (scripts/predicted_vs_measured.out.txt)."""


def learned_key(phase: str, enforce_eager: bool) -> str:
    """The learner's key of `phase` for a candidate or row: EAGER_GENERATION for generation with
    `enforce_eager`, else the phase."""
    return EAGER_GENERATION if phase == "generation" and enforce_eager else phase


def eager(rec: TrialRecord) -> bool:
    """Whether the row's rollout ran with `enforce_eager`."""
    return bool(rec.knobs.get("enforce_eager", False))


def measured(rec: TrialRecord) -> bool:
    return rec.source not in MEASURED_SOURCES_EXCLUDED and "not re-run" not in rec.reason


def measured_phases(rec: TrialRecord) -> tuple[str, ...]:
    """The phases of SCALED_PHASES a measured row timed: those with a time that its `extra`
    does not call predicted. A phase's own label decides where the row has one (the megatron
    runner's `generation=measured(vllm)` or `generation=predicted`), else the phases its
    `measured` names where it has that (the megatron runner's `old_log_prob + actor update`:
    generation is the cost model's there), else every phase with a time (verl rows)."""
    if not measured(rec):
        return ()
    ran = str(rec.extra.get("measured", "")).strip()

    def timed(ph: str) -> bool:
        label = str(rec.extra.get(ph, "")).strip()
        if label:
            return label.startswith("measured")
        return not ran or any(w in ran for w in RUN_WORDS[ph])

    return tuple(ph for ph in SCALED_PHASES if getattr(rec, f"{ph}_s") is not None and timed(ph))


def confirmed_trial(rec: TrialRecord) -> int:
    """The screened trial a ladder confirmation measured again (its `extra` confirms=<n>: a
    number in a live record, text in one read back); -1 for any other row."""
    try:
        return int(str(rec.extra.get("confirms", "")).strip())
    except ValueError:
        return -1


def raw_prediction(rec: TrialRecord, phase: str) -> float | None:
    """The cost model's time of `phase` for a row: its pred_<phase>_s over the scale the study
    applied when it was proposed (none recorded: none applied)."""
    pred = getattr(rec, f"pred_{phase}_s")
    scale = getattr(rec, f"pred_{phase}_scale")
    return pred / scale if pred is not None and scale else pred


def scaled_estimate(e: Estimate, scales: dict[str, float]) -> Estimate:
    """`e` with each phase of SCALED_PHASES times its scale (1 where absent) and the step,
    throughput, update MFU and bottleneck that follow; memory and the other phases as they
    were."""
    s = {ph: scales.get(ph, 1.0) for ph in SCALED_PHASES}
    if all(v == 1.0 for v in s.values()) or not math.isfinite(e.step_s):
        return e
    gen = e.generation_s * s["generation"]
    olp = e.old_log_prob_s * s["old_log_prob"]
    upd = e.update_actor_s * s["update_actor"]
    step = e.step_s + (gen - e.generation_s) + (olp - e.old_log_prob_s) + (upd - e.update_actor_s)
    if e.overlapped:  # a split step: the longer side plus the sync (estimate/split.py)
        step = max(gen, olp + e.ref_s + upd + e.critic_s) + e.reshard_s
    bottleneck = bottleneck_of(gen, olp + e.ref_s, upd, e.critic_s)
    return dataclasses.replace(
        e,
        generation_s=gen,
        old_log_prob_s=olp,
        update_actor_s=upd,
        step_s=step,
        throughput_tokens_per_s_per_gpu=e.throughput_tokens_per_s_per_gpu * e.step_s / step,
        mfu=e.mfu / s["update_actor"],
        bottleneck=bottleneck,
    )


@dataclass(kw_only=True)
class StudyLearner:
    """The study's running corrections to the cost model, refit after each measured trial."""

    capacity_gib: float
    headroom_gib: float | None = None
    guard: MemoryGuard = field(init=False)
    launches: list[float] = field(default_factory=list)
    pairs: list[tuple[str, float | None, float | None]] = field(default_factory=list)
    scales: dict[str, float] = field(default_factory=dict)
    screen_source: str = ""
    """A fidelity-ladder study's screening rung (the fast runner's `source`;
    tuner.runners.ladder_runner): the cost model's scales are learned from its rows alone, and the
    rows of another measuring source (real verl's confirmations) teach `rung_ratios` instead. ''
    for a one-runner study."""
    screens: dict[int, TrialRecord] = field(default_factory=dict)
    """The screening rung's ok rows by trial: what a confirmation is compared with."""
    rung_pairs: list[tuple[str, float | None, float | None]] = field(default_factory=list)
    rung_ratios: dict[str, float] = field(default_factory=dict)
    """verl's time over the fast runner's on the same candidate, per phase (learned_key) and for
    the step ("step": the fast rung's throughput over verl's, a time ratio); 1 where no
    confirmation measured it."""

    def __post_init__(self) -> None:
        self.guard = MemoryGuard(self.capacity_gib, headroom_gib=self.headroom_gib)

    def observe(self, rec: TrialRecord) -> None:
        """Learn from one finished trial (estimates and copies teach nothing)."""
        if not measured(rec):
            return
        if rec.launch_s:
            self.launches.append(rec.launch_s)
        if self.screen_source and rec.source != self.screen_source:
            self._observe_confirmation(rec)
            return
        if self.screen_source and rec.status is Status.OK:
            self.screens[rec.trial] = rec
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
        # each phase it timed against the cost model's time (not the scaled one the row shows),
        # so a scale is the whole measured/predicted ratio, not what is left of it; eager
        # generation apart (learned_key): pred_generation_scale is the regime's. A pruned-slow
        # row was stopped in its training steps after a whole generation (the megatron runner
        # measures it before them): its generation only (results/gen8k-h200-x1 trial 8)
        if rec.status is Status.OK:
            timed = measured_phases(rec)
        elif rec.status is Status.PRUNED_SLOW:
            timed = tuple(ph for ph in measured_phases(rec) if ph == "generation")
        else:
            return
        for ph in timed:
            key = learned_key(ph, eager(rec))
            self.pairs.append((key, raw_prediction(rec, ph), getattr(rec, f"{ph}_s")))
        # the runner's own measure: its throughput (a time ratio is the inverse)
        if rec.status is Status.OK and rec.pred_tokens_per_s_per_gpu and rec.tokens_per_s_per_gpu:
            self.pairs.append(("step", rec.tokens_per_s_per_gpu, rec.pred_tokens_per_s_per_gpu))
        self.scales = time_scales(self.pairs)

    def _observe_confirmation(self, rec: TrialRecord) -> None:
        """Learn the rung ratios from a confirmation (`extra` confirms=<screened trial>): each
        phase both rungs timed, and the throughput."""
        fast = self.screens.get(confirmed_trial(rec) if rec.status is Status.OK else -1)
        if fast is None:
            return
        for ph in set(measured_phases(fast)) & set(measured_phases(rec)):
            key = learned_key(ph, eager(rec))
            self.rung_pairs.append((key, getattr(fast, f"{ph}_s"), getattr(rec, f"{ph}_s")))
        if rec.tokens_per_s_per_gpu and fast.tokens_per_s_per_gpu:
            self.rung_pairs.append(("step", rec.tokens_per_s_per_gpu, fast.tokens_per_s_per_gpu))
        self.rung_ratios = time_scales(self.rung_pairs)

    def rung_ratios_for(self, enforce_eager: bool) -> dict[str, float]:
        """verl over the fast rung per phase (SCALED_PHASES) and for the step, for a candidate of
        this `enforce_eager` (generation from rows of the same mode); 1 where none learned."""
        out = {
            ph: self.rung_ratios.get(learned_key(ph, enforce_eager), 1.0) for ph in SCALED_PHASES
        }
        out["step"] = self.rung_ratios.get("step", 1.0)
        return out

    @property
    def time_scale(self) -> float:
        """Measured/predicted time of what the runner measures (from its throughput, against
        the cost model's); 1 until a trial is measured."""
        return self.scales.get("step", 1.0)

    def scales_for(self, enforce_eager: bool) -> dict[str, float]:
        """The phase scales for a candidate of this `enforce_eager`: generation from the rows of
        the same mode (EAGER_PRIOR for eager until an eager row timed it), the other phases from
        every row (1 until a row timed them)."""
        keys = {ph: learned_key(ph, enforce_eager) for ph in SCALED_PHASES}
        return {
            ph: self.scales.get(k, EAGER_PRIOR if k == EAGER_GENERATION else 1.0)
            for ph, k in keys.items()
        }

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

    def fit(self, predicted_device_gib: float, phase: str) -> tuple[float, str]:
        """(the guard's corrected device prediction, why it does not fit: '' if it fits) of a
        candidate whose device total peaks in `phase`."""
        return (
            float(self.guard.corrected_gib(predicted_device_gib)),
            str(self.guard.unfit(predicted_device_gib, phase)),
        )

    def headroom_for(self, phase: str) -> float:
        """The headroom the guard keeps for a candidate peaking in `phase`."""
        return float(self.guard.headroom_for(phase))


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
