"""The README's main job with the estimator: its time and its answer, whatever the seed
(issue 38.7).

    python scripts/bench_study.py [--seeds 0 2] [--pool-seeds 10] [--trials 200]

(a) `tune --model qwen3-30b-moe --gpus 32 --trials 200 --seed S` in a fresh folder, one process
    per seed: wall and CPU seconds (user + system of the process; the wall time counts what
    other processes on the machine take, the CPU time does not) and the best row's
    tokens/s/GPU.
(b) The estimator's search (`cost_model_search`) climbing from the pools of seeds 0..N-1 (the
    study draws its pool with SEARCH_SEED whatever its --seed): the best each reaches, and how
    many candidates it scored. A pool seed whose climb ends below the others' best is a local
    optimum the study's fixed pool would meet if it were drawn so.

Not part of the test suite; output committed as scripts/bench_study.out.txt.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL, GPUS = "qwen3-30b-moe", 32


def _study(seed: int, trials: int) -> tuple[float, float, float]:
    """(wall s, CPU s, best tokens/s/GPU) of one study in a fresh folder."""
    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "tuner", "--model", MODEL, "--gpus", str(GPUS)]
        cmd += ["--trials", str(trials), "--seed", str(seed), "--no-progress"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True, text=True)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        csv_path = next((Path(tmp) / "results").glob("*.csv"))
        with csv_path.open() as f:
            best = max(float(r["tokens_per_s_per_gpu"] or 0) for r in csv.DictReader(f))
    return wall, cpu, best


def _climbs(pool_seeds: int) -> list[tuple[int, float, int, float]]:
    """(pool seed, best score, candidates scored, CPU s) of the search from each pool."""
    from tuner.hardware import Cluster, get_gpu
    from tuner.models import get_model
    from tuner.runners.estimate import EstimateRunner
    from tuner.space import SearchSpace
    from tuner.study import TuneRequest
    from tuner.study.learn import StudyLearner
    from tuner.study.objective import search_score
    from tuner.study.warmstart import SEARCH_STARTS, cost_model_search, scored_candidates
    from tuner.workload import get_workload

    req = TuneRequest(
        model=get_model(MODEL),
        model_arg=MODEL,
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=GPUS),
        workload=get_workload("dapo-math"),
        runner=EstimateRunner(),
        trials=1,
    )
    space = SearchSpace(
        model=req.model,
        cluster=req.cluster,
        workload=req.workload,
        limits=req.runner.space_limits(req.model),
    )
    out = []
    for seed in range(pool_seeds):
        t0 = time.process_time()
        pool = [
            (s.predicted.tokens_per_s_per_gpu, s.params)
            for s in scored_candidates(space, req.profile, req.runner, seed, 2000, None)
            if s.origin == "estimator" and not s.predicted.unfit
        ]
        pool.sort(key=lambda x: -x[0])
        starts: dict[object, dict[str, object]] = {}
        for _, p in pool:
            starts.setdefault(p.get("layout"), p)
        score = search_score(req, StudyLearner(capacity_gib=req.cluster.gpu.memory_gib))
        seen = cost_model_search(space, score, list(starts.values())[:SEARCH_STARTS])
        best = max(v for v, _ in seen.values())
        out.append((seed, best, len(seen), time.process_time() - t0))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 2])
    ap.add_argument("--pool-seeds", type=int, default=10)
    ap.add_argument("--trials", type=int, default=200)
    args = ap.parse_args(argv)
    print(
        f"python {sys.version.split()[0]} on {os.uname().machine}, {os.cpu_count()} CPUs "
        f"visible; load average at start {os.getloadavg()[0]:.1f}"
    )
    print(f"\n(a) tune --model {MODEL} --gpus {GPUS} --trials {args.trials} --seed S")
    for seed in args.seeds:
        wall, cpu, best = _study(seed, args.trials)
        print(
            f"  seed {seed}: best {best:.1f} tokens/s/GPU; {cpu:.1f} s CPU, {wall:.1f} s wall "
            f"(load average {os.getloadavg()[0]:.1f})",
            flush=True,
        )
    from tuner.study.warmstart import SEARCH_SEED, SEARCH_STARTS

    print(
        f"\n(b) the search climbing from the pools of seeds 0..{args.pool_seeds - 1} (the "
        f"best of {SEARCH_STARTS} layouts of each; a study draws seed {SEARCH_SEED}'s)"
    )
    for seed, best, n, cpu in _climbs(args.pool_seeds):
        print(f"  pool seed {seed}: best {best:.1f}; {n} candidates scored, {cpu:.1f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
