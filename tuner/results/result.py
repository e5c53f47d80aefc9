"""What a runner reports for one trial: its status (`Status`) and measures (`TrialResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    OK = "ok"
    OOM = "oom"
    FAILED = "failed"
    TIMEOUT = "timeout"
    PRUNED_INVALID = "pruned-invalid"
    PRUNED_OOM = "pruned-oom-predicted"
    PRUNED_SLOW = "pruned-slow"
    """Stopped early by Optuna's pruner: its first measured steps were far slower than the best."""
    INTERRUPTED = "interrupted"
    """Its worker was killed mid-trial; a resumed study re-runs it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialResult:
    """What a runner reports for one trial. Times in seconds, memory in GiB."""

    status: Status
    source: str
    """estimate, megatron or verl: where the numbers come from."""
    reason: str = ""
    """Why it failed or was pruned; a short line."""
    step_s: float | None = None
    generation_s: float | None = None
    old_log_prob_s: float | None = None
    ref_s: float | None = None
    update_actor_s: float | None = None
    reshard_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu_update_pct: float | None = None
    """The actor update's model FLOPs utilisation, percent (TrialRecord.mfu_update_pct)."""
    verl_mfu_actor_pct: float | None = None
    """verl's own `perf/mfu/actor` in percent (verl runner only)."""
    peak_mem_gib: float | None = None
    """Peak allocated memory, max over GPUs."""
    peak_mem_reserved_gib: float | None = None
    """Peak memory reserved by PyTorch's caching allocator, max over GPUs."""
    peak_mem_device_gib: float | None = None
    """Peak device memory in use (torch.cuda.mem_get_info / NVML: CUDA context, NCCL, cuBLAS
    workspaces and fragmentation included), max over GPUs: what an OOM is decided on."""
    backend: str = ""
    """What actually ran, e.g. `megatron-core (update, old_log_prob); generation predicted`."""
    launch_s: float | None = None
    """Wall time from launch to the first measured step (start-up, model build, warm-up)."""
    measured_s: float | None = None
    """Wall time spent in measured steps."""
    hardware: str = ""
    """What it ran on, e.g. `4x NVIDIA H200`; `model` for estimates."""
    versions: str = ""
    log_path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    """Runner-specific measures, kept in the row's `extra` column as k=v pairs."""

    @property
    def value(self) -> float | None:
        """The objective: tokens/s/GPU of a run that finished."""
        if self.status is Status.OK and self.tokens_per_s_per_gpu is not None:
            return self.tokens_per_s_per_gpu
        return None
