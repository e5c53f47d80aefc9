"""Numbers derived once per (model, cluster, workload, profile), shared by every candidate.

The estimator scores thousands of candidates of one study; everything that does not depend on
the candidate is computed here once and cached, so the per-candidate work is a few dozen float
operations (see scripts/bench_estimator.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tuner.estimate.profile import Profile
from tuner.hardware import GIB, Cluster
from tuner.lengths import EULER_GAMMA as EULER_GAMMA
from tuner.lengths import ResponseLengths
from tuner.lengths import solve_theta as solve_theta
from tuner.models import ModelSpec
from tuner.workload import Workload

BF16 = 2
"""Bytes of a bf16 value."""
FP32 = 4
"""Bytes of an fp32 value."""

DECODE_KERNELS_DENSE_LAYER = 14
"""Kernels one dense decoder layer launches per vLLM decode step (norm, QKV, rope, cache write,
attention, output projection, add+norm, gate/up, activation, down, ...)."""
DECODE_KERNELS_MOE_EXTRA = 30
"""Extra host cost of a MoE layer per decode step, in kernel launches: router GEMM, top-k
softmax, block alignment and the buffers it allocates, activation, weighted sum, and two Triton
fused-MoE launches that go through Python (config lookup, grid set-up: several launches' worth
each)."""
VLLM_RUNTIME_GIB = 0.5
"""vLLM's own buffers beside weights, activations and KV cache (sampler, block tables)."""
PERMUTE_PASSES = 12
"""Memory passes over the routed tokens per MoE layer, forward and backward together: permute
and unpermute read and write each copy, and the backward does the same twice."""


