"""Where a real verl launch's wall time goes, per trial of a study: start-up split at the
milestones verl, Ray and vLLM log (tuner.runners.verl_timeline, from the trial's log and the
clock the runner kept on it), the warm-up steps, the measured step, the teardown, the measured
share of the launch and the study's GPU-hours.

usage: python scripts/launch_cost.py RESULTS_DIR STUDY
RESULTS_DIR holds STUDY.csv and STUDY/trials/<n>/ (verl.log or verl.log.gz, log-clock.csv).
A failed launch counts with its whole wall time (the row's duration_s). Committed outputs:
    python scripts/launch_cost.py results tail4k-h100-x2   # scripts/launch_cost.out.txt
    python scripts/launch_cost.py results moe2k-h200-x1  # launch_cost.moe2k-h200-x1.out.txt
"""

from __future__ import annotations

import csv
import gzip
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.results import parse_extra  # noqa: E402
from tuner.runners.verl_log import read_console, split_wall_time  # noqa: E402
from tuner.runners.verl_timeline import CLOCK_NAME, MILESTONES, timeline  # noqa: E402


def report(results: Path, study: str) -> str:
    with open(results / f"{study}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    out = [f"{study}: launch cost per trial (seconds from launch; a milestone is its first line)"]
    names = list(MILESTONES)
    head = ["trial", "status", "launch", *names, "startup", "warmup", "measured", "teardown"]
    out.append(" ".join(f"{h:>14}" if i > 1 else f"{h:>6}" for i, h in enumerate(head)))
    gpu_s = measured_s = total_s = 0.0
    launches: list[tuple[dict[str, str], dict[str, str], float]] = []
    for row in rows:
        folder = results / study / "trials" / row["trial"]
        log = folder / "verl.log"
        with tempfile.TemporaryDirectory() as tmp:
            if not log.exists() and log.with_suffix(".log.gz").exists():
                plain = Path(tmp) / "verl.log"
                plain.write_bytes(gzip.decompress(log.with_suffix(".log.gz").read_bytes()))
                log = plain
            ex = parse_extra(row.get("extra", ""))
            step = float(row["measured_s"] or 0)
            warm = float(ex.get("warmup_s", 0))
            launch = float(row["launch_s"] or 0) + warm + step
            if not row["launch_s"]:  # a launch that failed: its wall time, spent all the same
                launch = float(row.get("duration_s") or 0)
            got = timeline(log, folder / CLOCK_NAME, {}, launch)
            if "step1_s" not in ex:  # a row from before the runner kept them: from its log
                steps = read_console(log.read_text(errors="replace")) if log.exists() else {}
                kept: dict[str, object] = {}
                split_wall_time(steps, int(ex.get("step", 3)), 0.0, kept)
                ex.update({k: str(v) for k, v in kept.items()})
        launches.append((row, ex, launch))
        marks = [got.get(f"t_{n}_s") for n in names]
        startup = float(ex.get("startup_s", "nan"))
        teardown = float(ex.get("teardown_s", "nan"))
        cells = [row["trial"], row["status"], f"{launch:.0f}"]
        cells += ["-" if m is None else f"{m:.0f}" for m in marks]
        cells += [f"{startup:.0f}", f"{warm:.0f}", f"{step:.1f}", f"{teardown:.0f}"]
        out.append(" ".join(f"{c:>14}" if i > 1 else f"{c:>6}" for i, c in enumerate(cells)))
        n = int(row["num_gpus"])
        gpu_s += n * launch
        measured_s += step
        total_s += launch
    out.append(
        f"launches {total_s:.0f} s in all, measured steps {measured_s:.1f} s "
        f"({100 * measured_s / total_s:.1f}% of the launches); {gpu_s / 3600:.2f} GPU-hours"
    )
    out += first_steps(launches)
    return "\n".join(out)


def first_steps(launches: list[tuple[dict[str, str], dict[str, str], float]]) -> list[str]:
    """Issue 36's measures of each (row, its extra, its launch's seconds): its first step
    against its steady one (verl's timers of step 1, `step1_*` in extra, where the row or its
    log has them), how many steps it measured, the compile cache, and the medians the goals
    are stated in."""
    out = ["first step against a steady one (s; extra's step1_* and measured_steps)"]
    head = ["trial", "startup", "step1", "steady", "ratio", "gen", "logp", "update", "sync"]
    head += ["untimed", "measured", "cache_new"]
    out.append(" ".join(f"{h:>9}" for h in head))
    startups, ratios, shares = [], [], []
    for row, ex, launch in launches:
        if row["status"] != "ok" or "step1_s" not in ex:
            continue
        steady = float(row["step_s"])
        first = float(ex["step1_s"])
        startups.append(float(ex.get("startup_s", "nan")))
        ratios.append(first / steady)
        shares.append(float(row["measured_s"] or 0) / launch if launch else 0.0)
        cells = [row["trial"], ex.get("startup_s", "-"), f"{first:.1f}", f"{steady:.1f}"]
        cells.append(f"{first / steady:.2f}")
        for k in ("gen", "old_log_prob", "update_actor", "update_weights", "untimed"):
            cells.append(ex.get(f"step1_{k}_s", "-"))
        cells += [ex.get("measured_steps", "1"), ex.get("vllm_cache_new_files", "-")]
        out.append(" ".join(f"{c:>9}" for c in cells))
    if startups:
        out.append(
            f"medians: start-up {statistics.median(startups):.0f} s (goal <= 90), first step "
            f"{statistics.median(ratios):.2f} x a steady one (goal <= 2), measured "
            f"{100 * statistics.median(shares):.0f}% of a launch (goal >= 30%)"
        )
    else:
        out.append("(no row of this study kept its first step's timers)")
    return out


if __name__ == "__main__":
    print(report(Path(sys.argv[1]), sys.argv[2]))
