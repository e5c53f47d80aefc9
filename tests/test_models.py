from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.errors import UserError
from tuner.models import REGISTRY, get_model


@pytest.mark.parametrize(
    ("name", "total_b", "active_b"),
    [
        # published sizes: Qwen2.5-7B 7.61B, Qwen2.5-14B 14.7B, Qwen2.5-32B 32.5B, Qwen3-8B 8.2B,
        # Qwen3-30B-A3B 30.5B / 3.3B active, Qwen3-235B-A22B 235B / 22B, Llama 3.1 8B / 70B
        ("qwen2.5-7b", 7.61, 7.61),
        ("qwen2.5-14b", 14.7, 14.7),
        ("qwen2.5-32b", 32.5, 32.5),
        ("qwen3-8b", 8.2, 8.2),
        ("qwen3-30b-moe", 30.5, 3.3),
        ("qwen3-235b-moe", 235.0, 22.0),
        ("llama3.1-8b", 8.03, 8.03),
        ("llama3.1-70b", 70.6, 70.6),
    ],
)
def test_registry_parameter_counts_match_published_sizes(
    name: str, total_b: float, active_b: float
) -> None:
    m = REGISTRY[name]
    assert m.num_params / 1e9 == pytest.approx(total_b, rel=0.03)
    assert m.num_active_params / 1e9 == pytest.approx(active_b, rel=0.06)


def test_qwen3_30b_moe_architecture() -> None:
    m = get_model("qwen3-30b-moe")
    assert (m.num_layers, m.num_experts, m.moe_topk, m.moe_ffn_hidden_size) == (48, 128, 8, 768)
    assert m.is_moe


def _write(tmp_path: Path, cfg: object) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_reads_hf_config_json(tmp_path: Path) -> None:
    cfg = {
        "model_type": "qwen2",
        "num_hidden_layers": 28,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    }
    m = get_model(str(_write(tmp_path, cfg)))
    ref = REGISTRY["qwen2.5-7b"]
    assert m.num_params == ref.num_params
    assert get_model(str(tmp_path)).num_params == ref.num_params  # the folder works too


def test_reads_moe_config(tmp_path: Path) -> None:
    cfg = {
        "num_hidden_layers": 48,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "model_type": "qwen3_moe",
    }
    m = get_model(str(_write(tmp_path, cfg)))
    assert m.num_params == REGISTRY["qwen3-30b-moe"].num_params
    assert m.qk_layernorm  # qwen3 builds q_norm/k_norm without a config flag


def test_qk_layernorm_only_where_the_model_has_it(tmp_path: Path) -> None:
    """Issue 12: ModelSpec had no QK-norm field; the megatron worker guessed False."""
    base = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    }
    assert not get_model(
        str(_write(_mk(tmp_path / "a"), {**base, "model_type": "qwen2"}))
    ).qk_layernorm
    assert get_model(str(_write(_mk(tmp_path / "b"), {**base, "model_type": "qwen3"}))).qk_layernorm
    assert REGISTRY["qwen3-8b"].qk_layernorm and not REGISTRY["llama3.1-8b"].qk_layernorm


def test_one_flops_formula() -> None:
    """The estimator's training FLOPs are the model's (tuner.models), not a copy."""
    from tuner.estimate.context import get_context
    from tuner.estimate.profile import Profile
    from tuner.hardware import Cluster, get_gpu
    from tuner.workload import get_workload

    m = REGISTRY["qwen3-30b-moe"]
    ctx = get_context(
        m, Cluster(gpu=get_gpu("h100"), num_gpus=8), get_workload("dapo-math"), Profile()
    )
    assert ctx.forward_flops_per_token() == m.forward_flops(1.0, ctx.seq_eff)
    assert m.training_flops([10, 20]) == 3 * m.forward_flops(30, 500)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "no JSON object"),
        ('{"hidden_size": 8}', "lacks num_hidden_layers"),
        (
            '{"num_hidden_layers": "x", "hidden_size": 8, "num_attention_heads": 2, '
            '"vocab_size": 10}',
            "not a whole number",
        ),
        (
            '{"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 3, '
            '"num_key_value_heads": 2, "vocab_size": 1000, "intermediate_size": 4}',
            "multiple",
        ),
    ],
)
def test_malformed_config_is_a_user_error(tmp_path: Path, content: str, message: str) -> None:
    p = tmp_path / "config.json"
    p.write_text(content)
    with pytest.raises(UserError, match=message):
        get_model(str(p))


def test_unknown_model_names_the_registry() -> None:
    with pytest.raises(UserError, match="qwen3-30b-moe"):
        get_model("gpt-5")