@dataclass(slots=True)
class Context:
    """Model, cluster, workload and profile numbers one study uses for every candidate."""

    model: ModelSpec
    cluster: Cluster
    workload: Workload
    profile: Profile
    # --- model
    layers: int = 0
    hidden: int = 0
    q_dim: int = 0
    kv_dim: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    ffn: int = 0
    vocab: int = 0
    experts: int = 0
    topk: int = 0
    moe_ffn: int = 0
    is_moe: bool = False
    attn_linear_params: float = 0.0
    """QKV and output projection weights of one layer."""
    dense_mlp_params: float = 0.0
    """Dense (TP-split) MLP weights of one layer, the mean over the layers: the dense MLP, or
    on a MoE the shared experts and the leading dense layers' MLPs."""
    shared_ffn: int = 0
    """Inner width of a MoE layer's shared experts (0: none)."""
    dense_layers: int = 0
    """Layers with a dense MLP (all of a dense model, the leading ones of a MoE)."""
    router_params: float = 0.0
    expert_params_layer: float = 0.0
    """All routed experts of one layer."""
    one_expert_params: float = 0.0
    embed_params: float = 0.0
    """Input embedding rows (one table)."""
    head_params: float = 0.0
    """Output layer (0 when tied to the embedding)."""
    total_params: float = 0.0
    expert_params_total: float = 0.0
    active_params: float = 0.0
    """Matmul weights one token touches (embedding lookup excluded), for FLOPs."""
    layer_active_linear: float = 0.0
    """Matmul weights of one layer one token touches."""
    # --- workload
    prompt_mean: float = 0.0
    response_mean: float = 0.0
    response_max: int = 0
    theta: float = 0.0
    """Scale of the exponential part of the response lengths."""
    lengths: ResponseLengths | None = None
    """The response-length model (tuner.lengths) of the workload."""
    expert_imbalance: float = 1.0
    """The busiest routed expert's tokens over the mean expert's (Workload.expert_imbalance)."""
    seq_mean: float = 0.0
    seq_sd: float = 0.0
    seq_eff: float = 0.0
    """Token-weighted mean sequence length E[s^2]/E[s]: what attention cost per token sees."""
    max_seq: int = 0
    samples: int = 0
    longest_sample: float = 0.0
    """Expected longest sample of a step (prompt + longest response), tokens."""
    tokens_step: float = 0.0
    batch_bytes_log_prob: float = 0.0
    """Padded batch the controller ships to a log-prob pass and collects back, bytes."""
    batch_bytes_update: float = 0.0
    batch_bytes_generation: float = 0.0
    minis: int = 0
    uses_ref: bool = False
    has_critic: bool = False
    # --- hardware
    peak: float = 0.0
    """bf16 FLOP/s."""
    hbm: float = 0.0
    """Bytes/s streaming kernels reach."""
    nvlink: float = 0.0
    """Bytes/s collectives reach inside a node."""
    internode: float = 0.0
    """Bytes/s collectives reach across nodes, per GPU."""
    pcie: float = 0.0
    """Bytes/s offload copies reach."""
    mem_bytes: float = 0.0
    local_gpus: int = 0
    # --- caches filled lazily, one entry per distinct key
    layout_cache: dict[tuple[object, ...], object] = field(default_factory=dict)
    generation_cache: dict[tuple[float, ...], object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        model, cluster, workload, profile = self.model, self.cluster, self.workload, self.profile
        self.layers, self.hidden = model.num_layers, model.hidden_size
        self.heads, self.kv_heads, self.head_dim = (
            model.num_attention_heads,
            model.num_kv_heads,
            model.head_dim,
        )
        self.q_dim = model.num_attention_heads * model.head_dim
        self.kv_dim = model.num_kv_heads * model.head_dim
        self.ffn, self.vocab = model.ffn_hidden_size, model.vocab_size
        self.experts, self.topk, self.moe_ffn = (
            model.num_experts,
            model.moe_topk,
            model.moe_ffn_hidden_size,
        )
        self.is_moe = model.is_moe
        h = self.hidden
        self.attn_linear_params = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        self.shared_ffn, self.dense_layers = (
            model.shared_expert_ffn_hidden_size,
            model.num_dense_mlp_layers,
        )
        self.dense_mlp_params = (
            model.num_dense_mlp_layers * model.dense_mlp_params_per_layer
            + model.num_moe_layers * model.shared_expert_params_per_layer
        ) / self.layers
        self.router_params = float(model.router_params_per_layer) if model.is_moe else 0.0
        self.expert_params_layer = float(model.expert_params_per_layer)
        self.one_expert_params = 3.0 * h * model.moe_ffn_hidden_size
        self.embed_params = float(model.vocab_size * h)
        self.head_params = 0.0 if model.tie_word_embeddings else float(model.vocab_size * h)
        self.total_params = float(model.num_params)
        self.expert_params_total = model.num_moe_layers * self.expert_params_layer
        # one formula for matmul weights and FLOPs: tuner.models (attention + active MLP)
        self.layer_active_linear = float(model.layer_matmul_params)
        self.active_params = self.layers * self.layer_active_linear + self.embed_params

        self.prompt_mean = workload.mean_prompt_len
        self.response_mean = workload.mean_response_len
        self.response_max = workload.response_len
        self.expert_imbalance = workload.expert_imbalance
        self.lengths = workload.response_lengths
        self.theta = self.lengths.theta
        e_r2 = self.lengths.second_moment()
        prompt_mean, response_mean = self.prompt_mean, self.response_mean
        self.seq_mean = prompt_mean + response_mean
        e_s2 = prompt_mean * prompt_mean + 2 * prompt_mean * response_mean + e_r2
        self.seq_sd = math.sqrt(max(0.0, e_s2 - self.seq_mean**2))
        self.seq_eff = e_s2 / self.seq_mean
        self.max_seq = workload.max_seq_len
        self.samples = workload.num_samples
        longest_response = self.lengths.longest_of(self.samples)
        self.longest_sample = prompt_mean + longest_response
        self.tokens_step = self.samples * self.seq_mean
        # verl keeps the batch padded to (max prompt, max response): int64 ids, mask, positions
        # over the whole sequence, prompts, responses and the response mask; fp32 per-token
        # tensors (scores, log-probs, advantages) over the response.
        samples, prompt_len, response_len = self.samples, workload.prompt_len, workload.response_len
        ids = 8.0 * samples * (3 * (prompt_len + response_len) + prompt_len + 2 * response_len)
        per_token = 4.0 * samples * response_len
        self.batch_bytes_generation = ids
        self.batch_bytes_log_prob = ids + per_token + 2 * per_token
        self.batch_bytes_update = ids + 4 * per_token
        self.minis = workload.mini_batches_per_step
        self.uses_ref = workload.algorithm in ("grpo", "ppo")
        self.has_critic = workload.algorithm == "ppo"

        gpu = cluster.gpu
        self.peak = gpu.bf16_tflops * 1e12
        self.hbm = gpu.hbm_tb_s * 1e12 * profile.hbm_efficiency
        self.nvlink = gpu.nvlink_gb_s * 1e9 * profile.comm_efficiency
        self.internode = gpu.internode_gb_s * 1e9 * profile.comm_efficiency
        self.pcie = gpu.pcie_gb_s * 1e9 * profile.pcie_efficiency
        self.mem_bytes = gpu.memory_gib * GIB
        self.local_gpus = cluster.local_gpus

    def forward_flops_per_token(self) -> float:
        """Model forward FLOPs of one token, attention over its sequence included (causal)."""
        return self.model.forward_flops(1.0, self.seq_eff)

    def head_or_embed(self) -> float:
        """Output-layer weights (the embedding table when tied)."""
        return self.head_params or self.embed_params


def bandwidth_between(ctx: Context, span: int) -> float:
    """Collective bandwidth of a group of `span` consecutive ranks (inside a node or not)."""
    return ctx.nvlink if span <= ctx.local_gpus else ctx.internode


_CACHE: dict[tuple[object, ...], Context] = {}
_LAST: list[object] = [None, None, None, None, None]
_CACHE_LIMIT = 64


def get_context(
    model: ModelSpec, cluster: Cluster, workload: Workload, profile: Profile
) -> Context:
    """The cached Context of these four; identity check first, so a study's loop pays nothing."""
    last = _LAST
    if last[0] is model and last[1] is cluster and last[2] is workload and last[3] is profile:
        return last[4]  # type: ignore[return-value]
    key = (model, cluster, workload, profile)
    ctx = _CACHE.get(key)
    if ctx is None:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        ctx = _CACHE[key] = Context(
            model=model, cluster=cluster, workload=workload, profile=profile
        )
    last[:] = [model, cluster, workload, profile, ctx]
    return ctx
