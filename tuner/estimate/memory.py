"""Peak memory per GPU in each phase of a colocated verl Megatron + vLLM step.

The phases share one GPU: vLLM generates with `gpu_memory_utilization` of the memory while the
actor's states that are not offloaded stay beside it; the log-prob passes hold the weights and one
micro-batch's forward transients; the actor update holds weights, fp32 gradients, the distributed
optimizer's shard and the activations of the micro-batches in flight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.estimate.context import (
    BF16,
    FP32,
    Context,
    get_context,
)
from tuner.estimate.device import (
    CUDA_CONTEXT_GIB,
    WORKSPACE_GIB,
    nccl_gib,
    slack_gib,
    verl_training_outside_gib,
)
from tuner.estimate.logits import DEFAULT_VERL, LOGIT_HELD_BYTES
from tuner.estimate.micro_batches import micro_batches, peak_micro_tokens
from tuner.estimate.profile import Profile
from tuner.estimate.rollout_memory import kv_cache_bytes, verl_generation_gib
from tuner.hardware import GIB, Cluster
from tuner.models import ModelSpec
from tuner.space import Candidate, ParallelLayout, modules_of
from tuner.workload import Workload

OPTIMIZER_BYTES = 3 * FP32
"""Adam in Megatron's distributed optimizer: fp32 master weights and two moments per parameter."""
ADAM_STEP_TEMP_BYTES = FP32
"""Per parameter of the largest optimizer shard, the temporary of the optimizer step: without
transformer-engine or apex, megatron-core 0.19 falls back to torch.optim.Adam(W)
(optimizer/__init__.py), whose foreach path materialises sqrt(v) over the whole shard in fp32;
a chained optimizer (dense + experts) steps one shard at a time. TE/apex FusedAdam update in
place; the model keeps the temporary anyway (it decides fitting: conservative there). It sets
the update's peak when activations are small (full recompute, a large DP shard): the dense
full-recompute row of results/dense-h200-x2.csv measured 78.3 GiB, its states 63.9 GiB plus
this 14.2 GiB."""

UNFUSED_SWIGLU_EXTRA = 1
"""Extra ffn-wide bf16 tensors per token an unfused SwiGLU keeps (bias_activation_fusion off):
megatron-core's `glu` runs silu(x1) * x2 as two autograd ops, so beside the fc1 output (2 ffn
wide, kept by silu and the product) and the product (fc2's input) it keeps silu(x1) too; the
fused bias_swiglu keeps only its input. Measured: the small16k rows of results/
small16k-h100-x1.csv (Qwen3-1.7B, one H100, full recompute of 4..13 layers at 27630-token
micro-batches) grow 2.57 GiB per recomputed layer: 99.7 kB per token-layer, against 100.4 kB
with this term and LOCAL_NORM_EXTRA_BYTES."""
LOCAL_NORM_EXTRA_BYTES = 8.0
"""Bytes per hidden unit per token-layer that the two torch.nn.RMSNorms of megatron-core's
local spec keep beyond their bf16 input and output (4 bytes each: the fp32 upcast of the
input that PyTorch's composite rms_norm saves for backward). transformer-engine's fused norms
keep input and output only. Measured: Qwen2.5-7B tp2 without recompute (results/
dense8k-h200-x2.csv trials 0, 14) keeps 45.4 GiB over 28 layers x 11508 tokens, 146 kB per
token-layer after one layer's backward transient, against 145.5 kB with this and
UNFUSED_SWIGLU_EXTRA (116.8 kB without it)."""

