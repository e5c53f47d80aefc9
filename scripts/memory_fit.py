"""Fit the memory model's correction, headroom and allocator slack to measured rows.

    python scripts/memory_fit.py [CSV ...]      # default: results/*-h200-x2.csv + the anchors

Prints, per measured row, the predicted allocated / reserved / device peaks beside the measured
ones; the least-squares fit of the allocator slack (reserved - allocated = fixed + fraction x
transient) that memfit.SLACK_* record; and `fit_memory` of the raw model (scale 1, offset 0: the
DEFAULT_HEADROOM_GIB) and with a fitted scale. Output committed as scripts/memory_fit.out.txt.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

from tuner.estimate import estimate
from tuner.estimate.memfit import fit_memory, rows_from_leaderboards
from tuner.estimate.validate import load_cases
from tuner.results import number, read_rows

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [
    ROOT / "results" / "dense-h200-x2.csv",
    ROOT / "results" / "moe-h200-x2.csv",
    *sorted((ROOT / "tests" / "data" / "anchors").glob("*.csv")),
]


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or DEFAULT
    print(
        f"{'row':24} {'alloc':>6} {'pred':>6} {'err':>6} | {'resv':>6} {'pred':>6} {'err':>6}"
        f" | {'dev pred':>8} {'transient':>9}"
    )
    alloc_err: list[float] = []
    resv_err: list[float] = []
    xs: list[float] = []
    ys: list[float] = []
    for path in paths:
        raw = {f"{r.get('study', '')}:{r.get('trial', '')}": r for r in read_rows(path)}
        for case in load_cases([path]):
            row = raw.get(case.label, {})
            ma, mr = number(row.get("peak_mem_gib")), number(row.get("peak_mem_reserved_gib"))
            if case.status != "ok" or ma is None or mr is None:
                continue
            m = estimate(case.candidate, case.model, case.cluster, case.workload).memory
            alloc = m.update_peak_gib - m.reference_gib  # the megatron runner's peak phase
            resv = alloc + m.slack_gib
            alloc_err.append((alloc - ma) / ma)
            resv_err.append((resv - mr) / mr)
            xs.append(m.update_transient_gib)
            ys.append(mr - ma)
            print(
                f"{case.label:24} {ma:6.1f} {alloc:6.1f} {alloc_err[-1]:+6.1%} | {mr:6.1f} "
                f"{resv:6.1f} {resv_err[-1]:+6.1%} | {m.update_device_gib - m.reference_gib:8.1f}"
                f" {m.update_transient_gib:9.1f}"
            )
    if alloc_err:
        print(
            f"median |error|: allocated {statistics.median(map(abs, alloc_err)):.1%}, "
            f"reserved {statistics.median(map(abs, resv_err)):.1%} over {len(alloc_err)} rows"
        )
        a = np.vstack([np.ones(len(xs)), xs]).T
        fixed, frac = np.linalg.lstsq(a, np.array(ys), rcond=None)[0]
        print(
            f"allocator slack fit: reserved - allocated = {fixed:.2f} GiB + {frac:.3f} x "
            "transient (memfit.SLACK_FIXED_GIB, SLACK_FRACTION)"
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
