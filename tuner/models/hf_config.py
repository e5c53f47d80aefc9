"""The reader of a Hugging Face config.json: every number and switch it uses checked first
(`check_config_values`), then read into a ModelSpec (`from_hf_config`)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from tuner.errors import UserError
from tuner.fileio import load_json
from tuner.models.spec import MIN_VOCAB, ModelSpec

QKV_BIAS_MODEL_TYPES = ("qwen2", "qwen2_moe")
"""HF model types whose QKV projection has a bias without an `attention_bias` flag (their
modeling code builds q/k/v_proj with bias=True)."""
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe", "qwen3_next", "olmo2", "gemma3")
"""HF model types whose attention always normalises q and k per head (their modeling code builds
q_norm/k_norm unconditionally; their config.json has no flag for it)."""


def _has_qk_norm(cfg: dict[str, object]) -> bool:
    """Qwen3 and its kin always use q_norm/k_norm; other configs may say so with a flag."""
    if cfg.get("model_type") in QK_NORM_MODEL_TYPES:
        return True
    return bool(cfg.get("qk_layernorm") or cfg.get("use_qk_norm") or cfg.get("qk_norm"))


CONFIG_MAX_BYTES = 4 << 20
"""Largest config.json read: the hub's are a few KiB (a label table makes some 100 KiB)."""
MAX_COUNT = 1 << 24
"""Largest architecture count accepted (16.7M): vocabularies reach 262k, widths 30k."""
MAX_LAYERS = 512
"""Largest `num_hidden_layers` accepted: the deepest published models have 126 (Llama 3.1
405B); the search's pipeline splits and the cost model's batch plans of a deeper model ran for
minutes (issue 38: 100,000 layers ran for over 20 minutes before a study started)."""
CONFIG_MOST: dict[str, int] = {"num_hidden_layers": MAX_LAYERS}
"""The counts of `CONFIG_COUNTS` with a largest value below MAX_COUNT."""
CONFIG_COUNTS: dict[str, int] = {
    "num_hidden_layers": 1,
    "hidden_size": 1,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 1,
    "vocab_size": MIN_VOCAB,
    "intermediate_size": 0,
    "num_experts": 0,
    "num_local_experts": 0,
    "n_routed_experts": 0,
    "num_experts_per_tok": 0,
    "moe_intermediate_size": 0,
    "n_shared_experts": 0,
    "shared_expert_intermediate_size": 0,
    "first_k_dense_replace": 0,
    "moe_layer_freq": 1,
    "decoder_sparse_step": 1,
    "kv_lora_rank": 0,
    "q_lora_rank": 0,
    "qk_rope_head_dim": 0,
    "qk_nope_head_dim": 0,
    "v_head_dim": 0,
}
"""Every config.json count the reader may use, with its least value. Each one present (and not
null) must be a JSON whole number in least..MAX_COUNT: not 27.9, not true, not "28"."""
CONFIG_FLAGS = ("attention_bias", "tie_word_embeddings", "qk_layernorm", "use_qk_norm", "qk_norm")
"""config.json switches the reader uses: JSON true or false where present."""
CONFIG_TEXTS = ("model_type", "_name_or_path")
"""config.json strings the reader uses: JSON text where present (a `model_type` of 5 matched
no known type and was read as a model without its QKV bias or q/k norm)."""


def check_config_values(cfg: dict[str, object], path: Path) -> None:
    """The one check of a config.json's numbers and switches (`CONFIG_COUNTS`, `CONFIG_FLAGS`),
    before any is used; UserError naming the field, its value and the allowed range."""
    for key, least in CONFIG_COUNTS.items():
        v = cfg.get(key)
        if v is None:
            continue
        shown = json.dumps(v)[:40]
        if isinstance(v, bool) or not isinstance(v, int):
            raise UserError(f"{path}: {key} is {shown}, not a whole number: fix the config.json")
        most = CONFIG_MOST.get(key, MAX_COUNT)
        if not least <= v <= most:
            raise UserError(
                f"{path}: {key} is {shown}, outside {least}..{most}: fix the config.json"
            )
    for key in CONFIG_FLAGS:
        v = cfg.get(key)
        if v is not None and not isinstance(v, bool):
            raise UserError(
                f"{path}: {key} is {json.dumps(v)[:40]}, not true or false: fix the config.json"
            )
    for key in CONFIG_TEXTS:
        v = cfg.get(key)
        if v is not None and not isinstance(v, str):
            raise UserError(f"{path}: {key} is {json.dumps(v)[:40]}, not text: fix the config.json")
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    no_head_dim = cfg.get("head_dim") is None
    if no_head_dim and isinstance(heads, int) and isinstance(hidden, int) and hidden % heads:
        raise UserError(
            f"{path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads} "
            "and no head_dim says the width of a head: fix the config.json (add head_dim)"
        )


