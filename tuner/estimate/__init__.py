"""The cost model: predicted memory and step time of a candidate, from first principles.

`estimate(candidate, model, cluster, workload, profile)` is the one entry point the study and
the runners use. Model-, cluster- and workload-derived numbers are cached per (model, cluster,
workload, profile) in `context.get_context`, so scoring many candidates is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.estimate.context import get_context
from tuner.estimate.device import phases_unfit
from tuner.estimate.generation import VLLM_ASYNC_SCHEDULING
from tuner.estimate.host_memory import host_memory_gib, host_unfit
from tuner.estimate.logits import DEFAULT_VERL
from tuner.estimate.memory import DEVICE_OF, MemoryBreakdown, memory_of
from tuner.estimate.profile import Profile, load_profile, profile_source, save_profile
from tuner.estimate.split import split_memory, split_step_s, split_sync_s, split_times
from tuner.estimate.time import phase_times_of
from tuner.fields import same_named
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.space import Candidate
from tuner.space.placement import pools
from tuner.workload import Workload

__all__ = [
    "Estimate",
    "MemoryBreakdown",
    "Profile",
    "estimate",
    "load_profile",
    "profile_source",
    "save_profile",
]

_DEFAULT_PROFILE = Profile()


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """Predicted values of one step; seconds, GiB, tokens/s/GPU."""

    step_s: float
    generation_s: float
    old_log_prob_s: float
    ref_s: float
    update_actor_s: float
    reshard_s: float
    throughput_tokens_per_s_per_gpu: float
    mfu: float
    """Actor-update model FLOPs utilisation, a fraction."""
    peak_mem_gib: float
    peak_phase: str
    fits: bool
    bottleneck: str
    """The phase that takes longest: generation, log_prob, update_actor or critic."""
    memory: MemoryBreakdown
    critic_s: float = 0.0
    """PPO only: critic values plus critic update."""
    offload_s: float = 0.0
    """PCIe offload/onload time included in the phases."""
    tokens_per_step: float = 0.0
    """Tokens (prompt + response, unpadded) the step trains on, all GPUs."""
    fit_reason: str = ""
    """Why it does not fit (empty when it does)."""
    device_peak_gib: float = 0.0
    """Predicted device total at the peak (what an OOM is decided on): PyTorch's allocated
    peak + the allocator's slack + CUDA context + NCCL buffers (tuner.estimate.device)."""
    device_peak_phase: str = ""
    """The phase whose device total is the largest."""
    slack_gib: float = 0.0
    """Caching-allocator slack (reserved - allocated) inside device_peak_gib."""
    outside_gib: float = 0.0
    """Outside PyTorch inside device_peak_gib: CUDA context and NCCL buffers."""
    headroom_gib: float | None = None
    """Kept free below the capacity by every phase when `fits` was decided (a phase's device
    total + headroom <= capacity): the study's --headroom-gib; None: each phase's own
    (device.phase_headroom_gib)."""
    host_mem_gib: float = 0.0
    """Predicted host memory (CPU RAM) of one node, offloaded states included: an estimate
    fitted on measured rows (tuner.estimate.host_memory); it decides `fits` where the
    cluster's host_mem_gib is known."""
    overlapped: bool = False
    """Generation overlaps training (a split placement, tuner/estimate/split.py): step_s is
    max(generation_s, old_log_prob_s + ref_s + update_actor_s + critic_s) + reshard_s, not
    their sum."""

    def as_dict(self) -> dict[str, object]:
        d = {k: getattr(self, k) for k in self.__slots__ if k != "memory"}  # type: ignore[attr-defined]
        mem = self.memory
        d["memory_gib"] = {k: getattr(mem, k) for k in mem.__slots__}  # type: ignore[attr-defined]
        return d