FUSED_CHUNK_TOKENS = 2048
"""Tokens per chunk of the fused log-prob / entropy path (use_fused_kernels): the megatron-core
runner's (tuner/runners/megatron_worker/logprob.py FUSED_CHUNK_TOKENS)."""
FUSED_CHUNK_BWD_BYTES = 5 * FP32
"""Per logit of one chunk in the fused path's backward: the fp32 logits and probabilities and,
while the gradient expression is evaluated, three fp32 temporaries (logprob.py `backward`)."""
FUSED_CHUNK_FWD_BYTES = BF16 + 2 * FP32
"""Per logit of one chunk in its forward: the bf16 matmul, its fp32 copy and the exponentials."""
FUSED_WEIGHT_GRAD_BYTES = FP32 + BF16
"""Per output-layer weight: the fused backward accumulates the weight's gradient in fp32 over
the chunks, each chunk's bf16 product beside it. With the chunk it sits on top of the
micro-batch's stored activations at the start of the backward: Qwen3-1.7B full recompute
at 15601 / 27630-token micro-batches
(results/small16k-h100-x1.csv trials 2, 3) held 9.4 / 10.9 GiB beyond the states, 3.0 / 5.4 of
activations (1.7 / 3.0 of them stored layer inputs) plus 7.5 of these."""
BACKWARD_LAYER_GRADS = 1.0
"""Layers' worth of activation gradients the layer in backward holds beside its saved
activations (the gradients of its intermediates are as large as they). Measured: Qwen3-1.7B,
full recompute of 4..13 layers (results/small16k-h100-x1.csv trials 17, 33..36, 43) held
2.1..4.1 GiB more than the stored inputs and the recomputed layers; one layer is 2.6 GiB."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdown:
    """GiB per GPU. `peak_gib` is the largest phase total."""

    weights_gib: float
    """Actor bf16 weights on the heaviest pipeline stage."""
    grads_gib: float
    """fp32 main gradients."""
    optimizer_gib: float
    """Distributed-optimizer shard (fp32 master + Adam moments)."""
    activations_gib: float
    """Activations kept for backward by the micro-batches in flight, recompute applied."""
    logits_gib: float
    """Full-vocabulary logits of a micro-batch (0 with fused kernels)."""
    rollout_gib: float
    """vLLM's share: gpu_memory_utilization of the GPU."""
    overhead_gib: float
    """Outside PyTorch: the CUDA context and the NCCL buffers (cuda_context_gib + nccl_gib)."""
    generation_peak_gib: float
    """What the model's tensors hold in generation: vLLM's whole share plus the actor's (and
    reference's) states left on the GPU, and the workspaces (PyTorch's allocated peak there)."""
    log_prob_peak_gib: float
    """PyTorch's allocated peak of the log-prob passes."""
    update_peak_gib: float
    """PyTorch's allocated peak of the actor update."""
    kv_cache_gib: float = 0.0
    """What vLLM has left for KV cache per GPU after its weights and activations."""
    dispatch_gib: float = 0.0
    """MoE all-to-all buffers of one layer (transient)."""
    reference_gib: float = 0.0
    """Reference-model weights left on the GPU (GRPO/PPO without param offload)."""
    workspace_gib: float = 0.0
    """cuBLAS / cuBLASLt / transformer-engine workspaces (inside the allocated peaks)."""
    cuda_context_gib: float = 0.0
    """CUDA context and loaded kernels of verl's process (outside PyTorch; the megatron runner's
    worker holds its own in their place: runner_memory.memory_view `process_gib`)."""
    nccl_gib: float = 0.0
    """Buffers of the NCCL communicators the rank uses (outside PyTorch; device.nccl_gib)."""
    update_transient_gib: float = 0.0
    """The update's short-lived tensors at its peak: the micro-batches' activations, logits and
    dispatch buffers, or the optimizer step's temporary, whichever is larger."""
    slack_gib: float = 0.0
    """Caching-allocator slack (reserved - allocated) at the update's peak."""
    log_prob_slack_gib: float = 0.0
    """The same in the log-prob passes."""
    generation_device_gib: float = 0.0
    """Device total in generation: its allocated peak + context + NCCL (verl empties the
    allocator's cache before the rollout, so no slack) + `rollout_process_gib`."""
    rollout_process_gib: float = 0.0
    """What verl 0.9.1's two processes add to generation's device total over one process
    holding actor and vLLM (verl <= 0.5; 0 with `rollout_in_actor`): vLLM's worker beyond its
    budget and the actor's VERL_ACTOR_RETAINED_GIB, or the weight sync's surplus where the sync
    holds more (rollout_memory.verl_generation_gib)."""
    weight_sync_device_gib: float = 0.0
    """Device total while verl 0.9.1 syncs the weights, inside generation (0 with
    `rollout_in_actor`)."""
    training_process_gib: float = 0.0
    """What verl 0.9.1's two processes add to old_log_prob's and update_actor's device totals:
    vLLM's worker asleep and the actor's retained memory (device.verl_training_outside_gib; 0
    with `rollout_in_actor`; the megatron runner's view leaves it out, view.phase_devices)."""
    log_prob_device_gib: float = 0.0
    """Device total of the log-prob passes: allocated + slack + context + NCCL + the above."""
    update_device_gib: float = 0.0
    """Device total of the update: allocated + slack + context + NCCL + the above."""

    @property
    def peak_gib(self) -> float:
        return max(self.generation_peak_gib, self.log_prob_peak_gib, self.update_peak_gib)

    @property
    def peak_phase(self) -> str:
        return _largest(self.generation_peak_gib, self.log_prob_peak_gib, self.update_peak_gib)

    @property
    def device_peak_gib(self) -> float:
        """The largest phase's device total: what an OOM is decided on."""
        return max(self.generation_device_gib, self.log_prob_device_gib, self.update_device_gib)

    @property
    def device_peak_phase(self) -> str:
        return _largest(
            self.generation_device_gib, self.log_prob_device_gib, self.update_device_gib
        )


