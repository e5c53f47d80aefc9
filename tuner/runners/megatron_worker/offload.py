"""Offload as verl does it around its phases: weights and grad buffers (verl 0.9.1's
`param_offload` moves both) and optimizer states go to the CPU at the end of the update and all
come back at the start of the next step's old_log_prob, inside the timed phases (verl brings the
optimizer back later, before its update: the same copies, counted in the other phase)."""

from __future__ import annotations

from typing import Any

from tuner.runners.megatron_worker.spec import OffloadCfg


class Offloader:
    """Moves DDP param/grad buffers and optimizer states to the CPU after a step and back before
    the next, like verl's offload_megatron_model_to_cpu / offload_megatron_optimizer."""

    def __init__(self, model: list[Any], optimizer: Any, cfg: OffloadCfg) -> None:
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.saved: list[tuple[Any, Any]] = []
        self.pinned: dict[int, Any] = {}
        self.on_cpu = False

    def _buffers(self) -> list[Any]:
        bufs: list[Any] = []
        for chunk in self.model:
            for attr in ("buffers", "expert_parallel_buffers"):
                bufs.extend(getattr(chunk, attr, []) or [])
        return bufs

    def _opt_tensors(self) -> list[tuple[Any, str]]:
        out: list[tuple[Any, str]] = []
        opts = getattr(self.optimizer, "chained_optimizers", None) or [self.optimizer]
        for opt in opts:
            for group in getattr(opt, "shard_fp32_from_float16_groups", []) or []:
                out.extend((p, "data") for p in group)
            inner = getattr(opt, "optimizer", None)
            for st in getattr(inner, "state", {}).values():
                for key in ("exp_avg", "exp_avg_sq"):
                    if key in st:
                        out.append((st, key))
        return out

    def offload(self) -> None:
        import torch

        c = self.cfg
        if not (c.param or c.optimizer):
            return
        self.saved = []
        n = 0
        for buf in self._buffers():
            for want, attr in ((c.param, "param_data"), (c.param, "grad_data")):
                t = getattr(buf, attr, None)
                if want and t is not None and t.untyped_storage().size() > 0:
                    cpu = self.pinned.get(n)
                    if cpu is None:  # pinned host copies are made once and reused
                        cpu = self.pinned[n] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    n += 1
                    cpu.copy_(t, non_blocking=True)
                    self.saved.append((t, cpu))
        if c.optimizer:
            for obj, key in self._opt_tensors():
                t = getattr(obj, key) if key == "data" else obj[key]
                moved = t.to("cpu", non_blocking=True)
                if key == "data":
                    obj.data = moved
                else:
                    obj[key] = moved
        torch.cuda.synchronize()
        for t, _ in self.saved:
            t.untyped_storage().resize_(0)
        torch.cuda.empty_cache()
        self.on_cpu = True

    def load(self) -> None:
        if not self.on_cpu:
            return
        for t, cpu in self.saved:
            t.untyped_storage().resize_(cpu.numel() * cpu.element_size())
            t.copy_(cpu, non_blocking=True)
        if self.cfg.optimizer:
            for obj, key in self._opt_tensors():
                if key == "data":
                    obj.data = obj.data.to("cuda", non_blocking=True)
                else:
                    obj[key] = obj[key].to("cuda", non_blocking=True)
        self.saved = []
        self.on_cpu = False
