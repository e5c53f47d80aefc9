"""A model's architecture (`ModelSpec`) and what follows from it alone: its parameter counts and
the FLOP formulas the estimator, the reports and the megatron worker share. The known models are
in registry.py, the reader of a Hugging Face config.json in hf_config.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.errors import UserError

MIN_VOCAB = 256
"""Smallest `vocab_size` accepted: a tokenizer that encodes any text holds at least the 256 byte
values (byte-level BPE, SentencePiece's byte fallback; this project's own offline tokenizer,
tuner.dataset.write_word_tokenizer, has them and more), and the hub's models have 32k and up. A
vocabulary of 1 was read and scored (issue 38 item 4)."""


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
        if self.vocab_size < MIN_VOCAB:
            raise UserError(
                f"model {self.name}: vocab_size {self.vocab_size} is below {MIN_VOCAB}, the byte "
                "values any tokenizer holds: fix the config.json"
            )
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
    def tp_split_widths(self) -> list[tuple[str, int]]:
        """(what, width) of each MLP this model has whose inner width a tensor-parallel group
        splits (megatron-core's tp, vLLM's rollout tp): the dense MLP where some layer has one
        (intermediate_size), and the shared experts (their summed width). The routed experts are
        split by the experts' own group (megatron-core's etp), so they are not among them."""
        out = []
        if self.num_dense_mlp_layers:
            out.append(("MLP width (intermediate_size)", self.ffn_hidden_size))
        if self.shared_expert_ffn_hidden_size:
            out.append(("shared experts' width", self.shared_expert_ffn_hidden_size))
        return out

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
