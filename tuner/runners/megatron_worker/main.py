"""The entry point: one trial (`--spec`/`--out`) or a pool serving many (`--pool DIR`).

Every failure becomes a result file: the first rank that fails writes it (exclusive), with the
phase, and on OOM what was allocated/reserved/device-used at the failure, then exits at once
(other ranks may wait in a collective for it: torchrun, or the runner, ends them). A pool thus
ends after a failed trial; the runner starts a fresh one for the next trial."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.runners.megatron_worker.log import log
from tuner.runners.megatron_worker.protocol import Request, serve
from tuner.runners.megatron_worker.result import WorkerResult, is_oom, one_line, write_json_atomic
from tuner.runners.megatron_worker.spec import load_spec


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tuner.runners.megatron_worker")
    ap.add_argument("--spec", type=Path, help="spec.json (schema 2): run this one trial")
    ap.add_argument("--out", type=Path, help="result.json to write (rank 0)")
    ap.add_argument("--progress", default="", help="file to append a line per measured step")
    ap.add_argument("--abandon", default="", help="stop the trial once this file exists")
    ap.add_argument("--pool", type=Path, help="serve trials requested in this folder")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if (args.pool is None) == (args.spec is None):
        print("give either --pool DIR or --spec FILE --out FILE", file=sys.stderr)
        return 2
    if args.spec is not None and args.out is None:
        print("--spec needs --out", file=sys.stderr)
        return 2
    t_start = time.monotonic()
    if args.pool is not None:
        return _serve(args.pool)
    return _one(args.spec, args.out, args.progress, args.abandon, t_start)


class _Ctx:
    """What stays up between trials: the process group, the kernels chosen, the meter."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        if not dist.is_initialized():
            # Lazy NCCL (estimate/device.py WORKER_NCCL_INIT): no device_id, as verl 0.9.1's
            # actor (utils/distributed.py initialize_global_process_group_ray, called by
            # workers/engine_workers.py TrainingWorker). With device_id torch initialises NCCL
            # eagerly and every new_group of megatron's initialize_model_parallel splits a
            # communicator at once (~0.38 GiB each, 20 at world 1, never returned): on one H100
            # (torch 2.11) the process held 8.89 GiB outside PyTorch in a Qwen3-1.7B trial, 2.43
            # without, with the same times and PyTorch peaks (scripts/gpu_outside_probe.py).
            dist.init_process_group("nccl")
        from tuner.runners.megatron_worker.attention import choose_attention
        from tuner.runners.megatron_worker.device_memory import MemoryMeter

        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.attn = choose_attention()
        self.experts: dict[bool, tuple[Any, str]] = {}
        self.meter = MemoryMeter()
        self.meter.start()

    def experts_for(self, moe: bool) -> tuple[Any, str]:
        if moe not in self.experts:
            from tuner.runners.megatron_worker.experts import choose_experts

            self.experts[moe] = choose_experts() if moe else (None, "")
        return self.experts[moe]


def _trial(ctx: _Ctx | None, spec_path: Path, out: Path, files: Any, t0: float, phase: Any) -> _Ctx:
    from tuner.runners.megatron_worker.trial import run_trial

    spec = load_spec(spec_path)
    if ctx is None:
        ctx = _Ctx()
    result = run_trial(
        spec,
        phase=phase,
        meter=ctx.meter,
        files=files,
        t_handover=t0,
        attn=ctx.attn,
        # the te layers bring their own experts (model.te_block_spec): no check for ours
        experts=ctx.experts_for(spec.model.is_moe and spec.layer_spec == "local"),
    )
    if ctx.rank == 0:
        write_json_atomic(out, result.to_dict())
        log(
            f"{result.status} step {result.step_s or 0:.3f}s tokens/s/gpu "
            f"{result.tokens_per_s_per_gpu or 0:.0f} launch {result.launch_s or 0:.1f}s "
            f"measured {result.measured_s or 0:.1f}s peak alloc/resv/device "
            f"{result.peak_mem_gib or 0:.1f}/{result.peak_mem_reserved_gib or 0:.1f}/"
            f"{result.peak_mem_device_gib or 0:.1f} GiB"
        )
    return ctx


def _fail(e: BaseException, out: Path, phase: Any, ctx: _Ctx | None) -> int:
    """Write the failure (first rank wins); the exit status the process must end with now."""
    status = "oom" if is_oom(e) else "failed"
    if not isinstance(e, ValueError) or status == "oom":
        traceback.print_exc()
    log(f"{status} in {phase.name}: {one_line(e)}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    res = WorkerResult(
        status=status,
        phase=phase.name,
        reason=one_line(e),
        world_size=world,
        mem_at_failure=ctx.meter.snapshot_gib() if ctx is not None else {},
        extra={"failed_rank": int(os.environ.get("RANK", "0"))},
    )
    write_json_atomic(out, res.to_dict(), exclusive=True)
    sys.stdout.flush()
    sys.stderr.flush()
    return 1 if status == "failed" else 3


