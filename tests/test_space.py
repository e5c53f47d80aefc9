from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.errors import UserError
from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY
from tuner.space import (
    KNOBS,
    Candidate,
    ParallelLayout,
    RandomSuggester,
    SearchSpace,
    SpaceLimits,
    knob_overrides,
    params_for,
    sample,
    token_budget,
    validate,
)
from tuner.workload import PRESETS, Workload


def test_layout_product_message_names_every_factor() -> None:
    with pytest.raises(
        ValueError, match=r"tp\(4\) \* pp\(2\) \* cp\(1\) \* dp\(3\) != world\(30\)"
    ):
        ParallelLayout(world=30, tp=4, pp=2)


def test_expert_layout_must_divide_tp_cp_dp() -> None:
    with pytest.raises(ValueError, match=r"ep\(16\) \* etp\(4\) does not divide"):
        ParallelLayout(world=16, tp=4, ep=16, etp=4)
    assert ParallelLayout(world=16, tp=4, ep=16, etp=1).expert_dp == 1


@pytest.mark.parametrize(
    ("text", "world", "expect"),
    [
        ("tp4pp2vpp2", 8, dict(tp=4, pp=2, vpp=2, dp=1)),
        ("tp2cp2", 8, dict(tp=2, cp=2, dp=2)),
        ("ep8cp4", 32, dict(ep=8, cp=4, dp=8)),
        ("tp4ep16", 16, dict(tp=4, ep=16, etp=1, dp=4)),
        ("ep8cp2tp2", 32, dict(tp=2, cp=2, ep=8, dp=8)),
        ("Tp4pp1cp1", 8, dict(tp=4, dp=2)),
        ("all dp", 32, dict(dp=32)),
    ],
)
def test_parse_reference_notation(text: str, world: int, expect: dict[str, int]) -> None:
    lay = ParallelLayout.parse(text, world)
    for k, v in expect.items():
        assert getattr(lay, k) == v
    assert ParallelLayout.parse(lay.notation, world) == lay


@pytest.mark.parametrize("text", ["tp4xx2", "sp4fsdp8", "tp3pp"])
def test_unreadable_layout_is_a_user_error(text: str) -> None:
    with pytest.raises(UserError):
        ParallelLayout.parse(text, 8)


def _space(model: str, gpus: int, per_node: int = 8, workload: str = "dapo-math") -> SearchSpace:
    return SearchSpace(
        model=REGISTRY[model],
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=gpus, gpus_per_node=per_node),
        workload=PRESETS[workload],
    )


def test_validate_names_each_broken_rule() -> None:
    sp = _space("qwen2.5-7b", 8)
    m, cl, w = sp.model, sp.cluster, sp.workload
    bad = Candidate(
        layout=ParallelLayout(world=8, tp=8),
        sequence_parallel=False,
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=4096,
        log_prob_max_token_len_per_gpu=20480,
        rollout_tp=3,
        gpu_memory_utilization=1.5,  # more than the whole GPU (Knob.bounds)
    )
    reasons = " | ".join(validate(bad, m, cl, w))
    assert "tp(8) does not divide the 28 attention heads" in reasons
    assert "ppo_max_token_len_per_gpu(4096)" in reasons and "at least 10240" in reasons
    assert "rollout tp(3)" in reasons
    assert "gpu_memory_utilization(1.5)" in reasons
    sp_no_tp = Candidate(
        layout=ParallelLayout(world=8),
        sequence_parallel=True,
        ppo_max_token_len_per_gpu=10240,
        log_prob_max_token_len_per_gpu=10240,
    )
    assert any("sequence parallel needs tp > 1" in r for r in validate(sp_no_tp, m, cl, w))
    moe = _space("qwen3-30b-moe", 16)
    for ep in (8, 1):  # megatron-core refuses MoE with tp > 1 and no SP, with or without EP
        no_sp = Candidate(
            layout=ParallelLayout(world=16, tp=2, ep=ep),
            sequence_parallel=False,
            ppo_max_token_len_per_gpu=10240,
            log_prob_max_token_len_per_gpu=10240,
        )
        assert any(
            "sequence parallel for a MoE model" in r
            for r in validate(no_sp, moe.model, moe.cluster, moe.workload)
        )
    dense_ep = Candidate(
        layout=ParallelLayout(world=8, ep=2),
        ppo_max_token_len_per_gpu=10240,
        log_prob_max_token_len_per_gpu=10240,
    )
    assert any("dense model" in r for r in validate(dense_ep, m, cl, w))