def _largest(generation: float, log_prob: float, update: float) -> str:
    if generation >= log_prob and generation >= update:
        return "generation"
    return "old_log_prob" if log_prob >= update else "update_actor"


DEVICE_OF = {
    "generation": "generation_device_gib",
    "old_log_prob": "log_prob_device_gib",
    "update_actor": "update_device_gib",
}
"""Phase -> the MemoryBreakdown field of its device total."""
ALLOCATED_OF = {
    "generation": "generation_peak_gib",
    "old_log_prob": "log_prob_peak_gib",
    "update_actor": "update_peak_gib",
}
"""Phase -> the MemoryBreakdown field of its allocated peak."""


# --------------------------------------------------------------------------------------------
# Formulas (each a pure function of the model and the candidate; tests pin them)
# --------------------------------------------------------------------------------------------


def params_per_gpu(model: ModelSpec, candidate: Candidate) -> tuple[float, float]:
    """(dense parameters, expert parameters) on one GPU of the heaviest pipeline stage.

    Dense weights (attention, dense MLP, router, norms, embedding) split over TP; with PP each
    stage holds L/PP layers and the first/last stage one vocabulary table. Expert weights split
    over PP, EP and expert-TP."""
    return params_local(get_context(model, _ANY_CLUSTER, _ANY_WORKLOAD, _DEFAULT), candidate.layout)


def params_local(ctx: Context, layout: ParallelLayout) -> tuple[float, float]:
    expert_total = ctx.expert_params_total
    dense_total = ctx.total_params - expert_total
    if layout.pp == 1:
        dense = dense_total / layout.tp
    else:
        tables = ctx.embed_params + ctx.head_params
        dense = ((dense_total - tables) / layout.pp + ctx.embed_params) / layout.tp
    expert = expert_total / (layout.pp * layout.ep * layout.etp)
    return dense, expert


def activation_bytes_per_token_layer(model: ModelSpec, candidate: Candidate) -> float:
    """Bytes one token keeps for the backward pass in one layer, no recompute (flash attention:
    no s^2 term; Korthikanti et al. 2022 adapted to GQA, SwiGLU and MoE)."""
    ctx = get_context(model, _ANY_CLUSTER, _ANY_WORKLOAD, _DEFAULT)
    return _act_per_token_layer(
        ctx,
        candidate.layout,
        candidate.sequence_parallel,
        _selective_modules(candidate),
        fused_swiglu=candidate.bias_activation_fusion,
        local_norm=local_norms(candidate),
    )


def _selective_modules(candidate: Candidate) -> frozenset[str]:
    """The modules selective recompute recomputes (none for the other granularities: full
    recompute is applied per layer by _stored_and_working)."""
    return (
        frozenset(modules_of(candidate))
        if candidate.recompute_granularity == "selective"
        else frozenset()
    )