def _mk(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


# config.json of public MoE checkpoints (fields as their Hugging Face files give them; read from
# transcriptions of those files in public repositories, the numbers being the published ones)
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "vocab_size": 102400,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "moe_intermediate_size": 1408,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
QWEN15_MOE_A27B = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "model_type": "qwen2_moe",
    "decoder_sparse_step": 1,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "num_attention_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 16,
    "shared_expert_intermediate_size": 5632,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}
QWEN2_57B_A14B = {
    **QWEN15_MOE_A27B,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "moe_intermediate_size": 2560,
    "num_attention_heads": 28,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "shared_expert_intermediate_size": 20480,
}


@pytest.mark.parametrize(
    ("cfg", "total_b", "active_b", "shared", "dense_layers", "gate"),
    [
        # published: Qwen1.5-MoE-A2.7B 14.3B / 2.7B active, Qwen2-57B-A14B 57.4B / 14.2B
        (QWEN15_MOE_A27B, 14.3, 2.7, 5632, 0, True),
        (QWEN2_57B_A14B, 57.4, 14.2, 20480, 0, True),
        # DeepSeek-V2-Lite 15.7B / 2.4B activated (that one without the input embedding);
        # its multi-latent attention is read as 16-head attention of width 128: +0.6% here
        (DEEPSEEK_V2_LITE, 15.7, 2.4, 2 * 1408, 1, False),
    ],
)
def test_reads_deepseek_and_qwen2_moe_configs(
    tmp_path: Path,
    cfg: dict[str, object],
    total_b: float,
    active_b: float,
    shared: int,
    dense_layers: int,
    gate: bool,
) -> None:
    """Issue 19 item 9: DeepSeek's n_routed_experts were not read (a dense model) and the
    shared experts of both families were lost."""
    m = get_model(str(_write(tmp_path, cfg)))
    assert m.is_moe
    assert (m.shared_expert_ffn_hidden_size, m.num_dense_layers) == (shared, dense_layers)
    assert m.shared_expert_gate is gate
    assert m.num_params / 1e9 == pytest.approx(total_b, rel=0.01)
    active = m.num_active_params - (m.vocab_size * m.hidden_size if dense_layers else 0)
    assert active / 1e9 == pytest.approx(active_b, rel=0.06)
    # the one FLOP formula counts the shared experts and the dense layer
    h = m.hidden_size
    mlp = (
        m.num_moe_layers * (m.moe_topk * 3 * h * m.moe_ffn_hidden_size + h * m.num_experts)
        + m.num_moe_layers * m.shared_expert_params_per_layer
        + dense_layers * 3 * h * m.ffn_hidden_size
    )
    attn = m.num_layers * (h * (h + 2 * m.num_kv_heads * m.head_dim) + h * h)
    assert m.matmul_params == attn + mlp + h * m.vocab_size


def test_moe_layer_patterns_it_cannot_represent_are_refused(tmp_path: Path) -> None:
    for extra in ({"decoder_sparse_step": 2}, {"mlp_only_layers": [0, 5]}):
        with pytest.raises(UserError, match="not modelled"):
            get_model(str(_write(tmp_path, {**QWEN15_MOE_A27B, **extra})))


def test_shared_experts_and_dense_layers_reach_the_cost_model(tmp_path: Path) -> None:
    from dataclasses import replace

    from tuner.estimate import estimate
    from tuner.estimate.memory import activation_bytes_per_token_layer
    from tuner.hardware import Cluster, get_gpu
    from tuner.runners.megatron_refusals import refusals
    from tuner.space import Candidate, ParallelLayout
    from tuner.workload import get_workload

    m = get_model(str(_write(tmp_path, QWEN15_MOE_A27B)))
    routed_only = replace(m, shared_expert_ffn_hidden_size=0, shared_expert_gate=False)
    cl = Cluster(gpu=get_gpu("h100"), num_gpus=8)
    c = Candidate(layout=ParallelLayout.parse("ep4", 8), rollout_tp=2)
    a, b = (estimate(c, x, cl, get_workload("grpo-short")) for x in (m, routed_only))
    assert a.memory.weights_gib > b.memory.weights_gib
    assert a.update_actor_s > b.update_actor_s
    assert activation_bytes_per_token_layer(m, c) > activation_bytes_per_token_layer(routed_only, c)
    for mods in ("core_attn,moe", "shared_experts"):  # both recompute the shared experts
        sel = replace(c, recompute_granularity="selective", recompute_modules=mods)
        assert activation_bytes_per_token_layer(m, sel) == activation_bytes_per_token_layer(
            routed_only, sel
        )
    # the megatron worker builds one layer spec for every layer: DeepSeek's dense first layer
    # is refused there, not measured as a MoE layer
    ds = get_model(str(_write(tmp_path, DEEPSEEK_V2_LITE)))
    w = get_workload("grpo-short")
    assert "dense_layers_not_built" in {r.rule for r in refusals(c, ds, cl, w)}
    assert "dense_layers_not_built" not in {r.rule for r in refusals(c, m, cl, w)}
