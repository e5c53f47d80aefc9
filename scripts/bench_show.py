"""How long loading and showing a 10,000-row leaderboard takes (the target is under 1 s).

The leaderboard is the committed measured rows (results/*.csv) as a study writes them today
(each row read in the current schema and written under its columns: the committed files are of
schemas 1 to 3, and an old schema's file is read cell by cell), repeated to 10,000 rows, trial
numbers renumbered and throughputs spread so that sorting has work to do. Times, median of 5:
`tuner.load_leaderboard` alone; `tune show` in this process (argument checks, load, reference
ratio, rank, format, print to /dev/null); and `python -m tuner show` as a new process (the
interpreter and imports included).

    python scripts/bench_show.py > scripts/bench_show.out.txt
"""

from __future__ import annotations

import contextlib
import csv
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROWS = 10_000
RUNS = 5


def make_leaderboard(path: Path) -> None:
    from tuner.results import COLUMNS, TrialRecord

    rows: list[dict[str, str]] = []
    for src in sorted((REPO / "results").glob("*.csv")):
        with open(src, newline="") as f:
            rows += [TrialRecord.from_row(r).to_row() for r in csv.DictReader(f)]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        for i in range(ROWS):
            r = dict(rows[i % len(rows)])
            r["study"], r["trial"] = "bench", str(i)
            if r["tokens_per_s_per_gpu"]:
                spread = 1 + (i * 7919 % 1000) / 1e4
                r["tokens_per_s_per_gpu"] = f"{float(r['tokens_per_s_per_gpu']) * spread:.6g}"
            w.writerow(r)


def median_s(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    import pandas

    import tuner
    from tuner.cli import main as tune

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.csv"
        make_leaderboard(path)
        size = path.stat().st_size
        load = median_s(lambda: tuner.load_leaderboard(path))

        def show() -> None:
            with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                assert tune(["show", str(path)]) == 0

        show_s = median_s(show)

        def process() -> None:
            cmd = [sys.executable, "-m", "tuner", "show", str(path)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=REPO)

        proc_s = median_s(process)
        cols = len(tuner.load_leaderboard(path).columns)
    print(f"leaderboard: {ROWS} rows x {cols} columns, {size / 1e6:.1f} MB")
    print(
        f"python {platform.python_version()}, pandas {pandas.__version__}, "
        f"{os.cpu_count()} CPUs ({platform.machine()}), load average "
        f"{os.getloadavg()[0]:.1f} (other work on the machine), median of {RUNS}"
    )
    print(f"tuner.load_leaderboard             {load:6.3f} s")
    print(
        f"tune show, in process              {show_s:6.3f} s  (checks, load, rank, format, print)"
    )
    print(f"python -m tuner show, new process  {proc_s:6.3f} s  (interpreter and imports included)")


if __name__ == "__main__":
    main()
