"""The split placement's step and memory (issue 29): vLLM on r GPUs of its own, the actor on the
other N - r, as verl 0.9.1's `verl.experimental.one_step_off_policy` runs them.

Its trainer (one_step_off_policy/ray_trainer.py `fit_step`, `_fit_generate`) waits for the
generation started last step (`timing_s/gen`, the wait; `timing_s/generate_async`, the whole
generation), syncs the weights to vLLM over the NCCL checkpoint engine
(`timing_s/sync_rollout_weights`), starts the next generation, then computes the reference and
the update while vLLM generates. It computes no old_log_prob: its config sets
`algorithm.rollout_correction.bypass_mode: True` (verl 0.9.1
experimental/one_step_off_policy/config/one_step_off_ppo_megatron_trainer.yaml), and in bypass
mode the separation trainer takes vLLM's log-probs as the old ones
(experimental/separation/ray_trainer.py `_fit_compute_log_prob`: `apply_bypass_mode`, no
`old_log_prob` timer). In steady state one step is therefore

    max(generation on r GPUs, ref + update (+ critic) on N - r) + weight sync

and each pool's memory is its own: the rollout's GPUs hold vLLM alone (no actor states beside
it, no sleep and wake-up: `free_cache_engine` is off), the trainer's hold the actor alone (no
vLLM process asleep beside it, so less need for offload).

Checked against one measured split row so far (results/split4k-h200-x2 trial 1: 2 x H200,
r1+t1): each pool's device peak within 3% of these formulas, the step 32.3 s measured against
39.0 predicted while the old_log_prob pass it does not run was still charged (6.3 s); its
generation is not measured there (the trainer never waited for it, and verl's timer then gives
the training's time: runners/verl_log.GEN_WAIT_NONE_S), only bounded, at most 32.1 s against
26.5 predicted. One row, one ratio of pools. The sync term is a broadcast of the whole bf16
model from the trainer's pool to each rollout replica at the link between the pools.
"""

from __future__ import annotations

from dataclasses import replace

from tuner.estimate.context import BF16, Context
from tuner.estimate.device import CUDA_CONTEXT_GIB, vllm_outside_gib
from tuner.estimate.memory import MemoryBreakdown
from tuner.estimate.rollout_memory import VERL_SYNC_BUCKET_BYTES
from tuner.estimate.time import (
    RESHARD_COLLECTIVES_PER_TENSOR,
    RESHARD_FIXED_S,
    PhaseTimes,
)
from tuner.hardware import GIB
from tuner.space import Candidate, RolloutDims


def training_s(times: PhaseTimes) -> float:
    """The trainer pool's part of a step: old_log_prob (none in a split: split_times), the
    reference, the update and the critic."""
    return times.old_log_prob_s + times.ref_s + times.update_actor_s + times.critic_s


def split_step_s(times: PhaseTimes) -> float:
    """One steady-state split step: the longer of generation and training, plus the sync."""
    return max(times.generation_s, training_s(times)) + times.reshard_s


def split_sync_s(
    trainer_ctx: Context, rollout_ctx: Context, candidate: Candidate, same_node: bool
) -> float:
    """The weight sync over the NCCL checkpoint engine: the whole bf16 model from the trainer's
    pool to every rollout replica at the link between the pools (NVLink on one node, else the
    inter-node link), the per-tensor collectives, vLLM's load of its shard, and under param
    offload the actor's weights brought back to the GPU to be sent."""
    profile = trainer_ctx.profile
    w_total = trainer_ctx.total_params * BF16
    link = trainer_ctx.nvlink if same_node else trainer_ctx.internode
    replicas = RolloutDims.of(candidate, rollout_ctx.cluster.num_gpus).replicas
    sync = RESHARD_FIXED_S + w_total * replicas / link
    experts_tensors = 3 * trainer_ctx.experts if trainer_ctx.is_moe else 0
    tensors = trainer_ctx.layers * (10 + experts_tensors) + 2
    sync += tensors * RESHARD_COLLECTIVES_PER_TENSOR * profile.collective_latency_s
    sync += 2 * w_total / candidate.rollout_tp / rollout_ctx.hbm
    if candidate.param_offload:
        span = candidate.layout.tp * candidate.layout.pp * candidate.layout.ep
        sync += 2 * w_total / span / trainer_ctx.pcie
    return sync


