"""The models known by name (`REGISTRY`, numbers from each model's config.json on the hub), and
`get_model`: a registry name or a path to a config.json (hf_config.py reads it)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from tuner.errors import UserError
from tuner.models.hf_config import from_hf_config, path_kind
from tuner.models.spec import ModelSpec


def _spec(name: str, hf_id: str, **kw: int | bool) -> ModelSpec:
    return ModelSpec(name=name, hf_id=hf_id, **kw)  # type: ignore[arg-type]


# Numbers from each model's config.json on the Hugging Face hub.
REGISTRY: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _spec(
            "qwen2.5-7b",
            "Qwen/Qwen2.5-7B-Instruct",
            num_layers=28,
            hidden_size=3584,
            ffn_hidden_size=18944,
            num_attention_heads=28,
            num_kv_heads=4,
            head_dim=128,
            vocab_size=152064,
            qkv_bias=True,
        ),
        _spec(
            "qwen2.5-14b",
            "Qwen/Qwen2.5-14B-Instruct",
            num_layers=48,
            hidden_size=5120,
            ffn_hidden_size=13824,
            num_attention_heads=40,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=152064,
            qkv_bias=True,
        ),
        _spec(
            "qwen2.5-32b",
            "Qwen/Qwen2.5-32B-Instruct",
            num_layers=64,
            hidden_size=5120,
            ffn_hidden_size=27648,
            num_attention_heads=40,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=152064,
            qkv_bias=True,
        ),
        _spec(
            "qwen3-8b",
            "Qwen/Qwen3-8B",
            num_layers=36,
            hidden_size=4096,
            ffn_hidden_size=12288,
            num_attention_heads=32,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=151936,
            qk_layernorm=True,
        ),
        _spec(
            "qwen3-30b-moe",
            "Qwen/Qwen3-30B-A3B",
            num_layers=48,
            hidden_size=2048,
            ffn_hidden_size=6144,
            num_attention_heads=32,
            num_kv_heads=4,
            head_dim=128,
            vocab_size=151936,
            num_experts=128,
            moe_topk=8,
            moe_ffn_hidden_size=768,
            qk_layernorm=True,
        ),
        _spec(
            "qwen3-235b-moe",
            "Qwen/Qwen3-235B-A22B",
            num_layers=94,
            hidden_size=4096,
            ffn_hidden_size=12288,
            num_attention_heads=64,
            num_kv_heads=4,
            head_dim=128,
            vocab_size=151936,
            num_experts=128,
            moe_topk=8,
            moe_ffn_hidden_size=1536,
            qk_layernorm=True,
        ),
        _spec(
            "llama3.1-8b",
            "meta-llama/Llama-3.1-8B-Instruct",
            num_layers=32,
            hidden_size=4096,
            ffn_hidden_size=14336,
            num_attention_heads=32,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=128256,
        ),
        _spec(
            "llama3.1-70b",
            "meta-llama/Llama-3.1-70B-Instruct",
            num_layers=80,
            hidden_size=8192,
            ffn_hidden_size=28672,
            num_attention_heads=64,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=128256,
        ),
    )
}


_CHECKOUT = Path(__file__).resolve().parents[2]


def _in_checkout(path: Path) -> Path:
    """A relative path not found from the current folder, looked up in the checkout this
    package runs from: the committed leaderboards name their models by a path relative to the
    repository (`scripts/models/.../config.json`), so they export and calibrate from any
    folder."""
    if path.is_absolute() or path_kind(path):
        return path
    there = _CHECKOUT / path
    return there if path_kind(there) else path


def get_model(name_or_path: str) -> ModelSpec:
    """A registry name (`qwen3-30b-moe`) or a path to a config.json or its folder."""
    key = name_or_path.lower()
    if key in REGISTRY:
        return REGISTRY[key]
    path = _in_checkout(Path(name_or_path))
    if path.suffix == ".json" or path_kind(path):
        return from_hf_config(path)
    known = ", ".join(sorted(REGISTRY))
    raise UserError(
        f"unknown model {name_or_path!r}: use one of {known}, or a path to a config.json"
    )


def spec_fields() -> list[str]:
    """Field names, for tables."""
    return [f.name for f in fields(ModelSpec)]
