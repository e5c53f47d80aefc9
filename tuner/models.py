"""Model architectures: a registry of known models and a reader for Hugging Face config.json."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from tuner.errors import UserError
from tuner.fileio import load_json


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """The architecture numbers the search space and the cost model need."""

    name: str
    """Registry name or the path it was read from."""
    num_layers: int
    """Transformer blocks."""
    hidden_size: int
    """Model width."""
    ffn_hidden_size: int
    """Dense MLP inner width (unused by layers that are MoE)."""
    num_attention_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention)."""
    head_dim: int
    """Width of one attention head."""
    vocab_size: int
    """Embedding rows (padded vocabulary as shipped in config.json)."""
    num_experts: int = 0
    """Routed experts per MoE layer; 0 for a dense model."""
    moe_topk: int = 0
    """Experts each token is routed to."""
    moe_ffn_hidden_size: int = 0
    """Inner width of one expert's MLP."""
    shared_expert_ffn_hidden_size: int = 0
    """Inner width of the shared experts every token of a MoE layer passes through, summed
    (megatron-core's moe_shared_expert_intermediate_size; DeepSeek: n_shared_experts x
    moe_intermediate_size, Qwen2-MoE: shared_expert_intermediate_size); 0 for none."""
    shared_expert_gate: bool = False
    """The shared experts' output is scaled by sigmoid(hidden x one weight per hidden unit)
    (Qwen2-MoE's shared_expert_gate; megatron-core's moe_shared_expert_gate)."""
    num_dense_layers: int = 0
    """Leading layers of a MoE model whose MLP is dense (ffn_hidden_size) instead of experts
    (DeepSeek's first_k_dense_replace)."""
    qkv_bias: bool = False
    """Whether the QKV projection has a bias (Qwen2 does)."""
    tie_word_embeddings: bool = False
    """Whether the output layer shares the embedding weights."""
    qk_layernorm: bool = False
    """RMSNorm on each query and key head before RoPE (Qwen3's q_norm/k_norm)."""
    hf_id: str = ""
    """The Hugging Face repository the numbers come from, for recipes."""

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim"):
            if getattr(self, f) <= 0:
                raise UserError(f"model {self.name}: {f} must be positive, got {getattr(self, f)}")
        if self.num_attention_heads % self.num_kv_heads:
            raise UserError(
                f"model {self.name}: num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_key_value_heads ({self.num_kv_heads})"
            )
        if self.num_experts and not (0 < self.moe_topk <= self.num_experts):
            raise UserError(
                f"model {self.name}: num_experts_per_tok ({self.moe_topk}) must be in "
                f"1..num_experts ({self.num_experts})"
            )
        if self.num_experts and self.moe_ffn_hidden_size <= 0:
            raise UserError(f"model {self.name}: moe_intermediate_size must be positive")
        if not self.num_experts and self.ffn_hidden_size <= 0:
            raise UserError(f"model {self.name}: intermediate_size must be positive")
        if not self.num_experts and (
            self.shared_expert_ffn_hidden_size or self.shared_expert_gate or self.num_dense_layers
        ):
            raise UserError(
                f"model {self.name}: shared experts and dense layers need routed experts"
            )
        if self.shared_expert_ffn_hidden_size < 0:
            raise UserError(f"model {self.name}: the shared experts' width must not be negative")
        if self.shared_expert_gate and not self.shared_expert_ffn_hidden_size:
            raise UserError(f"model {self.name}: a shared-expert gate needs shared experts")
        if not 0 <= self.num_dense_layers < self.num_layers:
            raise UserError(
                f"model {self.name}: first_k_dense_replace ({self.num_dense_layers}) must be in "
                f"0..num_hidden_layers - 1 ({self.num_layers - 1})"
            )
        if self.num_dense_layers and self.ffn_hidden_size <= 0:
            raise UserError(
                f"model {self.name}: dense layers (first_k_dense_replace) need intermediate_size"
            )

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attn_params_per_layer(self) -> int:
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        bias = (q + 2 * kv) if self.qkv_bias else 0
        qk_norm = 2 * self.head_dim if self.qk_layernorm else 0
        return (
            self.hidden_size * (q + 2 * kv)
            + q * self.hidden_size
            + bias
            + 2 * self.hidden_size
            + qk_norm
        )

    @property
    def dense_mlp_params_per_layer(self) -> int:
        """A SwiGLU MLP: gate, up and down projections."""
        return 3 * self.hidden_size * self.ffn_hidden_size

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a MoE block (0 for a dense model)."""
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    @property
    def num_dense_mlp_layers(self) -> int:
        """Layers whose MLP is dense."""
        return self.num_layers - self.num_moe_layers

    @property
    def expert_params_per_layer(self) -> int:
        """All routed experts of one MoE layer (zero for dense)."""
        return self.num_experts * 3 * self.hidden_size * self.moe_ffn_hidden_size

    @property
    def shared_expert_params_per_layer(self) -> int:
        """The shared experts of one MoE layer: SwiGLU projections, and the gate's weights."""
        gate = self.hidden_size if self.shared_expert_gate else 0
        return 3 * self.hidden_size * self.shared_expert_ffn_hidden_size + gate

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.num_experts

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def _mlp_params(self, active: bool) -> int:
        """MLP weights of every layer: the dense ones and the MoE blocks (router, shared
        experts, and all routed experts or, `active`, the top-k a token passes through)."""
        routed = self.moe_topk if active else self.num_experts
        moe = (
            routed * 3 * self.hidden_size * self.moe_ffn_hidden_size
            + self.router_params_per_layer
            + self.shared_expert_params_per_layer
        )
        return self.num_dense_mlp_layers * self.dense_mlp_params_per_layer + (
            self.num_moe_layers * moe
        )

    @property
    def num_params(self) -> int:
        """Total parameters."""
        return (
            self.num_layers * self.attn_params_per_layer
            + self._mlp_params(active=False)
            + self.embedding_params
            + self.hidden_size
        )

    @property
    def num_active_params(self) -> int:
        """Parameters one token touches (MoE: top-k experts only)."""
        return (
            self.num_layers * self.attn_params_per_layer
            + self._mlp_params(active=True)
            + self.embedding_params
            + self.hidden_size
        )

    # ---- FLOPs: the one formula the estimator, the reports and the megatron worker use ----

    @property
    def layer_matmul_params(self) -> float:
        """Weights of the matrix products one token passes through in one layer, the mean over
        the layers: QKV and output projections, the dense MLP or the router, top-k experts and
        shared experts (biases and norms excluded)."""
        return (self.matmul_params - self.hidden_size * self.vocab_size) / self.num_layers

    @property
    def matmul_params(self) -> int:
        """Matmul weights one token passes through: every layer plus the output layer (the
        embedding lookup is no matmul)."""
        h = self.hidden_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attn = h * (q + 2 * kv) + q * h
        return self.num_layers * attn + self._mlp_params(active=True) + h * self.vocab_size

    def forward_flops(self, tokens: float, sum_sq_len: float) -> float:
        """Forward FLOPs of `tokens` tokens in causal sequences whose squared lengths sum to
        `sum_sq_len`: 2 per matmul weight per token, plus attention scores and values
        (2 * 2 * layers * q_dim * s^2 / 2 per sequence, causal halving the work)."""
        q = self.num_attention_heads * self.head_dim
        return 2.0 * self.matmul_params * tokens + 2.0 * self.num_layers * q * sum_sq_len

    def training_flops(self, sequence_lengths: Sequence[int]) -> float:
        """Model FLOPs (forward + backward = 3 x forward, no recompute) of one pass over
        sequences of these lengths."""
        tokens = float(sum(sequence_lengths))
        sq = float(sum(s * s for s in sequence_lengths))
        return 3.0 * self.forward_flops(tokens, sq)

    def flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs of one token in a causal sequence of seq_len tokens."""
        return self.forward_flops(1.0, float(seq_len))


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
    "vocab_size": 1,
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


def _lookup(path: Path) -> str:
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
    if _lookup(path) == "folder":
        path = path / "config.json"
    if not _lookup(path):
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


_CHECKOUT = Path(__file__).resolve().parents[1]


def _in_checkout(path: Path) -> Path:
    """A relative path not found from the current folder, looked up in the checkout this
    package runs from: the committed leaderboards name their models by a path relative to the
    repository (`scripts/models/.../config.json`), so they export and calibrate from any
    folder."""
    if path.is_absolute() or _lookup(path):
        return path
    there = _CHECKOUT / path
    return there if _lookup(there) else path


def get_model(name_or_path: str) -> ModelSpec:
    """A registry name (`qwen3-30b-moe`) or a path to a config.json or its folder."""
    key = name_or_path.lower()
    if key in REGISTRY:
        return REGISTRY[key]
    path = _in_checkout(Path(name_or_path))
    if path.suffix == ".json" or _lookup(path):
        return from_hf_config(path)
    known = ", ".join(sorted(REGISTRY))
    raise UserError(
        f"unknown model {name_or_path!r}: use one of {known}, or a path to a config.json"
    )


def spec_fields() -> list[str]:
    """Field names, for tables."""
    return [f.name for f in fields(ModelSpec)]
