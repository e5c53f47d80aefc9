"""The cost model's memo is keyed by what a term reads (issue 39 item 1): no hand-written list of
Candidate fields, so a knob a term reads can never be left out of its key."""

from __future__ import annotations

import dataclasses
import random

import pytest

from tuner.estimate import Profile
from tuner.estimate.context import Context
from tuner.estimate.memo import memoized
from tuner.estimate.memory import memory_of
from tuner.estimate.time import phase_times_of
from tuner.hardware import GPUS, Cluster
from tuner.models import get_model
from tuner.space import KNOBS, Candidate, ParallelLayout, RandomSuggester, SearchSpace, sample
from tuner.workload import get_workload


def test_a_term_is_keyed_by_the_fields_it_reads_on_its_branch() -> None:
    """A field read on one branch only keys that branch; every field read keys the result."""
    calls: list[Candidate] = []

    def term(c: Candidate) -> float:
        calls.append(c)
        if c.attention_backend == "unfused":
            return c.layout.tp + (10 if c.masked_softmax_fusion else 20)
        return float(c.layout.tp)

    cache: dict[object, object] = {}
    lay = ParallelLayout(world=2, tp=2)
    flash = Candidate(layout=lay, attention_backend="flash")
    unfused = Candidate(layout=lay, attention_backend="unfused")
    got = [
        memoized(cache, "t", c, term)
        for c in (
            flash,
            dataclasses.replace(flash, masked_softmax_fusion=False),  # not read: a hit
            unfused,
            dataclasses.replace(unfused, masked_softmax_fusion=False),  # read: computed
            dataclasses.replace(unfused, masked_softmax_fusion=False),
            Candidate(layout=ParallelLayout(world=2), attention_backend="flash"),  # tp read
        )
    ]
    assert got == [2.0, 2.0, 12, 22, 22, 1.0]
    assert len(calls) == 4


def test_a_term_that_calls_a_method_of_the_candidate_is_refused() -> None:
    with pytest.raises(TypeError, match="read fields and properties only"):
        memoized({}, "t", Candidate(layout=ParallelLayout(world=1)), lambda c: c.to_record())


@pytest.mark.parametrize("model", ["qwen2.5-7b", "qwen3-30b-moe"])
def test_one_context_for_many_candidates_scores_each_as_a_fresh_one(model: str) -> None:
    """The memoized terms (a layout's coefficients, the micro-batches of a pass) give every
    candidate of a shared context, knob by knob varied, what a context of its own gives: no knob
    returns another candidate's cost."""
    m, w = get_model(model), get_workload("grpo-short")
    cl = Cluster(gpu=GPUS["h100"], num_gpus=8)
    space = SearchSpace(model=m, cluster=cl, workload=w)
    rng = random.Random(1)
    base = [sample(RandomSuggester(rng), space) for _ in range(6)]
    # each candidate, and each with one sampled knob moved to every other value it may take
    pool = []
    for c in base:
        pool.append(c)
        for k in KNOBS:
            if k.name in ("layout", "rollout_gpus") or k.choices is None:
                continue
            for other in {k.value(c2) for c2 in base} - {k.value(c)}:
                pool.append(dataclasses.replace(c, **{k.name: other}))
    shared = Context(model=m, cluster=cl, workload=w, profile=Profile())

    def score(ctx: Context, c: Candidate) -> tuple[object, object]:
        return memory_of(ctx, c), phase_times_of(ctx, c)

    for c in pool:
        fresh = Context(model=m, cluster=cl, workload=w, profile=Profile())
        assert score(shared, c) == score(fresh, c), c
