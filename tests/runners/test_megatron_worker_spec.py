"""The megatron worker's spec is built from the knob table (issue 20): for a spread of candidates
(dense and MoE, fixed and dynamic batching, every recompute granularity and method, offload,
uneven pipeline stages, te and local layers, context parallel) `worker_spec()` writes exactly the
JSON it wrote when it was built by hand (tests/data/megatron_worker_specs.json, written once by
that code, commit 7f69f1e), and the worker reads the table's keys by the table's names and types."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.runners.megatron import worker_spec
from tuner.space import Candidate, ParallelLayout
from tuner.workload import get_workload

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "megatron_worker_specs.json"
W = dataclasses.replace(get_workload("grpo-short"), batch_size=16, n=4, mini_batch_size=4)
"""3072 tokens a sample, 16 samples a mini batch, 4 mini batches a step (small lengths lists)."""
DYN = dict(ppo_max_token_len_per_gpu=3072, log_prob_max_token_len_per_gpu=6144)

CASES: dict[str, dict[str, Any]] = {
    "dense_tp2_dynamic": dict(model="qwen2.5-7b", layout=dict(world=2, tp=2), cand=DYN),
    "dense_dp4_fixed": dict(
        model="qwen2.5-7b",
        layout=dict(world=4),
        cand=dict(
            use_dynamic_bsz=False,
            ppo_micro_batch_size_per_gpu=2,
            log_prob_micro_batch_size_per_gpu=4,
            ppo_max_token_len_per_gpu=9999,  # not written: fixed batching
        ),
    ),
    "dense_dynamic_with_micro_sizes": dict(
        model="qwen2.5-7b",
        layout=dict(world=1),
        cand=dict(DYN, ppo_micro_batch_size_per_gpu=3, log_prob_micro_batch_size_per_gpu=5),
    ),
    "full_uniform_vpp": dict(
        model="qwen2.5-7b",
        layout=dict(world=4, pp=2, vpp=2),
        cand=dict(DYN, recompute_granularity="full", recompute_num_layers=2),
    ),
    "full_block_uneven": dict(
        model="qwen2.5-7b",
        layout=dict(world=2, pp=2, first_stage_layers=12, last_stage_layers=16),
        cand=dict(
            DYN, recompute_granularity="full", recompute_method="block", recompute_num_layers=3
        ),
    ),
    "selective_modules": dict(
        model="qwen2.5-7b",
        layout=dict(world=2, tp=2),
        cand=dict(
            DYN, recompute_granularity="selective", recompute_modules="core_attn,mlp"
        ),
    ),
    "no_recompute_with_full_fields_set": dict(
        model="qwen2.5-7b",
        layout=dict(world=1),
        cand=dict(DYN, recompute_method="block", recompute_num_layers=5),
    ),
    "offload_both": dict(
        model="qwen2.5-7b",
        layout=dict(world=2, tp=2),
        cand=dict(DYN, param_offload=True, optimizer_offload=True, use_fused_kernels=False),
    ),
    "moe_local_pinned": dict(
        model="qwen3-30b-moe",
        layout=dict(world=8, pp=2, ep=4),
        cand=dict(
            DYN,
            apply_rope_fusion=False,
            bias_activation_fusion=False,
            attention_backend="flash",
            moe_grouped_gemm=True,
            moe_permute_fusion=False,
            recompute_granularity="selective",
            recompute_modules="core_attn,moe",
        ),
    ),
    "moe_te_kernels": dict(
        model="qwen3-30b-moe",
        layout=dict(world=8, tp=2, ep=4),
        cand=dict(
            DYN,
            sequence_parallel=True,
            apply_rope_fusion=True,
            bias_activation_fusion=False,
            attention_backend="auto",
            moe_grouped_gemm=False,
            moe_permute_fusion=True,
            recompute_granularity="full",
            recompute_method="block",
            recompute_num_layers=4,
        ),
        layer_spec="te",
    ),
    "dense_te_cp2": dict(
        model="qwen2.5-7b",
        layout=dict(world=8, tp=2, cp=2),
        cand=dict(sequence_parallel=True, ppo_max_token_len_per_gpu=2048,
                  log_prob_max_token_len_per_gpu=4096),
        layer_spec="te",
    ),
    "dense_te_run_options": dict(
        model="qwen3-8b",
        layout=dict(world=4, tp=2, pp=2),
        cand=dict(DYN, sequence_parallel=True, attention_backend="fused"),
        layer_spec="te",
        seed=7,
        mini_batches=0,
        steps=3,
        warmup_steps=0,
        min_measured_s=12.0,
        max_steps=8,
    ),
}  # fmt: skip
"""Each case: the model, the layout, the candidate's knobs and worker_spec's own arguments."""


def spec_of(case: dict[str, Any]) -> dict[str, Any]:
    """worker_spec() of one case."""
    opts = {k: v for k, v in case.items() if k not in ("model", "layout", "cand")}
    lay = ParallelLayout(**case["layout"])
    c = Candidate(layout=lay, **case["cand"])
    cl = Cluster(gpu=get_gpu("h100"), num_gpus=lay.world, gpus_per_node=min(lay.world, 8))
    return worker_spec(c, get_model(case["model"]), cl, W, **opts)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_spec_is_the_one_written_by_hand(name: str) -> None:
    golden = json.loads(GOLDEN.read_text())
    assert set(golden) == set(CASES)
    assert spec_of(CASES[name]) == golden[name]
