"""Predict every measured row of the reference leaderboards and print the errors per phase.

    python scripts/validate_estimator.py [ANCHOR_DIR_OR_CSV ...] [--profile calibration.json]

Default: ../shared/anchors (relative to the repository). FSDP rows and rows without numbers are
skipped. The cost model is not fitted to these rows; this is the check of it. Inputs a row leaves
out come from the reference recipes' conventions and scripts (tuner.estimate.validate
REFERENCE_DEFAULTS, RECIPE_INPUTS); a file that reports throughput sets its own mean response
length (its rows' tokens per step), which the last summary line leaves out for comparison.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from tuner.estimate import load_profile
from tuner.estimate.validate import (
    GOAL_PHASES,
    PHASES,
    anchor_paths,
    load_cases,
    predicted_phase,
    validate,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ANCHORS = REPO / ".." / "shared" / "anchors"
TARGET = 0.15
"""Issue 10's target for the median error of each goal phase on the reference leaderboards."""
ABOVE_TARGET = {
    "generation": (
        "the dapo files report no token counts, so their rows take the workload's default "
        "response lengths (a capped exponential, mean 15% of the cap), which set how a run splits "
        "into the busy phase and the drain tail: the 11 dapo7b rows on H100 with rollout TP 1 "
        "come out 1.16-1.22x and the 2 with rollout TP 4 0.78-0.85x, while the 9 grpo rows (same "
        "model and GPUs, rollout TP 1; that file's throughput gives its mean response) come out "
        "0.89-1.15x. All anchors but grpo row 8 ran eagerly: CUDA graphs are not what is off."
    ),
    "old_log_prob": (
        "20 of the 29 H100 rows come out below 0.9x (median 0.84x), the 3 H20 rows 0.94-1.16x: "
        "a cost that does not scale with FLOPs seems missing from the log-prob pass, not "
        "identified yet (verl's per-sequence packing loops, by our count 0.1-0.4 ms a sequence, "
        "are too small to be it)."
    ),
}
"""Why a goal phase stays above TARGET on the anchors, as far as the rows tell."""


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("paths", nargs="*", type=Path, help="anchor folder(s) or CSV file(s)")
    ap.add_argument(
        "--profile", type=Path, default=None, help="calibration profile (default: none)"
    )
    args = ap.parse_args(argv)
    paths: list[Path] = []
    for p in args.paths or [DEFAULT_ANCHORS]:
        paths.extend(anchor_paths(p) if p.is_dir() else [p])
    profile = load_profile(args.profile) if args.profile else None
    summary = validate(load_cases(paths), profile)

    phases = [name for _, name in PHASES]
    short = {"generation": "gen", "old_log_prob": "logp", "update_actor": "update", "step": "step"}
    head = f"{'row':22} {'layout':12} {'roll':4} {'gpus':8}"
    for ph in phases:
        head += f" | {short[ph]:>6} {'pred':>6} {'ratio':>5}"
    head += " | status  pred-peak fits"
    print(head)
    print("-" * len(head))
    for o in summary.outcomes:
        c, e = o.case, o.estimate
        lay = c.candidate.layout
        line = (
            f"{c.label:22} {lay.notation:12} tp{c.candidate.rollout_tp:<2} "
            f"{c.cluster.gpu.name}x{c.cluster.num_gpus:<4}"
        )
        for ph in phases:
            m = c.measured.get(ph)
            pr = predicted_phase(e, ph)
            ratio = f"{pr / m:.2f}" if m and math.isfinite(pr) else "-"
            line += f" | {_fmt(m):>6} {_fmt(pr):>6} {ratio:>5}"
        line += f" | {c.status:7} {e.peak_mem_gib:6.1f} {'yes' if e.fits else 'NO'}"
        if c.notes:
            line += f"  ({c.notes})"
        print(line)
    print()
    print("ratio = predicted / measured; pred-peak in GiB (the largest phase peak).")
    for ph in phases:
        if ph in summary.median_ape:
            goal = " (goal <= 20%)" if ph in GOAL_PHASES else ""
            print(
                f"median absolute error {ph:13} {summary.median_ape[ph] * 100:5.1f}% over "
                f"{summary.counts[ph]} rows{goal}"
            )
    print(f"OOM rows predicted as not fitting: {summary.oom_caught}/{summary.oom_rows}")
    print(f"measured rows predicted as fitting: {summary.ok_fit}/{summary.ok_rows}")
    grpo = [o for o in summary.outcomes if o.case.label.startswith("grpo")]
    if grpo:
        g_oom = [o for o in grpo if o.case.status == "oom"]
        g_ok = [o for o in grpo if o.case.status == "ok"]
        print(
            f"grpo_qwen2.5_7b: OOM rows not fitting {sum(not o.estimate.fits for o in g_oom)}/"
            f"{len(g_oom)}, measured rows fitting {sum(o.estimate.fits for o in g_ok)}/{len(g_ok)}"
        )
    plain = validate(load_cases(paths, reported_tokens=False), profile)
    parts = ", ".join(
        f"{ph} {plain.median_ape[ph] * 100:.1f}%" for ph in phases if ph in plain.median_ape
    )
    print(
        "the same with the workload default (15% of the cap) as every row's mean response, "
        f"ignoring the token counts a file reports: {parts}"
    )
    print(f"goal met: {'yes' if summary.goal_met else 'no'}")
    for ph in GOAL_PHASES:
        err = summary.median_ape.get(ph)
        if err is not None and err > TARGET and ph in ABOVE_TARGET:
            print(f"{ph} above the {TARGET:.0%} target ({err:.1%}): {ABOVE_TARGET[ph]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
