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
from tuner.estimate.context import solve_theta
from tuner.estimate.validate import GOAL_PHASES, anchor_paths, load_cases, validate
from tuner.hardware import GPUS, Cluster
from tuner.models import get_model
from tuner.space import Candidate, ParallelLayout
from tuner.workload import get_workload

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


def test_the_reference_leaderboards_are_predicted(anchors: Path) -> None:
    summary = validate(load_cases(anchor_paths(anchors)))
    for phase in GOAL_PHASES:
        assert summary.median_ape[phase] <= 0.20, (phase, summary.median_ape)
    grpo = [o for o in summary.outcomes if o.case.label.startswith("grpo")]
    assert all(not o.estimate.fits for o in grpo if o.case.status == "oom")
    assert all(o.estimate.fits for o in grpo if o.case.status == "ok")
