"""vLLM's memory per GPU (its weights, activation peak and KV cache inside its budget) and
verl 0.9.1's generation-phase device total, vLLM's worker process beside the actor's.

The cost model's per-phase peaks (tuner.estimate.memory) take generation's from here; what the
processes hold outside PyTorch is tuner.estimate.device's.
"""

from __future__ import annotations

from tuner.estimate.context import BF16, FP32, VLLM_RUNTIME_GIB, Context
from tuner.estimate.device import CUDA_CONTEXT_GIB, VERL_ACTOR_RETAINED_GIB, vllm_outside_gib
from tuner.hardware import GIB
from tuner.space import Candidate

VERL_SYNC_BUCKET_BYTES = 2048 << 20
"""verl 0.9.1's weight-sync bucket: rollout.checkpoint_engine.update_weights_bucket_megabytes,
2048 by default (verl/workers/config/rollout.py CheckpointEngineConfig; the recipes leave it).
The actor allocates it for each sync (workers/rollout/vllm_rollout/bucketed_weight_transfer.py
`BucketedWeightSender._init_buffer`: torch.empty on its GPU, opened by vLLM's worker through
CUDA IPC) and frees it before vLLM's KV cache wakes."""


def rollout_params_per_gpu(
    ctx: Context, rollout_tp: int, rollout_dp: int = 1, params: float | None = None
) -> tuple[float, float]:
    """(dense, expert) parameters of `params` (default: the whole model) one vLLM GPU holds.

    Dense weights split over the rollout TP, K/V projections no further than one kv head per
    rank (vLLM replicates kv heads when rollout TP exceeds them). A MoE's experts split over the
    replica's tp * dp GPUs, expert-parallel (whole experts, `expert_parallel_size` = tp * dp,
    verl's rule) or tensor-parallel across them: the same bytes either way (vLLM's
    FusedMoEParallelConfig.make shards the experts over `flatten_tp_across_dp`, tp * dp ranks,
    with or without EP; read in vLLM's main-line source, assumed unchanged in 0.24.0)."""
    total = ctx.total_params if params is None else params
    kv_params = ctx.layers * 2 * ctx.hidden * ctx.kv_dim
    kv_share = max(1.0 / rollout_tp, 1.0 / max(1, ctx.kv_heads))
    dense = (total - ctx.expert_params_total - kv_params) / rollout_tp + kv_params * kv_share
    return dense, ctx.expert_params_total / (rollout_tp * max(1, rollout_dp))


def rollout_weight_bytes(ctx: Context, rollout_tp: int, rollout_dp: int = 1) -> float:
    """vLLM's weights per GPU (rollout_params_per_gpu, bf16)."""
    dense, expert = rollout_params_per_gpu(ctx, rollout_tp, rollout_dp)
    return (dense + expert) * BF16


def rollout_activation_bytes(
    ctx: Context, rollout_tp: int, batched_tokens: int, max_num_seqs: int
) -> float:
    """vLLM's profiled activation peak: one scheduler step of `batched_tokens` tokens plus the
    sampler's logits for max_num_seqs sequences (the candidate's, as the recipe sets it)."""
    width = 4 * ctx.hidden + (
        2 * ctx.topk * ctx.moe_ffn * 2 if ctx.is_moe else 2 * ctx.ffn * 2
    ) / max(1, rollout_tp)
    return batched_tokens * width * BF16 + max_num_seqs * ctx.vocab * FP32 / rollout_tp


def kv_cache_bytes(ctx: Context, candidate: Candidate) -> float:
    """Per GPU bytes vLLM can give to KV cache.

    CUDA graphs (`enforce_eager=False`) are ignored: vLLM 0.24.0 measures their pool at start-up
    and takes it out of this same gpu_memory_utilization budget (vllm/v1/worker/gpu_worker.py,
    `cudagraph_memory_estimate`, on by default since 0.21), so the device total does not grow;
    the KV cache loses the pool, a size vLLM does not document (it profiles it per run)."""
    max_num_batched_tokens = candidate.max_num_batched_tokens or ctx.max_seq
    budget = candidate.gpu_memory_utilization * ctx.mem_bytes
    used = (
        rollout_weight_bytes(ctx, candidate.rollout_tp, candidate.rollout_dp)
        + rollout_activation_bytes(
            ctx, candidate.rollout_tp, max_num_batched_tokens, candidate.max_num_seqs
        )
        + VLLM_RUNTIME_GIB * GIB
    )
    return budget - used


def verl_generation_gib(
    ctx: Context, candidate: Candidate, actor_bytes: float, weights_bytes: float, nccl: float
) -> tuple[float, float]:
    """(device total of verl 0.9.1's rollout, of its weight sync) per GPU, GiB: two processes
    on the GPU. Each step (workers/engine_workers.py `update_weights`) vLLM wakes its weights,
    the actor sends its parameters in buckets and offloads them again under param offload, then
    vLLM wakes its KV cache and generates.

    Both hold the actor's `actor_bytes` (states left on the GPU, workspaces), CUDA_CONTEXT_GIB +
    VERL_ACTOR_RETAINED_GIB outside them and its NCCL buffers `nccl`. The rollout adds vLLM's
    budget and what its process holds beyond it (device.vllm_outside_gib). The sync adds the
    parameters loaded for the export where offloaded (`get_per_tensor_param` ->
    `load_megatron_model_to_gpu(load_grad=False)`, engine/megatron/transformer_impl.py), the
    bucket (VERL_SYNC_BUCKET_BYTES), the export's transient (mbridge 0.15.1 core/bridge.py
    `export_weights` makes each parameter whole: up to a vocabulary table, twice under TP, the
    gathered shards and their merge), and vLLM asleep with its weights awake."""
    outside = CUDA_CONTEXT_GIB + VERL_ACTOR_RETAINED_GIB + nccl
    budget = candidate.gpu_memory_utilization * ctx.mem_bytes
    rollout = (
        (actor_bytes + budget) / GIB + outside + vllm_outside_gib(candidate.rollout_tp, ctx.cluster)
    )
    loaded = weights_bytes if candidate.param_offload else 0.0
    export = ctx.vocab * ctx.hidden * BF16 * (2 if candidate.layout.tp > 1 else 1)
    sent = actor_bytes + loaded + VERL_SYNC_BUCKET_BYTES + export
    vllm = rollout_weight_bytes(ctx, candidate.rollout_tp, candidate.rollout_dp)
    asleep = vllm_outside_gib(candidate.rollout_tp, ctx.cluster, asleep=True)
    return rollout, (sent + vllm) / GIB + outside + asleep