def _moe_fields(cfg: dict[str, object], path: Path) -> dict[str, int | bool]:
    """The MoE fields of a checked config.json as ModelSpec's: routed experts (`num_experts`,
    Mixtral's `num_local_experts`, DeepSeek's `n_routed_experts`), their top-k and width; the
    shared experts (Qwen2-MoE: `shared_expert_intermediate_size`, gated; DeepSeek:
    `n_shared_experts` x `moe_intermediate_size`, ungated); DeepSeek's leading dense layers
    (`first_k_dense_replace`). Layer patterns ModelSpec cannot represent (MoE every k-th layer,
    Qwen2-MoE's `mlp_only_layers`) are refused with the field that asks for them."""

    def count(key: str) -> int:
        v = cfg.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else 0

    experts = count("num_experts") or count("num_local_experts") or count("n_routed_experts")
    if not experts:
        return {}
    width = count("moe_intermediate_size")
    shared = count("shared_expert_intermediate_size")
    gate = bool(shared)  # Qwen2-MoE's shared expert is always gated (Qwen2MoeSparseMoeBlock)
    if not shared and count("n_shared_experts"):
        shared = count("n_shared_experts") * width  # DeepseekV2MoE: one MLP of that width
    for key in ("moe_layer_freq", "decoder_sparse_step"):
        if count(key) > 1:
            raise UserError(
                f"{path}: {key} {count(key)} (MoE every {count(key)} layers) is not modelled: "
                "only leading dense layers (first_k_dense_replace) are"
            )
    if cfg.get("mlp_only_layers"):
        raise UserError(
            f"{path}: mlp_only_layers {json.dumps(cfg.get('mlp_only_layers'))[:40]} is not "
            "modelled: only leading dense layers (first_k_dense_replace) are"
        )
    return {
        "num_experts": experts,
        "moe_topk": count("num_experts_per_tok"),
        "moe_ffn_hidden_size": width,
        "shared_expert_ffn_hidden_size": shared,
        "shared_expert_gate": gate,
        "num_dense_layers": count("first_k_dense_replace"),
    }


def path_kind(path: Path) -> str:
    """What is at `path`: "" (nothing), "folder", "file", or "unknown" where this user may not
    look (a folder of mode 000; Path.exists() raised a PermissionError there, which ended as
    'make it writable'): the reader (fileio.check_input_file) then says it cannot be read."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return ""
    except OSError:
        return "unknown"
    return "folder" if stat.S_ISDIR(st.st_mode) else "file"


def model_name_of(path: Path) -> str:
    """The name of the model whose config.json is `path`: its folder's name, as the folder
    really is (`../config.json` was named `..`, and its recipes went to `recipes/..`, the folder
    above; `./config.json` was named `config.json`); the file's stem where the folder has no
    name (`/config.json`)."""
    folder = Path(os.path.abspath(path)).parent
    return folder.name or path.stem or "model"


def from_hf_config(path: Path) -> ModelSpec:
    """Read a Hugging Face config.json (or a folder holding one)."""
    if path_kind(path) == "folder":
        path = path / "config.json"
    if not path_kind(path):
        raise UserError(f"no config.json at {path}: pass a registry name or a valid path")
    cfg = load_json(path, "model config", CONFIG_MAX_BYTES)
    if not isinstance(cfg, dict):
        raise UserError(f"{path} holds no JSON object: pass a Hugging Face config.json")
    cfg = {**cfg, **cfg.get("text_config", {})} if isinstance(cfg.get("text_config"), dict) else cfg
    check_config_values(cfg, path)
    required = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}: pass a Hugging Face config.json")
    null = [k for k in required if cfg[k] is None]
    if null:  # named by no field before: "int() argument must be ... not 'NoneType'"
        raise UserError(
            f"{path}: {', '.join(null)} {'is' if len(null) == 1 else 'are'} null, not a whole "
            "number: fix the config.json"
        )
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        moe = _moe_fields(cfg, path)
        return ModelSpec(
            name=model_name_of(path),
            num_layers=int(cfg["num_hidden_layers"]),
            hidden_size=hidden,
            ffn_hidden_size=int(cfg.get("intermediate_size") or 0),
            num_attention_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            vocab_size=int(cfg["vocab_size"]),
            **moe,  # type: ignore[arg-type]
            qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") in QKV_BIAS_MODEL_TYPES)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qk_layernorm=_has_qk_norm(cfg),
            hf_id=str(cfg.get("_name_or_path") or ""),
        )
    except (TypeError, ValueError) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(f"{path} has a non-numeric architecture field ({e})") from None
