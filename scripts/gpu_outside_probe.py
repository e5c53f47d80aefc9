"""Where the megatron worker's device memory outside PyTorch's allocator comes from: the device's
used memory (total - free) minus PyTorch's reserved memory, read after each start-up stage of
the worker and around one real trial (one Qwen3-1.7B full-recompute trial of the small H100
study). On one GPU host with the wheels installed (scripts/gpu_setup.sh), from the repository
root:

    torchrun --standalone --nproc-per-node 1 scripts/gpu_outside_probe.py OUT.txt
    torchrun --standalone --nproc-per-node 1 scripts/gpu_outside_probe.py OUT.txt --eager-nccl

The first initialises NCCL lazily, as the worker does (init_process_group without device_id,
tuner/runners/megatron_worker/main.py); the second (or PROBE_EAGER_NCCL=1) passes device_id, as
the worker did before: torch then initialises NCCL eagerly and each new_group of megatron's
initialize_model_parallel splits a communicator at once. Prints one line per stage: used,
reserved, allocated, outside (GiB), what changed, and the context's stack and malloc-heap limits.

Outputs on one H100 (torch 2.11, NCCL from torch's wheel, megatron-core 0.19.2), the same trial
with the same times and PyTorch peaks (reserved 40.75, allocated 38.37 GiB):
scripts/gpu_outside_probe.out.txt by --eager-nccl (the script as it was, with device_id): 8.89
GiB outside at the trial's peak, 7.60 of it appearing in the trial and kept after it;
scripts/gpu_outside_probe_lazy.out.txt by the first command: 2.43 GiB (the default communicator
at the first all_reduce, 0.55, and 1.14 in the trial, the groups it used). estimate/device.py
MEGATRON_WORKER_GIB is the second, EAGER_NCCL_EXCESS_GIB the first less the second (6.46).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

GIB = float(2**30)
CU_LIMIT_STACK_SIZE = 0x00
CU_LIMIT_MALLOC_HEAP_SIZE = 0x02
"""cuda.h CUlimit values: the per-thread stack, whose local-memory reservation the driver grows
for a kernel that needs more and keeps (per SM x resident threads), and the device malloc heap."""


def _driver() -> object:
    import ctypes

    return ctypes.CDLL("libcuda.so.1")


def ctx_limit(which: int) -> int:
    """cuCtxGetLimit on the current context (the one torch made current), bytes; -1 on error."""
    import ctypes

    v = ctypes.c_size_t(0)
    rc = _driver().cuCtxGetLimit(ctypes.byref(v), which)  # type: ignore[attr-defined]
    return int(v.value) if rc == 0 else -1


def set_ctx_limit(which: int, value: int) -> int:
    """cuCtxSetLimit: setting the stack size again makes the driver re-size the local-memory
    reservation to it (CUDA driver API docs, cuCtxSetLimit); returns the CUresult."""
    import ctypes

    return int(_driver().cuCtxSetLimit(which, ctypes.c_size_t(value)))  # type: ignore[attr-defined]


def main(out: Path, *, eager_nccl: bool = False) -> int:
    import torch

    lines: list[str] = []
    last = [0.0]

    def stage(name: str) -> None:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        used = (total - free) / GIB
        resv = torch.cuda.memory_reserved() / GIB
        alloc = torch.cuda.memory_allocated() / GIB
        outside = used - resv
        line = (
            f"{name:<44} used {used:7.2f}  reserved {resv:7.2f}  allocated {alloc:7.2f}  "
            f"outside {outside:6.2f} ({outside - last[0]:+.2f})  "
            f"stack {ctx_limit(CU_LIMIT_STACK_SIZE)} B  "
            f"heap {ctx_limit(CU_LIMIT_MALLOC_HEAP_SIZE)} B"
        )
        last[0] = outside
        print(line, flush=True)
        lines.append(line)

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    torch.zeros(1, device="cuda")
    stage("CUDA context (torch.zeros(1))")
    stack0 = ctx_limit(CU_LIMIT_STACK_SIZE)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    stage("first bf16 matmul (cuBLAS/cuBLASLt)")
    import torch.distributed as dist

    # device_id makes torch initialise NCCL eagerly (the worker before it went lazy)
    eager = {"device_id": torch.device("cuda", local_rank)} if eager_nccl else {}
    dist.init_process_group("nccl", **eager)
    stage("init_process_group (nccl)")
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    stage("first all_reduce (NCCL communicator)")
    from tuner.runners.megatron_worker.attention import choose_attention

    attn = choose_attention()
    stage(f"attention check ({attn.name})")
    from tuner.runners.megatron_worker.experts import choose_experts

    experts = choose_experts()
    stage(f"grouped-GEMM experts check ({experts[1]})")
    from tuner.runners.megatron_worker.device_memory import MemoryMeter

    meter = MemoryMeter()
    meter.start()
    stage(f"memory meter ({meter.source})")
    import megatron.core  # noqa: F401

    stage("import megatron.core")

    from tuner.runners.megatron_worker.spec import load_spec
    from tuner.runners.megatron_worker.trial import Files, Phase, run_trial

    spec_path = Path(out).with_suffix(".spec.json")
    spec = load_spec(spec_path)
    result = run_trial(
        spec,
        phase=Phase(),
        meter=meter,
        files=Files(),
        t_handover=time.monotonic(),
        attn=attn,
        experts=(None, ""),
    )
    peak_out = (result.peak_mem_device_gib or 0) - (result.peak_mem_reserved_gib or 0)
    line = (
        f"{'trial (peaks)':<44} used {result.peak_mem_device_gib or 0:7.2f}  reserved "
        f"{result.peak_mem_reserved_gib or 0:7.2f}  allocated "
        f"{result.peak_mem_gib or 0:7.2f}  outside {peak_out:6.2f}"
    )
    print(line, flush=True)
    lines.append(line)
    stage("after the trial (run_trial frees its tensors)")
    torch.cuda.empty_cache()
    stage("after empty_cache")
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    stage("after gc + empty_cache")
    rc = set_ctx_limit(CU_LIMIT_STACK_SIZE, stack0)
    stage(f"after cuCtxSetLimit(STACK_SIZE, {stack0}) rc {rc}")
    meter.stop()
    out.write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()
    return 0


def write_spec(path: Path) -> None:
    """The small H100 study's workload and a full-recompute candidate (its best hand-grid row)."""
    from tuner.hardware import Cluster, get_gpu
    from tuner.models import get_model
    from tuner.runners.megatron import worker_spec
    from tuner.space import Candidate, ParallelLayout
    from tuner.workload import get_workload

    model = get_model("scripts/models/qwen3-1.7b/config.json")
    w = get_workload("dapo-math").with_overrides(
        prompt_len=1024, response_len=15360, response_mean=6000, batch_size=4, n=4,
        mini_batch_size=2,
    )  # fmt: skip
    c = Candidate(
        layout=ParallelLayout(world=1),
        recompute_granularity="full",
        recompute_num_layers=1,
        ppo_max_token_len_per_gpu=16384,
        log_prob_max_token_len_per_gpu=32768,
        use_fused_kernels=True,
    )
    cluster = Cluster(gpu=get_gpu("h100"), num_gpus=1, gpus_per_node=1)
    path.write_text(json.dumps(worker_spec(c, model, cluster, w)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="scripts/gpu_outside_probe.py")
    ap.add_argument("out", nargs="?", type=Path, default=Path("outside_probe.txt"))
    ap.add_argument(
        "--eager-nccl",
        action="store_true",
        default=os.environ.get("PROBE_EAGER_NCCL") == "1",
        help="init_process_group with device_id (eager NCCL, the worker before); "
        "also PROBE_EAGER_NCCL=1",
    )
    args = ap.parse_args()
    if os.environ.get("LOCAL_RANK") is None:
        print("run under torchrun (see the docstring)", file=sys.stderr)
        sys.exit(2)
    write_spec(args.out.with_suffix(".spec.json"))
    sys.exit(main(args.out, eager_nccl=args.eager_nccl))
