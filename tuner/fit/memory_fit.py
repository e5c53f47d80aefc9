"""Fit the memory model's correction and headroom to measured leaderboard rows.

`fit_memory` fits a correction (scale, offset) and a headroom to measured rows (whatever of
allocated / reserved / device they carry); `fit_phase_headroom` fits one headroom per phase the
rows peak in; `rows_from_leaderboards` predicts the ok and OOM rows of leaderboards afresh, and
`misjudged` says which of them a headroom prunes although they ran, or keeps although they ran
out of memory. `tuner.estimate.device.PHASE_HEADROOM_GIB` is `fit_phase_headroom` on the
committed leaderboards (scripts/memory_fit.py). Rows a fit leaves out are named in the notes
beside their file (tuner.fit.notes), not here.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tuner.estimate.device import (
    MIN_HEADROOM_GIB,
    NCCL_INIT_KEY,
    WORKER_NCCL_INIT,
    megatron_worker_gib,
    phases_unfit,
)
from tuner.estimate.memory import DEVICE_OF, MemoryBreakdown
from tuner.estimate.runner_memory import memory_view, phase_devices
from tuner.fit.notes import excluded_rows
from tuner.fit.validate import load_cases
from tuner.results import number, parse_extra, read_rows

HEADROOM_MARGIN_GIB = 0.5
"""Added to the largest under-prediction of the fitted rows."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryRow:
    """One trial's predicted and measured memory, GiB per GPU (max over GPUs)."""

    predicted_gib: float
    """Predicted device total at the peak."""
    capacity_gib: float
    """The GPU's memory."""
    oom: bool = False
    """The trial ran out of device memory (its measures, if any, are ignored)."""
    measured_device_gib: float | None = None
    """Device memory in use at the peak (total - free), where the runner recorded it."""
    measured_reserved_gib: float | None = None
    """PyTorch's reserved peak."""
    measured_allocated_gib: float | None = None
    """PyTorch's allocated peak."""
    predicted_outside_gib: float = 0.0
    """Predicted device - reserved (CUDA context, NCCL): added to a reserved measure."""
    predicted_slack_gib: float = 0.0
    """Predicted reserved - allocated: added, with the outside part, to an allocated measure."""
    devices_gib: dict[str, float] = field(default_factory=dict)
    """Predicted device total of each phase the runner runs (the largest is `predicted_gib`)."""
    label: str = ""
    """The row's `study:trial` (validate.Case.label)."""

    def __post_init__(self) -> None:
        if not (self.predicted_gib > 0 and self.capacity_gib > 0):
            raise ValueError(
                f"predicted ({self.predicted_gib}) and capacity ({self.capacity_gib}) GiB must "
                "be positive: pass the cost model's device total and the GPU's memory"
            )

    @property
    def measured_gib(self) -> float | None:
        """The device total as measured, or as far as the row tells: reserved plus the
        predicted outside part, else allocated plus the predicted slack and outside part."""
        if self.oom:
            return None
        if self.measured_device_gib is not None:
            return self.measured_device_gib
        if self.measured_reserved_gib is not None:
            return self.measured_reserved_gib + self.predicted_outside_gib
        if self.measured_allocated_gib is not None:
            return (
                self.measured_allocated_gib + self.predicted_slack_gib + self.predicted_outside_gib
            )
        return None

    @property
    def phase(self) -> str:
        """The phase whose predicted device total is the largest ('' when not given)."""
        return max(self.devices_gib, key=self.devices_gib.__getitem__) if self.devices_gib else ""

    @property
    def level(self) -> str:
        """Which measure `measured_gib` rests on: device, reserved, allocated or none."""
        for name in ("device", "reserved", "allocated"):
            if getattr(self, f"measured_{name}_gib") is not None:
                return name
        return "none"


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryFit:
    """measured ~= scale * predicted + offset; prune when corrected + headroom > capacity."""

    scale: float
    """Multiplicative correction of the predicted device total."""
    offset_gib: float
    """Additive correction, GiB."""
    headroom_gib: float
    """Kept free below the capacity: the largest under-prediction left after the correction,
    plus HEADROOM_MARGIN_GIB, at least MIN_HEADROOM_GIB, and enough that every OOM row is
    predicted unfit."""
    ok_rows: int
    """Rows with a measure that the fit used."""
    oom_rows: int
    median_abs_error: float
    """Median |corrected - measured| / measured over the ok rows, a fraction."""
    max_under_gib: float
    """Largest measured - corrected over the ok rows (GiB; negative if all over-predicted)."""
    conflict: str = ""
    """Non-empty when no headroom separates the ok rows from the OOM rows (says which)."""

    def corrected_gib(self, predicted_gib: float) -> float:
        return self.scale * predicted_gib + self.offset_gib