def estimate(
    candidate: Candidate,
    model: ModelSpec,
    cluster: Cluster,
    workload: Workload,
    profile: Profile | None = None,
    *,
    headroom_gib: float | None = None,
    verl_logits: str = DEFAULT_VERL,
    rollout_in_actor: bool = False,
    async_scheduling: bool = VLLM_ASYNC_SCHEDULING,
) -> Estimate:
    """Predicted phase times, throughput, MFU and per-phase peak memory of `candidate`; it fits
    when each phase's device total plus `headroom_gib` (default: the phase's own,
    device.phase_headroom_gib) is at most the GPU's memory, vLLM has room for one sequence and,
    where the cluster says how much a node has, the node's host memory holds what it keeps
    there (host_memory.host_unfit). `verl_logits`: the verl release whose full-logits passes
    are counted (estimate/logits.py; the installed one's by default); `rollout_in_actor`: vLLM
    ran inside the actor's process, as in verl <= 0.5 (memory.memory_of); `async_scheduling`:
    vLLM overlaps each decode step's host work with the GPU, as the installed vLLM 0.24.0 does
    by default and the vLLM of the reference leaderboards did not
    (generation.VLLM_ASYNC_SCHEDULING)."""
    pool = pools(candidate.rollout_gpus, cluster)
    ctx = get_context(model, pool.trainer, workload, profile or _DEFAULT_PROFILE)
    mem = memory_of(ctx, candidate, verl_logits, rollout_in_actor=rollout_in_actor)
    times = phase_times_of(ctx, candidate, verl_logits, async_scheduling)
    step = times.step_s
    train_gpus = pool.trainer.num_gpus
    if pool.split:  # vLLM on its own GPUs, one step off-policy: tuner/estimate/split.py
        rollout_ctx = get_context(model, pool.rollout, workload, profile or _DEFAULT_PROFILE)
        rollout_times = phase_times_of(rollout_ctx, candidate, verl_logits, async_scheduling)
        same_node = cluster.num_nodes == 1
        times = split_times(
            times, rollout_times, split_sync_s(ctx, rollout_ctx, candidate, same_node)
        )
        step = split_step_s(times) if rollout_times.step_s < float("inf") else float("inf")
        mem = split_memory(rollout_ctx, candidate, mem)
    gpus = cluster.num_gpus
    peak = mem.peak_gib
    capacity = cluster.gpu.memory_gib
    device = mem.device_peak_gib
    phase = mem.device_peak_phase
    reason = phases_unfit(
        {name: getattr(mem, field) for name, field in DEVICE_OF.items()}, capacity, headroom_gib
    )
    if not reason and step == float("inf"):
        reason = (
            f"vLLM has {max(0.0, mem.kv_cache_gib):.1f} GiB for KV cache, less than one "
            f"{workload.max_seq_len}-token sequence: raise gpu_memory_utilization or rollout TP"
        )
    host = host_memory_gib(ctx, candidate, pool.trainer.local_gpus)
    if not reason:
        offloads = candidate.param_offload or candidate.optimizer_offload
        reason = host_unfit(host, cluster.host_mem_gib, offloads)
    finite = step < float("inf")
    update_s = times.update_actor_s
    return Estimate(
        **same_named(times, Estimate, skip=("bottleneck",)),  # the phase times
        step_s=step,
        throughput_tokens_per_s_per_gpu=ctx.tokens_step / step / gpus if finite else 0.0,
        mfu=times.update_flops / (train_gpus * ctx.peak * update_s) if update_s > 0 else 0.0,
        peak_mem_gib=peak,
        peak_phase=mem.peak_phase,
        fits=not reason,
        bottleneck=times.bottleneck if finite else "memory",
        memory=mem,
        tokens_per_step=ctx.tokens_step,
        fit_reason=reason,
        device_peak_gib=device,
        device_peak_phase=phase,
        slack_gib=_slack_of(mem, phase),
        outside_gib=mem.overhead_gib,
        headroom_gib=headroom_gib,
        host_mem_gib=host,
        overlapped=pool.split,
    )


def _slack_of(mem: MemoryBreakdown, phase: str) -> float:
    if phase == "update_actor":
        return mem.slack_gib
    return mem.log_prob_slack_gib if phase == "old_log_prob" else 0.0