def local_norms(candidate: Candidate) -> bool:
    """The candidate runs megatron-core's local spec, without transformer-engine / apex
    kernels (its RMSNorms are torch.nn.RMSNorm): the megatron-core runner's local layers turn
    off every fusion that needs them (tuner/runners/megatron.py MEGATRON_PINNED), verl's
    defaults keep them on. What its process holds outside PyTorch is the runner's, not the
    layers' (runner_memory.memory_view `process_gib`)."""
    return not (
        candidate.bias_activation_fusion
        or candidate.apply_rope_fusion
        or candidate.gradient_accumulation_fusion
    )


def separate_norms(is_moe: bool, local_norm: bool) -> int:
    """Norms of a layer that are modules of their own, what recompute module `layernorm`
    recomputes (transformer_layer.py: not an IdentityOp): both in megatron-core's local spec;
    under transformer-engine's spec a dense layer fuses both into the next linear layer and a
    MoE layer keeps its pre-MLP norm apart. The memory model frees their outputs, the time
    model charges their forward (one rule for both)."""
    if local_norm:
        return 2
    return 1 if is_moe else 0


def _act_per_token_layer(
    ctx: Context,
    layout: ParallelLayout,
    sequence_parallel: bool,
    recomputed: frozenset[str] = frozenset(),
    *,
    fused_swiglu: bool = True,
    local_norm: bool = False,
) -> float:
    """Bytes one token keeps in one layer, less what the selective-recompute modules in
    `recomputed` free. What each frees, by megatron-core 0.19's meaning of `recompute_modules`
    (TransformerConfig docstring and its users, read in the core_r0.19.0 branch, 0.19.1, assumed
    unchanged in 0.19.2; the time model charges the same modules' forward, time._Lin):
    - core_attn: the attention core runs under a checkpoint (attention.py
      _checkpointed_attention_forward); its Q, K, V inputs stay. Its output and softmax
      statistics are counted as freed, as this model always did; in megatron-core the output
      stays as linear_proj's saved input, so only the statistics truly go (not changed here:
      the selective rows of results/dense-h200-x2.csv are over-predicted already).
    - layernorm: input_layernorm and pre_mlp_layernorm run under output-discarding checkpoints
      (transformer_layer.py, CheckpointWithoutOutput: forward under no_grad, output storage
      freed after its consumers ran), so their bf16 outputs and, in the local spec, torch's
      fp32 upcast are not kept. Only a norm that is its own module: transformer-engine's spec
      fuses both into the following linear layer of a dense model (IdentityOp, nothing
      recomputed) and keeps the MoE's pre_mlp_layernorm separate.
    - mlp: the dense MLP runs under a checkpoint (transformer_layer.py, not on MoE layers); only
      its input, the norm output, stays.
    - moe: the whole MoE layer (router, dispatch, experts, combine) runs under a checkpoint
      (moe_layer.py); only its input stays.
    - moe_act: the experts' activation runs under an output-discarding checkpoint
      (experts.py); fc1's output (its input) stays, the activation's output (fc2's input) and
      an unfused SwiGLU's intermediates are not kept.
    - shared_experts: the shared experts run under a checkpoint (moe_layer.py); `moe` covers
      them too.
    - mlp also applies to a MoE's leading dense layers (ModelSpec.num_dense_layers).
    mla_up_proj and gdn_norm_out free nothing here: ModelSpec has no multi-latent attention
    or gated delta net."""
    tp = layout.tp
    sp_div = tp if sequence_parallel else 1
    h, q, kv = ctx.hidden, ctx.q_dim, ctx.kv_dim
    # the two norm inputs and the two norm outputs (QKV and MLP inputs), residual width,
    # sequence-sharded under SP
    norm_out = h * BF16 / sp_div
    norm_extra = (LOCAL_NORM_EXTRA_BYTES / 2) * h / sp_div if local_norm else 0.0
    width = 2 * h * BF16 / sp_div + 2 * (norm_out + norm_extra)
    if "layernorm" in recomputed:
        width -= separate_norms(ctx.is_moe, local_norm) * (norm_out + norm_extra)
    qkv = (q + 2 * kv) * BF16 / tp
    core_out = q * BF16 / tp + ctx.heads * FP32 / tp  # attention output and softmax stats
    if "core_attn" in recomputed:
        core_out = 0.0  # the attention core is recomputed from Q, K, V
    swiglu = 3 if fused_swiglu else 3 + UNFUSED_SWIGLU_EXTRA
    dense = 0.0 if "mlp" in recomputed else swiglu * ctx.ffn * BF16 / tp
    if not ctx.is_moe:
        return width + qkv + core_out + dense
    routed = ctx.topk * layout.etp / sp_div if sequence_parallel else ctx.topk
    f = ctx.moe_ffn / layout.etp
    # moe_act keeps fc1's output (2 ffn wide) of the activation's tensors
    per_routed = 2 * h + (2 if "moe_act" in recomputed else swiglu) * f
    moe = routed * per_routed * BF16 + 2 * ctx.experts * FP32 / sp_div
    if "shared_experts" not in recomputed:
        moe += swiglu * ctx.shared_ffn * BF16 / tp  # a TP-split MLP beside the routed experts
    if "moe" in recomputed:
        moe = 0.0  # the shared experts run inside the MoE layer's checkpoint too
    # the leading dense layers (DeepSeek's first_k_dense_replace), as a mean over the layers
    mlp = (ctx.dense_layers * dense + (ctx.layers - ctx.dense_layers) * moe) / ctx.layers
    return width + qkv + core_out + mlp


