"""Fit the memory model's correction, headroom and allocator slack to measured rows.

    python scripts/memory_fit.py [CSV ...]
    # default: the device-measured leaderboards (results/dense8k-h200-x2.csv,
    # results/moe8k-h200-x2.csv, results/small16k-h100-x1.csv) + the anchors

Prints, per measured row, the predicted allocated / reserved / device peaks beside the measured
ones; the least-squares fit of the allocator slack (reserved - allocated = fixed + fraction x
transient) that estimate/device.py's SLACK_* record; the device - reserved that its
MEGATRON_WORKER_GIB (+ EAGER_NCCL_EXCESS_GIB on the rows measured with eager NCCL) records; and
`fit_memory` of the raw model (scale 1, offset 0) and with a fitted scale. Then what sets the
headroom: for each split of the rows (MoE, 16k sequences, offload, expert parallel, recompute, GPU,
the phase that peaks), the headroom each group's measured rows ask and the most that its published
runs (ok rows without a measure) allow; the per-phase fit (`fit_phase_headroom`) against
device.PHASE_HEADROOM_GIB; and the rows each headroom misjudges (ran but pruned, OOM but kept,
under-predicted by more than the headroom) before (one 2.0 GiB) and after (per phase). The verl
runner's rows (results/verl4k-h100-x1.csv) are listed, not fitted (scripts/verl_memory_check.py
compares them phase by phase). Rows that the notes beside their CSV exclude (fit.toml,
tuner.fit.notes) are left out (and named). Output committed as scripts/memory_fit.out.txt.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tuner.estimate.device import (
    PHASE_HEADROOM_GIB,
    phase_headroom_gib,
    phases_unfit,
)
from tuner.estimate.memory import DEVICE_OF
from tuner.fit.memory_fit import (
    MemoryRow,
    fit_memory,
    fit_phase_headroom,
    measuring_process_gib,
    misjudged,
    outside_gib,
    rows_from_leaderboards,
)
from tuner.fit.notes import excluded_rows
from tuner.fit.validate import Case, load_cases
from tuner.results import number, read_rows

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [
    ROOT / "results" / "dense8k-h200-x2.csv",
    ROOT / "results" / "moe8k-h200-x2.csv",
    ROOT / "results" / "small16k-h100-x1.csv",
    *sorted((ROOT / "tests" / "data" / "anchors").glob("*.csv")),
]
VERL = ROOT / "results" / "verl4k-h100-x1.csv"
"""The verl runner's rows: nvidia-smi's device peak sampled over the whole trial (every process
on the GPU), so listed beside the fit, not in it."""
BEFORE_GIB = 2.0
"""The one headroom every phase kept before the per-phase fit (DEFAULT_HEADROOM_GIB until then)."""
SPLITS: dict[str, Callable[[Case], object]] = {
    "MoE": lambda c: c.model.num_experts > 0,
    "sequence >= 16k": lambda c: c.workload.max_seq_len >= 16384,
    "offload": lambda c: c.candidate.param_offload or c.candidate.optimizer_offload,
    "expert parallel": lambda c: c.candidate.layout.ep > 1,
    "recompute": lambda c: c.candidate.recompute_granularity,
    "GPU": lambda c: c.cluster.gpu.name,
}
"""Features of a row that could explain its under-prediction; the peak phase is the last split."""


def _pct(xs: list[float]) -> str:
    return f"{statistics.median(map(abs, xs)):.1%}" if xs else "-"


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or DEFAULT
    print(
        f"{'row':22} {'alloc':>6} {'pred':>6} {'err':>6} | {'resv':>6} {'pred':>6} {'err':>6}"
        f" | {'device':>6} {'pred':>6} {'err':>6} | {'dev-res':>7} {'transient':>9}"
    )
    errs: dict[str, list[float]] = {"allocated": [], "reserved": [], "device": []}
    xs: list[float] = []
    ys: list[float] = []
    outside: list[float] = []
    for path in paths:
        excluded = excluded_rows([path])
        raw = {f"{r.get('study', '')}:{r.get('trial', '')}": r for r in read_rows(path)}
        for case in load_cases([path]):
            row = raw.get(case.label, {})
            key = f"{path.name}:{row.get('trial', '')}"
            if key in excluded:
                print(f"{case.label:22} excluded: {excluded[key]}")
                continue
            ma, mr = number(row.get("peak_mem_gib")), number(row.get("peak_mem_reserved_gib"))
            md = number(row.get("peak_mem_device_gib"))
            if case.status != "ok" or ma is None or mr is None:
                continue
            m = case.predict().memory
            alloc = m.update_peak_gib - m.reference_gib  # the megatron runner's peak phase
            resv = alloc + m.slack_gib
            dev = resv + outside_gib(m, measuring_process_gib(row))
            errs["allocated"].append((alloc - ma) / ma)
            errs["reserved"].append((resv - mr) / mr)
            xs.append(m.update_transient_gib)
            ys.append(mr - ma)
            dcol = f"{'-':>6} {dev:6.1f} {'-':>6} | {'-':>7}"
            if md is not None:
                errs["device"].append((dev - md) / md)
                outside.append(md - mr)
                dcol = f"{md:6.1f} {dev:6.1f} {errs['device'][-1]:+6.1%} | {md - mr:7.2f}"
            print(
                f"{case.label:22} {ma:6.1f} {alloc:6.1f} {errs['allocated'][-1]:+6.1%} | "
                f"{mr:6.1f} {resv:6.1f} {errs['reserved'][-1]:+6.1%} | {dcol} "
                f"{m.update_transient_gib:9.1f}"
            )
    if xs:
        print(
            f"median |error| (update peak): allocated {_pct(errs['allocated'])}, reserved "
            f"{_pct(errs['reserved'])} over {len(xs)} rows; device {_pct(errs['device'])} over "
            f"{len(errs['device'])} rows"
        )
        a = np.vstack([np.ones(len(xs)), xs]).T
        fixed, frac = np.linalg.lstsq(a, np.array(ys), rcond=None)[0]
        print(
            f"allocator slack fit: reserved - allocated = {fixed:.2f} GiB + {frac:.3f} x "
            "transient (device.SLACK_FIXED_GIB, SLACK_FRACTION); median "
            f"{statistics.median(ys):.2f}"
        )
    if outside:
        print(
            f"device - reserved: median {statistics.median(outside):.2f} GiB, range "
            f"{min(outside):.2f}..{max(outside):.2f} over {len(outside)} rows "
            "(device.MEGATRON_WORKER_GIB + nccl_gib, + EAGER_NCCL_EXCESS_GIB where the "
            "row's extra has no nccl_init=lazy)"
        )
    rows = rows_from_leaderboards(paths)
    for label, kw in (("raw model", {"fit_scale": False}), ("fitted", {})):
        f = fit_memory(rows, **kw)
        print(
            f"fit_memory ({label}): scale {f.scale:.3f}, offset {f.offset_gib:+.2f} GiB, "
            f"headroom {f.headroom_gib:.2f} GiB; {f.ok_rows} measured ok rows, "
            f"{f.oom_rows} oom rows, median |error| {f.median_abs_error:.1%}, largest "
            f"under-prediction {f.max_under_gib:+.2f} GiB{'; ' + f.conflict if f.conflict else ''}"
        )
    cases = {c.label: c for c in load_cases(paths)}
    _splits(rows, cases)
    _per_phase(rows, cases)
    _misjudged(rows)
    if not argv and VERL.exists():
        _verl(rows_from_leaderboards([VERL]))
    return 0


def _under(r: MemoryRow) -> float:
    return (r.measured_gib or 0.0) - r.predicted_gib


def _of_case(f: Callable[[Case], object], cases: dict[str, Case]) -> Callable[..., object]:
    """A split's key of (row, phase): the feature of the row's case, whatever the phase."""
    return lambda r, p: f(cases[r.label])


def _splits(rows: list[MemoryRow], cases: dict[str, Case]) -> None:
    """Per split and group: the headroom its measured rows ask (fit_memory of the raw model over
    the rows peaking in the group), the most its published runs allow (every phase of theirs in
    the group: capacity - device total), and whether one headroom per group serves both."""
    print(
        "\nwhat the under-predicted rows share: per group, the headroom its measured rows ask "
        "(largest under-prediction + 0.5, at least 2.0) and the most its published runs allow"
    )
    keys = {n: _of_case(f, cases) for n, f in SPLITS.items()}
    keys["peak phase"] = lambda r, p: p
    fitted = [r for r in rows if r.measured_gib is not None or r.oom]
    for name, key in keys.items():
        groups = sorted({str(key(r, p)) for r in rows for p in r.devices_gib})
        verdicts = []
        for g in groups:
            mine = [r for r in fitted if str(key(r, r.phase)) == g]
            ask = fit_memory(mine, fit_scale=False).headroom_gib
            oom = sum(r.oom for r in mine)
            worst = max((r for r in mine if not r.oom), key=_under, default=None)
            ran = [
                (r.capacity_gib - d, r.label)
                for r in rows
                if not r.oom and r.measured_gib is None
                for p, d in r.devices_gib.items()
                if str(key(r, p)) == g
            ]
            allow, who = min(ran, default=(float("inf"), "-"))
            ok = ask <= allow
            verdicts.append(ok)
            under = f"{_under(worst):+.2f} ({worst.label})" if worst else "-"
            print(
                f"  {name:15} {g:12} {len(mine) - oom:2} ok + {oom} OOM, largest under "
                f"{under:24} -> asks {ask:.2f}; {len({w for _, w in ran}):2} published, allow "
                f"{allow:5.2f} ({who})"
                f"{'' if ok else '  CONFLICT'}"
            )
        print(f"  {name}: {'separates' if all(verdicts) else 'does not separate'}")


def _per_phase(rows: list[MemoryRow], cases: dict[str, Case]) -> None:
    big = sorted((r for r in rows if _under(r) > 1.0), key=_under, reverse=True)
    print("\nrows under-predicted by more than 1 GiB: phase, under-prediction, update transient")
    for r in big:
        transient = cases[r.label].predict().memory.update_transient_gib
        print(f"  {r.label:18} {r.phase:13} {_under(r):+.2f} GiB  {transient:5.1f} GiB")
    fit = fit_phase_headroom(rows)
    print(
        "\nfit_phase_headroom (raw model, rows by the phase their predicted device total peaks in):"
    )
    for p in DEVICE_OF:
        mine = [r for r in rows if r.phase == p and r.measured_gib is not None]
        worst = max(mine, key=_under, default=None)
        under = f", largest under {_under(worst):+.2f} GiB ({worst.label})" if worst else ""
        print(
            f"  {p:13} {fit[p]:.2f} GiB ({len(mine)} measured rows{under}); "
            f"device.PHASE_HEADROOM_GIB {PHASE_HEADROOM_GIB[p]:.2f}"
        )


def _misjudged(rows: list[MemoryRow]) -> None:
    ok = [r for r in rows if not r.oom and r.measured_gib is not None]
    pub = [r for r in rows if not r.oom and r.measured_gib is None]
    print(
        f"\nmisjudged rows, each phase checked ({len(ok)} measured ok, {len(pub)} published ok, "
        f"{sum(r.oom for r in rows)} OOM):"
    )
    for label, h in (
        (f"before: {BEFORE_GIB:.1f} GiB every phase", BEFORE_GIB),
        ("after: per phase", None),
    ):
        pruned, kept = misjudged(rows, h)
        past = [
            f"{r.label} {_under(r):+.2f} > {h or phase_headroom_gib(r.phase):.2f}"
            for r in ok
            if _under(r) > (h or phase_headroom_gib(r.phase))
        ]
        print(
            f"  {label:30} pruned-but-ran {len(pruned)} {[r.label for r in pruned]}, "
            f"kept-but-OOM {len(kept)} {[r.label for r in kept]}, under-predicted past its "
            f"headroom {len(past)} {past}"
        )
    tight = sorted(pub + ok, key=lambda r: min(r.capacity_gib - d for d in r.devices_gib.values()))
    for r in tight[:4]:
        room = {p: round(r.capacity_gib - d, 2) for p, d in r.devices_gib.items()}
        print(f"  tightest ran: {r.label:22} capacity - device per phase {room}")


def _verl(rows: list[MemoryRow]) -> None:
    print(
        f"\nnot fitted, {VERL.name} (nvidia-smi's sampled device peak of the whole GPU; "
        "scripts/verl_memory_check.py by phase):"
    )
    for r in rows:
        before, after = (
            "unfit" if phases_unfit(r.devices_gib, r.capacity_gib, h) else "kept"
            for h in (BEFORE_GIB, None)
        )
        print(
            f"  {r.label:18} predicted {r.predicted_gib:.1f} GiB in {r.phase}, measured "
            f"{r.measured_gib or 0.0:.1f} ({_under(r):+.2f}); before {before}, after {after}, "
            f"headroom {phase_headroom_gib(r.phase):.1f} GiB "
            f"{'covers' if _under(r) <= phase_headroom_gib(r.phase) else 'does not cover'} it"
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
