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
        "vocab_size": 100,
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
            '"num_key_value_heads": 2, "vocab_size": 10, "intermediate_size": 4}',
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
