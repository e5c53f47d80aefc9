"""Fit the memory model's correction, headroom and allocator slack to measured rows.

    python scripts/memory_fit.py [CSV ...]
    # default: the device-measured leaderboards (results/dense8k-h200-x2.csv,
    # results/moe8k-h200-x2.csv, results/small16k-h100-x1.csv) + the anchors

Prints, per measured row, the predicted allocated / reserved / device peaks beside the measured
ones; the least-squares fit of the allocator slack (reserved - allocated = fixed + fraction x
transient) that estimate/device.py's SLACK_* record; the device - reserved that its
CUDA_CONTEXT_GIB records; and `fit_memory` of the raw model (scale 1, offset 0: the
DEFAULT_HEADROOM_GIB) and with a fitted scale. Rows that the notes beside their CSV exclude
(fit.toml, tuner.fit.notes) are left out (and named). Output committed as
scripts/memory_fit.out.txt.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

from tuner.fit.memory import fit_memory, rows_from_leaderboards
from tuner.fit.notes import excluded_rows
from tuner.fit.validate import load_cases
from tuner.results import number, read_rows

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [
    ROOT / "results" / "dense8k-h200-x2.csv",
    ROOT / "results" / "moe8k-h200-x2.csv",
    ROOT / "results" / "small16k-h100-x1.csv",
    *sorted((ROOT / "tests" / "data" / "anchors").glob("*.csv")),
]


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
            dev = resv + m.overhead_gib
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
            "(device.LOCAL_SPEC_OUTSIDE_GIB + nccl_gib)"
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
