"""The megatron runner's refusals are the shared rule set (tuner.space.RULES) plus its worker's
own rules, never a second copy of a shared one (issue 20)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from tuner.hardware import Cluster, get_gpu
from tuner.models import ModelSpec, get_model
from tuner.runners import megatron_refusals as mr
from tuner.runners.megatron import worker_spec
from tuner.runners.megatron_refusals import (
    MEGATRON_RULES,
    RUNNER_RULES,
    megatron_refusals,
    refusals,
)
from tuner.space import RULES, Candidate, ParallelLayout, broken_rules
from tuner.workload import Workload, get_workload

W = get_workload("grpo-short")  # 3072 tokens a sample; 512 samples a mini batch
OK_BUDGETS = dict(ppo_max_token_len_per_gpu=W.max_seq_len, log_prob_max_token_len_per_gpu=4096)
DENSE, MOE = get_model("qwen2.5-7b"), get_model("qwen3-30b-moe")  # 28 / 32 heads, 4 kv heads


def _cluster(world: int) -> Cluster:
    return Cluster(gpu=get_gpu("h200"), num_gpus=world, gpus_per_node=min(world, 8))


def _cand(world: int = 1, **kw: Any) -> Candidate:
    lay = {k: kw.pop(k) for k in list(kw) if k in ParallelLayout.__dataclass_fields__}
    return Candidate(layout=ParallelLayout(world=world, **lay), **{**OK_BUDGETS, **kw})


def _names(c: Candidate, m: ModelSpec = DENSE, w: Workload = W) -> set[str]:
    return {r.rule for r in refusals(c, m, _cluster(c.layout.world), w)}


def test_refusals_name_the_rule_and_when_megatron_enforces_it() -> None:
    assert megatron_refusals(_cand(2, tp=2), DENSE, _cluster(2), W) == []
    assert _names(_cand(8, tp=8)) == {"tp_heads"}  # 28 heads
    assert _names(_cand(8, tp=2, ep=4), MOE) == {"moe_tp_needs_sp"}
    assert _names(_cand(2, ep=2)) == {"dense_no_ep"}
    assert _names(_cand(3, pp=3)) == {"pipeline_split"}
    assert _names(_cand(1, vpp=2)) == {"vpp_needs_pp"}
    full = _cand(2, pp=2, vpp=2, recompute_granularity="full", recompute_num_layers=8)
    assert _names(full) == {"recompute_num_layers"}  # 7 layers a chunk
    sel = dict(recompute_granularity="selective", recompute_modules="moe_act")
    # the candidate's flag (what verl builds) and the worker's flag are each a rule
    assert _names(_cand(1, moe_grouped_gemm=False, **sel), MOE) == {
        "recompute_modules",
        "moe_act_needs_grouped_gemm",
    }
    assert _names(_cand(1, moe_grouped_gemm=True, **sel), MOE) == {"moe_act_needs_grouped_gemm"}
    assert _names(_cand(1, ppo_max_token_len_per_gpu=2048)) == {"token_budget"}
    when = {r.rule: r.when for r in refusals(_cand(3, pp=3), DENSE, _cluster(3), W)}
    assert when == {"pipeline_split": "runtime"}  # the even split is checked at build time
    uneven = _cand(2, pp=2, first_stage_layers=27, last_stage_layers=2)
    assert {r.when for r in refusals(uneven, DENSE, _cluster(2), W)} == {"config"}
    low = _cand(1, ppo_max_token_len_per_gpu=2048)
    assert {r.when for r in refusals(low, DENSE, _cluster(1), W)} == {"verl"}


def test_the_runner_rules_are_the_shared_ones_then_its_own() -> None:
    """The same Rule objects as tuner.space.RULES (not copies), then rules of other names, each
    of which refuses a candidate no shared rule refuses."""
    assert len(RUNNER_RULES) == len(RULES) + len(MEGATRON_RULES)
    assert all(a is b for a, b in zip(RUNNER_RULES, RULES, strict=False))
    shared = {r.name for r in RULES}
    assert shared.isdisjoint(r.name for r in MEGATRON_RULES)
    sel = dict(recompute_granularity="selective")
    alone = {
        "dense_layers_not_built": (_cand(8, ep=8), dataclasses.replace(MOE, num_dense_layers=1)),
        "moe_act_needs_grouped_gemm": (_cand(1, recompute_modules="moe_act", **sel), MOE),
        "moe_recompute_dense": (_cand(1, recompute_modules="core_attn,moe", **sel), DENSE),
    }
    assert set(alone) == {r.name for r in MEGATRON_RULES}
    for name, (c, m) in alone.items():
        assert not broken_rules(c, m, _cluster(c.layout.world), W), name
        assert _names(c, m) == {name}
    # every rule when_refused places is one of the runner's
    assert {r.name for r in RUNNER_RULES} >= mr.AT_CONFIG | mr.AT_RUNTIME


# one candidate per rule the runner once restated (megatron_refusals.py, the token budgets of
# megatron.py), breaking that shared rule alone
ONCE_RESTATED: dict[str, tuple[Candidate, ModelSpec]] = {
    "tp_heads": (_cand(8, tp=8), DENSE),
    # 28 heads; 7 and the 4 kv heads: no (an FFN width 7 divides: 18944 is not; tp_ffn)
    "tp_kv_heads": (_cand(7, tp=7), dataclasses.replace(DENSE, ffn_hidden_size=7 * 2048)),
    "sp_needs_tp": (_cand(1, sequence_parallel=True), DENSE),
    "dense_no_ep": (_cand(2, ep=2), DENSE),
    "ep_experts": (_cand(24, ep=3, tp=1), MOE),
    "moe_tp_needs_sp": (_cand(8, tp=2, ep=4), MOE),
    "vpp_needs_pp": (_cand(1, vpp=2), DENSE),
    "pipeline_split": (_cand(3, pp=3), DENSE),
    "recompute_num_layers": (
        _cand(2, pp=2, recompute_granularity="full", recompute_num_layers=15),
        DENSE,
    ),
    "token_budget": (_cand(1, log_prob_max_token_len_per_gpu=0), DENSE),
}


@pytest.mark.parametrize("rule", sorted(ONCE_RESTATED))
def test_without_the_shared_rule_the_runner_has_no_copy_of_it(
    rule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each case breaks one shared rule; with that rule taken out of the runner's set, nothing
    in the runner refuses the candidate (a second copy of it would)."""
    c, m = ONCE_RESTATED[rule]
    cl = _cluster(c.layout.world)
    # 24 GPUs: dp 24 takes a mini batch of 48 x 8, not grpo-short's 64 x 8
    w = dataclasses.replace(W, batch_size=192, mini_batch_size=48) if rule == "ep_experts" else W
    assert {n for n, _ in broken_rules(c, m, cl, w)} == {rule}
    assert {r.rule for r in refusals(c, m, cl, w)} == {rule}
    monkeypatch.setattr(mr, "RUNNER_RULES", tuple(r for r in RUNNER_RULES if r.name != rule))
    assert refusals(c, m, cl, w) == []


