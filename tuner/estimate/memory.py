"""Peak memory per GPU in each phase of a colocated verl Megatron + vLLM step."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.estimate.profile import Profile
from tuner.hardware import GIB, Cluster
from tuner.models import ModelSpec
from tuner.space import Candidate
from tuner.workload import Workload

BF16 = 2
FP32 = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdown:
    """GiB per GPU. `peak_gib` is the largest phase total."""

    weights_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    logits_gib: float
    rollout_gib: float
    overhead_gib: float
    generation_peak_gib: float
    log_prob_peak_gib: float
    update_peak_gib: float

    @property
    def peak_gib(self) -> float:
        return max(self.generation_peak_gib, self.log_prob_peak_gib, self.update_peak_gib)

    @property
    def peak_phase(self) -> str:
        peaks = {
            "generation": self.generation_peak_gib,
            "old_log_prob": self.log_prob_peak_gib,
            "update_actor": self.update_peak_gib,
        }
        return max(peaks, key=lambda k: peaks[k])


def params_per_gpu(m: ModelSpec, c: Candidate) -> tuple[float, float]:
    """(dense parameters, expert parameters) held by one GPU of the actor."""
    lay = c.layout
    expert = m.num_layers * m.expert_params_per_layer / (lay.pp * lay.ep * lay.etp)
    dense = (m.num_params - m.num_layers * m.expert_params_per_layer) / (lay.tp * lay.pp)
    return dense, expert


def activation_bytes_per_token_layer(m: ModelSpec, c: Candidate) -> float:
    """Bytes one token keeps for the backward pass in one layer (flash attention: no s^2)."""
    t = c.layout.tp
    h = m.hidden_size
    q = m.num_attention_heads * m.head_dim
    kv = m.num_kv_heads * m.head_dim
    sp_div = t if c.sequence_parallel else 1
    # layer-norm inputs/outputs and residual-width tensors: 4 of width h
    replicated = 4 * h * BF16 / sp_div
    attn = (q + 2 * kv + q) * BF16 / t
    if c.recompute_granularity == "selective":
        attn = (q + 2 * kv) * BF16 / t
    if m.is_moe:
        f = m.moe_ffn_hidden_size
        mlp = m.moe_topk * (h + 3 * f) * BF16 / c.layout.etp
    else:
        mlp = 3 * m.ffn_hidden_size * BF16 / t
    return replicated + attn + mlp


def micro_batch_tokens(c: Candidate, w: Workload, log_prob: bool = False) -> float:
    """Tokens one GPU holds in one micro-batch."""
    if c.use_dynamic_bsz:
        budget = c.log_prob_max_token_len_per_gpu if log_prob else c.ppo_max_token_len_per_gpu
        return float(budget)
    mbs = c.log_prob_micro_batch_size_per_gpu if log_prob else c.ppo_micro_batch_size_per_gpu
    return mbs * w.max_seq_len / c.layout.cp


def memory(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload, p: Profile) -> MemoryBreakdown:
    lay = c.layout
    dense, expert = params_per_gpu(m, c)
    n_local = dense + expert
    weights = n_local * BF16
    grads = n_local * FP32
    # distributed optimizer: fp32 master + two Adam moments, sharded over data parallel
    optim = 3 * FP32 * (dense / (lay.dp * lay.cp) + expert / lay.expert_dp)

    tokens = micro_batch_tokens(c, w)
    layers_per_stage = m.num_layers / lay.pp
    per_layer = activation_bytes_per_token_layer(m, c)
    in_flight = min(lay.pp, 1 + (lay.pp - 1) * (1 + 1 / lay.vpp)) if lay.pp > 1 else 1
    if c.recompute_granularity == "full":
        kept = layers_per_stage * m.hidden_size * BF16 / (lay.tp if c.sequence_parallel else 1)
        acts = tokens * (kept * in_flight + per_layer)
    else:
        acts = tokens * per_layer * layers_per_stage * in_flight
    vocab_local = m.vocab_size / lay.tp
    logits_update = 0.0 if c.use_fused_kernels else tokens * vocab_local * (BF16 + 2 * FP32)
    lp_tokens = micro_batch_tokens(c, w, log_prob=True)
    logits_lp = lp_tokens * vocab_local * (BF16 + FP32) if not c.use_fused_kernels else 0.0
    lp_acts = lp_tokens * 4 * m.hidden_size * BF16 / (lay.tp if c.sequence_parallel else 1)

    frag = 1 + p.fragmentation
    ctx = p.context_gib * GIB
    resident = (
        (0 if c.param_offload else weights)
        + (0 if c.grad_offload else grads)
        + (0 if c.optimizer_offload else optim)
    )
    rollout = c.gpu_memory_utilization * cl.gpu.memory_gib * GIB
    gen_peak = rollout + resident + ctx
    lp_peak = (
        weights + (resident - (0 if c.param_offload else weights)) + lp_acts + logits_lp
    ) * frag + ctx
    upd_peak = (weights + grads + optim + acts + logits_update) * frag + ctx
    g = GIB
    return MemoryBreakdown(
        weights_gib=weights / g,
        grads_gib=grads / g,
        optimizer_gib=optim / g,
        activations_gib=acts / g,
        logits_gib=max(logits_update, logits_lp) / g,
        rollout_gib=rollout / g,
        overhead_gib=ctx / g,
        generation_peak_gib=gen_peak / g,
        log_prob_peak_gib=lp_peak / g,
        update_peak_gib=upd_peak / g,
    )