def _theil_sen(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    slopes = [
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(xs))
        for j in range(i + 1, len(xs))
        if xs[j] != xs[i]
    ]
    slope = statistics.median(slopes)
    offset = statistics.median(y - slope * x for x, y in zip(xs, ys, strict=True))
    return slope, offset


def fit_memory(
    rows: Iterable[MemoryRow],
    *,
    fit_scale: bool = True,
    fit_offset: bool = True,
    min_spread: float = 0.25,
) -> MemoryFit:
    """Correction and headroom from measured rows (ok rows with a measure, and OOM rows).

    With `fit_offset` and predictions spread over at least `min_spread` (relative range), a
    Theil-Sen line (median of pairwise slopes: robust to one odd row); else a scale alone (the
    median of measured/predicted); with neither, the raw model. The headroom is what the
    corrected model still under-predicts, plus a margin, at least MIN_HEADROOM_GIB; an OOM row
    whose corrected prediction + headroom would fit raises it just past fitting, unless that
    would prune an ok row (then `conflict` says so and the ok rows win)."""
    rs = list(rows)
    ok = [(r.predicted_gib, m) for r in rs if not r.oom and (m := r.measured_gib) is not None]
    oom = [r for r in rs if r.oom]
    scale, offset = 1.0, 0.0
    if ok and fit_scale:
        xs = [p for p, _ in ok]
        ys = [m for _, m in ok]
        spread = (max(xs) - min(xs)) / max(xs)
        if fit_offset and len(ok) >= 3 and spread >= min_spread:
            scale, offset = _theil_sen(xs, ys)
            if scale <= 0:
                scale, offset = statistics.median(y / x for x, y in ok), 0.0
        else:
            scale = statistics.median(y / x for x, y in ok)
    under = [m - (scale * p + offset) for p, m in ok]
    max_under = max(under) if under else 0.0
    headroom = max(MIN_HEADROOM_GIB, max_under + HEADROOM_MARGIN_GIB)
    conflict = ""
    ok_rows_cap = [(r, scale * r.predicted_gib + offset) for r in rs if not r.oom]
    for r in oom:
        need = r.capacity_gib - (scale * r.predicted_gib + offset) + 0.05
        if need > headroom:
            blocked = [f"{c:.1f}" for o, c in ok_rows_cap if c + need > o.capacity_gib]
            if blocked:
                conflict = (
                    f"an OOM at corrected {scale * r.predicted_gib + offset:.1f} GiB needs "
                    f"headroom {need:.1f} GiB, which would prune ok rows at "
                    f"{', '.join(blocked)} GiB"
                )
                continue
            headroom = need
    errs = [abs(scale * p + offset - m) / m for p, m in ok]
    return MemoryFit(
        scale=scale,
        offset_gib=offset,
        headroom_gib=headroom,
        ok_rows=len(ok),
        oom_rows=len(oom),
        median_abs_error=statistics.median(errs) if errs else 0.0,
        max_under_gib=max_under,
        conflict=conflict,
    )


def fit_phase_headroom(rows: Iterable[MemoryRow]) -> dict[str, float]:
    """Headroom per phase: `fit_memory` of the raw model over the rows whose predicted device
    total peaks in that phase (their largest under-prediction + HEADROOM_MARGIN_GIB, at least
    MIN_HEADROOM_GIB, enough for their OOM rows); MIN_HEADROOM_GIB for a phase no row peaks in."""
    rs = list(rows)
    return {
        p: fit_memory([r for r in rs if r.phase == p], fit_scale=False).headroom_gib
        for p in DEVICE_OF
    }


