"""Pins name the knobs (issue 30 class 9, issue 31): a pin of a name the sampler does not
suggest is refused where it is declared, and a pinned knob never varies."""

from __future__ import annotations

import random

import pytest

from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.runners.megatron import MEGATRON_PINNED, MegatronRunner
from tuner.runners.megatron_generation import ONE_REPLICA_PINS, ROLLOUT_SEARCHED, measured_pins
from tuner.space import (
    KNOBS,
    RandomSuggester,
    SearchSpace,
    SpaceLimits,
    check_pins,
    current_fingerprint,
    current_params,
    sample,
)
from tuner.space.knobs import knob_refusal
from tuner.workload import get_workload


def test_a_pin_of_a_name_the_sampler_does_not_have_is_refused() -> None:
    # a sampler parameter's older name (issue 31: one name per knob) names the knob to pin
    with pytest.raises(ValueError, match="rollout_dp_log2.*now the knob 'rollout_dp'"):
        SpaceLimits(pinned=(("rollout_dp_log2", 0),))
    with pytest.raises(ValueError, match="rollout_expert_parallel.*'rollout_ep'"):
        check_pins((("rollout_expert_parallel", False),))
    with pytest.raises(ValueError, match="no_such_knob"):
        SpaceLimits(pinned=(("no_such_knob", 1),))
    # the knobs' own names pass
    SpaceLimits(pinned=(("rollout_dp", 1), ("rollout_ep", 1)))


def test_the_runners_pins_are_knobs_at_a_value_of_theirs() -> None:
    """A pin holds the knob's name and its value as the CSV shows it (verl's default where the
    knob has one): one name for the sampler, the CSV, the pins and the recipe."""
    sampled = {k.name for k in KNOBS if k.choices is not None}
    for name, value in (*MEGATRON_PINNED, *ONE_REPLICA_PINS):
        assert name in sampled, name
        assert knob_refusal(name, value) is None, (name, value)


def test_a_pin_of_a_drawn_knob_pins_its_value() -> None:
    """rollout_dp is drawn as log2 and rollout_ep as on/off: pinned at 2 and on, every draw
    has rollout dp 2 and ep tp*dp, and neither is suggested (before, pins held the draw, so a
    pin of the knob's value pinned nothing)."""
    space = SearchSpace(
        model=get_model("qwen3-30b-moe"),
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=16),
        workload=get_workload("grpo-short"),
        limits=SpaceLimits(pinned=(("rollout_tp", 2), ("rollout_dp", 2), ("rollout_ep", 4))),
    )
    rng = random.Random(0)
    for _ in range(50):
        s = RandomSuggester(rng)
        c = sample(s, space)
        assert (c.rollout_tp, c.rollout_dp, c.rollout_ep) == (2, 2, 4)
        assert not {"rollout_tp", "rollout_dp", "rollout_ep"} & set(s.params)


def test_a_study_of_the_older_names_reads_back() -> None:
    """Storages and fingerprints written when the sampler's parameters had names of their own
    (rollout_dp_log2, max_num_batched_tokens_factor) read as the knobs' (issue 31)."""
    old = {"rollout_dp_log2": 1, "rollout_expert_parallel": True, "max_num_seqs": 128}
    assert current_params(old) == {"rollout_dp": 1, "rollout_ep": True, "max_num_seqs": 128}
    space = SearchSpace(
        model=get_model("qwen3-30b-moe"),
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=16),
        workload=get_workload("grpo-short"),
        limits=MegatronRunner(generation=False).space_limits(get_model("qwen3-30b-moe")),
    )
    today = space.fingerprint()
    before = (
        today.replace("rollout_dp=1", "rollout_dp_log2=0")
        .replace("rollout_ep=1", "rollout_expert_parallel=False")
        .replace("max_num_batched_tokens=0", "max_num_batched_tokens_factor=1")
    )
    assert before != today and current_fingerprint(before) == today


def test_the_megatron_runners_pins_never_vary() -> None:
    """300 draws on qwen3-30b-moe at 16 GPUs with the megatron runner's pins (no vLLM here:
    generation is not measured, so rollout TP, DP and EP are all pinned): every pinned knob
    takes its pin in every draw, rollout DP and EP included."""
    m = get_model("qwen3-30b-moe")
    runner = MegatronRunner(generation=False)
    limits = runner.space_limits(m)
    assert ("rollout_dp", 1) in limits.pinned
    assert ("rollout_ep", 1) in limits.pinned
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


HAND_MEGATRON_PINNED = (
    ("rollout_tp", 1),
    ("rollout_dp", 1),
    ("rollout_ep", 1),
    ("gpu_memory_utilization", 0.6),
    ("max_num_batched_tokens", 0),
    ("max_num_seqs", 256),
    ("enforce_eager", False),
    ("apply_rope_fusion", False),
    ("bias_activation_fusion", False),
    ("gradient_accumulation_fusion", False),
    ("attention_backend", "flash"),
    ("moe_token_dispatcher_type", "alltoall"),
    ("moe_grouped_gemm", True),
    ("moe_permute_fusion", False),
)
"""tuner/runners/megatron.py's MEGATRON_PINNED when it was a hand list (before issue 31 item 1
derived it from the knob table)."""
HAND_ROLLOUT_SEARCHED = (
    "rollout_tp",
    "gpu_memory_utilization",
    "max_num_batched_tokens",
    "max_num_seqs",
    "enforce_eager",
)
"""tuner/runners/megatron_generation.py's ROLLOUT_SEARCHED when it was a hand list."""


def test_the_pins_read_from_the_table_are_the_hand_lists_they_replace() -> None:
    """Same names, values, value types and order (a study's fingerprint spells the pins in
    order, `name=value`, and a committed recipe's pinned block lists them): stored studies
    resume and the committed recipes read as they did. A knob added to the table since may add
    a pin among them (a study made before it resumes where it is at the field's default:
    SearchSpace.added_since); the hand lists' own pins keep their order."""
    hand = dict(HAND_MEGATRON_PINNED)
    assert repr(tuple(p for p in MEGATRON_PINNED if p[0] in hand)) == repr(HAND_MEGATRON_PINNED)
    assert tuple(n for n in ROLLOUT_SEARCHED if n in HAND_ROLLOUT_SEARCHED) == HAND_ROLLOUT_SEARCHED
    by_hand = tuple(p for p in HAND_MEGATRON_PINNED if p[0] not in HAND_ROLLOUT_SEARCHED)
    measured = measured_pins(MEGATRON_PINNED)
    assert repr(tuple(p for p in measured if p[0] in hand)) == repr(by_hand)
    m = get_model("qwen3-30b-moe")
    limits = MegatronRunner(generation=False, layer_spec="local").space_limits(m)
    pins = ",".join(f"{k}={v}" for k, v in HAND_MEGATRON_PINNED)
    added = [n for n, _ in limits.pinned if n not in hand]
    assert limits.summary_without(added).startswith(f"cp1,nosp,{pins}"), limits.summary
