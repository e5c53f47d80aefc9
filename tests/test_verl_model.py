"""scripts/verl_model.py on a MoE config (issue 37): the random-weight model folder verl's mbridge
and vLLM load. Qwen3-30B-A3B's committed config (scripts/models/qwen3-30b-a3b-20l) shrunk in
width, experts and vocabulary so that it builds on a CPU in seconds; the architecture, the keys
and the config fields are what the full model's folder gets."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "scripts" / "models" / "qwen3-30b-a3b-20l" / "config.json"
TINY = {
    "num_hidden_layers": 2,
    "max_window_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 4096,
}


def _script() -> object:
    spec = importlib.util.spec_from_file_location("verl_model", ROOT / "scripts/verl_model.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_qwen3_moe_folder_has_the_keys_mbridge_maps(tmp_path: Path) -> None:
    """Per-expert HF keys (mbridge 0.15.1 models/qwen2moe.py, which Qwen3MoEBridge extends:
    `mlp.experts.{expert_id}.gate_proj/up_proj/down_proj`, the router `mlp.gate`, q/k norms),
    not transformers 5's fused in-memory experts; the config names its experts so that
    transformers (hence vLLM's qwen3_moe and mbridge's `hf_config.num_experts`) reads them."""
    pytest.importorskip("transformers")
    from safetensors import safe_open
    from transformers import AutoConfig

    raw = json.loads(CONFIG.read_text())
    assert raw["model_type"] == "qwen3_moe" and raw["architectures"] == ["Qwen3MoeForCausalLM"]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**raw, **TINY}))
    out = tmp_path / "model"
    assert _script().main([str(cfg), str(out)]) == 0  # type: ignore[attr-defined]
    keys: set[str] = set()
    for f in out.glob("*.safetensors"):
        with safe_open(str(f), "pt") as s:
            keys |= set(s.keys())
    for layer in range(2):
        p = f"model.layers.{layer}"
        assert {f"{p}.mlp.gate.weight", f"{p}.self_attn.q_norm.weight"} <= keys
        for e in range(4):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                assert f"{p}.mlp.experts.{e}.{proj}.weight" in keys
    assert not [k for k in keys if "shared_expert" in k or "gate_up_proj" in k]
    back = AutoConfig.from_pretrained(out)
    assert type(back).__name__ == "Qwen3MoeConfig"
    assert (back.num_experts, back.num_experts_per_tok, back.router_aux_loss_coef) == (4, 2, 0.001)