def in_flight_micro_batches(layout: ParallelLayout, n_micro: float) -> float:
    """Micro-batches whose activations the first pipeline stage holds at once (1F1B: pp of them;
    interleaved: (1 + (pp-1)/(pp*vpp)) times that; never more than there are)."""
    if layout.pp == 1:
        return 1.0
    base = min(float(layout.pp), max(1.0, n_micro))
    if layout.vpp > 1:
        base *= 1 + (layout.pp - 1) / (layout.pp * layout.vpp)
    return base


def kept_activation_bytes(
    ctx: Context, candidate: Candidate, tokens: float, per_layer: float, layers_stage: float
) -> float:
    """Activations of one micro-batch on one stage, recompute applied (what it stores plus the
    recompute working set)."""
    stored, working = _stored_and_working(ctx, candidate, tokens, per_layer, layers_stage)
    return stored + working


def _stored_and_working(
    ctx: Context, candidate: Candidate, tokens: float, per_layer: float, layers_stage: float
) -> tuple[float, float]:
    """(bytes one micro-batch keeps between its forward and backward, bytes of the layers being
    recomputed in its backward). Every micro-batch in flight keeps the first; only the one in
    backward holds the second, so a pipeline multiplies the first alone."""
    layout = candidate.layout
    if candidate.recompute_granularity != "full":
        return tokens * per_layer * layers_stage, 0.0
    layer_input = ctx.hidden * BF16 / (layout.tp if candidate.sequence_parallel else 1)
    recompute_layers = max(1, min(candidate.recompute_num_layers, int(layers_stage) or 1))
    chunk_layers = layers_stage / (layout.vpp if layout.vpp > 1 else 1)
    if candidate.recompute_method == "block":
        recomputed = min(recompute_layers, chunk_layers) * (layout.vpp if layout.vpp > 1 else 1)
        stored = (layers_stage - recomputed) * per_layer + recomputed * layer_input
        return tokens * stored, tokens * per_layer
    chunks = math.ceil(chunk_layers / recompute_layers) * (layout.vpp if layout.vpp > 1 else 1)
    return tokens * chunks * layer_input, tokens * recompute_layers * per_layer


# --------------------------------------------------------------------------------------------
# The phase peaks
# --------------------------------------------------------------------------------------------


