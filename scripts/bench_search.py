"""Search efficiency: trials to come within 3% of the best, for random search, TPE and TPE
with the study's warm start (issue 9.10).

    python scripts/bench_search.py [--seeds 5] [--trials 100] [--pool 3000]

(a) Surrogate: the cost model is the objective (tokens/s/GPU; 0 when it predicts the candidate
    does not fit or is invalid). The best is the best of a large random pool of the space
    (--pool candidates, plus every trial any method ran). Studies: qwen2.5-7b on 8 H100 and
    qwen3-30b-moe on 32 H100 (dapo-math).
(b) Replay: the objective looks up the measured row (results/*.csv) of the sampled candidate;
    the space is restricted to the measured candidates' knob values (each knob suggests the
    values the rows have), a combination no row measured scores 0, failed rows score 0. The
    best is the best measured row. The warm start there is the study's rule applied to the
    measured candidates: the cost model's best WARM_START_BEST (by the megatron runner's
    predicted throughput, unfit ones left out) first.

Real in-memory Optuna studies (RandomSampler, TPESampler; warm start by enqueue_trial, as
tuner.study does). Not part of the test suite; output committed as scripts/bench_search.out.txt.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from tuner.estimate import Profile, estimate
from tuner.fit.validate import case_from_row
from tuner.hardware import GPUS, Cluster
from tuner.models import get_model
from tuner.results import read_rows
from tuner.runners.estimate import EstimateRunner
from tuner.space import Candidate, RandomSuggester, SearchSpace, sample, validate
from tuner.study import WARM_START_BEST, warm_start_params
from tuner.workload import get_workload

ROOT = Path(__file__).resolve().parent.parent
WITHIN = 0.03
SURROGATES = (("qwen2.5-7b", "h100", 8), ("qwen3-30b-moe", "h100", 32))
METHODS = ("random", "tpe", "tpe+warm")


def _sampler(method: str, seed: int) -> optuna.samplers.BaseSampler:
    if method == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _trials_to_reach(values: list[float], best: float) -> int | None:
    """1-based index of the first trial whose best-so-far is within WITHIN of `best`."""
    run = 0.0
    for i, v in enumerate(values, 1):
        run = max(run, v)
        if best > 0 and run >= (1 - WITHIN) * best:
            return i
    return None


def _run(
    method: str,
    seed: int,
    trials: int,
    objective: Callable[[optuna.Trial], float],
    warm: list[dict[str, Any]],
) -> list[float]:
    study = optuna.create_study(direction="maximize", sampler=_sampler(method, seed))
    if method == "tpe+warm":
        for p in warm:
            study.enqueue_trial(p, skip_if_exists=True)
    study.optimize(objective, n_trials=trials)
    return [t.value if t.value is not None else 0.0 for t in study.trials]


class _Static:
    """An Optuna trial whose categorical parameters keep one value space: a knob whose choices
    depend on earlier draws (the space's rollout_ep: [1, rollout_tp * rollout_dp]) is suggested
    under a name carrying its choices, as Optuna refuses a dynamic value space."""

    def __init__(self, trial: optuna.Trial) -> None:
        self.trial = trial

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        try:
            return self.trial.suggest_categorical(name, choices)
        except ValueError:
            return self.trial.suggest_categorical(f"{name}{list(choices)}", choices)

    def suggest_int(self, name: str, low: int, high: int) -> int:
        return self.trial.suggest_int(name, low, high)


# --------------------------------------------------------------------------------------------
# (a) the cost model as the objective
# --------------------------------------------------------------------------------------------


def _surrogate(model: str, gpu: str, gpus: int, pool: int, seed: int) -> tuple[Any, float, Any]:
    m, w = get_model(model), get_workload("dapo-math")
    cl = Cluster(gpu=GPUS[gpu], num_gpus=gpus)
    space = SearchSpace(model=m, cluster=cl, workload=w)
    runner = EstimateRunner()

    def score(c: Candidate) -> float:
        if validate(c, m, cl, w):
            return 0.0
        p = runner.predicted(estimate(c, m, cl, w), cl)
        return 0.0 if p.unfit else p.tokens_per_s_per_gpu

    rng = random.Random(seed)
    best = max(score(sample(RandomSuggester(rng), space)) for _ in range(pool))

    def objective(trial: optuna.Trial) -> float:
        return score(sample(_Static(trial), space))

    return objective, best, space


# --------------------------------------------------------------------------------------------
# (b) replayed measured rows
# --------------------------------------------------------------------------------------------

REPLAY_KNOBS = (
    "train_parallel",
    "recompute_granularity",
    "param_offload",
    "optimizer_offload",
    "use_dynamic_bsz",
    "ppo_max_token_len_per_gpu",
    "ppo_micro_batch_size_per_gpu",
)


def _replay(path: Path) -> tuple[Any, float, list[dict[str, Any]], int]:
    rows = [r for r in read_rows(path) if r.get("status")]
    table: dict[tuple[str, ...], float] = {}
    choices: dict[str, list[str]] = {k: [] for k in REPLAY_KNOBS}
    ranked: list[tuple[float, dict[str, Any]]] = []
    from tuner.runners.megatron import MegatronRunner

    runner = MegatronRunner()
    for r in rows:
        key = tuple(r.get(k, "") for k in REPLAY_KNOBS)
        value = float(r["tokens_per_s_per_gpu"]) if r["status"] == "ok" else 0.0
        table[key] = max(table.get(key, 0.0), value)
        for k in REPLAY_KNOBS:
            if r.get(k, "") not in choices[k]:
                choices[k].append(r.get(k, ""))
        case = case_from_row({**r, "status": "ok", "update_actor_s": "1"})
        if case is not None:
            e = case.predict(Profile())
            p = runner.predicted(e, case.cluster)
            if not p.unfit:
                ranked.append((p.tokens_per_s_per_gpu, dict(zip(REPLAY_KNOBS, key, strict=True))))
    ranked.sort(key=lambda x: -x[0])
    warm: list[dict[str, Any]] = []
    for _, params in ranked:
        if params not in warm:
            warm.append(params)
        if len(warm) == WARM_START_BEST:
            break

    def objective(trial: optuna.Trial) -> float:
        key = tuple(trial.suggest_categorical(k, choices[k]) for k in REPLAY_KNOBS)
        return table.get(key, 0.0)

    combos = 1
    for k in REPLAY_KNOBS:
        combos *= len(choices[k])
    return objective, max(table.values()), warm, combos


# --------------------------------------------------------------------------------------------


def _report(label: str, results: dict[str, list[int | None]], trials: int) -> None:
    cells = []
    for method in METHODS:
        got = results[method]
        reached = [n for n in got if n is not None]
        shown = "/".join("-" if n is None else str(n) for n in got)
        med = statistics.median([n if n is not None else trials + 1 for n in got])
        med_s = f">{trials}" if med > trials else f"{med:g}"
        cells.append(f"{method}: median {med_s} ({shown}; reached {len(reached)}/{len(got)})")
    print(f"{label}\n  " + "\n  ".join(cells))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=100, help="per study run (default 100)")
    ap.add_argument("--replay-trials", type=int, default=60)
    ap.add_argument("--pool", type=int, default=3000, help="random pool for the best (a)")
    ap.add_argument("--only", choices=("surrogate", "replay"), default=None)
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    t0 = time.monotonic()
    seeds = list(range(args.seeds))
    print(
        f"trials to come within {WITHIN:.0%} of the best; {len(seeds)} seeds; per-seed counts "
        "in parentheses ('-': not reached within the budget)"
    )
    if args.only != "replay":
        print(f"\n(a) cost model as the objective, {args.trials} trials per run")
        for model, gpu, gpus in SURROGATES:
            objective, best, space = _surrogate(model, gpu, gpus, args.pool, seed=12345)
            runs: dict[str, list[list[float]]] = {m: [] for m in METHODS}
            for seed in seeds:
                warm = [p for p, _ in warm_start_params(space, Profile(), seed, EstimateRunner())]
                for method in METHODS:
                    values = _run(method, seed, args.trials, objective, warm)
                    best = max(best, *values)
                    runs[method].append(values)
            # counted against the final best (a run may have found better than the pool)
            res = {m: [_trials_to_reach(v, best) for v in runs[m]] for m in METHODS}
            _report(
                f"{model} on {gpus} x {gpu}: best {best:.0f} tokens/s/GPU "
                f"(random pool of {args.pool} and every trial run)",
                res,
                args.trials,
            )
    if args.only != "surrogate":
        print(f"\n(b) replayed measured rows, {args.replay_trials} trials per run")
        for path in sorted((ROOT / "results").glob("*.csv")):
            objective, best, warm, combos = _replay(path)
            res = {m: [] for m in METHODS}
            for seed in seeds:
                for method in METHODS:
                    values = _run(method, seed, args.replay_trials, objective, warm)
                    res[method].append(_trials_to_reach(values, best))
            _report(
                f"{path.relative_to(ROOT)}: best measured {best:.0f} tokens/s/GPU, "
                f"{combos} knob combinations over {len(REPLAY_KNOBS)} knobs",
                res,
                args.replay_trials,
            )
    print(f"\nwall {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