def test_no_layout_fits_is_a_user_error() -> None:
    with pytest.raises(UserError, match="no parallel layout fits"):
        # 17 GPUs on one node: 28 heads forbid tp17, pp17 exceeds MAX_PP and dp17 does not
        # divide the 512 samples of a mini batch (pp5 on 5 GPUs is fine now: uneven stages)
        _space("qwen2.5-7b", 17, per_node=17).check_nonempty()


def test_moe_layouts_respect_expert_rules() -> None:
    sp = _space("qwen3-30b-moe", 32)
    assert "tp4ep8" in sp.layouts and "ep8" in sp.layouts
    for lay in sp.layouts.values():
        assert 128 % lay.ep == 0
        assert (lay.tp * lay.cp * lay.dp) % (lay.ep * lay.etp) == 0


SPACES = [
    ("qwen2.5-7b", 8, 8),
    ("qwen2.5-7b", 32, 8),
    ("qwen3-30b-moe", 32, 8),
    ("qwen3-30b-moe", 16, 8),
    ("llama3.1-70b", 64, 8),
    ("qwen3-8b", 4, 4),
    ("qwen3-235b-moe", 128, 8),
    ("qwen2.5-14b", 2, 8),
]
_BUILT = {s: _space(*s) for s in SPACES}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(SPACES), seed=st.integers(0, 2**32 - 1))
def test_every_sampled_candidate_is_valid(which: tuple[str, int, int], seed: int) -> None:
    space = _BUILT[which]
    c = sample(RandomSuggester(random.Random(seed)), space)
    assert validate(c, space.model, space.cluster, space.workload) == []
    lay = c.layout
    assert lay.tp * lay.pp * lay.cp * lay.dp == space.cluster.num_gpus