def test_worker_spec_refuses_what_the_shared_rules_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The token budgets: the runner's spec refuses by the shared rule's sentence (it had its
    own copy, which let a log-prob budget of 0 fall back to the update's: verl takes 0 and
    refuses it)."""
    c = _cand(1, log_prob_max_token_len_per_gpu=0)
    with pytest.raises(ValueError, match=r"\[token_budget\] log_prob_max_token_len_per_gpu\(0\)"):
        worker_spec(c, DENSE, _cluster(1), W, mini_batches=1)
    worker_spec(dataclasses.replace(c, log_prob_max_token_len_per_gpu=4096), DENSE, _cluster(1), W)


def _random_candidate(rng: random.Random, world: int) -> Candidate | None:
    pick = rng.choice
    lay: dict[str, int] = dict(
        tp=pick((1, 1, 2, 3, 4, 8)),
        pp=pick((1, 1, 2, 3, 4)),
        vpp=pick((1, 1, 2, 3)),
        ep=pick((1, 1, 2, 3, 4, 8)),
    )
    if rng.random() < 0.1:
        lay.update(first_stage_layers=pick((1, 2, 4, 6)), last_stage_layers=pick((0, 2, 4)))
    try:
        layout = ParallelLayout(world=world, **lay)
    except ValueError:
        return None
    gran = pick(("none", "full", "selective", "some"))
    mods = pick(("core_attn", "core_attn,mlp", "moe", "moe_act", "layernorm", "mla_up_proj"))
    return Candidate(
        layout=layout,
        sequence_parallel=rng.random() < 0.5,
        recompute_granularity=gran,
        recompute_num_layers=pick((0, 1, 2, 7, 14, 15, 30)),
        recompute_modules=mods,
        moe_grouped_gemm=rng.random() < 0.7,
        use_dynamic_bsz=rng.random() < 0.8,
        ppo_max_token_len_per_gpu=pick((0, 1024, 3072, 6144)),
        log_prob_max_token_len_per_gpu=pick((0, 2048, 3072, 12288)),
        ppo_micro_batch_size_per_gpu=pick((1, 2, 3)),
        rollout_tp=pick((1, 2, 3, 4)),
        gpu_memory_utilization=pick((0.6, 0.99)),
    )


def test_runner_refusals_hold_every_shared_verdict_of_generated_candidates() -> None:
    rng = random.Random(20)
    own = {r.name for r in MEGATRON_RULES}
    seen: set[str] = set()
    n = 0
    while n < 600:
        world = rng.choice((1, 2, 4, 8, 16, 24))
        m = rng.choice((DENSE, MOE, get_model("qwen3-8b")))
        c = _random_candidate(rng, world)
        if c is None:
            continue
        n += 1
        cl = _cluster(world)
        shared = broken_rules(c, m, cl, W)
        runner = [(r.rule, r.message) for r in refusals(c, m, cl, W)]
        assert runner[: len(shared)] == shared  # every shared verdict, the same sentence
        assert {name for name, _ in runner[len(shared) :]} <= own
        seen |= {name for name, _ in shared}
    assert set(ONCE_RESTATED) <= seen  # the generated candidates exercise each of them