def memory_of(
    ctx: Context,
    candidate: Candidate,
    verl_logits: str = DEFAULT_VERL,
    *,
    rollout_in_actor: bool = False,
) -> MemoryBreakdown:
    """The per-phase peaks of `candidate`: the largest micro-batch of each pass and, under
    pipeline parallelism, how many of the update's are in flight, from the micro-batch model
    (estimate/micro_batches.py, which the time model reads too); `verl_logits`: the verl
    release whose full-logits passes are counted (estimate/logits.py). Generation is verl
    0.9.1's, vLLM in a process of its own (rollout_memory.verl_generation_gib);
    `rollout_in_actor`: one process holds both, as in verl <= 0.5's sync-mode rollout (the
    published reference runs: workers/rollout/vllm_rollout/vllm_rollout_spmd.py,
    distributed_executor_backend "external_launcher"), whose generation is its tensors +
    CUDA_CONTEXT_GIB + NCCL."""
    layout = candidate.layout
    dense, expert = params_local(ctx, layout)
    n_local = dense + expert
    weights = n_local * BF16
    grads = n_local * FP32
    expert_dp = layout.expert_dp
    optim = OPTIMIZER_BYTES * (dense / (layout.dp * layout.cp) + expert / expert_dp)

    layers_stage = ctx.layers / layout.pp
    per_layer = _act_per_token_layer(
        ctx,
        layout,
        candidate.sequence_parallel,
        _selective_modules(candidate),
        fused_swiglu=candidate.bias_activation_fusion,
        local_norm=local_norms(candidate),
    )
    tokens = peak_micro_tokens(ctx, candidate, log_prob=False)
    update_count = micro_batches(ctx, candidate, log_prob=False).count
    in_flight = in_flight_micro_batches(layout, float(update_count))
    stored, working = _stored_and_working(ctx, candidate, tokens, per_layer, layers_stage)
    acts = stored * in_flight + working
    vocab_local = ctx.vocab / layout.tp
    # without fused kernels: the full logits verl's passes hold at once (estimate/logits.py);
    # the log-prob phase's peak is old_log_prob's (it computes the entropy, the ref pass not)
    held = LOGIT_HELD_BYTES[verl_logits]
    logits_upd = tokens * vocab_local * held["update_actor"]
    lp_tokens = peak_micro_tokens(ctx, candidate, log_prob=True)
    logits_lp = lp_tokens * vocab_local * held["old_log_prob"]
    if candidate.use_fused_kernels:
        head = vocab_local * ctx.hidden  # the output layer's weight on this rank
        logits_upd = (
            min(tokens, FUSED_CHUNK_TOKENS) * vocab_local * FUSED_CHUNK_BWD_BYTES
            + head * FUSED_WEIGHT_GRAD_BYTES
        )
        logits_lp = min(lp_tokens, FUSED_CHUNK_TOKENS) * vocab_local * FUSED_CHUNK_FWD_BYTES
    sp_div = layout.tp if candidate.sequence_parallel else 1
    # forward-only transients: the residual stream plus one layer's intermediates
    lp_acts = lp_tokens * (2 * ctx.hidden * BF16 / sp_div + per_layer)
    dispatch = 0.0
    if ctx.is_moe:
        routed = ctx.topk * (layout.etp / sp_div if candidate.sequence_parallel else 1)
        dispatch = 2 * routed * ctx.hidden * BF16  # send and receive buffers, per token
        dispatch_upd, dispatch_lp = tokens * dispatch, lp_tokens * dispatch
    else:
        dispatch_upd = dispatch_lp = 0.0

    workspace = WORKSPACE_GIB * GIB
    ref_weights = weights if (ctx.uses_ref and not candidate.param_offload) else 0.0
    resident = (
        (0.0 if candidate.param_offload else weights)
        + (0.0 if candidate.param_offload else grads)
        + (0.0 if candidate.optimizer_offload else optim)
    )
    critic = resident if ctx.has_critic else 0.0  # the critic shares the actor's layout
    rollout = candidate.gpu_memory_utilization * ctx.mem_bytes
    gen_peak = rollout + resident + critic + ref_weights + workspace
    states_lp = (
        weights
        + (0.0 if candidate.param_offload else grads)
        + (0.0 if candidate.optimizer_offload else optim)
    )
    lp_transient = lp_acts + logits_lp + dispatch_lp
    lp_peak = states_lp + critic + ref_weights + lp_transient + workspace
    # the optimizer step runs after the micro-batches' transients are freed; its own transient
    # is the largest shard's Adam temporary (memory: ADAM_STEP_TEMP_BYTES)
    step_temp = ADAM_STEP_TEMP_BYTES * max(dense / (layout.dp * layout.cp), expert / expert_dp)
    # the backward starts at the output layer (its logits / fused-chunk transient on top of
    # the stored activations), then walks the layers: the one in backward holds its
    # recomputed working set plus the gradients of its activations (BACKWARD_LAYER_GRADS)
    layer_grads = BACKWARD_LAYER_GRADS * tokens * per_layer
    backward = max(working + layer_grads, logits_upd)
    upd_transient = max(stored * in_flight + backward + dispatch_upd, step_temp)
    upd_peak = weights + grads + optim + critic + ref_weights + upd_transient + workspace
    kv_cache = kv_cache_bytes(ctx, candidate)
    # verl's processes; in the training phases the megatron runner's view puts its worker's
    # in their place (runner_memory.memory_view `process_gib`), generation stays verl's whatever
    # layers the worker builds (verl4k-h100-x1 trial 1 ran it at 72.6 GiB in real verl)
    nccl = _nccl_of(ctx, layout)
    outside = CUDA_CONTEXT_GIB + nccl
    slack_lp = slack_gib(lp_transient / GIB)
    slack_upd = slack_gib(upd_transient / GIB)
    one_process = gen_peak / GIB + outside
    rollout_dev = sync_dev = one_process
    training = 0.0  # verl 0.9.1's vLLM worker sleeps beside the actor in the training phases
    if not rollout_in_actor:
        rollout_dev, sync_dev = verl_generation_gib(
            ctx, candidate, gen_peak - rollout, weights, nccl
        )
        training = verl_training_outside_gib(candidate.rollout_tp, ctx.cluster)
    gen_device = max(rollout_dev, sync_dev)
    return MemoryBreakdown(
        weights_gib=weights / GIB,
        grads_gib=grads / GIB,
        optimizer_gib=optim / GIB,
        activations_gib=acts / GIB,
        logits_gib=max(logits_upd, logits_lp) / GIB,
        rollout_gib=rollout / GIB,
        overhead_gib=outside,
        generation_peak_gib=gen_peak / GIB,
        log_prob_peak_gib=lp_peak / GIB,
        update_peak_gib=upd_peak / GIB,
        kv_cache_gib=kv_cache / GIB,
        dispatch_gib=dispatch_upd / GIB,
        reference_gib=ref_weights / GIB,
        workspace_gib=WORKSPACE_GIB,
        cuda_context_gib=CUDA_CONTEXT_GIB,
        nccl_gib=nccl,
        update_transient_gib=upd_transient / GIB,
        slack_gib=slack_upd,
        log_prob_slack_gib=slack_lp,
        generation_device_gib=gen_device,
        rollout_process_gib=gen_device - one_process,
        weight_sync_device_gib=0.0 if rollout_in_actor else sync_dev,
        training_process_gib=training,
        log_prob_device_gib=lp_peak / GIB + slack_lp + outside + training,
        update_device_gib=upd_peak / GIB + slack_upd + outside + training,
    )


def _nccl_of(ctx: Context, layout: ParallelLayout) -> float:
    """NCCL buffers of this layout (cached per layout in the context)."""
    key = ("nccl", layout)
    nccl = ctx.layout_cache.get(key)
    if nccl is None:
        nccl = ctx.layout_cache[key] = nccl_gib(
            layout, ctx.cluster, moe=ctx.is_moe, tied=ctx.model.tie_word_embeddings
        )
    return float(nccl)  # type: ignore[arg-type]


def memory(
    candidate: Candidate, model: ModelSpec, cluster: Cluster, workload: Workload, profile: Profile
) -> MemoryBreakdown:
    """Per-phase peak memory of one GPU for `candidate`."""
    return memory_of(get_context(model, cluster, workload, profile), candidate)


# Model-only helpers need a context; these stand in for the parts a formula does not read.
from tuner.hardware import GPUS  # noqa: E402

_ANY_CLUSTER = Cluster(gpu=GPUS["h100"], num_gpus=8)
_ANY_WORKLOAD = Workload()
_DEFAULT = Profile()
