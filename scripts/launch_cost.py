"""Where a real verl launch's wall time goes, per trial of a study: start-up split at the
milestones verl, Ray and vLLM log (tuner.runners.verl_timeline, from the trial's log and the
clock the runner kept on it), the warm-up steps, the measured step, the teardown, the measured
share of the launch and the study's GPU-hours.

usage: python scripts/launch_cost.py RESULTS_DIR STUDY
RESULTS_DIR holds STUDY.csv and STUDY/trials/<n>/ (verl.log or verl.log.gz, log-clock.csv).
Committed output: scripts/launch_cost.out.txt, from
    python scripts/launch_cost.py results tail4k-h100-x2
"""

from __future__ import annotations

import csv
import gzip
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.results import parse_extra  # noqa: E402
from tuner.runners.verl_timeline import CLOCK_NAME, MILESTONES, timeline  # noqa: E402


def report(results: Path, study: str) -> str:
    with open(results / f"{study}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    out = [f"{study}: launch cost per trial (seconds from launch; a milestone is its first line)"]
    names = list(MILESTONES)
    head = ["trial", "status", "launch", *names, "startup", "warmup", "measured", "teardown"]
    out.append(" ".join(f"{h:>14}" if i > 1 else f"{h:>6}" for i, h in enumerate(head)))
    gpu_s = measured_s = total_s = 0.0
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
            got = timeline(log, folder / CLOCK_NAME, {}, launch)
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
    return "\n".join(out)


if __name__ == "__main__":
    print(report(Path(sys.argv[1]), sys.argv[2]))
