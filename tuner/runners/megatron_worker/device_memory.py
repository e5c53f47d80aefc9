"""Device memory measured three ways: PyTorch's allocated peak, its reserved peak, and the
device's used memory (total - free: CUDA context, NCCL buffers, cuBLAS workspaces and
fragmentation included), which is what an OOM is decided on.

Device used is read from NVML when pynvml imports (this process's device), else from
torch.cuda.mem_get_info, by a sampling thread (every `interval_s`) and at each micro-batch and
phase end (`sample()`); the peak is the largest reading."""

from __future__ import annotations

import threading
from typing import Any

GIB = float(2**30)


class MemoryMeter:
    """Peaks of this rank since `reset()`; `snapshot()` is what is in use now."""

    def __init__(self, interval_s: float = 0.02) -> None:
        import torch

        self.torch = torch
        self.device = torch.cuda.current_device()
        self.interval_s = interval_s
        self.peak_device = 0
        self.source = "mem_get_info"
        self._nvml: Any = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            bus = torch.cuda.get_device_properties(self.device).pci_bus_id  # type: ignore[attr-defined]
            self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByPciBusId(bus))
            self.source = "nvml"
        except Exception:  # noqa: BLE001 (no NVML here: mem_get_info)
            self._nvml = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def device_used(self) -> int:
        if self._nvml is not None:
            pynvml, handle = self._nvml
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        free, total = self.torch.cuda.mem_get_info(self.device)
        return int(total - free)

    def sample(self) -> int:
        used = self.device_used()
        with self._lock:
            self.peak_device = max(self.peak_device, used)
        return used

    def _run(self) -> None:
        self.torch.cuda.set_device(self.device)
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 (a failed reading must not end the trial)
                return

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="memory-meter", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None

    def reset(self) -> None:
        self.torch.cuda.reset_peak_memory_stats(self.device)
        with self._lock:
            self.peak_device = 0
        self.sample()

    def peaks_gib(self) -> tuple[float, float, float]:
        """(allocated, reserved, device used) peaks in GiB."""
        self.sample()
        c = self.torch.cuda
        return (
            c.max_memory_allocated(self.device) / GIB,
            c.max_memory_reserved(self.device) / GIB,
            self.peak_device / GIB,
        )

    def snapshot_gib(self) -> dict[str, float]:
        """What is in use now (on a failure: at the failure), and the peaks so far."""
        out: dict[str, float] = {}
        c = self.torch.cuda
        try:
            out["allocated"] = round(c.memory_allocated(self.device) / GIB, 2)
            out["reserved"] = round(c.memory_reserved(self.device) / GIB, 2)
            out["device"] = round(self.sample() / GIB, 2)
            a, r, d = self.peaks_gib()
            out.update(
                peak_allocated=round(a, 2), peak_reserved=round(r, 2), peak_device=round(d, 2)
            )
        except Exception:  # noqa: BLE001 (best effort after an error)
            pass
        return out


def release_storages(
    *roots: Any, devices: tuple[str, ...] = ("cuda",), max_objects: int = 500_000
) -> int:
    """Free the device memory of every tensor reachable from `roots` (a trial's model chunks,
    optimizer, inputs) by resizing its storage to 0 bytes, and return the bytes freed.

    Needed because a finished MoE trial stayed alive after the pool dropped it: measured on 2
    H200s, 47-63 GiB (parameters, the DDP grad buffer, Adam's state) were still reachable after
    teardown, each parameter held by a closure cell (megatron's DDP backward hook, registered on
    an autograd node that Python's collector cannot see through) and the next trial ran out of
    memory or the pool had to restart (12 s a trial). Freed storages leave the Python objects
    behind (bytes), not the device memory. Walks modules, containers and the attributes of
    torch / megatron objects; other objects are not entered."""
    import torch

    seen: set[int] = set()
    storages: dict[int, Any] = {}
    todo = list(roots)
    while todo and len(seen) < max_objects:
        o = todo.pop()
        if id(o) in seen or o is None or isinstance(o, (str, bytes, int, float, bool)):
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            if o.device.type in devices:
                st = o.untyped_storage()
                storages.setdefault(st.data_ptr(), st)
            # a parameter's extra attributes (main_grad, ...) are in its __dict__
            todo.extend(getattr(o, "__dict__", {}).values())
            if o.grad is not None:
                todo.append(o.grad)
        elif isinstance(o, dict):
            todo.extend(o.keys())
            todo.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            todo.extend(o)
        elif _entered(o):
            todo.extend(vars(o).values())
    freed = 0
    for st in storages.values():
        freed += st.nbytes()
        st.resize_(0)
    return freed


def _entered(o: Any) -> bool:
    """Objects whose attributes the walk follows: torch modules and optimizers, and megatron's
    (DDP buffers and bucket groups, the distributed optimizer, its chained optimizers)."""
    mod = type(o).__module__ or ""
    return hasattr(o, "__dict__") and (
        mod.startswith(("torch.nn", "torch.optim", "megatron.", "tuner.runners.megatron_worker"))
    )