@settings(max_examples=100, deadline=None)
@given(
    which=st.sampled_from(SPACES),
    workload=st.builds(
        Workload,
        prompt_len=st.sampled_from([512, 1024, 2048, 3000]),
        response_len=st.sampled_from([1024, 4096, 8192, 5000]),
        batch_size=st.sampled_from([64, 256, 512]),
        n=st.sampled_from([1, 4, 5, 16]),
        mini_batch_size=st.sampled_from([16, 32, 64]),
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_sampled_candidates_are_valid_for_any_workload(
    which: tuple[str, int, int], workload: Workload, seed: int
) -> None:
    model, gpus, per_node = which
    space = SearchSpace(
        model=REGISTRY[model],
        workload=workload,
        cluster=Cluster(gpu=get_gpu("h200"), num_gpus=gpus, gpus_per_node=per_node),
    )
    if not space.layouts:
        with pytest.raises(UserError):
            space.check_nonempty()
        return
    c = sample(RandomSuggester(random.Random(seed)), space)
    assert validate(c, space.model, space.cluster, workload) == []


class _Replay:
    """Answers sample()'s questions from a fixed dict, as Optuna does for an enqueued trial."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        assert self.params[name] in choices, (name, self.params[name], choices)
        return self.params[name]

    def suggest_int(self, name: str, low: int, high: int) -> int:
        assert low <= self.params[name] <= high
        return int(self.params[name])


@pytest.mark.parametrize("seed", range(40))
def test_params_for_replays_to_the_same_candidate(seed: int) -> None:
    space = _BUILT[SPACES[seed % len(SPACES)]]
    rs = RandomSuggester(random.Random(seed))
    c = sample(rs, space)
    assert params_for(c, space) == rs.params
    assert sample(_Replay(params_for(c, space)), space) == c


def test_record_round_trip() -> None:
    space = _BUILT[("qwen3-30b-moe", 32, 8)]
    for seed in range(20):
        c = sample(RandomSuggester(random.Random(seed)), space)
        rec = {k: str(v) for k, v in c.to_record().items()}
        assert Candidate.from_record(rec, 32) == c


def test_overrides_cover_each_knob_and_follow_conditions() -> None:
    c = Candidate(
        layout=ParallelLayout(world=8, tp=4, pp=2, vpp=2),
        sequence_parallel=True,
        recompute_granularity="full",
        recompute_num_layers=2,
        use_dynamic_bsz=False,
        ppo_micro_batch_size_per_gpu=2,
        log_prob_micro_batch_size_per_gpu=4,
    )
    ov = knob_overrides(c, REGISTRY["qwen2.5-7b"])
    assert ov["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"] == 4
    assert ov["actor_rollout_ref.ref.megatron.tensor_model_parallel_size"] == 4
    assert ov["actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size"] == 2
    assert (
        ov["actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers"] == 2
    )
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu" not in ov
    assert ov["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 2
    plain = knob_overrides(Candidate(layout=ParallelLayout(world=8)))
    assert plain["actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size"] is None
    gran = "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity"
    assert plain[gran] is None  # written even when off: the recipe sets what is scored
    assert not any("recompute" in k for k in plain if k != gran)
    assert {k.name for k in KNOBS} >= {"tp", "pp", "vpp", "cp", "ep", "etp", "rollout_tp"}


_NO_TE = SpaceLimits(
    context_parallel=False,
    sequence_parallel=False,
    pinned=(("rollout_tp", 1), ("use_fused_kernels", False), ("gpu_memory_utilization", 0.6)),
)


@settings(max_examples=100, deadline=None)
@given(which=st.sampled_from(SPACES), seed=st.integers(0, 2**32 - 1))
def test_limited_space_samples_only_what_the_runner_can_run(
    which: tuple[str, int, int], seed: int
) -> None:
    full = _BUILT[which]
    space = SearchSpace(
        model=full.model, cluster=full.cluster, workload=full.workload, limits=_NO_TE
    )
    rs = RandomSuggester(random.Random(seed))
    c = sample(rs, space)
    assert validate(c, space.model, space.cluster, space.workload) == []
    assert c.layout.cp == 1 and not c.sequence_parallel
    assert (c.rollout_tp, c.use_fused_kernels, c.gpu_memory_utilization) == (1, False, 0.6)
    assert not {"rollout_tp", "use_fused_kernels", "gpu_memory_utilization"} & set(rs.params)
    # an enqueued trial (params_for) replays to the same candidate without the pinned names
    assert params_for(c, space) == rs.params
    assert sample(_Replay(params_for(c, space)), space) == c


def test_limited_moe_space_leaves_out_what_needs_sequence_parallel() -> None:
    full = _space("qwen3-30b-moe", 32)
    space = SearchSpace(
        model=full.model, cluster=full.cluster, workload=full.workload, limits=_NO_TE
    )
    assert set(space.layouts) < set(full.layouts)
    assert "ep8" in space.layouts and "tp4ep8" not in space.layouts and "tp2" not in space.layouts
    assert all(lay.cp == 1 for lay in space.layouts.values())
    assert all(lay.tp == 1 for lay in space.layouts.values())  # MoE with tp > 1 needs SP
    assert space.fingerprint() != full.fingerprint()


# --- one test per validity rule, by name (megatron-core 0.19 / vLLM / verl 0.9.1) ------------

_BASE = dict(ppo_max_token_len_per_gpu=10240, log_prob_max_token_len_per_gpu=10240)


def _broken(model: str, gpus: int, **kw: Any) -> set[str]:
    from tuner.space import broken_rules

    sp = _space(model, gpus)
    w = kw.pop("_workload", sp.workload)
    sp = SearchSpace(model=sp.model, cluster=sp.cluster, workload=w)
    lay = kw.pop("layout", ParallelLayout(world=gpus))
    c = Candidate(layout=lay, **{**_BASE, **kw})
    return {n for n, _ in broken_rules(c, sp.model, sp.cluster, sp.workload)}


RULE_CASES: dict[str, tuple[str, int, dict[str, Any]]] = {
    "world": ("qwen2.5-7b", 8, dict(layout=ParallelLayout(world=16))),
    "tp_heads": (
        "qwen2.5-7b",
        8,
        dict(layout=ParallelLayout(world=8, tp=8), sequence_parallel=True),
    ),
    "tp_kv_heads": ("qwen3-8b", 24, dict(layout=ParallelLayout(world=24, tp=3))),
    "vpp_needs_pp": ("qwen2.5-7b", 8, dict(layout=ParallelLayout(world=8, vpp=2))),
    "pipeline_split": (
        "qwen3-235b-moe",
        64,
        dict(
            layout=ParallelLayout(world=64, pp=8, ep=8, first_stage_layers=10, last_stage_layers=10)
        ),
    ),
    "dense_no_ep": ("qwen2.5-7b", 8, dict(layout=ParallelLayout(world=8, ep=2))),
    "ep_experts": ("qwen3-30b-moe", 24, dict(layout=ParallelLayout(world=24, ep=3))),
    # 18944 = 2^9 x 37: tp 3 splits no MLP (nor the 28 heads); 768 = 2^8 x 3: etp 5 no expert
    "tp_ffn": ("qwen2.5-7b", 24, dict(layout=ParallelLayout(world=24, tp=3))),
    "etp_ffn": ("qwen3-30b-moe", 40, dict(layout=ParallelLayout(world=40, etp=5))),
    "dense_no_etp": ("qwen2.5-7b", 8, dict(layout=ParallelLayout(world=8, tp=2, etp=2))),
    "mini_batch_dp": ("qwen2.5-7b", 24, dict()),
    "sp_needs_tp": ("qwen2.5-7b", 8, dict(sequence_parallel=True)),
    "moe_tp_needs_sp": ("qwen3-30b-moe", 16, dict(layout=ParallelLayout(world=16, tp=2, ep=8))),
    "flex_needs_tp_ep": (
        "qwen3-30b-moe",
        16,
        dict(layout=ParallelLayout(world=16, pp=16), moe_token_dispatcher_type="flex"),
    ),
    "recompute_granularity": ("qwen2.5-7b", 8, dict(recompute_granularity="some")),
    "recompute_method": ("qwen2.5-7b", 8, dict(recompute_method="random")),
    "recompute_num_layers": (
        "qwen2.5-7b",
        8,
        dict(recompute_granularity="full", recompute_num_layers=29),
    ),
    "recompute_modules": (
        "qwen3-30b-moe",
        16,
        dict(
            recompute_granularity="selective", recompute_modules="moe_act", moe_grouped_gemm=False
        ),
    ),
    "attention_backend": ("qwen2.5-7b", 8, dict(attention_backend="sdpa")),
    "moe_token_dispatcher_type": ("qwen3-30b-moe", 16, dict(moe_token_dispatcher_type="deepep")),
    "token_budget": ("qwen2.5-7b", 8, dict(ppo_max_token_len_per_gpu=4096)),
    "micro_batch": ("qwen2.5-7b", 8, dict(use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=3)),
    "rollout_tp": ("qwen2.5-7b", 8, dict(rollout_tp=3)),
    "rollout_dp": ("qwen3-30b-moe", 16, dict(rollout_tp=16, rollout_dp=2)),
    "rollout_ep": ("qwen3-30b-moe", 16, dict(rollout_tp=2, rollout_ep=8)),
    "gpu_memory_utilization": ("qwen2.5-7b", 8, dict(gpu_memory_utilization=1.5)),
    "max_num_batched_tokens": ("qwen2.5-7b", 8, dict(max_num_batched_tokens=100)),
    "max_num_seqs": ("qwen2.5-7b", 8, dict(max_num_seqs=0)),
}


@pytest.mark.parametrize("rule", sorted(RULE_CASES))
def test_each_rule_names_itself(rule: str) -> None:
    model, gpus, kw = RULE_CASES[rule]
    assert rule in _broken(model, gpus, **dict(kw))


def test_every_rule_has_a_case() -> None:
    from tuner.space import RULES

    assert {r.name for r in RULES} == set(RULE_CASES)


def test_layouts_real_recipes_use_are_valid() -> None:
    """Issue 10: 94 layers on pp8 with uneven first/last stages, rollout TP 16 on 8-GPU nodes,
    TP above the kv heads: megatron-core and vLLM run them, so the space accepts them."""
    from tuner.space import balanced_split

    uneven = ParallelLayout(world=64, pp=8, ep=8, first_stage_layers=11, last_stage_layers=11)
    assert not _broken("qwen3-235b-moe", 64, layout=uneven)
    assert uneven.stage_layers(94) == [11, 12, 12, 12, 12, 12, 12, 11]
    assert balanced_split(94, 8) is not None and balanced_split(96, 8) is None
    assert "pp8ep8" in _space("qwen3-235b-moe", 64).layouts
    assert not _broken("qwen3-30b-moe", 16, rollout_tp=16)  # vLLM TP across two nodes
    assert 16 in _space("qwen3-30b-moe", 16).rollout_tps
    lay = ParallelLayout(world=8, tp=8)
    assert not _broken("qwen3-8b", 8, layout=lay, sequence_parallel=True)  # 8 kv heads... tp 8
    assert not _broken("qwen3-30b-moe", 8, layout=lay, sequence_parallel=True)  # tp8 > 4 kv heads


def test_refused_layout_is_one_user_error_line_naming_the_rule() -> None:
    from tuner.space import check_candidate

    sp = _space("qwen3-235b-moe", 64)
    lay = ParallelLayout.parse("pp8ep8first10last10", 64)
    with pytest.raises(UserError, match=r"\[pipeline_split\]") as e:
        check_candidate(Candidate(layout=lay, **_BASE), sp.model, sp.cluster, sp.workload)
    assert "\n" not in str(e.value)


def test_old_csv_with_grad_offload_still_reads() -> None:
    rec = {
        k: str(v) for k, v in Candidate(layout=ParallelLayout(world=8, tp=2)).to_record().items()
    }
    rec["grad_offload"] = "True"  # a schema-1 column verl 0.9.1 has no key for
    for k in ("max_num_seqs", "first_stage_layers", "apply_rope_fusion"):
        rec.pop(k)  # columns older files lack take the defaults
    c = Candidate.from_record(rec, 8)
    assert c == Candidate(layout=ParallelLayout(world=8, tp=2))
    assert not hasattr(c, "grad_offload")


def test_context_parallel_takes_any_sequence_length() -> None:
    """verl pads each packed sequence to a multiple of tp*cp*2 itself (verl/models/mcore/
    util.py preprocess_packed_seqs), so cp8 runs prompt + response = 10232 tokens."""
    w = Workload(prompt_len=2040, response_len=8192)
    assert w.max_seq_len % 16
    assert not _broken(
        "qwen2.5-7b",
        8,
        layout=ParallelLayout(world=8, cp=8),
        _workload=w,
        ppo_max_token_len_per_gpu=20480,
        log_prob_max_token_len_per_gpu=20480,
    )
    sp = SearchSpace(
        model=_space("qwen2.5-7b", 8).model, cluster=_space("qwen2.5-7b", 8).cluster, workload=w
    )
    assert any(lay.cp == 8 for lay in sp.layouts.values())


def test_token_budgets_follow_context_parallel() -> None:
    """Issue 19: the budgets offered are whole samples per micro-batch of a CP group
    (factor * max_seq / cp), so cp8 offers 8k for 64k sequences instead of 64k and more."""
    w = Workload(prompt_len=1024, response_len=64512)
    space = SearchSpace(
        model=REGISTRY["qwen2.5-7b"], cluster=Cluster(gpu=get_gpu("h100"), num_gpus=8), workload=w
    )
    seen: dict[int, set[int]] = {}
    for seed in range(400):
        c = sample(RandomSuggester(random.Random(seed)), space)
        if c.use_dynamic_bsz:
            seen.setdefault(c.layout.cp, set()).add(c.ppo_max_token_len_per_gpu)
            seen.setdefault(-c.layout.cp, set()).add(c.log_prob_max_token_len_per_gpu)
            assert sample(_Replay(params_for(c, space)), space) == c
    assert min(seen[8]) == 65536 // 8
    assert min(seen[1]) == 65536
    assert all(b % 8192 == 0 and b <= 10 * 8192 for b in seen[-8])
    cp8 = next(lay for lay in space.layouts.values() if lay.cp == 8)
    for k in KNOBS:
        if k.name.endswith("max_token_len_per_gpu"):
            assert k.decode(1.0, space, {"layout": cp8}) == 8192
    assert token_budget(1.5, 65536, 8) == 12288


def test_etp_on_a_dense_model_is_not_refused() -> None:
    """megatron-core 0.19 refuses expert parallel without experts (TransformerConfig:
    "num_moe_experts must be non None to use expert-parallel"), not expert tensor parallel, which
    a dense model never uses; the rule is no stricter (issue 20: the two copies disagreed)."""
    assert "dense_no_ep" not in _broken("qwen2.5-7b", 8, layout=ParallelLayout(world=8, etp=2))
    assert "dense_no_ep" in _broken("qwen2.5-7b", 8, layout=ParallelLayout(world=8, ep=2, etp=2))


# --- one owner of the derived degrees (issue 39 item 4) ---------------------------------------


def test_the_rollout_degrees_and_what_follows_from_them() -> None:
    from tuner.space import ParallelLayout, RolloutDims

    d = RolloutDims(world=16, tp=2, dp=4, ep=8)
    assert (d.replica_gpus, d.replicas, d.ep_problem) == (8, 2, "")
    assert RolloutDims(world=4, tp=8).replicas == 1  # a replica spanning more than the pool
    assert RolloutDims(world=8, tp=2, dp=2, ep=2).ep_problem == (
        "rollout ep(2) must be 1 or rollout tp * dp = 4"
    )
    with pytest.raises(ValueError, match=r"rollout dp\(0\) must be at least 1"):
        RolloutDims(world=8, tp=2, dp=0)
    c = Candidate(layout=ParallelLayout(world=8), rollout_tp=2, rollout_dp=2, rollout_ep=4)
    assert RolloutDims.of(c, 8) == RolloutDims(world=8, tp=2, dp=2, ep=4)
    assert ParallelLayout(world=16, pp=2, ep=2, etp=2).expert_dp == 2


def test_no_module_derives_the_expert_dp_or_the_rollout_replicas_again() -> None:
    """ParallelLayout.expert_dp and RolloutDims are the one place of each formula (issue 39:
    expert_dp was re-derived in three modules, the replicas in three more)."""
    import re
    from pathlib import Path

    tuner = Path(__file__).resolve().parents[1] / "tuner"
    formulas = re.compile(r"//\s*\(\s*[\w.]*pp\s*\*\s*[\w.]*ep\s*\*|//\s*\(?\s*[\w.]*rollout_tp\b")
    found = [
        f"{p.relative_to(tuner.parent)}:{n}"
        for p in sorted(tuner.rglob("*.py"))
        if p.name != "layout.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if formulas.search(line)
    ]
    assert not found, found


def test_a_declared_expert_imbalance_is_part_of_the_study_fingerprint() -> None:
    """Issue 37 item 4: the imbalance changes every MoE prediction, so a study made under one
    refuses to resume under another; at its default the fingerprint is the one studies made
    before the setting have (they resume)."""
    m = REGISTRY["qwen3-30b-moe"]
    cl = Cluster(gpu=get_gpu("h200"), num_gpus=8)
    w = PRESETS["dapo-math"]
    before = SearchSpace(model=m, cluster=cl, workload=w).fingerprint()
    assert "/e" not in before.rpartition("|")[2]
    skew = w.with_overrides(expert_imbalance=1.5)
    assert SearchSpace(model=m, cluster=cl, workload=skew).fingerprint() == before + "/e1.5"
