"""Phase times: physical monotonicity, the algorithm's phases, the CLI's JSON, and the check
against the reference leaderboards."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.estimate import Profile, estimate
from tuner.estimate.context import get_context, solve_theta
from tuner.estimate.generation import (
    EAGER,
    FULL_GRAPH,
    _decode_step_s,
    cudagraph_capture_sizes,
    eager_ops,
    padded_batch,
)
from tuner.estimate.logits import DEFAULT_VERL
from tuner.estimate.logits import LOGIT_TRAFFIC_BYTES as TRAFFIC
from tuner.estimate.time import ROPE_THD_OPS_PER_SEQUENCE, TORCH_OP_HOST_S
from tuner.fit.validate import GOAL_PHASES, anchor_paths, load_cases, validate
from tuner.hardware import GPUS, Cluster
from tuner.models import get_model
from tuner.space import Candidate, ParallelLayout
from tuner.workload import get_workload

LOGIT_TRAFFIC_BYTES = TRAFFIC[DEFAULT_VERL]
QWEN7B = get_model("qwen2.5-7b")
MOE30B = get_model("qwen3-30b-moe")
DAPO = get_workload("dapo-math")


def cluster(gpus: int = 8, gpu: str = "h100") -> Cluster:
    return Cluster(gpu=GPUS[gpu], num_gpus=gpus)


def cand(layout: str, world: int = 8, **kw: object) -> Candidate:
    lay = ParallelLayout.parse(layout, world)
    base: dict[str, object] = {
        "layout": lay,
        "sequence_parallel": lay.tp > 1,
        "param_offload": True,
        "optimizer_offload": True,
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": 20480,
        "log_prob_max_token_len_per_gpu": 61440,
        "rollout_tp": 1,
        "gpu_memory_utilization": 0.6,
        "max_num_batched_tokens": 10240,
    }
    base.update(kw)
    return Candidate(**base)  # type: ignore[arg-type]


def test_estimate_json_has_the_keys_other_tools_read(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "estimate",
        "--model",
        "qwen2.5-7b",
        "--gpu",
        "h100",
        "--gpus",
        "8",
        "--layout",
        "tp4pp2",
        "--rollout-tp",
        "4",
        "--prompt-len",
        "2048",
        "--response-len",
        "8192",
        "--response-mean",
        "4000",
        "--batch",
        "512",
        "--n",
        "16",
        "--mini-batch",
        "32",
        "--max-token-len",
        "20480",
        "--logprob-max-token-len",
        "30720",
        "--offload",
        "--recompute",
        "full",
        "--no-fused-kernels",
        "--json",
    ]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    for k in (
        "step_s",
        "generation_s",
        "old_log_prob_s",
        "ref_s",
        "update_actor_s",
        "reshard_s",
        "throughput_tokens_per_s_per_gpu",
        "mfu",
        "peak_mem_gib",
        "fits",
        "bottleneck",
    ):
        assert k in d, k
    assert isinstance(d["fits"], bool)
    assert isinstance(d["bottleneck"], str) and d["bottleneck"]
    assert d["step_s"] == pytest.approx(
        d["generation_s"] + d["old_log_prob_s"] + d["ref_s"] + d["update_actor_s"] + d["reshard_s"]
    )


def test_estimate_prints_a_breakdown(capsys: pytest.CaptureFixture[str]) -> None:
    argv = "estimate --model qwen3-30b-moe --gpus 32 --layout ep8 --rollout-tp 4 --offload"
    assert main([*argv.split(), "--recompute", "full"]) == 0
    out = capsys.readouterr().out
    for word in ("generation", "update actor", "update peak", "fits", "bottleneck"):
        assert word in out


def test_throughput_is_tokens_over_step_and_gpus() -> None:
    e = estimate(cand("tp4"), QWEN7B, cluster(), DAPO)
    assert e.throughput_tokens_per_s_per_gpu * 8 * e.step_s == pytest.approx(e.tokens_per_step)
    assert 0 < e.mfu < 1


def test_reference_model_only_for_grpo_and_ppo_critic_only_for_ppo() -> None:
    c = cand("tp4")
    dapo = estimate(c, QWEN7B, cluster(), DAPO)
    grpo = estimate(c, QWEN7B, cluster(), get_workload("grpo-math"))
    ppo = estimate(c, QWEN7B, cluster(), DAPO.with_overrides(algorithm="ppo"))
    assert dapo.ref_s == 0 and dapo.critic_s == 0
    assert grpo.ref_s == pytest.approx(grpo.old_log_prob_s)
    assert ppo.critic_s > ppo.update_actor_s


def test_more_gpus_make_every_training_phase_faster() -> None:
    small = estimate(cand("tp4"), QWEN7B, cluster(8), DAPO)
    big = estimate(cand("tp4", 32), QWEN7B, cluster(32), DAPO)
    assert big.update_actor_s < small.update_actor_s / 2.5
    assert big.old_log_prob_s < small.old_log_prob_s / 2
    assert big.generation_s < small.generation_s


def test_full_recompute_and_offload_cost_time() -> None:
    base = estimate(cand("tp4"), QWEN7B, cluster(), DAPO)
    rec = estimate(cand("tp4", recompute_granularity="full"), QWEN7B, cluster(), DAPO)
    keep = cand("tp4", param_offload=False, optimizer_offload=False)
    no_off = estimate(keep, QWEN7B, cluster(), DAPO)
    assert rec.update_actor_s > base.update_actor_s * 1.15
    assert no_off.update_actor_s < base.update_actor_s
    assert no_off.offload_s == 0 < base.offload_s


def test_small_micro_batches_are_slower() -> None:
    times = [
        estimate(cand("tp4", ppo_max_token_len_per_gpu=b), QWEN7B, cluster(), DAPO).update_actor_s
        for b in (10240, 20480, 40960)
    ]
    assert times[0] > times[1] > times[2]
    fixed = cand("tp4", use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=1)
    assert estimate(fixed, QWEN7B, cluster(), DAPO).update_actor_s > times[0]


def test_pipeline_bubble_shrinks_with_interleaving() -> None:
    pp = estimate(cand("tp4pp2", ppo_max_token_len_per_gpu=40960), QWEN7B, cluster(), DAPO)
    vpp = estimate(cand("tp4pp2vpp2", ppo_max_token_len_per_gpu=40960), QWEN7B, cluster(), DAPO)
    assert vpp.update_actor_s < pp.update_actor_s


def test_more_kv_cache_never_slows_generation() -> None:
    gens = [
        estimate(cand("tp4", gpu_memory_utilization=u), QWEN7B, cluster(), DAPO).generation_s
        for u in (0.4, 0.5, 0.6, 0.8)
    ]
    assert gens == sorted(gens, reverse=True)


def test_longer_responses_take_longer_and_the_tail_is_bounded_by_the_cap() -> None:
    short = estimate(cand("tp4"), QWEN7B, cluster(), DAPO.with_overrides(response_mean=600))
    long = estimate(cand("tp4"), QWEN7B, cluster(), DAPO.with_overrides(response_mean=4000))
    assert long.generation_s > short.generation_s
    assert long.update_actor_s > 2 * short.update_actor_s
    assert solve_theta(1228.8, 8192) == pytest.approx(1228.8, rel=0.01)
    theta = solve_theta(6000, 8192)
    assert theta * (1 - math.exp(-8192 / theta)) == pytest.approx(6000, rel=1e-6)


def test_gpu_kinds_rank_as_their_datasheets() -> None:
    c = cand("tp4")
    h100 = estimate(c, QWEN7B, cluster(8, "h100"), DAPO)
    h200 = estimate(c, QWEN7B, cluster(8, "h200"), DAPO)
    h20 = estimate(c, QWEN7B, cluster(8, "h20"), DAPO)
    a100 = estimate(c, QWEN7B, cluster(8, "a100"), DAPO)
    assert h200.generation_s < h100.generation_s  # more HBM bandwidth and KV room
    assert h20.update_actor_s > 3 * h100.update_actor_s  # 148 vs 989 TFLOP/s
    assert a100.update_actor_s > 2 * h100.update_actor_s


def test_expert_parallel_inside_a_node_beats_pipelining_a_moe_without_it() -> None:
    kw = {"recompute_granularity": "full", "rollout_tp": 4, "ppo_max_token_len_per_gpu": 20480}
    ep8 = estimate(cand("ep8", 32, **kw), MOE30B, cluster(32), DAPO)
    pp16 = estimate(cand("pp16", 32, **kw), MOE30B, cluster(32), DAPO)
    ep32 = estimate(cand("ep32", 32, **kw), MOE30B, cluster(32), DAPO)
    assert ep8.fits and pp16.fits
    assert ep8.update_actor_s < pp16.update_actor_s
    assert ep8.update_actor_s < ep32.update_actor_s  # all-to-all across nodes


def test_a_slower_profile_is_slower() -> None:
    slow = dataclasses.replace(Profile(), gemm_efficiency=0.5, hbm_efficiency=0.5)
    c = cand("tp4")
    assert (
        estimate(c, QWEN7B, cluster(), DAPO, slow).step_s
        > estimate(c, QWEN7B, cluster(), DAPO).step_s
    )


def test_capture_sizes_are_vllms_defaults_and_a_batch_pads_to_the_next() -> None:
    """vLLM 0.24.0's _set_cudagraph_sizes: 1, 2, 4, multiples of 8 below 256, of 16 from 256,
    up to min(2 * max_num_seqs, 512, max_num_batched_tokens)."""
    sizes = cudagraph_capture_sizes(256, 10240)
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[-1] == 512
    assert {248, 256, 272} <= set(sizes) and not {252, 264} & set(sizes)
    assert cudagraph_capture_sizes(64, 10240)[-1] == 128
    assert cudagraph_capture_sizes(1024, 10240)[-1] == 512
    assert cudagraph_capture_sizes(256, 300)[-3:] == (272, 288, 300)
    assert [padded_batch(b, sizes) for b in (1, 3, 9, 248.5, 256, 257)] == [1, 4, 16, 256, 256, 272]
    assert padded_batch(513, cudagraph_capture_sizes(1024, 10240)) == 0  # no graph: eager


def test_cuda_graph_decode_steps_are_cheaper_than_eager_at_small_batch() -> None:
    """Eager, the host calls every op and a small batch waits for it (a MoE layer's router and
    fused-MoE launches most of all); a graph is one replay."""
    for m, rtp in ((QWEN7B, 4), (MOE30B, 4)):
        ctx = get_context(m, cluster(), DAPO, Profile())
        eager = _decode_step_s(ctx, rtp, 1, 1, 4, 2000.0, EAGER)
        graph = _decode_step_s(ctx, rtp, 1, 1, 4, 2000.0, FULL_GRAPH, 4)
        assert eager >= eager_ops(ctx) * ctx.profile.eager_op_host_s
        assert graph < 0.8 * eager, (m.name, graph, eager)
    # and the whole generation phase, whose drain tail runs at small batch
    c = cand("tp4", 16, rollout_tp=4, max_num_seqs=256)
    graphs = estimate(c, MOE30B, cluster(16), DAPO)
    eager_gen = estimate(dataclasses.replace(c, enforce_eager=True), MOE30B, cluster(16), DAPO)
    assert graphs.generation_s < 0.8 * eager_gen.generation_s
    assert graphs.update_actor_s == eager_gen.update_actor_s


def test_a_graph_runs_the_batch_padded_to_its_capture_size() -> None:
    """On an H20 a 7B decode step of a few hundred sequences is GEMM-bound: 255 and 256
    sequences both run the 256 graph, 257 runs the 272 graph, so the step time is a staircase."""
    ctx = get_context(QWEN7B, cluster(8, "h20"), DAPO, Profile())
    sizes = cudagraph_capture_sizes(512, 10240)

    def step(b: int) -> float:
        return _decode_step_s(ctx, 1, 1, 1, b, 1.0, FULL_GRAPH, padded_batch(b, sizes))

    assert step(257) - step(256) > 10 * (step(256) - step(255))
    unpadded = _decode_step_s(ctx, 1, 1, 1, 257, 1.0, FULL_GRAPH, 257)
    assert step(257) > unpadded


def test_unfused_rope_pays_a_host_loop_per_sequence() -> None:
    """megatron-core's unfused THD RoPE loops over the packed sequences in Python for q and k in
    every layer, forward and backward. The reference rows that differ only by the fusion show it
    (dapo7b rows 5 and 7, 8 H100: log-prob 84 s vs 67 s, update 203 s vs 167 s)."""
    fused = estimate(cand("tp4"), QWEN7B, cluster(), DAPO)
    unfused = estimate(cand("tp4", apply_rope_fusion=False), QWEN7B, cluster(), DAPO)
    per_rank = DAPO.num_samples / 2  # dp 2
    loop = per_rank * QWEN7B.num_layers * 2 * ROPE_THD_OPS_PER_SEQUENCE * TORCH_OP_HOST_S
    extra = unfused.old_log_prob_s - fused.old_log_prob_s
    assert extra == pytest.approx(loop, rel=0.05)
    assert 14 < extra < 20  # the 17 s the references measured
    assert unfused.update_actor_s - fused.update_actor_s == pytest.approx(2 * extra, rel=0.05)


def test_full_logits_cost_the_bytes_verl_moves_per_logit() -> None:
    """Without fused kernels verl 0.9.1's old_log_prob makes the [tokens, vocab/tp] logits and
    streams them through the fp32 copy, temperature division, clone, entropy and cross-entropy
    (LOGIT_TRAFFIC_BYTES per logit); the fused kernel streams none of it. On 8 H100 at tp4 that
    is seconds per step (dapo7b rows 5-8, which ran before verl's megatron fused kernels)."""
    cl = cluster()
    fused = estimate(cand("tp4"), QWEN7B, cl, DAPO)
    full = estimate(cand("tp4", use_fused_kernels=False), QWEN7B, cl, DAPO)
    ctx = get_context(QWEN7B, cl, DAPO, Profile())
    logits_per_rank = DAPO.tokens_per_step / 2 * QWEN7B.vocab_size / 4  # dp 2, tp 4
    extra = full.old_log_prob_s - fused.old_log_prob_s
    assert extra == pytest.approx(
        logits_per_rank * LOGIT_TRAFFIC_BYTES["old_log_prob"] / ctx.hbm, rel=1e-6
    )
    assert 6 < extra < 10
    # the update streams fewer bytes per logit (no entropy) over the same tokens, plus the
    # one-sample imbalance per mini-batch
    upd = full.update_actor_s - fused.update_actor_s
    ratio = LOGIT_TRAFFIC_BYTES["update_actor"] / LOGIT_TRAFFIC_BYTES["old_log_prob"]
    assert upd / extra == pytest.approx(ratio, rel=0.02)


def test_the_reference_log_prob_pass_skips_the_entropy() -> None:
    """verl's reference policy asks for log-probs only (`_compute_ref_log_prob`:
    calculate_entropy=False): without fused kernels it streams LOGIT_TRAFFIC_BYTES["ref"] per
    logit."""
    grpo = get_workload("grpo-math")
    cl = cluster()
    e = estimate(cand("tp4", use_fused_kernels=False), QWEN7B, cl, grpo)
    ctx = get_context(QWEN7B, cl, grpo, Profile())
    logits_per_rank = grpo.tokens_per_step / 2 * QWEN7B.vocab_size / 4
    gap = e.old_log_prob_s - e.ref_s
    lp, ref = LOGIT_TRAFFIC_BYTES["old_log_prob"], LOGIT_TRAFFIC_BYTES["ref"]
    want = logits_per_rank * (lp - ref) / ctx.hbm
    assert gap == pytest.approx(want, rel=1e-6)
    fused = estimate(cand("tp4"), QWEN7B, cl, grpo)
    assert fused.old_log_prob_s == pytest.approx(fused.ref_s)


def test_log_prob_micro_batches_round_up_to_the_pipeline_under_vpp() -> None:
    """Under virtual pipelining verl splits a forward-only batch into a multiple of the pp size
    too: 3 micro-batches' worth of tokens runs as 4 equal ones, like 4 micro-batches' worth."""
    per_rank = DAPO.tokens_per_step  # dp 1 at tp4pp2 on 8 GPUs
    three = cand("tp4pp2vpp2", log_prob_max_token_len_per_gpu=math.ceil(per_rank / 2.5))
    four = cand("tp4pp2vpp2", log_prob_max_token_len_per_gpu=math.ceil(per_rank / 3.5))
    e3, e4 = (estimate(c, QWEN7B, cluster(), DAPO) for c in (three, four))
    assert e3.old_log_prob_s == pytest.approx(e4.old_log_prob_s, rel=1e-9)
    plain3, plain4 = (
        estimate(
            dataclasses.replace(c, layout=ParallelLayout.parse("tp4pp2", 8)),
            QWEN7B,
            cluster(),
            DAPO,
        )
        for c in (three, four)
    )
    assert plain3.old_log_prob_s != pytest.approx(plain4.old_log_prob_s, rel=1e-6)


def test_the_reference_rows_are_scored_with_what_they_ran(anchors: Path) -> None:
    """Eager vLLM (verl's default before August 2025, and the GRPO recipe's setting) except the
    one row that says "Cuda graph"; RoPE fused where the row or its recipe says so."""
    cases = {c.label: c.candidate for c in load_cases(anchor_paths(anchors))}
    assert cases["grpo_qwen2.5_7b:8"].enforce_eager is False
    assert all(c.enforce_eager for label, c in cases.items() if label != "grpo_qwen2.5_7b:8")
    unfused = {label for label, c in cases.items() if not c.apply_rope_fusion}
    assert unfused == {f"dapo7b:{n}" for n in (3, 4, 5, 6, 11)}


def test_the_reference_leaderboards_are_predicted(anchors: Path) -> None:
    summary = validate(load_cases(anchor_paths(anchors)))
    for phase in GOAL_PHASES:
        assert summary.median_ape[phase] <= 0.20, (phase, summary.median_ape)
    grpo = [o for o in summary.outcomes if o.case.label.startswith("grpo")]
    assert all(not o.estimate.fits for o in grpo if o.case.status == "oom")
    assert all(o.estimate.fits for o in grpo if o.case.status == "ok")


def test_layernorm_recompute_is_charged_where_the_memory_model_frees_it() -> None:
    """Recompute module layernorm recomputes only norms that are modules of their own
    (memory.separate_norms): none of a dense layer under transformer-engine's spec, both in the
    local spec (the megatron runner's), a MoE's pre-MLP norm under TE."""
    from tuner.estimate.memory import activation_bytes_per_token_layer

    w = get_workload("dapo-math")
    local = dict(
        bias_activation_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False
    )
    for m, lay, world, kw, charged in (
        (QWEN7B, "tp4", 8, {}, False),
        (QWEN7B, "tp4", 8, local, True),
        (MOE30B, "ep8", 32, {}, True),
    ):
        cl = Cluster(gpu=GPUS["h100"], num_gpus=world)
        layout = ParallelLayout.parse(lay, world)
        base = Candidate(
            layout=layout,
            sequence_parallel=layout.tp > 1,
            recompute_granularity="selective",
            recompute_modules="core_attn",
            **kw,  # type: ignore[arg-type]
        )
        ln = dataclasses.replace(base, recompute_modules="core_attn,layernorm")
        slower = estimate(ln, m, cl, w).update_actor_s > estimate(base, m, cl, w).update_actor_s
        smaller = activation_bytes_per_token_layer(m, ln) < activation_bytes_per_token_layer(
            m, base
        )
        assert slower is charged and smaller is charged, (m.name, kw)


def test_expert_imbalance_slows_the_busiest_expert_parallel_rank_only() -> None:
    """Issue 37 item 4: a declared routing imbalance (Workload.expert_imbalance) prices the
    busiest expert-parallel rank's expert GEMMs and all-to-all; with every expert on each GPU
    (ep1) the grouped GEMM's rows add up the same, and the default 1.0 is the balanced model."""
    cl = cluster(8, "h200")
    skewed = dataclasses.replace(DAPO, expert_imbalance=4.0)
    ep8, ep1 = cand("ep8"), cand("dp8")
    base = estimate(ep8, MOE30B, cl, DAPO)
    assert estimate(ep8, MOE30B, cl, dataclasses.replace(DAPO, expert_imbalance=1.0)) == base
    hot = estimate(ep8, MOE30B, cl, skewed)
    assert hot.update_actor_s > base.update_actor_s * 1.02
    assert hot.old_log_prob_s > base.old_log_prob_s
    assert hot.generation_s == base.generation_s  # the rollout's experts are not priced by it
    flat = estimate(ep1, MOE30B, cl, DAPO)
    assert estimate(ep1, MOE30B, cl, skewed).update_actor_s == pytest.approx(flat.update_actor_s)
    dense = estimate(cand("tp2"), QWEN7B, cl, DAPO)
    assert estimate(cand("tp2"), QWEN7B, cl, skewed) == dense
