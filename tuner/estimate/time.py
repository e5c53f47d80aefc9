"""Seconds of each phase of one RL step: generation, old/ref log-prob, actor update, reshard.

Every phase is built from the same few pieces, each a datasheet rate times a Profile efficiency:
GEMMs (a soft roofline: FLOPs at the GEMM rate plus bytes at the HBM rate), flash attention,
elementwise memory traffic, NCCL collectives (bytes over NVLink or the network plus a latency),
PCIe copies, and host time (Python and kernel launches that the GPU waits for). Per micro-batch
costs are linear in its tokens, so a layout's coefficients are computed once and cached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.estimate.context import (
    BF16,
    DECODE_KERNELS_DENSE_LAYER,
    DECODE_KERNELS_MOE_EXTRA,
    EULER_GAMMA,
    FP32,
    PERMUTE_PASSES,
    VLLM_MAX_NUM_SEQS,
    Context,
    get_context,
)
from tuner.estimate.memory import kv_cache_bytes, params_local
from tuner.estimate.profile import Profile
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.space import Candidate
from tuner.workload import Workload

GROUPED_GEMM_TILE_ROWS = 64
"""Rows wasted per expert on average by a grouped GEMM whose tiles are 128 rows tall."""
CP_HOST_PER_STEP = 0.15
"""Transformer Engine's ring attention runs a Python loop of cp steps in every layer, forward and
backward: each extra step costs about this fraction of a layer's host time."""
OPTIMIZER_BYTES_PER_SHARD_PARAM = 36
"""Adam step on a distributed-optimizer shard: read grad, read/write fp32 master and both
moments, write the bf16 copy."""
BUCKET_PARAMS = 40e6
"""Megatron's gradient bucket size (parameters): one reduce-scatter and one all-gather each."""
HOST_FORWARD_SHARE = 0.7
"""Share of a layer's host time spent in the forward (Python module calls); the backward runs
in the autograd engine's C++ loop. Recompute repeats the forward share."""
RESHARD_FIXED_S = 1.0
"""Weight sync fixed cost: waking vLLM's memory, resetting its cache, the controller round trips."""
RESHARD_COLLECTIVES_PER_TENSOR = 4
"""Collectives verl issues per weight tensor when it gathers the actor's shards for vLLM."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseTimes:
    generation_s: float
    old_log_prob_s: float
    ref_s: float
    update_actor_s: float
    reshard_s: float
    update_flops: float
    """Model FLOPs of the actor update (forward + backward, no recompute), all GPUs."""
    bottleneck: str
    critic_s: float = 0.0
    """PPO: critic value pass plus critic update (0 for GRPO/DAPO)."""
    n_micro_update: float = 1.0
    """Micro-batches per mini-batch on one DP rank in the update."""
    offload_s: float = 0.0
    """PCIe time of offload/onload inside the phases above."""

    @property
    def step_s(self) -> float:
        return (
            self.generation_s
            + self.old_log_prob_s
            + self.ref_s
            + self.update_actor_s
            + self.reshard_s
            + self.critic_s
        )


# --------------------------------------------------------------------------------------------
# Training-side coefficients of one layout: time of a micro-batch = slope * tokens + intercept
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Lin:
    """Per-layer (and per-head) costs of one layout, linear in tokens per GPU per micro-batch."""

    fwd_slope: float
    fwd_icpt: float
    bwd_slope: float
    bwd_icpt: float
    core_fwd_slope: float
    """Attention core forward alone (what selective recompute repeats)."""
    head_fwd_slope: float
    head_fwd_icpt: float
    head_bwd_slope: float
    head_bwd_icpt: float
    p2p_slope: float
    p2p_icpt: float
    """Pipeline send+receive of one micro-batch's boundary activations (one direction)."""


def _bandwidth_between(ctx: Context, span: int) -> float:
    """Collective bandwidth of a group of `span` consecutive ranks (inside a node or not)."""
    return ctx.nvlink if span <= ctx.local_gpus else ctx.internode


