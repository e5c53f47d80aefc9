"""Summary of measured leaderboards (results/README.md): ok rows, launches without a number,
tuned best against the hand grid's best, and the error of the predicted device peak.

    python scripts/measured_summary.py results/dense8k-h200-x2.csv ...
"""

from __future__ import annotations

import csv
import statistics
import sys

LAUNCHED = ("ok", "oom", "failed", "timeout", "pruned-slow")


def summary(path: str) -> str:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    # a repeat of an earlier candidate is recorded with that trial's numbers, not launched
    rows = [r for r in rows if "not re-run" not in (r["reason"] or "")]
    ok = [r for r in rows if r["status"] == "ok"]
    launched = [r for r in rows if r["status"] in LAUNCHED]
    no_number = [r for r in launched if r["status"] in ("oom", "failed", "timeout")]
    tps = [float(r["tokens_per_s_per_gpu"]) for r in ok]
    hand = [float(r["tokens_per_s_per_gpu"]) for r in ok if r["origin"].startswith("hand grid")]
    errs = [
        abs(float(r["pred_device_mem_gib"]) / float(r["peak_mem_device_gib"]) - 1)
        for r in ok
        if r["peak_mem_device_gib"] and r["pred_device_mem_gib"]
    ]
    errs_c = [
        abs(float(r["pred_device_mem_corrected_gib"]) / float(r["peak_mem_device_gib"]) - 1)
        for r in ok
        if r["peak_mem_device_gib"] and r.get("pred_device_mem_corrected_gib")
    ]
    meas = sum(float(r["measured_s"] or 0) for r in launched)
    dur = sum(float(r["duration_s"] or 0) for r in launched)
    # per ok trial; rows recording pool_started=True are left out (their wall time includes
    # the pool's start-up), rows older than that record are all in
    shares = [
        float(r["measured_s"]) / float(r["duration_s"])
        for r in ok
        if r["measured_s"] and r["duration_s"] and "pool_started=True" not in r["extra"]
    ]
    lines = [
        f"{path}: {len(rows)} rows (repeats left out), {len(launched)} launched, {len(ok)} ok, "
        f"{len(no_number)} launches without a number "
        f"({', '.join(r['trial'] + ':' + r['status'] for r in no_number) or '-'})",
        f"  best {max(tps):.0f} tok/s/GPU; hand grid best {max(hand) if hand else 0:.0f}; "
        f"tuned/hand {max(tps) / max(hand) if hand else float('nan'):.3f}",
        f"  predicted device peak, median |error| over ok rows: raw "
        f"{100 * statistics.median(errs):.1f}%"
        f" (max {100 * max(errs):.1f}%), as corrected in the study "
        f"{100 * statistics.median(errs_c):.1f}%"
        if errs and errs_c
        else "  no device memory",
        f"  wall time of launched trials in measured steps: {100 * meas / dur:.0f}%; "
        f"per ok trial, median {100 * statistics.median(shares):.0f}%, best "
        f"{100 * max(shares):.0f}%"
        if shares
        else "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n".join(summary(p) for p in sys.argv[1:]))
