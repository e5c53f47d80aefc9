"""The megatron worker's spec is built from the knob table (issue 20): for a spread of candidates
(dense and MoE, fixed and dynamic batching, every recompute granularity and method, offload,
uneven pipeline stages, te and local layers, context parallel) `worker_spec()` writes exactly the
JSON it wrote when it was built by hand (tests/data/megatron_worker_specs.json, written once by
that code, commit a136077), and the worker reads the table's keys by the table's names and types.
The rules the worker checks of a hand-written spec are the search space's functions, named as the
search space names them, but for its own two."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.runners.megatron import worker_spec
from tuner.runners.megatron_worker import WorkerSpec
from tuner.runners.megatron_worker import spec as spec_module
from tuner.space import WORKER_KEYS, Candidate, ParallelLayout
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


def test_the_worker_reads_each_table_key_into_its_field_of_that_type() -> None:
    """Every key the knob table gives the worker is a field of the same name of its section's
    class (the top level: WorkerSpec), typed as the table types it; the recompute, offload and
    kernels sections hold knobs only."""
    hints = get_type_hints(WorkerSpec)
    as_type = {bool: bool, int: int, str: str, list: tuple[str, ...]}
    for k in WORKER_KEYS:
        cls = hints[k.section] if k.section else WorkerSpec
        assert get_type_hints(cls).get(k.name) == as_type[k.kind], k.key
    for section in ("recompute", "offload", "kernels"):
        fields = set(get_type_hints(hints[section]))
        assert fields == {k.name for k in WORKER_KEYS if k.section == section}, section


def test_a_hand_written_spec_is_typed_by_the_table() -> None:
    """A value of the wrong type under any key of the table is refused, naming the key."""
    base = spec_of(CASES["moe_te_kernels"])
    for k in WORKER_KEYS:
        d = copy.deepcopy(base)
        at = d[k.section] if k.section else d
        at[k.name] = 1 if k.kind in (str, list) else "x"
        with pytest.raises(ValueError, match=rf"spec {re.escape(k.key)} must be"):
            WorkerSpec.from_dict(d)


TINY = {
    "name": "tiny",
    "num_layers": 4,
    "hidden_size": 256,
    "ffn_hidden_size": 512,
    "num_attention_heads": 8,
    "num_kv_heads": 2,
    "head_dim": 32,
    "vocab_size": 1000,
}
MOE_TINY = {**TINY, "num_experts": 6, "moe_topk": 2, "moe_ffn_hidden_size": 128}
HAND = {
    "schema": 2,
    "model": TINY,
    "layout": {"world": 4, "pp": 2, "vpp": 2},
    "batch": {
        "sequence_lengths": [100, 200, 300, 400],
        "mini_batch_size": 2,
        "use_dynamic_bsz": True,
        "max_token_len_per_gpu": 1024,
    },
}
"""A hand-written spec the worker runs: 4 layers, pp2 vpp2 (one layer a chunk)."""
FULL = {"granularity": "full", "num_layers": 1}
# rule -> (the sections of HAND it replaces, the search-space function that decides it)
SHARED_RULES: dict[str, tuple[dict[str, Any], str]] = {
    "tp_heads": ({"model": {**TINY, "num_attention_heads": 6}, "layout": {"world": 4, "tp": 4}},
                 "layout_model_rules"),
    "tp_kv_heads": ({"model": {**TINY, "num_attention_heads": 12, "num_kv_heads": 3},
                     "layout": {"world": 2, "tp": 2}}, "layout_model_rules"),
    "vpp_needs_pp": ({"layout": {"world": 4, "vpp": 2}}, "layout_model_rules"),
    "pipeline_split": ({"model": {**TINY, "num_layers": 6}}, "layout_model_rules"),
    "dense_no_ep": ({"layout": {"world": 4, "pp": 2, "ep": 2}}, "layout_model_rules"),
    "ep_experts": ({"model": MOE_TINY, "layout": {"world": 8, "pp": 2, "ep": 4}},
                   "layout_model_rules"),
    "sp_needs_tp": ({"sequence_parallel": True}, "sequence_parallel_problems"),
    "recompute_granularity": ({"recompute": {"granularity": "sometimes"}}, "choice_problems"),
    "recompute_method": ({"recompute": {**FULL, "method": "zigzag"}}, "choice_problems"),
    "recompute_num_layers": ({"recompute": {**FULL, "num_layers": 2}},
                             "recompute_layers_problems"),
    "attention_backend": ({"kernels": {"attention_backend": "sdpa"}}, "choice_problems"),
}  # fmt: skip


@pytest.mark.parametrize("rule", sorted(SHARED_RULES))
def test_the_worker_checks_a_shared_rule_by_the_search_spaces_function(
    rule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each case breaks one rule of tuner.space.rules: the worker refuses it under the rule's
    name, and with the search space's function taken away it has no copy that would."""
    patch, function = SHARED_RULES[rule]
    d = {**HAND, **patch}
    with pytest.raises(ValueError, match=rf"^spec: \[{rule}\] [^;]*$"):
        WorkerSpec.from_dict(d)
    monkeypatch.setattr(spec_module, function, lambda *a: [])
    WorkerSpec.from_dict(d)


def test_the_workers_own_rules() -> None:
    WorkerSpec.from_dict(HAND)
    with pytest.raises(ValueError, match=r"\[layer_spec\] layer_spec 'tex' is not one of"):
        WorkerSpec.from_dict({**HAND, "layer_spec": "tex"})
    cp = {**HAND, "layout": {"world": 4, "cp": 2}}
    with pytest.raises(ValueError, match=r"^spec: \[cp_needs_te\] cp \(2\) needs"):
        WorkerSpec.from_dict(cp)
    assert WorkerSpec.from_dict({**cp, "layer_spec": "te"}).layout.cp == 2
    # etp > 1 on a dense model runs in megatron-core (the runner's rule dense_no_etp skips it)
    assert WorkerSpec.from_dict({**HAND, "layout": {"world": 4, "pp": 2, "etp": 2}}).layout.etp == 2
