"""result.json (schema 3), the FLOPs count behind MFU, and how failures are told apart.

Pure Python: the runner reads results with `parse_result` on a machine with no torch."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuner.fileio import write_atomic
from tuner.measures import TrialMeasures
from tuner.models import ModelSpec

SCHEMA = 3
"""3: the measures under the row's names (TrialMeasures: peak_mem_gib); 2 named the allocated
peak peak_mem_allocated_gib, read as peak_mem_gib (OLD_NAMES)."""
READ_SCHEMAS = (2, SCHEMA)
OLD_NAMES = {"peak_mem_allocated_gib": "peak_mem_gib"}
"""Schema 2's names of the measures, and theirs now."""
STATUSES = ("ok", "oom", "failed", "abandoned")
"""abandoned: the runner asked the worker to stop the trial (early stop)."""
RESULT_PHASES = ("init", "build", "warmup", "old_log_prob", "update_actor", "teardown")

FLOPS_FORMULA = (
    "update 6*N_active*T + 6*L*a*d*sum(s_i^2), old_log_prob a third of that (forward only); "
    "N_active = matmul weights one token passes through (L*(h*(a*d+2*g*d) + a*d*h + mlp) + h*V, "
    "mlp = 3*h*ffn dense or k*3*h*ffn_e + h*E MoE), T = tokens, s_i = sample lengths (causal), "
    "no recompute counted"
)


def active_matmul_params(m: ModelSpec) -> int:
    """Weights of the matrix products one token passes through (biases, norms and the
    embedding lookup excluded; the output layer included): ModelSpec.matmul_params."""
    return m.matmul_params


def model_flops(
    m: ModelSpec, sequence_lengths: Sequence[int], *, forward_only: bool = False
) -> float:
    """FLOPs of one pass over `sequence_lengths`: forward + backward (3 x forward), or the
    forward alone (FLOPS_FORMULA): ModelSpec.training_flops, the tuner's one formula."""
    full = m.training_flops(sequence_lengths)
    return full / 3.0 if forward_only else full


def peak_bf16_tflops(device_name: str) -> float | None:
    """Dense bf16 peak of the GPU named `device_name` (torch.cuda.get_device_name), from
    tuner.hardware's table; the longest matching name wins (h200 before h20)."""
    from tuner.hardware import GPUS

    name = device_name.lower()
    hits = [g for key, g in GPUS.items() if key in name]
    if not hits:
        return None
    return max(hits, key=lambda g: len(g.name)).bf16_tflops


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerResult(TrialMeasures):
    """result.json: the trial's measures (TrialMeasures, max over ranks: peak_mem_gib is the
    allocated peak; old_log_prob_s and update_actor_s the median measured step's, over the
    mini-batches run; step_s their sum; tokens_per_s_per_gpu tokens / step_s / world; those it
    does not measure, generation and both of the row's MFUs among them, stay None) and the
    worker's own fields."""

    status: str
    phase: str
    """Where it ended (ok: the last phase run; failure: where it failed)."""
    reason: str = ""
    step_times_s: list[float] = field(default_factory=list)
    """Every measured step, both phases."""
    tokens: int = 0
    mfu_pct: float | None = None
    """Both phases' model FLOPs over both phases' time (the worker's own line; the row's
    mfu_update_pct, the update's alone, is the runner's: megatron.update_mfu_pct)."""
    flops_formula: str = FLOPS_FORMULA
    model_tflops_per_step: float | None = None
    mem_at_failure: dict[str, float] = field(default_factory=dict)
    """On OOM: allocated/reserved/device GiB on the failing rank when it failed."""
    num_micro_batches: int = 0
    versions: dict[str, str] = field(default_factory=dict)
    gpu: str = ""
    world_size: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    """Worker details: init_s, build_s, attention, experts, max_micro_batch_tokens, ..."""

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}


def parse_result(data: str | bytes | Mapping[str, Any]) -> WorkerResult:
    """A WorkerResult from result.json's text (or parsed object); raises ValueError if it is
    not a result of READ_SCHEMAS."""
    d = json.loads(data) if isinstance(data, (str, bytes)) else data
    if not isinstance(d, Mapping):
        raise ValueError("result is not a JSON object")
    if d.get("schema") not in READ_SCHEMAS:
        raise ValueError(f"result schema {d.get('schema')!r} is not one of {READ_SCHEMAS}")
    d = {OLD_NAMES.get(k, k): v for k, v in d.items()}
    if d.get("status") not in STATUSES:
        raise ValueError(f"result status {d.get('status')!r} is not one of {STATUSES}")
    if d.get("phase") not in RESULT_PHASES:
        raise ValueError(f"result phase {d.get('phase')!r} is not one of {RESULT_PHASES}")
    known = set(WorkerResult.__dataclass_fields__)
    r = WorkerResult(**{k: v for k, v in d.items() if k in known})
    if r.status == "ok":
        for k in ("step_s", "tokens_per_s_per_gpu", "peak_mem_gib"):
            v = getattr(r, k)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise ValueError(f"ok result lacks a finite {k}")
    return r


def write_json_atomic(path: str | Path, obj: Mapping[str, Any], *, exclusive: bool = False) -> bool:
    """Write `obj` to `path` atomically (fileio.write_atomic). With `exclusive`, keep an
    existing file (the first failure wins) and return False."""
    try:
        write_atomic(path, json.dumps(obj, indent=1) + "\n", exclusive=exclusive)
    except FileExistsError:
        if exclusive and os.path.lexists(path):  # not a file where the folder should be
            return False
        raise
    return True


OOM_TEXTS = (
    "CUDA out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "NCCL error: unhandled cuda error",
    "cudaErrorMemoryAllocation",
    "out of memory",
)


def is_oom(exc: BaseException) -> bool:
    """CUDA out-of-memory, however it surfaced (torch's error, cuBLAS or NCCL allocation)."""
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return any(s in text for s in OOM_TEXTS)


def one_line(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:limit]
