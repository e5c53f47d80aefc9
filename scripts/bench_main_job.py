"""The README's main job with the estimator: its time and its answer, whatever the seed
(issue 38 item 7).

    python scripts/bench_main_job.py [--seeds 0 2 3] [--repeat 3] [--trials 200]
                                     [--before DIR] [--spaces]

(a) `tune --model qwen3-30b-moe --gpus 32 --trials 200 --seed S` in a fresh folder, one process
    per run, `--repeat` runs per seed: wall and CPU seconds of each (user + system of the
    process; the wall time counts what other processes on the machine take, the CPU time does
    not), the best row's tokens/s/GPU and layout. The answer must be the same for every seed.
(b) With `--before DIR` (a checkout of an earlier commit, e.g. `git archive 5021a56 | tar -x -C
    DIR`), the same study run from that tree, seed 0, for the time and the answer before.
(c) The exact search alone (tuner/study/exact.py, the study's warm start: its 200 best) on the
    main job's space: CPU seconds (best of `--repeat`), its cost-model calls (phase times, and
    memory totals) and its best.
(d) With `--spaces`, other spaces: the exact search's best against the climb it replaced
    (warmstart.cost_model_search from the best layouts of a seed-0 pool of 2000, which
    --allow-off-policy spaces keep), each with its CPU seconds.

Not part of the test suite; output committed as scripts/bench_main_job.out.txt. It replaces
scripts/bench_study.py, whose output recorded the climb ending below the space's best from
some pool seeds (git history).
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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.space import Candidate, SearchSpace
    from tuner.study import TuneRequest

ROOT = Path(__file__).resolve().parent.parent
MODEL, GPUS = "qwen3-30b-moe", 32
SPACES = (
    ("qwen2.5-7b", "h100", 8, "dapo-math"),
    ("llama3.1-8b", "h200", 4, "grpo-math"),
    ("qwen3-30b-moe", "h200", 8, "grpo-short"),
    ("qwen2.5-32b", "h100", 16, "grpo-math"),
    ("llama3.1-70b", "h100", 32, "dapo-math"),
)
"""Other spaces for (d): dense and MoE models, memory-tight and not."""


def _study(tree: Path, seed: int, trials: int) -> tuple[float, float, float, str]:
    """(wall s, CPU s, best tokens/s/GPU, its layout) of one study in a fresh folder, run with
    the package of `tree`."""
    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "tuner", "--model", MODEL, "--gpus", str(GPUS)]
        cmd += ["--trials", str(trials), "--seed", str(seed), "--no-progress"]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True, text=True)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        csv_path = next((Path(tmp) / "results").glob("*.csv"))
        with csv_path.open() as f:
            rows = [r for r in csv.DictReader(f) if r["tokens_per_s_per_gpu"]]
        best = max(rows, key=lambda r: float(r["tokens_per_s_per_gpu"]))
    return wall, cpu, float(best["tokens_per_s_per_gpu"]), best["train_parallel"]


def _runs(tree: Path, seeds: list[int], repeat: int, trials: int) -> set[tuple[float, str]]:
    """Print each run of (a) or (b); return the answers seen, (tokens/s/GPU, layout)."""
    answers = set()
    for seed in seeds:
        for i in range(repeat):
            wall, cpu, best, layout = _study(tree, seed, trials)
            answers.add((round(best, 1), layout))
            print(
                f"  seed {seed} run {i + 1}: best {best:.1f} tokens/s/GPU ({layout}); "
                f"{cpu:.1f} s CPU, {wall:.1f} s wall (load average {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    return answers


def _request(
    model: str, gpu: str, gpus: int, workload: str
) -> tuple[TuneRequest, SearchSpace, Callable[[Candidate], float]]:
    """(request, space, the study's score) of the estimator on this setup."""
    from tuner.hardware import Cluster, get_gpu
    from tuner.models import get_model
    from tuner.runners.estimate import EstimateRunner
    from tuner.space import SearchSpace
    from tuner.study import TuneRequest
    from tuner.study.learn import StudyLearner
    from tuner.study.objective import search_score
    from tuner.workload import get_workload

    req = TuneRequest(
        model=get_model(model),
        model_arg=model,
        cluster=Cluster(gpu=get_gpu(gpu), num_gpus=gpus),
        workload=get_workload(workload),
        runner=EstimateRunner(),
        trials=1,
    )
    space = SearchSpace(
        model=req.model,
        cluster=req.cluster,
        workload=req.workload,
        limits=req.runner.space_limits(req.model),
    )
    score = search_score(req, StudyLearner(capacity_gib=req.cluster.gpu.memory_gib))
    return req, space, score


def _exact(setup: tuple[str, str, int, str], count: int) -> tuple[float, float, str, int, int]:
    """(CPU s, best tokens/s/GPU, its layout, phase-time calls, memory calls) of the exact
    search, in a process of its own (the cost model's caches cold, as in a study)."""
    code = (
        "import sys, time\n"
        "sys.path[:0] = [sys.argv[1], sys.argv[1] + '/..']\n"
        "from bench_main_job import _request\n"
        "from tuner.study.exact import _Search, exact_best\n"
        "req, space, score = _request(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])\n"
        "t0 = time.process_time()\n"
        "s = _Search(space, req.profile, None, int(sys.argv[6]))\n"
        "s.run()\n"
        "cpu = time.process_time() - t0\n"
        "v, p = exact_best(space, req.profile, None, 1, score)[0]\n"
        "print(cpu, v, p['layout'], s.model.timed, s.model.fitted)\n"
    )
    args = [str(ROOT / "scripts"), *map(str, setup), str(count)]
    out = subprocess.run(
        [sys.executable, "-c", code, *args], check=True, capture_output=True, text=True
    ).stdout.split()
    return float(out[0]), float(out[1]), out[2], int(out[3]), int(out[4])


def _climb(setup: tuple[str, str, int, str]) -> tuple[float, float, str]:
    """(CPU s, best tokens/s/GPU, its layout) of the climb the exact search replaced."""
    from tuner.study.warmstart import SEARCH_STARTS, cost_model_search, scored_candidates

    req, space, score = _request(*setup)
    t0 = time.process_time()
    pool = [
        (s.predicted.tokens_per_s_per_gpu, s.params)
        for s in scored_candidates(space, req.profile, req.runner, 0, 2000, None)
        if s.origin == "estimator" and not s.predicted.unfit
    ]
    pool.sort(key=lambda x: -x[0])
    starts: dict[object, dict[str, object]] = {}
    for _, p in pool:
        starts.setdefault(p.get("layout"), p)
    seen = cost_model_search(space, score, list(starts.values())[:SEARCH_STARTS])
    best, params = max(seen.values(), key=lambda x: x[0])
    return time.process_time() - t0, best, str(params.get("layout"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 2, 3])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--before", type=Path, default=None)
    ap.add_argument("--spaces", action="store_true")
    args = ap.parse_args(argv)
    print(
        f"python {sys.version.split()[0]} on {os.uname().machine}, {os.cpu_count()} CPUs "
        f"visible, shared with other work; load average at start {os.getloadavg()[0]:.1f}"
    )
    print(f"\n(a) tune --model {MODEL} --gpus {GPUS} --trials {args.trials} --seed S")
    answers = _runs(ROOT, args.seeds, args.repeat, args.trials)
    print(f"  answers: {sorted(answers)} ({'the same' if len(answers) == 1 else 'DIFFER'})")
    if args.before is not None:
        print(f"\n(b) the same, seed 0, with the package of {args.before}")
        _runs(args.before, [0], args.repeat, args.trials)
    print(f"\n(c) the exact search alone on that space, its {args.trials} best (best of runs)")
    runs = [_exact((MODEL, "h100", GPUS, "dapo-math"), args.trials) for _ in range(args.repeat)]
    cpu, best, layout, timed, fitted = min(runs)
    print(
        f"  {cpu:.1f} s CPU (runs: {', '.join(f'{r[0]:.1f}' for r in runs)}); {timed} phase-time "
        f"and {fitted} memory calls; best {best:.1f} tokens/s/GPU ({layout})"
    )
    if args.spaces:
        print("\n(d) other spaces: the exact search's best against the climb it replaced")
        for setup in SPACES:
            e_cpu, e_best, e_layout, timed, fitted = _exact(setup, 1)
            c_cpu, c_best, c_layout = _climb(setup)
            name = f"{setup[0]} x {setup[2]} {setup[1]} {setup[3]}"
            print(
                f"  {name}: exact {e_best:.1f} ({e_layout}) in {e_cpu:.1f} s CPU "
                f"({timed} + {fitted} calls); climb {c_best:.1f} ({c_layout}) in "
                f"{c_cpu:.1f} s CPU",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
