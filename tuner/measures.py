"""What is measured of one trial, declared once (`TrialMeasures`): the runners' result
(`TrialResult`), the megatron worker's result.json (`WorkerResult`) and the leaderboard's row
(`TrialRecord`, one CSV column each, in this order) are this record plus their own fields.

A leaf module: it imports the stdlib only (the megatron worker reads it on a GPU machine)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialMeasures:
    """The measures of one trial. Times in seconds, memory in GiB (max over GPUs); None where
    not measured."""

    tokens_per_s_per_gpu: float | None = None
    """Measured throughput (verl's perf/throughput): the objective."""
    step_s: float | None = None
    generation_s: float | None = None
    old_log_prob_s: float | None = None
    ref_s: float | None = None
    update_actor_s: float | None = None
    reshard_s: float | None = None
    mfu_update_pct: float | None = None
    """Model FLOPs utilisation of the actor update, in percent, by the tuner's one formula
    (`ModelSpec.training_flops`: forward + backward, no recompute) over `update_actor_s` x GPUs x
    the GPU's dense bf16 peak: the cost model's for estimates, the measured update's for megatron
    rows; empty where the update's FLOPs are not known (verl rows: see verl_mfu_actor_pct)."""
    verl_mfu_actor_pct: float | None = None
    """verl's own counter `perf/mfu/actor` in percent (its FlopsCounter over update_policy's
    time; verl rows and the reference CSVs): not comparable with mfu_update_pct."""
    peak_mem_gib: float | None = None
    """Measured peak allocated memory, max over GPUs."""
    peak_mem_reserved_gib: float | None = None
    """Measured peak reserved by PyTorch's caching allocator, max over GPUs."""
    peak_mem_device_gib: float | None = None
    """Measured peak device memory in use (torch.cuda.mem_get_info / NVML: CUDA context, NCCL,
    cuBLAS workspaces and fragmentation included), max over GPUs: what an OOM is decided on."""
    launch_s: float | None = None
    """Wall time from launch to the first measured step (start-up, model build, warm-up)."""
    measured_s: float | None = None
    """Wall time spent in measured steps."""


MEASURES: tuple[str, ...] = tuple(f.name for f in fields(TrialMeasures))
"""The measures' names, in the record's (and the leaderboard's) order."""
