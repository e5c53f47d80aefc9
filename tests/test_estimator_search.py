"""With the estimator alone the study's answer is the cost model's best over the space (issue 30
class 9; issue 38 item 7: found exactly, tuner/study/exact.py): checked against an exhaustive
enumeration of a smaller space, where the warm start's random pool alone ends 1.2% below it
(tests/test_exact_search.py holds the exact search to three more)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.hardware import Cluster, get_gpu
from tuner.models import ModelSpec, get_model
from tuner.runners.estimate import EstimateRunner
from tuner.space import KNOBS, SAMPLER_PARAMS, SearchSpace, SpaceLimits, walk
from tuner.study import TuneRequest, run_study
from tuner.study.learn import StudyLearner
from tuner.study.objective import search_score
from tuner.study.warmstart import warm_start_params
from tuner.workload import get_workload

REPO = Path(__file__).resolve().parents[1]
MODEL = str(REPO / "scripts" / "models" / "qwen3-30b-moe-8l" / "config.json")
FREE = (
    "layout",
    "sequence_parallel",
    "recompute_granularity",
    "recompute_modules",
    "param_offload",
    "optimizer_offload",
    "ppo_max_token_len_per_gpu",
    "ppo_micro_batch_size_per_gpu",
    "log_prob_micro_batch_size_per_gpu",
    "rollout_tp",
    "rollout_dp",
    "rollout_ep",
    "gpu_memory_utilization",
)
"""The knobs the space below leaves free."""
PIN_VALUES = {"log_prob_max_token_len_per_gpu": 40960}  # 4 samples of 10240 tokens at cp 1
PINS = tuple(
    (k.name, PIN_VALUES.get(k.name, k.field_default))
    for k in KNOBS
    if k.name in SAMPLER_PARAMS and k.name not in FREE
)
"""Every other knob held still, at its Candidate field's default (a knob added since too), so
that the space (35,000 candidates: layout, recompute, offload, token budget, rollout TP/DP/EP and
vLLM's memory share free) can be enumerated in seconds."""
SEED = 2
"""A study seed whose warm-start pool's best is 1.2% below the space's best."""


class SmallSpaceEstimate(EstimateRunner):
    """The estimator on the space above (a real runner: only its space is smaller)."""

    def space_limits(self, model: ModelSpec) -> SpaceLimits:
        return SpaceLimits(pinned=PINS)


def _request(tmp: Path, trials: int) -> TuneRequest:
    return TuneRequest(
        model=get_model(MODEL),
        model_arg=MODEL,
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=2),
        workload=get_workload("dapo-math"),
        runner=SmallSpaceEstimate(),
        trials=trials,
        seed=SEED,
        results_dir=tmp / "results",
        recipes_dir=tmp / "recipes",
    )


def _space(req: TuneRequest) -> SearchSpace:
    return SearchSpace(
        model=req.model,
        cluster=req.cluster,
        workload=req.workload,
        limits=req.runner.space_limits(req.model),
    )


@pytest.fixture(scope="module")
def enumerated(tmp_path_factory: pytest.TempPathFactory) -> float:
    """The best score of every candidate of the space, as the study scores them."""
    req = _request(tmp_path_factory.mktemp("enum"), trials=1)
    score = search_score(req, StudyLearner(capacity_gib=req.cluster.gpu.memory_gib))
    scores = [score(c) for c, _ in walk(_space(req))]
    assert len(scores) == 35000 and sum(v > 0 for v in scores) > 1000
    return max(scores)


def test_walk_enumerates_each_candidate_once() -> None:
    req = _request(Path("."), trials=1)
    seen = [tuple(sorted(p.items())) for _, p in walk(_space(req))]
    assert len(seen) == len(set(seen)) == 35000


def test_the_search_finds_the_enumerated_best(enumerated: float) -> None:
    req = _request(Path("."), trials=1)
    space = _space(req)
    score = search_score(req, StudyLearner(capacity_gib=req.cluster.gpu.memory_gib))
    pool = warm_start_params(space, req.profile, SEED, req.runner, best=1)
    searched = warm_start_params(space, req.profile, SEED, req.runner, best=1, search=score)
    from tuner.space import FollowSuggester, sample

    def value(params: dict[str, object]) -> float:
        return score(sample(FollowSuggester(dict(params)), space))

    assert value(pool[0][0]) < 0.99 * enumerated  # the random pool alone falls short
    assert value(searched[0][0]) == pytest.approx(enumerated, rel=1e-12)


def test_an_estimator_study_returns_the_enumerated_best_and_prunes_nothing(
    workdir: Path, enumerated: float
) -> None:
    summary = run_study(_request(workdir, trials=8))
    best = float(summary.best_rows[0]["tokens_per_s_per_gpu"])
    assert best == pytest.approx(enumerated, rel=1e-4)  # the CSV's digits
    assert summary.pruned_before_launch == 0 and summary.trials_total == 8


def test_the_estimators_answer_is_the_same_whatever_the_seed() -> None:
    """The estimator's trials are the exact search's best, which draws nothing of the study's
    seed (issue 38.7: seeds 0 and 2 answered 2342 and 2420 tokens/s/GPU on qwen3-30b-moe x 32,
    then seed 0 2307 where the space's best is 2420): two seeds give the same candidates in the
    same order (scripts/bench_main_job.out.txt: the main job's answer for seeds 0, 2 and 3)."""
    req = _request(Path("."), trials=1)
    space = _space(req)
    score = search_score(req, StudyLearner(capacity_gib=req.cluster.gpu.memory_gib))
    got = [
        warm_start_params(space, req.profile, seed, req.runner, best=5, pool=300, search=score)
        for seed in (SEED, SEED + 1)
    ]
    assert got[0] == got[1] and len(got[0]) >= 5
