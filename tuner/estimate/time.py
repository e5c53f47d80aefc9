"""Seconds of each phase of one RL step: old/ref log-prob, actor update, reshard, and the step
(generation's seconds come from estimate/generation.py).

Every phase is built from the same few pieces, each a datasheet rate times a Profile efficiency:
GEMMs (a soft roofline: FLOPs at the GEMM rate plus bytes at the HBM rate), flash attention,
elementwise memory traffic, NCCL collectives (bytes over NVLink or the network plus a latency),
PCIe copies, and host time (Python and kernel launches that the GPU waits for). Per micro-batch
costs are linear in its tokens, so a layout's coefficients are computed once and cached; how many
micro-batches a pass runs and their tokens come from estimate/micro_batches.py, the model the
memory model reads too.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.estimate.context import (
    BF16,
    FP32,
    PERMUTE_PASSES,
    Context,
    bandwidth_between,
    get_context,
)
from tuner.estimate.generation import VLLM_ASYNC_SCHEDULING, generation
from tuner.estimate.logits import DEFAULT_VERL, LOGIT_TRAFFIC_BYTES
from tuner.estimate.memo import memoized
from tuner.estimate.memory import (
    local_norms,
    params_local,
    separate_norms,
)
from tuner.estimate.micro_batches import micro_batches
from tuner.estimate.profile import Profile
from tuner.estimate.rollout_memory import kv_cache_bytes
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.space import Candidate, modules_of
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
ROPE_UNFUSED_PASSES = 6
"""Memory passes over q and k of an unfused RoPE (cos/sin products, rotate-half, add), forward;
the backward does the same. The fused kernel reads and writes them once inside attention."""
ROPE_THD_OPS_PER_SEQUENCE = 13
"""PyTorch ops an unfused RoPE runs per packed sequence, for q and again for k, in every layer:
megatron-core 0.19.2's `_apply_rotary_pos_emb_thd` (megatron/core/models/common/embeddings/
rope_utils.py) loops in Python over the micro-batch's sequences, each running
`_apply_rotary_pos_emb_bshd` (cos and sin of its frequencies, each scaled and cast, the two
products, rotate-half's negation and concatenation, the sum, the final concatenation) and a copy
into the output: 13 ops, one more under context parallelism (its frequency slices are
concatenated). The loop starts with `.tolist()` and `.item()` on device tensors, so the GPU has
drained and waits while the host runs it; the backward's autograd nodes are as many, and the QKV
weight-gradient GEMM waits on them. The fused kernel is one launch for the whole micro-batch."""
TORCH_OP_HOST_S = 6e-6
"""Host time of one small PyTorch eager op: the Python call, the dispatcher, TensorIterator set-up
and cudaLaunchKernel (the GPU work of these per-sequence ops is negligible)."""
SWIGLU_UNFUSED_PASSES = 4
"""Extra memory passes over the MLP intermediate when bias + SwiGLU are not fused (read gate and
up separately, write the product, read it again), forward; twice that backward."""
SCORE_PASSES_FUSED_SOFTMAX = 3
"""Memory passes over the attention score matrix of the unfused/local backends per forward
with the fused scale-mask-softmax (write scores, softmax in place, read for the values)."""
SCORE_PASSES_UNFUSED_SOFTMAX = 6
"""The same with scale, mask and softmax as separate kernels."""
PERMUTE_PASSES_UNFUSED = 24
"""PERMUTE_PASSES without moe_permute_fusion: index computation, gather/scatter and their
backward as separate kernels, each pass twice."""
SEQUENTIAL_EXPERT_LAUNCH_S = 30e-6
"""Host time per local expert per GEMM when moe_grouped_gemm is off (a Python loop of small
GEMMs: launch plus the per-expert slicing), forward; the backward launches twice as many."""


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
    """Attention core forward alone (selective recompute of core_attn repeats it)."""
    norm_fwd_slope: float
    """The two layer norms' forward (recompute module layernorm)."""
    mlp_fwd_slope: float
    """Dense MLP forward (recompute module mlp)."""
    moe_fwd_slope: float
    """MoE block forward with its dispatch (recompute module moe)."""
    moe_act_fwd_slope: float
    """Expert activation forward (recompute module moe_act)."""
    head_fwd_slope: float
    head_fwd_icpt: float
    head_bwd_slope: float
    head_bwd_icpt: float
    p2p_slope: float
    p2p_icpt: float
    """Pipeline send+receive of one micro-batch's boundary activations (one direction)."""


def busiest_rank_load(imbalance: float, experts: int, ep: int) -> float:
    """The busiest expert-parallel rank's routed tokens over the mean rank's, where the busiest
    expert takes `imbalance` times the mean expert's tokens (Workload.expert_imbalance) and the
    other E - 1 share the rest evenly: that expert and E/ep - 1 of the others on one rank, so
    (imbalance + (E/ep - 1) * (E - imbalance) / (E - 1)) * ep / E. It is 1 at ep 1 (one GPU
    holds every expert: the grouped GEMM's rows add up the same however they are routed),
    `imbalance` where each rank holds one expert, and exactly 1 where imbalance is 1, the
    balance the cost model assumed before it had the setting."""
    if imbalance == 1.0 or experts <= 1:
        return 1.0
    local = experts / ep
    return (imbalance + (local - 1) * (experts - imbalance) / (experts - 1)) / local


def _layout_lin(ctx: Context, candidate: Candidate) -> _Lin:
    """A layer's time per token (slope) and per micro-batch (intercept) of each part, for the
    candidate's layout and kernels: memoized in the context by the fields it reads
    (memo.memoized), as every micro-batch of every phase asks."""
    return memoized(
        ctx.layout_cache,
        ("layout_lin",),
        candidate,
        lambda reading: _compute_layout_lin(ctx, reading),
    )


def _compute_layout_lin(ctx: Context, candidate: Candidate) -> _Lin:
    layout = candidate.layout
    tp, cp, ep, etp, sequence_parallel, world = (
        layout.tp,
        layout.cp,
        layout.ep,
        layout.etp,
        candidate.sequence_parallel,
        layout.world,
    )
    profile = ctx.profile
    h, q, kv, f = ctx.hidden, ctx.q_dim, ctx.kv_dim, ctx.ffn
    gemm_rate = ctx.peak * profile.gemm_efficiency
    attn_rate = ctx.peak * profile.attention_efficiency
    hbm, lat = ctx.hbm, profile.collective_latency_s
    sp_div = tp if sequence_parallel else 1

    # attention (and dense MLP) GEMMs, per token: FLOPs and activation bytes; weights per micro.
    # Above the kv heads megatron-core gives each rank a replica of its kv group, so the K/V
    # projections and their activations stop shrinking with tp (replicated KV work).
    kv_local = max(kv / tp, float(ctx.head_dim))
    lin_local = (2 * h * q + ctx.dense_mlp_params) / tp + 2 * h * kv_local
    kn = 2 * h + 2 * q / tp + 2 * kv_local + ((2 * h + 3 * f / tp) if not ctx.is_moe else 0.0)
    gemm_f = 2 * lin_local / gemm_rate + 2 * kn * BF16 / hbm
    weights_f = lin_local * BF16 / hbm
    weights_b = lin_local * (BF16 + 2 * FP32) / hbm  # dgrad read + fp32 wgrad accumulate r/w
    elem = 2 * (10 * h / sp_div + 2 * (q / tp + kv_local) + (3 * f / tp if not ctx.is_moe else 0.0))
    if not candidate.apply_rope_fusion:
        elem += ROPE_UNFUSED_PASSES * (q / tp + kv_local)
    if not candidate.bias_activation_fusion and not ctx.is_moe:
        elem += SWIGLU_UNFUSED_PASSES * 2 * f / tp
    elem_f = elem * BF16 / hbm
    core_f = 2 * ctx.seq_eff * q / tp / attn_rate
    if candidate.attention_backend in ("unfused", "local"):
        # scores materialised: GEMMs at the GEMM rate plus passes over the s x s matrix
        passes = (
            SCORE_PASSES_FUSED_SOFTMAX
            if candidate.masked_softmax_fusion
            else SCORE_PASSES_UNFUSED_SOFTMAX
        )
        core_f = 2 * ctx.seq_eff * q / tp / gemm_rate
        core_f += passes * ctx.heads / tp * ctx.seq_eff / 2 * BF16 / hbm
    core_b = 2.5 * core_f
    norm_f = 4 * h / sp_div * BF16 / hbm
    mlp_f = (
        (2 * 3 * h * f / tp / gemm_rate + 2 * 3 * f / tp * BF16 / hbm) if not ctx.is_moe else 0.0
    )
    # tensor parallel: SP does all-gather/reduce-scatter (4 forward, 6 backward); plain TP does
    # all-reduces (2 forward, 2 backward) that move twice the bytes
    tp_f = tp_b = tp_fi = tp_bi = 0.0
    if tp > 1:
        one = h * BF16 * (tp - 1) / tp / bandwidth_between(ctx, tp)
        if sequence_parallel:
            tp_f, tp_b, tp_fi, tp_bi = 4 * one, 6 * one, 4 * lat, 6 * lat
        else:
            tp_f, tp_b, tp_fi, tp_bi = 4 * one, 4 * one, 2 * lat, 2 * lat
    # context parallel: ring exchange of K/V, overlapped with the attention core it feeds
    cp_f = cp_b = cp_fi = cp_bi = 0.0
    if cp > 1:
        bw = bandwidth_between(ctx, tp * cp)
        kv_local = max(kv / tp, ctx.head_dim)
        ring = (cp - 1) * 2 * kv_local * BF16 / bw
        cp_f = max(0.0, ring - core_f)
        cp_b = max(0.0, 2 * ring - core_b)
        cp_fi, cp_bi = (cp - 1) * 2 * lat, (cp - 1) * 4 * lat
    host = profile.moe_layer_host_s if ctx.is_moe else profile.layer_host_s
    host *= 1 + CP_HOST_PER_STEP * (cp - 1)
    host_f, host_b = HOST_FORWARD_SHARE * host, (1 - HOST_FORWARD_SHARE) * host

    fwd_s = gemm_f + elem_f + core_f + tp_f + cp_f
    bwd_s = 2 * gemm_f + 2 * elem_f + core_b + tp_b + cp_b
    if not candidate.apply_rope_fusion:
        # the per-sequence loop for q and k; a GPU's micro-batch of t tokens holds t·cp/seq_mean
        # sequences (each CP rank keeps a slice of every sequence)
        ops = ROPE_THD_OPS_PER_SEQUENCE + (1 if cp > 1 else 0)
        rope_host = 2 * ops * TORCH_OP_HOST_S * cp / ctx.seq_mean
        fwd_s += rope_host
        bwd_s += rope_host
    fwd_i = weights_f + tp_fi + cp_fi + host_f
    bwd_i = weights_b + tp_bi + cp_bi + host_b
    if not candidate.gradient_accumulation_fusion:
        bwd_i += lin_local * 2 * FP32 / hbm  # wgrad written, then added into the fp32 main grad
    moe_fwd = act_fwd = 0.0

    if ctx.is_moe:
        routed = ctx.topk * etp / tp if (sequence_parallel and tp > 1) else float(ctx.topk)
        fe = ctx.moe_ffn / etp
        local_experts = ctx.experts / ep
        grouped_rate = gemm_rate * profile.grouped_gemm_efficiency
        # the busiest expert-parallel rank sets the pace (the all-to-all waits for it)
        busiest = routed * busiest_rank_load(ctx.expert_imbalance, ctx.experts, ep)
        expert_flops = 2 * busiest * 3 * h * fe
        tile = 2 * 3 * h * fe * GROUPED_GEMM_TILE_ROWS * local_experts / grouped_rate
        router = 2 * h * ctx.experts / sp_div / gemm_rate
        act_bytes = busiest * (2 * h + 6 * fe) * BF16 / hbm
        perm = routed * h * BF16 / hbm
        w_bytes = local_experts * 3 * h * fe
        if not candidate.bias_activation_fusion:
            act_bytes += busiest * SWIGLU_UNFUSED_PASSES * 2 * fe * BF16 / hbm
        passes = PERMUTE_PASSES if candidate.moe_permute_fusion else PERMUTE_PASSES_UNFUSED
        moe_f = expert_flops / grouped_rate + act_bytes + router + passes / 3 * perm
        moe_b = 2 * expert_flops / grouped_rate + 2 * act_bytes + 2 * router
        moe_b += passes * 2 / 3 * perm
        if not candidate.moe_grouped_gemm:
            tile = 0.0
            fwd_i += local_experts * 3 * SEQUENTIAL_EXPERT_LAUNCH_S
            bwd_i += local_experts * 6 * SEQUENTIAL_EXPERT_LAUNCH_S
        a2a_f = a2a_b = a2a_i = 0.0
        if ep > 1:
            vol = busiest * h * BF16 * (ep - 1) / ep  # the busiest rank's receive
            if candidate.moe_token_dispatcher_type == "allgather":
                vol = h * BF16 * (ep - 1) / sp_div  # every rank gathers every token
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
        if not candidate.gradient_accumulation_fusion:
            bwd_i += w_bytes * 2 * FP32 / hbm
        moe_fwd = moe_f + a2a_f
        act_fwd = act_bytes / 2

    # output layer and the log-prob/loss over the vocabulary (fused kernels: read once)
    head_local = ctx.head_or_embed() / tp
    head_f = 2 * head_local / gemm_rate + 2 * (h + ctx.vocab / tp) * BF16 / hbm
    head_b = 2 * head_f
    head_wi = head_local * BF16 / hbm
    tp_head = 3 * lat if tp > 1 else 0.0

    pp_span = world  # pipeline neighbours are world/pp ranks apart: inside a node only if all are
    p2p = h * BF16 / sp_div / bandwidth_between(ctx, pp_span)
    lin = _Lin(
        fwd_slope=fwd_s,
        fwd_icpt=fwd_i,
        bwd_slope=bwd_s,
        bwd_icpt=bwd_i,
        core_fwd_slope=core_f,
        norm_fwd_slope=norm_f,
        mlp_fwd_slope=mlp_f,
        moe_fwd_slope=moe_fwd,
        moe_act_fwd_slope=act_fwd,
        head_fwd_slope=head_f,
        head_fwd_icpt=head_wi + tp_head,
        head_bwd_slope=head_b,
        head_bwd_icpt=head_wi * 5 + tp_head,
        p2p_slope=p2p,
        p2p_icpt=lat,
    )
    return lin


def _logits_slope(ctx: Context, tp: int, fused: bool, bytes_per_logit: int) -> float:
    """Extra seconds per token for full-vocabulary logits in memory (no fused kernels):
    `bytes_per_logit` (the phase's LOGIT_TRAFFIC_BYTES, estimate/logits.py) over this rank's
    vocab shard at the HBM rate."""
    if fused:
        return 0.0
    return ctx.vocab / tp * bytes_per_logit / ctx.hbm


# --------------------------------------------------------------------------------------------
# One step
# --------------------------------------------------------------------------------------------


def bottleneck_of(generation_s: float, log_prob_s: float, update_s: float, critic_s: float) -> str:
    """The step's longest phase (log_prob: old log-probs and the reference pass together); ties
    go to the earlier phase of the step."""
    if generation_s >= log_prob_s and generation_s >= update_s and generation_s >= critic_s:
        return "generation"
    if update_s >= log_prob_s and update_s >= critic_s:
        return "update_actor"
    return "log_prob" if log_prob_s >= critic_s else "critic"


def phase_times_of(
    ctx: Context,
    candidate: Candidate,
    verl_logits: str = DEFAULT_VERL,
    async_scheduling: bool = VLLM_ASYNC_SCHEDULING,
) -> PhaseTimes:
    """Seconds of each phase for `candidate` (the per-candidate hot path); `verl_logits`: the
    verl release whose full-logits passes are counted (estimate/logits.py); `async_scheduling`:
    vLLM overlaps each decode step's host work with the GPU (generation.VLLM_ASYNC_SCHEDULING)."""
    logit_bytes = LOGIT_TRAFFIC_BYTES[verl_logits]
    layout = candidate.layout
    profile = ctx.profile
    tp, pp, vpp, cp, dp = layout.tp, layout.pp, layout.vpp, layout.cp, layout.dp
    lin = _layout_lin(ctx, candidate)
    # the slowest pipeline stage sets the pace (uneven splits: the largest stage)
    layers_stage = max(layout.stage_layers(ctx.layers)) if layout.uneven else ctx.layers / pp
    minis = ctx.minis

    # --- actor update: micro-batches of the slowest DP rank in each mini-batch (its mean share)
    upd_batches = micro_batches(ctx, candidate, log_prob=False)
    n_micro, tok = upd_batches.count, upd_batches.mean_tokens
    logit = _logits_slope(ctx, tp, candidate.use_fused_kernels, logit_bytes["update_actor"])
    fwd = layers_stage * (lin.fwd_slope * tok + lin.fwd_icpt)
    bwd = layers_stage * (lin.bwd_slope * tok + lin.bwd_icpt)
    head = (lin.head_fwd_slope + lin.head_bwd_slope + logit) * tok
    head += lin.head_fwd_icpt + lin.head_bwd_icpt
    if candidate.recompute_granularity == "full":
        if candidate.recompute_method == "block":
            frac = min(1.0, candidate.recompute_num_layers * vpp / layers_stage)
        else:
            frac = 1.0
        recompute = frac * fwd
    elif candidate.recompute_granularity == "selective":
        slope = 0.0
        for module in modules_of(candidate):
            slope += {
                "core_attn": lin.core_fwd_slope,
                # norm_fwd_slope is both norms' forward; only those apart are recomputed
                "layernorm": lin.norm_fwd_slope
                * separate_norms(ctx.is_moe, local_norms(candidate))
                / 2,
                "mlp": lin.mlp_fwd_slope,
                "moe": lin.moe_fwd_slope,
                "moe_act": lin.moe_act_fwd_slope,
            }.get(module, 0.0)
        recompute = layers_stage * slope * tok
    else:
        recompute = 0.0
    p2p = 0.0
    if pp > 1:
        p2p = 2 * vpp * (lin.p2p_slope * tok + lin.p2p_icpt)
    micro = fwd + bwd + head + recompute + p2p
    bubble = (pp - 1) / vpp if pp > 1 else 0.0
    per_mini = (n_micro + bubble) * micro

    # optimizer step: grads reduce-scattered (fp32), params all-gathered (bf16), Adam on the shard
    dense, expert = params_local(ctx, layout)
    expert_dp = layout.expert_dp
    dp_bw = ctx.nvlink if layout.world // pp <= ctx.local_gpus else ctx.internode
    dp_cp = dp * cp
    comm = 0.0
    if dp_cp > 1:
        comm += (FP32 + BF16) * dense * (dp_cp - 1) / dp_cp / dp_bw
    if expert_dp > 1 and expert:
        comm += (FP32 + BF16) * expert * (expert_dp - 1) / expert_dp / dp_bw
    comm += 2 * (dense + expert) / BUCKET_PARAMS * profile.collective_latency_s
    shard = dense / dp_cp + (expert / expert_dp if expert else 0.0)
    adam = (shard * OPTIMIZER_BYTES_PER_SHARD_PARAM + (dense + expert) * 2 * FP32) / ctx.hbm
    per_mini += comm + adam

    weights_b = (dense + expert) * BF16
    grads_b = (dense + expert) * FP32
    optim_b = 3 * FP32 * shard
    moved = 0.0
    if candidate.param_offload:
        moved += weights_b
    if candidate.param_offload:  # verl 0.9.1: param_offload moves the gradient buffers too
        moved += grads_b
    if candidate.optimizer_offload:
        moved += optim_b
    upd_offload = 2 * moved / ctx.pcie
    ship = 1.0 / (profile.controller_gb_s * 1e9)
    update = minis * per_mini + upd_offload + ctx.batch_bytes_update * ship

    # --- log-prob passes: each rank's whole share, balanced across ranks by verl
    lp_batches = micro_batches(ctx, candidate, log_prob=True)
    n_lp, tok_lp = lp_batches.count, lp_batches.mean_tokens
    lp_micro = layers_stage * (lin.fwd_slope * tok_lp + lin.fwd_icpt)
    lp_micro += lin.head_fwd_slope * tok_lp + lin.head_fwd_icpt
    if pp > 1:
        lp_micro += vpp * (lin.p2p_slope * tok_lp + lin.p2p_icpt)
    lp_steps = n_lp + (pp - 1)
    lp_offload = 2 * weights_b / ctx.pcie if candidate.param_offload else 0.0
    lp_fixed = lp_offload + ctx.batch_bytes_log_prob * ship
    # the last stage's logits work: old_log_prob computes the entropy too, the reference pass
    # only the log-probs (trainer/ppo/ray_trainer.py _compute_ref_log_prob)
    fused = candidate.use_fused_kernels
    old_logits = _logits_slope(ctx, tp, fused, logit_bytes["old_log_prob"]) * tok_lp
    log_prob = lp_steps * (lp_micro + old_logits) + lp_fixed
    ref = 0.0
    if ctx.uses_ref:
        ref_logits = _logits_slope(ctx, tp, fused, logit_bytes["ref"]) * tok_lp
        ref = lp_steps * (lp_micro + ref_logits) + lp_fixed
    critic = (update + log_prob) if ctx.has_critic else 0.0

    # --- weight sync to vLLM
    rollout_tp = candidate.rollout_tp
    w_total = ctx.total_params * BF16
    span = tp * pp * layout.ep
    reshard = RESHARD_FIXED_S + w_total / rollout_tp / bandwidth_between(ctx, span)
    experts_tensors = 3 * ctx.experts if ctx.is_moe else 0
    tensors = ctx.layers * (10 + experts_tensors) + 2
    reshard += tensors * RESHARD_COLLECTIVES_PER_TENSOR * profile.collective_latency_s
    reshard += 2 * w_total / rollout_tp / ctx.hbm
    if candidate.param_offload:
        reshard += 2 * weights_b / ctx.pcie

    # --- generation
    max_num_batched_tokens = candidate.max_num_batched_tokens or ctx.max_seq
    gen = generation(
        ctx,
        rollout_tp,
        candidate.rollout_dp,
        candidate.rollout_ep,
        candidate.gpu_memory_utilization,
        max_num_batched_tokens,
        candidate.max_num_seqs,
        kv_cache_bytes(ctx, candidate),
        candidate.enforce_eager,
        async_scheduling,
    ).seconds
    gen += ctx.batch_bytes_generation * ship

    flops = ctx.tokens_step * ctx.forward_flops_per_token() * 3
    bottleneck = bottleneck_of(gen, log_prob + ref, update, critic)
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


def phase_times(
    candidate: Candidate, model: ModelSpec, cluster: Cluster, workload: Workload, profile: Profile
) -> PhaseTimes:
    """Seconds of each phase of one step for `candidate`."""
    return phase_times_of(get_context(model, cluster, workload, profile), candidate)
