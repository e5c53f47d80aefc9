"""Pins name the sampler's parameters (issue 30 class 9): a pin of a name the sampler does not
suggest is refused where it is declared, and a pinned knob never varies."""

from __future__ import annotations

import random

import pytest

from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.runners.megatron import MEGATRON_PINNED, MegatronRunner
from tuner.runners.megatron_generation import ONE_REPLICA_PINS
from tuner.space import (
    KNOBS,
    RandomSuggester,
    SearchSpace,
    SpaceLimits,
    check_pins,
    sample,
)
from tuner.workload import get_workload


def test_a_pin_of_a_name_the_sampler_does_not_have_is_refused() -> None:
    # the knob's name where its sampler parameter differs: the bug of MEGATRON_PINNED
    with pytest.raises(ValueError, match="rollout_dp.*rollout_dp_log2"):
        SpaceLimits(pinned=(("rollout_dp", 1),))
    with pytest.raises(ValueError, match="rollout_ep.*rollout_expert_parallel"):
        check_pins((("rollout_ep", 1),))
    with pytest.raises(ValueError, match="no_such_knob"):
        SpaceLimits(pinned=(("no_such_knob", 1),))
    # the sampler's own names pass
    SpaceLimits(pinned=(("rollout_dp_log2", 0), ("rollout_expert_parallel", False)))


def test_the_runners_pins_are_sampler_parameters() -> None:
    params = {k.sampler_param for k in KNOBS if k.choices is not None}
    for name, _ in (*MEGATRON_PINNED, *ONE_REPLICA_PINS):
        assert name in params, name


def test_the_megatron_runners_pins_never_vary() -> None:
    """300 draws on qwen3-30b-moe at 16 GPUs with the megatron runner's pins (no vLLM here:
    generation is not measured, so rollout TP, DP and EP are all pinned): every pinned knob
    takes its pin in every draw, rollout DP and EP included."""
    m = get_model("qwen3-30b-moe")
    runner = MegatronRunner(generation=False)
    limits = runner.space_limits(m)
    assert ("rollout_dp_log2", 0) in limits.pinned
    assert ("rollout_expert_parallel", False) in limits.pinned
    space = SearchSpace(
        model=m,
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=16),
        workload=get_workload("grpo-short"),
        limits=limits,
    )
    rng = random.Random(0)
    seen: dict[str, set[object]] = {}
    for _ in range(300):
        s = RandomSuggester(rng)
        c = sample(s, space)
        for name in ("rollout_tp", "rollout_dp", "rollout_ep"):
            seen.setdefault(name, set()).add(getattr(c, name))
        pinned = {k for k, _ in limits.pinned}
        assert pinned.isdisjoint(s.params), pinned & set(s.params)
    assert seen == {"rollout_tp": {1}, "rollout_dp": {1}, "rollout_ep": {1}}
