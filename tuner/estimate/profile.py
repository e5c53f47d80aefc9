"""Efficiency constants of the cost model, and the profile file `tune calibrate` writes.

The defaults are first-principles figures (fractions of datasheet peaks that well-known kernels
reach, host overheads of the software stack), not fits to any reference row; `tune calibrate`
fits the ones listed in CALIBRATED to the user's own measured rows.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from tuner.errors import UserError
from tuner.fileio import load_json, write_atomic

PROFILE_SCHEMA = 2
DEFAULT_PROFILE_PATH = Path("results") / "calibration.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    """Fractions of the datasheet peaks a real run reaches, and fixed overheads."""

    gemm_efficiency: float = 0.90
    """Fraction of the dense bf16 peak GEMM kernels reach when not limited by memory traffic.
    The model adds the GEMM's bytes at the HBM rate (a soft roofline), so a 4096^3 GEMM on an
    H100 comes out near the ~720-780 TFLOP/s cuBLAS measures, and compute-poor GPUs (H20) run
    their GEMMs closer to peak."""
    attention_efficiency: float = 0.45
    """Fraction of the bf16 peak flash attention reaches, forward and backward together, on
    variable-length packed sequences of a few thousand tokens."""
    grouped_gemm_efficiency: float = 0.55
    """MoE expert GEMMs (grouped GEMM over the local experts) relative to dense GEMMs of the same
    size: one launch for many small problems, tile waste per expert, unfused permutes."""
    hbm_efficiency: float = 0.80
    """Fraction of the memory bandwidth streaming kernels reach (decode, elementwise, optimizer)."""
    comm_efficiency: float = 0.70
    """Fraction of NVLink / network bandwidth NCCL collectives reach (bus bandwidth)."""
    pcie_efficiency: float = 0.40
    """Fraction of the host link that offload copies reach (pageable, not pinned, memory)."""
    collective_latency_s: float = 25e-6
    """Fixed cost of one NCCL collective or all-to-all call (launch plus latency)."""
    layer_host_s: float = 3.0e-3
    """Host time of one dense transformer layer for one micro-batch, forward plus backward: the
    Python of about ten Megatron/Transformer Engine module calls (~0.1-0.2 ms each with their
    argument checks, FP8/SP bookkeeping and launches) in the forward, the autograd engine's
    launches in the backward (HOST_FORWARD_SHARE of it is the forward). verl's micro-batch loop
    synchronises with the GPU (packed-sequence metadata, loss), so it is not hidden."""
    moe_layer_host_s: float = 5.0e-3
    """The same for a MoE layer: router, permute, two all-to-alls, grouped MLP and unpermute,
    with a device-to-host synchronisation for the all-to-all split sizes in every layer."""
    decode_launch_s: float = 12e-6
    """Host time per kernel of a vLLM decode step's compiled model launched outside a CUDA graph:
    the steps no graph covers (batches above the largest capture size, mixed batches too large
    for the piecewise graphs) and the attention launches between piecewise graphs."""
    eager_op_host_s: float = 20e-6
    """Host time per op of a vLLM 0.24.0 decode step with `enforce_eager=True`, which runs the
    model uncompiled and calls each op from Python (estimate.generation.eager_ops: 12 per Qwen3
    layer) while the GPU waits on the host: the module call, vLLM's CustomOp and IR-op dispatch,
    the output's allocation, the torch.ops call and its launch, and for attention two Python
    custom ops through the dispatcher with their forward-context look-ups. It is the host's:
    scripts/eager_decode_fit.py (and its .out.txt) fits 48 us to vLLM's LLM.generate and 67 us
    to verl 0.9.1 on this project's single-H100 VMs (Qwen3-1.7B, 32 sequences of 4096 tokens:
    20 and 26 ms per step against 5.4 ms with CUDA graphs), while the reference leaderboards'
    eager rows (H100 and H20 nodes, vLLM before 0.24) imply ~10 us and allow at most ~23 us:
    there eager generation ran as fast as with graphs. The default is a fast host's figure, inside
    what the reference rows allow; `tune calibrate` on a host's own eager rows learns its own."""
    decode_graph_replay_s: float = 30e-6
    """Launch cost of one CUDA-graph replay in a vLLM decode step with `enforce_eager=False`,
    verl 0.9.1's default: one cudaGraphLaunch of the captured forward (tens of microseconds for
    a graph of several hundred kernels), nearly constant whatever the batch and the kernel
    count; the kernels inside run back to back on the GPU."""
    decode_step_overhead_s: float = 3e-3
    """Fixed host time per vLLM decode step: scheduler, input preparation, sampler. Under vLLM
    0.24.0's async scheduling it runs while the GPU runs the step before, so a step costs it only
    where the host's chain (it, decode_seq_overhead_s and the step's launches) outlasts the GPU's
    work; without async scheduling (the reference rows' vLLM) it adds to every step
    (estimate.generation VLLM_ASYNC_SCHEDULING, _decode_step_s)."""
    decode_seq_overhead_s: float = 25e-6
    """Host time per running sequence per decode step in vLLM's scheduler and output processing
    (tens of microseconds per sequence in the V0 engine), overlapped or added as
    decode_step_overhead_s. It does not shrink with rollout TP."""
    controller_gb_s: float = 1.0
    """Rate at which verl's single controller ships a phase's padded batch to the workers and
    collects the results (pickling, Ray object store, unpickling), GB/s."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (v >= 0 and math.isfinite(v)):
                raise UserError(f"calibration constant {f.name} must be finite and >= 0, got {v}")
        for name in (
            "gemm_efficiency",
            "attention_efficiency",
            "grouped_gemm_efficiency",
            "hbm_efficiency",
            "comm_efficiency",
            "pcie_efficiency",
        ):
            if not 0 < getattr(self, name) <= 1:
                raise UserError(
                    f"calibration constant {name} must lie in (0, 1], got {getattr(self, name)}"
                )

    def with_values(self, **kw: float) -> Profile:
        return replace(self, **kw)


CALIBRATED: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (0.3, 1.0),
    "attention_efficiency": (0.15, 0.9),
    "grouped_gemm_efficiency": (0.15, 1.0),
    "hbm_efficiency": (0.3, 1.0),
    "comm_efficiency": (0.2, 1.0),
    "pcie_efficiency": (0.05, 1.0),
    "layer_host_s": (1e-4, 1e-2),
    "moe_layer_host_s": (3e-4, 3e-2),
    "decode_launch_s": (2e-6, 6e-5),
    "eager_op_host_s": (5e-6, 2e-4),
    "decode_graph_replay_s": (5e-6, 1e-3),
    "decode_step_overhead_s": (2e-4, 2e-2),
    "decode_seq_overhead_s": (2e-6, 2e-4),
    "controller_gb_s": (0.05, 20.0),
}
"""Constants `tune calibrate` may fit, with their bounds (memory constants are not fitted: a
measured peak is a lower bound of what a run needs, not its need)."""
UNFITTED: dict[str, tuple[float, float]] = {
    "collective_latency_s": (1e-6, 1e-3),
}
"""The range of each constant `tune calibrate` does not fit: NCCL's fixed cost of one collective
is a few to tens of microseconds (launch plus the first hop), never a millisecond."""
RANGES: dict[str, tuple[float, float]] = {**CALIBRATED, **UNFITTED}
"""Every constant's range, as a profile file may set it (`profile_of`): a constant of 1e300 was
read and printed as a 300-digit step time (issue 38 item 4)."""


RETIRED_CONSTANTS = ("context_gib", "fragmentation")
"""Constants of schema-2 profiles that the cost model no longer has (9cc925f took the memory
model's out of the profile; it was never fitted): a profile holding them is read without them."""


def load_profile(path: Path | None = None) -> Profile:
    """The profile at `path`, else the default file if present, else the built-in defaults."""
    file = path or DEFAULT_PROFILE_PATH
    if not file.exists():
        if path is not None:
            raise UserError(f"no calibration profile at {file}: run `tune calibrate` first")
        return Profile()
    return profile_of(load_json(file, "calibration profile"), file)


def profile_source(path: Path | None = None) -> str:
    """The file `load_profile(path)` reads (text), '' where it takes the built-in constants: a
    study says which profile it uses and records it in every row, since a `tune calibrate` in
    the folder changes every later run's predictions without a word otherwise."""
    file = path or DEFAULT_PROFILE_PATH
    return str(file) if file.exists() else ""


def profile_of(data: object, file: Path) -> Profile:
    """The Profile a profile file's JSON holds; UserError naming the file and what is wrong: not
    `tune calibrate`'s schema, a constant this version does not know (a misspelt name was
    dropped without a word), a value that is not a number (text, true), or one outside what
    `tune calibrate` fits in (`CALIBRATED`) or the model allows (`Profile.__post_init__`)."""
    redo = "re-run `tune calibrate` to write one, or fix the file"
    if not isinstance(data, dict):
        raise UserError(f"calibration profile {file} holds no JSON object: {redo}")
    if data.get("schema") != PROFILE_SCHEMA:
        got = json.dumps(data.get("schema"))[:20]
        raise UserError(
            f"calibration profile {file} has schema {got}, not {PROFILE_SCHEMA} (this version's): "
            f"{redo}"
        )
    constants = data.get("constants")
    if not isinstance(constants, dict):
        raise UserError(f'calibration profile {file} has no "constants" object: {redo}')
    known = [f.name for f in fields(Profile)]
    values: dict[str, float] = {}
    for name, value in constants.items():
        if name in RETIRED_CONSTANTS:
            continue
        if name not in known:
            raise UserError(
                f"calibration profile {file}: unknown constant {str(name)[:40]!r}: use the names "
                f"`tune calibrate` prints (e.g. {known[0]}), or {redo}"
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(
                f"calibration profile {file}: {name} is {json.dumps(value)[:40]}, not a number: "
                f"{redo}"
            )
        lo, hi = RANGES[name]
        if not lo <= value <= hi:
            fits = "`tune calibrate` fits in" if name in CALIBRATED else "the cost model takes"
            raise UserError(
                f"calibration profile {file}: {name} {value:g} is outside {lo:g}..{hi:g} (the "
                f"range {fits}): {redo}"
            )
        values[name] = float(value)
    try:
        return Profile(**values)
    except UserError as e:
        raise UserError(f"calibration profile {file}: {e}: {redo}") from None


def save_profile(profile: Profile, path: Path | None = None, **meta: object) -> Path:
    """Write the profile atomically (fileio.write_atomic) with its schema version."""
    file = path or DEFAULT_PROFILE_PATH
    payload = {"schema": PROFILE_SCHEMA, "constants": asdict(profile), **meta}
    return write_atomic(file, json.dumps(payload, indent=2) + "\n")
