"""How many candidates per second the cost model scores (goal: over 10,000 on a 2-core CPU).

    python scripts/bench_estimator.py [--candidates 20000] [--repeat 3]

Candidates are drawn the way the warm start draws them (space.sample with a seeded
RandomSuggester) for a few (model, GPUs) studies, then each is scored with estimate(). The
first pass over a study also pays for the per-study caches (model constants, generation per
rollout setting); it is reported separately.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time

from tuner.estimate import estimate
from tuner.estimate.context import _CACHE
from tuner.hardware import GPUS, Cluster
from tuner.models import get_model
from tuner.space import RandomSuggester, SearchSpace, sample
from tuner.workload import get_workload

STUDIES = (
    ("qwen2.5-7b", "h100", 8, "dapo-math"),
    ("qwen2.5-7b", "h20", 32, "grpo-math"),
    ("qwen3-30b-moe", "h100", 32, "dapo-math"),
    ("llama3.1-70b", "h200", 64, "ppo-gsm8k"),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--candidates", type=int, default=20000, help="per study (default 20000)")
    ap.add_argument("--repeat", type=int, default=3, help="timed passes, best kept (default 3)")
    args = ap.parse_args(argv)
    print(
        f"python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} CPUs visible; one thread"
    )
    total_n, total_t = 0, 0.0
    for model_name, gpu, gpus, wl in STUDIES:
        m = get_model(model_name)
        cl = Cluster(gpu=GPUS[gpu], num_gpus=gpus)
        w = get_workload(wl)
        space = SearchSpace(model=m, cluster=cl, workload=w)
        rng = random.Random(0)
        cands = [sample(RandomSuggester(rng), space) for _ in range(args.candidates)]
        _CACHE.clear()
        t0 = time.perf_counter()
        estimate(cands[0], m, cl, w)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        for c in cands:
            estimate(c, m, cl, w)
        cold = time.perf_counter() - t0
        best = cold
        for _ in range(args.repeat - 1):
            t0 = time.perf_counter()
            for c in cands:
                estimate(c, m, cl, w)
            best = min(best, time.perf_counter() - t0)
        total_n += len(cands)
        total_t += best
        print(
            f"{model_name:14} {gpu}x{gpus:<3} {wl:10} {len(space.layouts):4} layouts: "
            f"{len(cands) / best:8.0f} candidates/s warm, {len(cands) / cold:8.0f} in the first "
            f"pass; first call {first * 1e3:.1f} ms"
        )
    print(f"overall: {total_n / total_t:.0f} candidates/s ({total_t / total_n * 1e6:.1f} us each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