def split_times(trainer_times: PhaseTimes, rollout_times: PhaseTimes, sync_s: float) -> PhaseTimes:
    """The split's phases: training from the trainer's pool less old_log_prob, which the
    one-step-off trainer does not run (bypass mode: module docstring), generation from the
    rollout's, the sync between them; `bottleneck` the longer side."""
    times = replace(
        trainer_times,
        generation_s=rollout_times.generation_s,
        reshard_s=sync_s,
        old_log_prob_s=0.0,
    )
    if times.generation_s >= training_s(times):
        times = replace(times, bottleneck="generation")
    return times


NCCL_ENGINE_BUFFERS = 2
"""Buckets the NCCL checkpoint engine holds on each GPU of a sync, either side: a send and a
receive buffer of `update_weights_bucket_megabytes` each (VERL_SYNC_BUCKET_BYTES), allocated by
`prepare()` on every rollout worker and on every actor worker that sends or relays (all those on
the source's node: `multi_sender` is its default) (verl 0.9.1
checkpoint_engine/nccl_checkpoint_engine.py `NCCLCheckpointEngine.prepare`)."""
NCCL_ENGINE_MASTER_KEPT = 2
"""Of those, what the sync's source (actor rank 0) keeps for the rest of the step: its buffers
are CuPy arrays (`prepare`: CuPy, not torch, on the master) and `finalize` only drops them, so
CuPy's default memory pool keeps both blocks on the GPU through old_log_prob and the update
(verl 0.9.1 frees that pool nowhere for this engine; only delta_checkpoint_engine.py calls
`free_all_blocks`)."""


def split_memory(
    rollout_ctx: Context, candidate: Candidate, mem: MemoryBreakdown
) -> MemoryBreakdown:
    """Each pool's device totals on its own, from the trainer's colocated breakdown `mem`
    (computed on the trainer's pool): old_log_prob and update without vLLM's process asleep
    beside the actor (`training_process_gib`) but with the sync's buffers the source keeps
    (NCCL_ENGINE_MASTER_KEPT); generation on the rollout's GPUs: vLLM's budget, its process
    beyond it and the checkpoint engine's buffers (NCCL_ENGINE_BUFFERS), with no actor states;
    the sync on the trainer's GPUs: the actor's states, the engine's buffers and its NCCL
    buffers (folded into the generation phase's total, as colocated does, so the fit check
    sees it)."""
    budget = candidate.gpu_memory_utilization * rollout_ctx.mem_bytes
    bucket = VERL_SYNC_BUCKET_BYTES / GIB
    rollout_dev = (
        budget / GIB
        + NCCL_ENGINE_BUFFERS * bucket
        + CUDA_CONTEXT_GIB
        + vllm_outside_gib(candidate.rollout_tp, rollout_ctx.cluster)
    )
    held = mem.weights_gib + mem.workspace_gib
    if not candidate.param_offload:
        held += mem.grads_gib
    if not candidate.optimizer_offload:
        held += mem.optimizer_gib
    sync_dev = held + NCCL_ENGINE_BUFFERS * bucket + mem.overhead_gib
    kept = NCCL_ENGINE_MASTER_KEPT * bucket - mem.training_process_gib
    return replace(
        mem,
        rollout_gib=budget / GIB,
        generation_peak_gib=budget / GIB,
        generation_device_gib=max(rollout_dev, sync_dev),
        rollout_process_gib=rollout_dev - budget / GIB,
        weight_sync_device_gib=sync_dev,
        training_process_gib=0.0,
        log_prob_device_gib=mem.log_prob_device_gib + kept,
        update_device_gib=mem.update_device_gib + kept,
    )
