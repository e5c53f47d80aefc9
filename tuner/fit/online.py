"""What a running study learns from its own trials, between trials: a time scale per phase
and the memory guard (a correction of the predicted device total and a ceiling from OOMs).

These read no files: the study hands them its finished trials. The fits over committed
leaderboards are tuner.fit.calibrate and tuner.fit.memory_fit.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from tuner.estimate.device import phase_headroom_gib

TIME_SCALE_BOUNDS = (0.05, 20.0)
"""A learned measured/predicted time ratio is clipped to this range (a wild row cannot make
every later time limit absurd)."""


def time_scales(
    pairs: Iterable[tuple[str, float | None, float | None]], min_rows: int = 1
) -> dict[str, float]:
    """Robust multiplicative scale per key from (key, predicted_s, measured_s) triples (a key is
    a phase, or a phase in one launch mode: tuner.study.learn.learned_key):
    exp(median(log(measured / predicted))), clipped to TIME_SCALE_BOUNDS. Triples with a missing
    or non-positive value are skipped; a phase with fewer than `min_rows` usable triples is left
    out (its scale is 1). The median, not the mean, so one stalled trial moves nothing.

    The full `tuner.fit.calibrate.calibrate` refits the Profile's constants across models and is
    too slow to run after every trial; this scale is what a study applies between trials, to its
    time limits."""
    logs: dict[str, list[float]] = {}
    for phase, pred, meas in pairs:
        if pred and meas and pred > 0 and meas > 0 and math.isfinite(pred):
            logs.setdefault(phase, []).append(math.log(meas / pred))
    lo, hi = TIME_SCALE_BOUNDS
    return {
        k: min(hi, max(lo, math.exp(statistics.median(v))))
        for k, v in logs.items()
        if len(v) >= min_rows
    }


# --------------------------------------------------------------------------------------------
# The study's memory guard
# --------------------------------------------------------------------------------------------

OOM_MARGIN_GIB = 0.5
"""After an OOM at corrected prediction P, candidates at P minus this are unfit too."""
MEMORY_SCALE_BOUNDS = (0.7, 1.5)
"""The guard's correction stays inside these (one odd row must not undo the model)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryObservation:
    """One finished trial as the memory guard sees it."""

    predicted_gib: float
    """The device total the model predicted for it (raw, before any correction)."""
    measured_gib: float | None
    """Its measured device total (or the best measure there is); None when not measured."""
    oom: bool
    """It ran out of device memory."""


class MemoryGuard:
    """What a study learns about memory from its own trials, and what it then prunes.

    A multiplicative correction `scale` = the median of measured/predicted over the trials that
    ran (bounded by MEMORY_SCALE_BOUNDS; 1 before any). An OOM at raw prediction P makes every
    candidate whose corrected prediction is >= corrected(P) - OOM_MARGIN_GIB unfit for the rest
    of the study; every candidate whose corrected prediction + the headroom of its peak phase
    (`headroom_for`: the study's, else the cost model's `phase_headroom_gib`) exceeds the capacity
    is unfit."""

    def __init__(self, capacity_gib: float, headroom_gib: float | None = None) -> None:
        if not capacity_gib > 0:
            raise ValueError(f"capacity_gib must be positive, got {capacity_gib}")
        if headroom_gib is not None and not (0 <= headroom_gib < capacity_gib):
            raise ValueError(
                f"headroom_gib must lie in [0, capacity {capacity_gib}), got {headroom_gib}"
            )
        self.capacity_gib = float(capacity_gib)
        self._headroom = None if headroom_gib is None else float(headroom_gib)
        self._ratios: list[float] = []
        self._oom_raw: list[float] = []

    @property
    def headroom_gib(self) -> float | None:
        """GiB the study keeps free below the capacity (--headroom-gib); None: per phase."""
        return self._headroom

    def headroom_for(self, phase: str) -> float:
        """GiB kept free below the capacity when a candidate peaks in `phase`: the study's, else
        the cost model's default for the phase (tuner.estimate.device.phase_headroom_gib)."""
        return phase_headroom_gib(phase) if self._headroom is None else self._headroom

    @property
    def scale(self) -> float:
        """The current correction, measured/predicted."""
        if not self._ratios:
            return 1.0
        lo, hi = MEMORY_SCALE_BOUNDS
        return min(hi, max(lo, statistics.median(self._ratios)))

    @property
    def oom_ceiling_gib(self) -> float:
        """Corrected prediction from which candidates are unfit after an OOM (inf if none)."""
        if not self._oom_raw:
            return math.inf
        return self.corrected_gib(min(self._oom_raw)) - OOM_MARGIN_GIB

    def observe(self, obs: MemoryObservation) -> None:
        """Learn from one finished trial (ignored when it has neither a measure nor an OOM)."""
        p = obs.predicted_gib
        if not (math.isfinite(p) and p > 0):
            return
        if obs.oom:
            self._oom_raw.append(p)
        elif (
            obs.measured_gib is not None
            and math.isfinite(obs.measured_gib)
            and obs.measured_gib > 0
        ):
            self._ratios.append(obs.measured_gib / p)

    def corrected_gib(self, predicted_gib: float) -> float:
        """The prediction after what the study learned."""
        return self.scale * predicted_gib

    def unfit(self, predicted_gib: float, phase: str) -> str:
        """'' when a candidate predicted at `predicted_gib`, peaking in `phase`, may launch; else
        why not, one line."""
        c = self.corrected_gib(predicted_gib)
        ceiling = self.oom_ceiling_gib
        if c >= ceiling:
            return (
                f"device {c:.1f} GiB (corrected x{self.scale:.2f}) >= {ceiling:.1f} GiB, "
                f"{OOM_MARGIN_GIB:.1f} GiB below a trial that ran out of memory"
            )
        h = self.headroom_for(phase)
        if c + h > self.capacity_gib:
            return (
                f"device {c:.1f} GiB in {phase} (corrected x{self.scale:.2f}) + headroom "
                f"{h:.1f} GiB > {self.capacity_gib:.1f} GiB"
            )
        return ""