def _layout_lin(ctx: Context, tp: int, cp: int, ep: int, etp: int, sp: bool, world: int) -> _Lin:
    key = (tp, cp, ep, etp, int(sp), world)
    hit = ctx.layout_cache.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    p = ctx.profile
    h, q, kv, f = ctx.hidden, ctx.q_dim, ctx.kv_dim, ctx.ffn
    gemm_rate = ctx.peak * p.gemm_efficiency
    attn_rate = ctx.peak * p.attention_efficiency
    hbm, lat = ctx.hbm, p.collective_latency_s
    sp_div = tp if sp else 1

    # attention (and dense MLP) GEMMs, per token: FLOPs and activation bytes; weights per micro
    lin_local = (ctx.attn_linear_params + ctx.dense_mlp_params) / tp
    kn = 2 * h + (2 * q + 2 * kv) / tp + ((2 * h + 3 * f / tp) if not ctx.is_moe else 0.0)
    gemm_f = 2 * lin_local / gemm_rate + 2 * kn * BF16 / hbm
    weights_f = lin_local * BF16 / hbm
    weights_b = lin_local * (BF16 + 2 * FP32) / hbm  # dgrad read + fp32 wgrad accumulate r/w
    elem = 2 * (10 * h / sp_div + 2 * (q + kv) / tp + (3 * f / tp if not ctx.is_moe else 0.0))
    elem_f = elem * BF16 / hbm
    core_f = 2 * ctx.seq_eff * q / tp / attn_rate
    core_b = 2.5 * core_f
    # tensor parallel: SP does all-gather/reduce-scatter (4 forward, 6 backward); plain TP does
    # all-reduces (2 forward, 2 backward) that move twice the bytes
    tp_f = tp_b = tp_fi = tp_bi = 0.0
    if tp > 1:
        one = h * BF16 * (tp - 1) / tp / ctx.nvlink
        if sp:
            tp_f, tp_b, tp_fi, tp_bi = 4 * one, 6 * one, 4 * lat, 6 * lat
        else:
            tp_f, tp_b, tp_fi, tp_bi = 4 * one, 4 * one, 2 * lat, 2 * lat
    # context parallel: ring exchange of K/V, overlapped with the attention core it feeds
    cp_f = cp_b = cp_fi = cp_bi = 0.0
    if cp > 1:
        bw = _bandwidth_between(ctx, tp * cp)
        kv_local = max(kv / tp, ctx.head_dim)
        ring = (cp - 1) * 2 * kv_local * BF16 / bw
        cp_f = max(0.0, ring - core_f)
        cp_b = max(0.0, 2 * ring - core_b)
        cp_fi, cp_bi = (cp - 1) * 2 * lat, (cp - 1) * 4 * lat
    host = p.moe_layer_host_s if ctx.is_moe else p.layer_host_s
    host *= 1 + CP_HOST_PER_STEP * (cp - 1)
    host_f, host_b = HOST_FORWARD_SHARE * host, (1 - HOST_FORWARD_SHARE) * host

    fwd_s = gemm_f + elem_f + core_f + tp_f + cp_f
    bwd_s = 2 * gemm_f + 2 * elem_f + core_b + tp_b + cp_b
    fwd_i = weights_f + tp_fi + cp_fi + host_f
    bwd_i = weights_b + tp_bi + cp_bi + host_b

    if ctx.is_moe:
        routed = ctx.topk * etp / tp if (sp and tp > 1) else float(ctx.topk)
        fe = ctx.moe_ffn / etp
        local_experts = ctx.experts / ep
        grouped_rate = gemm_rate * p.grouped_gemm_efficiency
        expert_flops = 2 * routed * 3 * h * fe
        tile = 2 * 3 * h * fe * GROUPED_GEMM_TILE_ROWS * local_experts / grouped_rate
        router = 2 * h * ctx.experts / sp_div / gemm_rate
        act_bytes = routed * (2 * h + 6 * fe) * BF16 / hbm
        perm = routed * h * BF16 / hbm
        w_bytes = local_experts * 3 * h * fe
        moe_f = expert_flops / grouped_rate + act_bytes + router + 4 * perm
        moe_b = 2 * expert_flops / grouped_rate + 2 * act_bytes + 2 * router
        moe_b += (PERMUTE_PASSES - 4) * perm
        a2a_f = a2a_b = a2a_i = 0.0
        if ep > 1:
            vol = routed * h * BF16 * (ep - 1) / ep
            if ep * etp <= ctx.local_gpus:
                one = vol / ctx.nvlink
            else:
                local_ep = max(1, ctx.local_gpus // etp)
                cross = 1 - local_ep / ep
                one = max(vol * (1 - cross) / ctx.nvlink, vol * cross / ctx.internode)
            a2a_f, a2a_b, a2a_i = 2 * one, 2 * one, 2 * lat
        if etp > 1:
            one = h * BF16 * etp / sp_div * (etp - 1) / etp / ctx.nvlink
            a2a_f += 2 * one
            a2a_b += 2 * one
            a2a_i += 2 * lat
        fwd_s += moe_f + a2a_f
        bwd_s += moe_b + a2a_b
        fwd_i += tile + w_bytes * BF16 / hbm + a2a_i
        bwd_i += 2 * tile + w_bytes * (BF16 + 2 * FP32) / hbm + a2a_i

    # output layer and the log-prob/loss over the vocabulary (fused kernels: read once)
    head_local = ctx.head_or_embed() / tp
    head_f = 2 * head_local / gemm_rate + 2 * (h + ctx.vocab / tp) * BF16 / hbm
    head_b = 2 * head_f
    head_wi = head_local * BF16 / hbm
    tp_head = 3 * lat if tp > 1 else 0.0

    pp_span = world  # pipeline neighbours are world/pp ranks apart: inside a node only if all are
    p2p = h * BF16 / sp_div / _bandwidth_between(ctx, pp_span)
    lin = _Lin(
        fwd_slope=fwd_s,
        fwd_icpt=fwd_i,
        bwd_slope=bwd_s,
        bwd_icpt=bwd_i,
        core_fwd_slope=core_f,
        head_fwd_slope=head_f,
        head_fwd_icpt=head_wi + tp_head,
        head_bwd_slope=head_b,
        head_bwd_icpt=head_wi * 5 + tp_head,
        p2p_slope=p2p,
        p2p_icpt=lat,
    )
    ctx.layout_cache[key] = lin
    return lin


def _logits_slope(ctx: Context, tp: int, fused: bool) -> float:
    """Extra seconds per token for full-vocabulary logits in memory (no fused kernels)."""
    if fused:
        return 0.0
    return ctx.vocab / tp * (BF16 + 2 * FP32) * 2 / ctx.hbm


# --------------------------------------------------------------------------------------------
# Generation (vLLM, colocated; one engine per rollout-TP group)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Gen:
    seconds: float
    concurrency: float
    """Sequences one engine runs at once in its busy phase."""
    kv_tokens: float
    """KV-cache capacity of one engine, tokens."""


def _decode_step_s(ctx: Context, rtp: int, batch: float, context_len: float) -> float:
    """One vLLM decode step of `batch` sequences whose mean context is `context_len`: the GPU
    streams weights and KV cache or computes, whichever is longer (eager launches can also bound
    it), then TP all-reduces, then the engine's host work."""
    p = ctx.profile
    dense_w = (ctx.total_params - ctx.expert_params_total) * BF16 / rtp
    expert_w = ctx.expert_params_total * BF16 / rtp
    if ctx.is_moe:
        touched = 1.0 - (1.0 - ctx.topk / ctx.experts) ** max(batch, 1.0)
        expert_w *= touched
    kv_heads_local = max(1.0, ctx.kv_heads / rtp)
    kv_token = 2 * ctx.layers * kv_heads_local * ctx.head_dim * BF16
    mem = (dense_w + expert_w + batch * context_len * kv_token) / ctx.hbm
    flops = batch * (
        2 * (ctx.layers * ctx.layer_active_linear + ctx.head_or_embed())
        + 4 * ctx.layers * ctx.q_dim * context_len
    )
    comp = flops / rtp / (ctx.peak * p.gemm_efficiency)
    kernels = DECODE_KERNELS_DENSE_LAYER + (DECODE_KERNELS_MOE_EXTRA if ctx.is_moe else 0)
    launch = ctx.layers * kernels * p.decode_launch_s
    gpu = max(mem, comp, launch)
    comm = 0.0
    if rtp > 1:
        per = batch * ctx.hidden * BF16 * 2 * (rtp - 1) / rtp / ctx.nvlink
        comm = 2 * ctx.layers * (p.collective_latency_s + per)
    host = p.decode_step_overhead_s + batch * p.decode_seq_overhead_s
    return gpu + comm + host


DRAIN_SEGMENTS = 48
"""Pieces the decode tail is integrated over."""


def _generation(ctx: Context, rtp: int, util: float, mnbt: int, kv_bytes: float) -> _Gen:
    """Seconds the slowest engine needs for its share of the batch.

    Response lengths are exponential with scale θ, capped at the maximum. An engine runs its
    sequences with concurrency C = min(its share, max_num_seqs, KV capacity / mean context);
    while sequences wait it makes C tokens per step, then the last C drain: the active count
    decays as C·e^(-t/θ) and the slowest engine runs until the longest response of the batch,
    about θ(ln N + γ) steps or the cap."""
    key = (rtp, util, mnbt)
    hit = ctx.generation_cache.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    engines = max(1, ctx.cluster.num_gpus // rtp)
    share = ctx.samples / engines
    kv_heads_local = max(1.0, ctx.kv_heads / rtp)
    kv_token = 2 * ctx.layers * kv_heads_local * ctx.head_dim * BF16
    kv_tokens = max(0.0, kv_bytes) / kv_token
    if kv_tokens < ctx.max_seq:
        gen = _Gen(math.inf, 0.0, kv_tokens)
        ctx.generation_cache[key] = gen
        return gen
    theta, cap = ctx.theta, ctx.response_max
    prompt, mean = ctx.prompt_mean, ctx.response_mean
    conc = min(share, float(VLLM_MAX_NUM_SEQS), float(mnbt), kv_tokens / (prompt + mean))
    conc = max(conc, 1.0)
    seconds = 0.0
    if share > conc:  # the busy phase: C sequences, C tokens per step
        steps = max(0.0, share * mean / conc - mean)
        seconds += steps * _decode_step_s(ctx, rtp, conc, prompt + mean)
    longest = min(float(cap), theta * (math.log(max(2.0, conc * engines)) + EULER_GAMMA))
    seg = longest / DRAIN_SEGMENTS
    for i in range(DRAIN_SEGMENTS):
        t = (i + 0.5) * seg
        active = max(1.0, conc * math.exp(-t / theta))
        seconds += seg * _decode_step_s(ctx, rtp, active, prompt + t)
    # prefill of the engine's prompts (chunked into the decode steps, compute-bound)
    p = ctx.profile
    prefill_flops = (
        share
        * prompt
        * (
            2 * (ctx.layers * ctx.layer_active_linear + ctx.head_or_embed())
            + 2 * ctx.layers * ctx.q_dim * prompt
        )
    )
    seconds += prefill_flops / rtp / (ctx.peak * p.gemm_efficiency)
    gen = _Gen(seconds, conc, kv_tokens)
    ctx.generation_cache[key] = gen
    return gen


# --------------------------------------------------------------------------------------------
# One step
# --------------------------------------------------------------------------------------------


def phase_times_of(ctx: Context, c: Candidate) -> PhaseTimes:
    """Seconds of each phase for candidate `c` (the per-candidate hot path)."""
    lay = c.layout
    p = ctx.profile
    tp, pp, vpp, cp, dp = lay.tp, lay.pp, lay.vpp, lay.cp, lay.dp
    lin = _layout_lin(ctx, tp, cp, lay.ep, lay.etp, c.sequence_parallel, lay.world)
    layers_stage = ctx.layers / pp
    minis = ctx.minis

    # --- actor update: micro-batches of the slowest DP rank in each mini-batch
    rank_mini = ctx.tokens_step / (dp * minis)
    samples_rank = ctx.samples / (dp * minis)
    if dp > 1:
        # verl balances each mini-batch's samples over the DP ranks by tokens; what is left is
        # the granularity of one sample, and the slowest rank sets the pace
        rank_mini += ctx.seq_mean
    if c.use_dynamic_bsz:
        n_micro = math.ceil(rank_mini / (max(1, c.ppo_max_token_len_per_gpu) * cp))
    else:
        n_micro = math.ceil(samples_rank / max(1, c.ppo_micro_batch_size_per_gpu))
    n_micro = max(1, n_micro)
    if vpp > 1 and n_micro % pp:
        n_micro += pp - n_micro % pp
    tok = rank_mini / (n_micro * cp)
    logit = _logits_slope(ctx, tp, c.use_fused_kernels)
    fwd = layers_stage * (lin.fwd_slope * tok + lin.fwd_icpt)
    bwd = layers_stage * (lin.bwd_slope * tok + lin.bwd_icpt)
    head = (lin.head_fwd_slope + lin.head_bwd_slope + logit) * tok
    head += lin.head_fwd_icpt + lin.head_bwd_icpt
    if c.recompute_granularity == "full":
        if c.recompute_method == "block":
            frac = min(1.0, c.recompute_num_layers * vpp / layers_stage)
        else:
            frac = 1.0
        recompute = frac * fwd
    elif c.recompute_granularity == "selective":
        recompute = layers_stage * lin.core_fwd_slope * tok
    else:
        recompute = 0.0
    p2p = 0.0
    if pp > 1:
        p2p = 2 * vpp * (lin.p2p_slope * tok + lin.p2p_icpt)
    micro = fwd + bwd + head + recompute + p2p
    bubble = (pp - 1) / vpp if pp > 1 else 0.0
    per_mini = (n_micro + bubble) * micro

    # optimizer step: grads reduce-scattered (fp32), params all-gathered (bf16), Adam on the shard
    dense, expert = params_local(ctx, lay)
    edp = lay.world // (pp * lay.ep * lay.etp)
    dp_bw = ctx.nvlink if lay.world // pp <= ctx.local_gpus else ctx.internode
    g = dp * cp
    comm = 0.0
    if g > 1:
        comm += (FP32 + BF16) * dense * (g - 1) / g / dp_bw
    if edp > 1 and expert:
        comm += (FP32 + BF16) * expert * (edp - 1) / edp / dp_bw
    comm += 2 * (dense + expert) / BUCKET_PARAMS * p.collective_latency_s
    shard = dense / g + (expert / edp if expert else 0.0)
    adam = (shard * OPTIMIZER_BYTES_PER_SHARD_PARAM + (dense + expert) * 2 * FP32) / ctx.hbm
    per_mini += comm + adam

    weights_b = (dense + expert) * BF16
    grads_b = (dense + expert) * FP32
    optim_b = 3 * FP32 * shard
    moved = 0.0
    if c.param_offload:
        moved += weights_b
    if c.grad_offload:
        moved += grads_b
    if c.optimizer_offload:
        moved += optim_b
    upd_offload = 2 * moved / ctx.pcie
    ship = 1.0 / (p.controller_gb_s * 1e9)
    update = minis * per_mini + upd_offload + ctx.batch_bytes_update * ship

    # --- log-prob passes: each rank's whole share, balanced across ranks by verl
    rank_tokens = ctx.tokens_step / dp
    if c.use_dynamic_bsz:
        n_lp = math.ceil(rank_tokens / (max(1, c.log_prob_max_token_len_per_gpu) * cp))
    else:
        n_lp = math.ceil(ctx.samples / dp / max(1, c.log_prob_micro_batch_size_per_gpu))
    n_lp = max(1, n_lp)
    tok_lp = rank_tokens / (n_lp * cp)
    lp_micro = layers_stage * (lin.fwd_slope * tok_lp + lin.fwd_icpt)
    lp_micro += (lin.head_fwd_slope + logit / 2) * tok_lp + lin.head_fwd_icpt
    if pp > 1:
        lp_micro += vpp * (lin.p2p_slope * tok_lp + lin.p2p_icpt)
    lp_offload = 2 * weights_b / ctx.pcie if c.param_offload else 0.0
    log_prob = (n_lp + (pp - 1)) * lp_micro + lp_offload + ctx.batch_bytes_log_prob * ship
    ref = log_prob if ctx.uses_ref else 0.0
    critic = (update + log_prob) if ctx.has_critic else 0.0

    # --- weight sync to vLLM
    rtp = c.rollout_tp
    w_total = ctx.total_params * BF16
    span = tp * pp * lay.ep
    reshard = RESHARD_FIXED_S + w_total / rtp / _bandwidth_between(ctx, span)
    experts_tensors = 3 * ctx.experts if ctx.is_moe else 0
    tensors = ctx.layers * (10 + experts_tensors) + 2
    reshard += tensors * RESHARD_COLLECTIVES_PER_TENSOR * p.collective_latency_s
    reshard += 2 * w_total / rtp / ctx.hbm
    if c.param_offload:
        reshard += 2 * weights_b / ctx.pcie

    # --- generation
    mnbt = c.max_num_batched_tokens or ctx.max_seq
    gen = _generation(ctx, rtp, c.gpu_memory_utilization, mnbt, kv_cache_bytes(ctx, c)).seconds
    gen += ctx.batch_bytes_generation * ship

    flops = ctx.tokens_step * ctx.forward_flops_per_token() * 3
    lp_total = log_prob + ref
    if gen >= lp_total and gen >= update and gen >= critic:
        bottleneck = "generation"
    elif update >= lp_total and update >= critic:
        bottleneck = "update_actor"
    elif lp_total >= critic:
        bottleneck = "log_prob"
    else:
        bottleneck = "critic"
    offload = upd_offload + lp_offload * (2 if ctx.uses_ref else 1)
    return PhaseTimes(
        generation_s=gen,
        old_log_prob_s=log_prob,
        ref_s=ref,
        update_actor_s=update,
        reshard_s=reshard,
        update_flops=flops,
        bottleneck=bottleneck,
        critic_s=critic,
        n_micro_update=float(n_micro),
        offload_s=offload,
    )


def phase_times(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload, p: Profile) -> PhaseTimes:
    """Seconds of each phase of one step for candidate `c`."""
    return phase_times_of(get_context(m, cl, w, p), c)
