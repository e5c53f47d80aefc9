"""Device memory of a verl trial on this node: nvidia-smi sampled while the launch runs (the
CUDA contexts, NCCL and vLLM's engine included, which verl's own `perf/max_memory_*` leave out),
its peak, and a split placement's peak of each pool beside the cost model's."""

from __future__ import annotations

import contextlib
import datetime
import shutil
import subprocess
from pathlib import Path
from typing import Any

SMI_LOG = "device-memory.csv"
SMI_PERIOD_MS = 500
SMI_TIME_FORMAT = "%Y/%m/%d %H:%M:%S.%f"
"""nvidia-smi's `timestamp` field (`--query-gpu=timestamp`), e.g. 2026/11/28 22:30:01.123."""


class DeviceMemorySampler:
    """Device memory in use on this node's GPUs, sampled by nvidia-smi every SMI_PERIOD_MS
    while a local trial runs: the CUDA contexts, NCCL and the colocated vLLM engine included,
    which verl's own `perf/max_memory_*` (the actor process's PyTorch allocator) leave out."""

    def __init__(self, path: Path, *, enabled: bool) -> None:
        self.path, self.enabled = path, enabled
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> DeviceMemorySampler:
        if self.enabled and shutil.which("nvidia-smi"):
            # the child keeps its own copy of the file's descriptor
            with contextlib.suppress(OSError), open(self.path, "wb") as out:
                self._proc = subprocess.Popen(
                    [
                        "nvidia-smi",
                        "--query-gpu=timestamp,index,memory.used",
                        "--format=csv,noheader,nounits",
                        f"-lms={SMI_PERIOD_MS}",
                    ],
                    stdout=out,
                    stderr=subprocess.DEVNULL,
                    stdin=subprocess.DEVNULL,
                )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)


def read_device_peak(path: Path) -> float | None:
    """The largest `memory.used` (MiB) of any GPU in a sampler file, in GiB; None if none."""
    return device_peak(read_device_samples(path))


def device_peak(samples: list[tuple[float, int, float]]) -> float | None:
    """The largest `memory.used` of any GPU among `samples`, in GiB; None if there are none."""
    return gib(max(mib for _, _, mib in samples)) if samples else None


def gib(mib: float) -> float:
    """nvidia-smi's MiB as the rows' GiB (3 decimals)."""
    return round(mib / 1024, 3)


def read_device_samples(path: Path) -> list[tuple[float, int, float]]:
    """(seconds since the first sample, GPU index, MiB used) of a sampler file: lines of
    `timestamp, index, memory.used` (DeviceMemorySampler) or, in files written before it kept
    the time, `index, memory.used`, timed by their order (one round of every GPU each
    SMI_PERIOD_MS)."""
    out: list[tuple[float, int, float]] = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return out
    start: datetime.datetime | None = None
    rounds: dict[int, int] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) not in (2, 3):
            continue
        try:
            gpu, mib = int(parts[-2]), float(parts[-1])
        except ValueError:
            continue
        rounds[gpu] = rounds.get(gpu, -1) + 1
        t = rounds[gpu] * SMI_PERIOD_MS / 1000  # by order, where no timestamp reads
        if len(parts) == 3:
            with contextlib.suppress(ValueError):
                when = datetime.datetime.strptime(parts[0], SMI_TIME_FORMAT)
                start = start or when
                t = (when - start).total_seconds()
        out.append((t, gpu, mib))
    return out


def predicted_pools(pred: Any) -> dict[str, float]:
    """A split candidate's predicted device total of each pool (estimate/split.py
    `split_memory`): the trainer's largest phase (old_log_prob, update, the weight sync's send
    side) and the rollout's vLLM (its budget and its process beyond it)."""
    mem = getattr(pred, "memory", None)
    if mem is None:
        return {}
    trainer = max(mem.log_prob_device_gib, mem.update_device_gib, mem.weight_sync_device_gib)
    return {
        "pred_trainer_device_gib": round(trainer, 2),
        "pred_rollout_device_gib": round(mem.rollout_gib + mem.rollout_process_gib, 2),
    }


POOL_RISE_MIB = 4096
"""A GPU has joined its pool once this much of it is used: the actor's weights on the trainer's
GPUs, vLLM's on the rollout's (an idle H100 or H200 holds well under 1 GiB)."""


def pool_peaks(
    samples: list[tuple[float, int, float]], trainer_gpus: int
) -> dict[str, float | str]:
    """A split row's device peak of each pool, in GiB, from its nvidia-smi samples: verl 0.9.1's
    one-step-off trainer builds the actor (`_init_models`) before it starts the rollout's
    servers (`_init_async_rollout_manager`; experimental/one_step_off_policy/ray_trainer.py
    `init_workers`), so the `trainer_gpus` GPUs whose memory rose first (POOL_RISE_MIB) are the
    trainer's, the others the rollout's. {} where fewer GPUs than that rose."""
    rise: dict[int, float] = {}
    peak: dict[int, float] = {}
    for t, gpu, mib in samples:
        peak[gpu] = max(peak.get(gpu, 0.0), mib)
        if mib >= POOL_RISE_MIB and gpu not in rise:
            rise[gpu] = t
    if len(rise) <= trainer_gpus:
        return {}
    order = sorted(rise, key=lambda g: (rise[g], g))
    trainer = order[:trainer_gpus]
    rollout = [g for g in peak if g not in trainer]
    return {
        "trainer_device_peak_gib": gib(max(peak[g] for g in trainer)),
        "rollout_device_peak_gib": gib(max(peak[g] for g in rollout)),
        "trainer_gpu_indices": "+".join(str(g) for g in sorted(trainer)),
    }