def _one(spec_path: Path, out: Path, progress: str, abandon: str, t0: float) -> int:
    from tuner.runners.megatron_worker.trial import Files, Phase

    phase = Phase()
    ctx = None
    try:
        ctx = _trial(ctx, spec_path, out, Files(progress, abandon), t0, phase)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 (every failure must become a result)
        os._exit(_fail(e, out, phase, ctx))
    _shutdown()
    return 0


def _serve(pool: Path) -> int:
    """Run requested trials until an exit request (protocol.serve; every rank reads the
    requests, rank 0 writes ready and done)."""
    from tuner.runners.megatron_worker import model as mdl
    from tuner.runners.megatron_worker.trial import Files, Phase

    pool.mkdir(parents=True, exist_ok=True)
    phase = Phase()
    ctx = _Ctx()
    log(f"pool up: world={ctx.world} attention={ctx.attn.name}")

    def handle(req: Request) -> bool:
        t0 = time.monotonic()
        files = Files(req.get("progress", ""), req.get("abandon", ""))
        _trial(ctx, Path(req["spec"]), Path(req["out"]), files, t0, phase)
        phase.name = "teardown"
        t_down = time.monotonic()
        import torch.distributed as dist

        dist.barrier()
        mdl.teardown_parallel()
        _free()
        left = _left_behind_gib()
        log(f"teardown {time.monotonic() - t_down:.1f}s, {left:.2f} GiB left allocated")
        if left > LEAK_LIMIT_GIB:
            # Measured on 2 H200s (MoE layers, grouped experts): a trial's tensors stayed
            # allocated after teardown and the next trial ran out of memory in its warm-up.
            # A fresh pool is cheaper than a trial that measures the last one's leftovers.
            log(f"trial left {left:.1f} GiB allocated after teardown: pool exits")
            for line in leak_report():
                log(line)
            return False
        return True

    def on_failure(e: BaseException, req: Request) -> int:
        return _fail(e, Path(req["out"]), phase, ctx)

    serve(pool, handle, on_failure, world=ctx.world, lead=ctx.rank == 0)
    ctx.meter.stop()
    _shutdown()
    return 0


LEAK_LIMIT_GIB = 1.0
"""Memory a finished trial may leave allocated (max over ranks) before the pool restarts."""


def _left_behind_gib() -> float:
    """What is still allocated after a trial's teardown, max over the ranks (all agree)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([torch.cuda.memory_allocated() / 2**30], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def leak_report(top: int = 8) -> list[str]:
    """The largest CUDA tensors still reachable from Python objects after a teardown, each with
    what refers to it, and how much of what is allocated no Python object reaches (autograd
    graphs, C++ caches): what to look at when a pool has to restart."""
    import gc

    import torch

    seen: dict[int, tuple[int, Any]] = {}
    for o in gc.get_objects():
        with contextlib.suppress(Exception):
            if isinstance(o, torch.Tensor) and o.is_cuda:
                st = o.untyped_storage()
                seen.setdefault(st.data_ptr(), (st.nbytes(), o))
    allocated = torch.cuda.memory_allocated()
    reached = sum(n for n, _ in seen.values())
    lines = [
        f"leak: {len(seen)} CUDA storages reachable from Python, {reached / 2**30:.2f} GiB; "
        f"{(allocated - reached) / 2**30:.2f} GiB of {allocated / 2**30:.2f} allocated not"
    ]
    for n, t in sorted(seen.values(), key=lambda x: -x[0])[:top]:
        refs = []
        for r in gc.get_referrers(t):
            if isinstance(r, dict):
                keys = [k for k, v in r.items() if v is t][:2]
                refs.append(f"dict{keys}")
            elif not isinstance(r, list) or len(r) < 1000:
                refs.append(type(r).__qualname__)
        lines.append(
            f"leak:   {n / 2**30:.3f} GiB {type(t).__name__}{tuple(t.shape)} {t.dtype} "
            f"held by {', '.join(refs[:4]) or 'nothing in Python'}"
        )
    return lines


def _free() -> None:
    """Collect what the trial left (module cycles, hooks) and hand the cache back, so the next
    trial's peaks are its own."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def _shutdown() -> None:
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