def misjudged(
    rows: Iterable[MemoryRow], headroom_gib: float | None
) -> tuple[list[MemoryRow], list[MemoryRow]]:
    """(rows that ran but that pruning would prune, OOM rows that pruning would keep), each row
    checked as pruning checks a candidate: every phase of `devices_gib` with `headroom_gib`,
    else with its own (device.phase_headroom_gib)."""
    rs = [r for r in rows if r.devices_gib]
    unfit = [bool(phases_unfit(r.devices_gib, r.capacity_gib, headroom_gib)) for r in rs]
    pruned = [r for r, u in zip(rs, unfit, strict=True) if u and not r.oom]
    kept = [r for r, u in zip(rs, unfit, strict=True) if r.oom and not u]
    return pruned, kept


def rows_from_leaderboards(
    paths: Iterable[Path], *, exclude: Mapping[str, str] | None = None
) -> list[MemoryRow]:
    """MemoryRows of the ok and oom rows of leaderboards (ours or reference CSVs), predicted
    afresh by today's model in the view of the runner that measured them (the megatron runner
    measures old_log_prob + update without a reference model; others the whole step). Rows
    named in `exclude` (`FILE NAME:trial` -> why) are left out; by default those that the notes
    beside each file exclude (tuner.fit.notes: `excluded_rows`)."""
    out: list[MemoryRow] = []
    for path in paths:
        skip = excluded_rows([path]) if exclude is None else exclude
        raw = {
            f"{r.get('study', '')}:{r.get('trial', '')}": r
            for r in read_rows(path)
            if r.get("status") in ("ok", "oom")
        }
        for case in load_cases([path]):
            row = raw.get(case.label, {})
            if f"{path.name}:{row.get('trial', '')}" in skip:
                continue
            e = case.predict()
            process = measuring_process_gib(row)
            megatron = process is not None
            phases = ("old_log_prob", "update_actor") if megatron else _ALL_PHASES
            _, device, phase, _ = memory_view(
                e, case.cluster, phases=phases, drop_reference=megatron, process_gib=process
            )
            mem = e.memory
            slack = {"update_actor": mem.slack_gib, "old_log_prob": mem.log_prob_slack_gib}
            out.append(
                MemoryRow(
                    predicted_gib=device,
                    capacity_gib=case.cluster.gpu.memory_gib,
                    oom=case.status == "oom",
                    measured_device_gib=number(row.get("peak_mem_device_gib")),
                    measured_reserved_gib=number(row.get("peak_mem_reserved_gib")),
                    measured_allocated_gib=number(row.get("peak_mem_gib")),
                    predicted_outside_gib=outside_gib(mem, process),
                    predicted_slack_gib=slack.get(phase, 0.0),
                    devices_gib=phase_devices(
                        mem, phases, drop_reference=megatron, process_gib=process
                    ),
                    label=case.label,
                )
            )
    return out


_ALL_PHASES = ("generation", "old_log_prob", "update_actor")


def measuring_process_gib(row: Mapping[str, str]) -> float | None:
    """What the process that measured `row` held outside PyTorch beside NCCL where it was not
    verl's (None: verl's, CUDA_CONTEXT_GIB): the megatron runner's worker, with its eager-NCCL
    excess on the rows measured before it initialised NCCL lazily (their extra has no
    `nccl_init=lazy`: device.EAGER_NCCL_EXCESS_GIB). The one place an old row is told apart."""
    if row.get("runner") != "megatron" and row.get("source") != "megatron":
        return None
    init = parse_extra(row.get("extra", "")).get(NCCL_INIT_KEY)
    return megatron_worker_gib(eager_nccl=init != WORKER_NCCL_INIT)


def outside_gib(mem: MemoryBreakdown, process_gib: float | None) -> float:
    """The predicted device - reserved of a row measured by a process holding `process_gib`
    (`measuring_process_gib`; None: verl's): that process's own memory plus its NCCL buffers."""
    return (mem.cuda_context_gib if process_gib is None else process_gib) + mem.nccl_gib
