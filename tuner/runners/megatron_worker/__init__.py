"""The torchrun worker of the megatron runner: verl's old_log_prob and actor update, measured
on real GPUs with megatron-core.

    torchrun --nproc-per-node N -m tuner.runners.megatron_worker --spec spec.json --out result.json
    torchrun --nproc-per-node N -m tuner.runners.megatron_worker --pool DIR     (many trials)

Modules, one concern each: `spec` (the spec, schema 2, parsed with no torch), `result`
(result.json, FLOPs, OOM detection), `protocol` (progress lines, abandon, pool requests),
`pipeline` (p2p settings for variable-length micro-batches), `model` (config, build, teardown),
`attention`, `experts`, `offload`, `logprob` (full-logits and fused paths), `memory` (three-way
peaks), `trial` (one trial's phases and measurement), `main` (entry, one-shot and pool).
Everything imported here runs on a CPU-only Python without torch or megatron."""

from tuner.runners.megatron_worker.protocol import Progress, append_progress, read_progress
from tuner.runners.megatron_worker.result import (
    FLOPS_FORMULA,
    STATUSES,
    WorkerResult,
    active_matmul_params,
    is_oom,
    model_flops,
    one_line,
    parse_result,
    peak_bf16_tflops,
    write_json_atomic,
)
from tuner.runners.megatron_worker.spec import (
    LAYER_SPECS,
    PHASES,
    SCHEMA,
    BatchCfg,
    KernelCfg,
    OffloadCfg,
    RecomputeCfg,
    WorkerSpec,
    load_spec,
    spec_to_dict,
)

__all__ = [
    "FLOPS_FORMULA",
    "LAYER_SPECS",
    "PHASES",
    "SCHEMA",
    "STATUSES",
    "BatchCfg",
    "KernelCfg",
    "OffloadCfg",
    "Progress",
    "RecomputeCfg",
    "WorkerResult",
    "WorkerSpec",
    "active_matmul_params",
    "append_progress",
    "is_oom",
    "load_spec",
    "model_flops",
    "one_line",
    "parse_result",
    "peak_bf16_tflops",
    "read_progress",
    "spec_to_dict",
    "write_json_atomic",
]
