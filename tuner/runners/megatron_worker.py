"""The torchrun worker of the megatron runner: verl's actor update, measured on real GPUs.

    torchrun --nproc-per-node N -m tuner.runners.megatron_worker --spec spec.json --out result.json

It builds a GPT model with megatron-core from the spec (random bf16 weights, megatron-core's
local layers: no transformer-engine needed), the layout's process groups, megatron's DDP and
distributed optimizer, and runs `warmup_steps + steps` steps of the actor update as verl's
Megatron actor does it: the step's samples are placed by `tuner.runners.batching` (verl's DP
balancing, mini-batches, dynamic or fixed micro-batches), each micro-batch is one packed
(THD) sequence of its samples with `PackedSeqParams`, one optimizer step per mini-batch, through
megatron's pipeline schedule. Attention is our own core-attention module on PyTorch's flash
kernels (varlen flash attention over the packed sequences; never the unfused softmax path).
Only real tokens exist in a packed micro-batch, so throughput counts real tokens only.

Loss: per-token cross-entropy from megatron's vocab-parallel loss (the log-probs verl's policy
loss is built on), averaged over the micro-batch's tokens.

Offload (`param`, `grad`, `optimizer`) is done as verl does it around its update: weights, grad
buffers and optimizer states are loaded to the GPU at the start of the step and moved to the CPU
at its end, inside the timed step.

Rank 0 writes the result JSON (temp file + os.replace) on success; on failure the first rank
that fails writes it and exits non-zero, and torchrun ends the others. Everything in this file
above `_gpu_main` imports on a CPU-only Python without torch or megatron (the tests use it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = 1
STATUSES = ("ok", "oom", "failed")
PHASES = ("init", "build", "warmup", "step")
RECOMPUTE_GRANULARITIES = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")


# --------------------------------------------------------------------------------------------
# The spec
# --------------------------------------------------------------------------------------------


def _get(d: Mapping[str, Any], key: str, kind: type, where: str, default: Any = ...) -> Any:
    if key not in d:
        if default is ...:
            raise ValueError(f"spec {where} lacks {key!r}")
        return default
    v = d[key]
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ValueError(f"spec {where}.{key} must be an integer, got {v!r}")
    if kind is bool and not isinstance(v, bool):
        raise ValueError(f"spec {where}.{key} must be true or false, got {v!r}")
    if kind is str and not isinstance(v, str):
        raise ValueError(f"spec {where}.{key} must be a string, got {v!r}")
    return v


def _positive(where: str, **values: int) -> None:
    for k, v in values.items():
        if v <= 0:
            raise ValueError(f"spec {where}.{k} must be positive, got {v}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelCfg:
    """The architecture (Hugging Face names in comments)."""

    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    """intermediate_size; unused when every layer is MoE."""
    num_attention_heads: int
    num_query_groups: int
    """num_key_value_heads."""
    kv_channels: int
    """head_dim."""
    vocab_size: int
    num_experts: int = 0
    """0 for a dense model."""
    moe_router_topk: int = 0
    moe_ffn_hidden_size: int = 0
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    qk_layernorm: bool = False
    """Optional in the spec (Qwen3 has it); default false."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelCfg:
        w = "model"
        m = cls(
            name=_get(d, "name", str, w),
            num_layers=_get(d, "num_layers", int, w),
            hidden_size=_get(d, "hidden_size", int, w),
            ffn_hidden_size=_get(d, "ffn_hidden_size", int, w),
            num_attention_heads=_get(d, "num_attention_heads", int, w),
            num_query_groups=_get(d, "num_query_groups", int, w),
            kv_channels=_get(d, "kv_channels", int, w),
            vocab_size=_get(d, "vocab_size", int, w),
            num_experts=_get(d, "num_experts", int, w, 0),
            moe_router_topk=_get(d, "moe_router_topk", int, w, 0),
            moe_ffn_hidden_size=_get(d, "moe_ffn_hidden_size", int, w, 0),
            qkv_bias=_get(d, "qkv_bias", bool, w, False),
            tie_word_embeddings=_get(d, "tie_word_embeddings", bool, w, False),
            qk_layernorm=_get(d, "qk_layernorm", bool, w, False),
        )
        _positive(
            w,
            num_layers=m.num_layers,
            hidden_size=m.hidden_size,
            num_attention_heads=m.num_attention_heads,
            num_query_groups=m.num_query_groups,
            kv_channels=m.kv_channels,
            vocab_size=m.vocab_size,
        )
        if m.num_attention_heads % m.num_query_groups:
            raise ValueError(
                f"spec model: num_attention_heads ({m.num_attention_heads}) is not a multiple of "
                f"num_query_groups ({m.num_query_groups})"
            )
        if m.num_experts < 0:
            raise ValueError(f"spec model.num_experts must not be negative, got {m.num_experts}")
        if m.num_experts:
            if not 0 < m.moe_router_topk <= m.num_experts:
                raise ValueError(
                    f"spec model.moe_router_topk ({m.moe_router_topk}) must lie in "
                    f"1..num_experts ({m.num_experts})"
                )
            _positive(w, moe_ffn_hidden_size=m.moe_ffn_hidden_size)
        else:
            _positive(w, ffn_hidden_size=m.ffn_hidden_size)
        return m

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


@dataclass(frozen=True, kw_only=True, slots=True)
class LayoutCfg:
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    """Virtual stages per pipeline rank; 1 means no interleaving."""
    cp: int = 1
    ep: int = 1
    etp: int = 1
    sp: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LayoutCfg:
        w = "layout"
        lay = cls(
            tp=_get(d, "tp", int, w, 1),
            pp=_get(d, "pp", int, w, 1),
            vpp=_get(d, "vpp", int, w, 1),
            cp=_get(d, "cp", int, w, 1),
            ep=_get(d, "ep", int, w, 1),
            etp=_get(d, "etp", int, w, 1),
            sp=_get(d, "sp", bool, w, False),
        )
        _positive(w, tp=lay.tp, pp=lay.pp, vpp=lay.vpp, cp=lay.cp, ep=lay.ep, etp=lay.etp)
        if lay.vpp > 1 and lay.pp == 1:
            raise ValueError(f"spec layout: vpp ({lay.vpp}) needs pp > 1")
        if lay.sp and lay.tp == 1:
            raise ValueError("spec layout: sequence parallel needs tp > 1")
        return lay

    def dp(self, world: int) -> int:
        """Data-parallel size; raises with every factor named when it does not divide."""
        denom = self.tp * self.pp * self.cp
        if world % denom:
            raise ValueError(
                f"world ({world}) is not a multiple of tp({self.tp}) * pp({self.pp}) * "
                f"cp({self.cp}) = {denom}"
            )
        dp = world // denom
        if (self.tp * self.cp * dp) % (self.ep * self.etp):
            raise ValueError(
                f"ep({self.ep}) * etp({self.etp}) does not divide tp({self.tp}) * cp({self.cp}) "
                f"* dp({dp}) = {self.tp * self.cp * dp}"
            )
        return dp


@dataclass(frozen=True, kw_only=True, slots=True)
class RecomputeCfg:
    granularity: str = "none"
    method: str = "uniform"
    num_layers: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RecomputeCfg:
        w = "recompute"
        r = cls(
            granularity=_get(d, "granularity", str, w, "none"),
            method=_get(d, "method", str, w, "uniform"),
            num_layers=_get(d, "num_layers", int, w, 0),
        )
        if r.granularity not in RECOMPUTE_GRANULARITIES:
            raise ValueError(
                f"spec recompute.granularity {r.granularity!r} is not one of "
                f"{', '.join(RECOMPUTE_GRANULARITIES)}"
            )
        if r.method not in RECOMPUTE_METHODS:
            raise ValueError(
                f"spec recompute.method {r.method!r} is not one of {', '.join(RECOMPUTE_METHODS)}"
            )
        if r.granularity == "full" and r.num_layers <= 0:
            raise ValueError("spec recompute: full recompute needs num_layers >= 1")
        return r


@dataclass(frozen=True, kw_only=True, slots=True)
class OffloadCfg:
    param: bool = False
    grad: bool = False
    optimizer: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OffloadCfg:
        w = "offload"
        return cls(
            param=_get(d, "param", bool, w, False),
            grad=_get(d, "grad", bool, w, False),
            optimizer=_get(d, "optimizer", bool, w, False),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchCfg:
    sequence_lengths: tuple[int, ...]
    """One step's samples, prompt + response tokens each."""
    mini_batch_size: int
    """Samples per optimizer step (verl: ppo_mini_batch_size * rollout.n)."""
    use_dynamic_bsz: bool
    max_token_len_per_gpu: int = 0
    micro_batch_size_per_gpu: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BatchCfg:
        w = "batch"
        lens = d.get("sequence_lengths")
        if not isinstance(lens, list) or not lens:
            raise ValueError("spec batch.sequence_lengths must be a non-empty list of integers")
        if any(isinstance(x, bool) or not isinstance(x, int) or x <= 0 for x in lens):
            raise ValueError("spec batch.sequence_lengths must hold positive integers")
        b = cls(
            sequence_lengths=tuple(lens),
            mini_batch_size=_get(d, "mini_batch_size", int, w),
            use_dynamic_bsz=_get(d, "use_dynamic_bsz", bool, w),
            max_token_len_per_gpu=_get(d, "max_token_len_per_gpu", int, w, 0),
            micro_batch_size_per_gpu=_get(d, "micro_batch_size_per_gpu", int, w, 0),
        )
        _positive(w, mini_batch_size=b.mini_batch_size)
        if b.use_dynamic_bsz:
            _positive(w, max_token_len_per_gpu=b.max_token_len_per_gpu)
        else:
            _positive(w, micro_batch_size_per_gpu=b.micro_batch_size_per_gpu)
        return b


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSpec:
    """What one worker run measures; the JSON form is the runner's contract (schema 1)."""

    model: ModelCfg
    layout: LayoutCfg
    recompute: RecomputeCfg
    offload: OffloadCfg
    batch: BatchCfg
    steps: int = 3
    warmup_steps: int = 1
    seed: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkerSpec:
        if not isinstance(d, Mapping):
            raise ValueError("spec must be a JSON object")
        if d.get("schema") != SCHEMA:
            raise ValueError(f"spec schema {d.get('schema')!r} is not {SCHEMA}")
        for key in ("model", "layout", "batch"):
            if not isinstance(d.get(key), Mapping):
                raise ValueError(f"spec lacks the {key!r} object")
        s = cls(
            model=ModelCfg.from_dict(d["model"]),
            layout=LayoutCfg.from_dict(d["layout"]),
            recompute=RecomputeCfg.from_dict(d.get("recompute") or {}),
            offload=OffloadCfg.from_dict(d.get("offload") or {}),
            batch=BatchCfg.from_dict(d["batch"]),
            steps=_get(d, "steps", int, "", 3),
            warmup_steps=_get(d, "warmup_steps", int, "", 1),
            seed=_get(d, "seed", int, "", 0),
        )
        _positive("", steps=s.steps)
        if s.warmup_steps < 0:
            raise ValueError(f"spec warmup_steps must not be negative, got {s.warmup_steps}")
        m, lay = s.model, s.layout
        chunks = lay.pp * lay.vpp
        if m.num_layers % chunks:
            raise ValueError(
                f"num_layers ({m.num_layers}) is not a multiple of pp({lay.pp}) * vpp({lay.vpp})"
            )
        if m.num_attention_heads % lay.tp or m.num_query_groups % lay.tp:
            raise ValueError(
                f"tp ({lay.tp}) must divide num_attention_heads ({m.num_attention_heads}) and "
                f"num_query_groups ({m.num_query_groups})"
            )
        if m.is_moe and m.num_experts % lay.ep:
            raise ValueError(f"ep ({lay.ep}) does not divide num_experts ({m.num_experts})")
        if not m.is_moe and (lay.ep > 1 or lay.etp > 1):
            raise ValueError("ep and etp must be 1 for a dense model")
        r = s.recompute
        if r.granularity == "full":
            per_chunk = m.num_layers // chunks
            if r.method == "block" and r.num_layers > per_chunk:
                raise ValueError(
                    f"recompute num_layers ({r.num_layers}) exceeds the {per_chunk} layers of a "
                    "pipeline chunk (block method)"
                )
            if r.method == "uniform" and per_chunk % r.num_layers:
                raise ValueError(
                    f"recompute num_layers ({r.num_layers}) must divide the {per_chunk} layers of "
                    "a pipeline chunk (uniform method)"
                )
        return s

    @property
    def micro_batch_multiple(self) -> int:
        """Interleaved stages need micro-batch counts in whole groups of pp (megatron's
        microbatch_group_size_per_vp_stage defaults to pp)."""
        return self.layout.pp if self.layout.vpp > 1 else 1


def load_spec(path: str | Path) -> WorkerSpec:
    with open(path) as f:
        return WorkerSpec.from_dict(json.load(f))


def spec_to_dict(spec: WorkerSpec) -> dict[str, Any]:
    """The JSON form (schema 1) of a spec."""
    d = asdict(spec)
    d["batch"]["sequence_lengths"] = list(spec.batch.sequence_lengths)
    return {"schema": SCHEMA, **d}


# --------------------------------------------------------------------------------------------
# FLOPs and MFU
# --------------------------------------------------------------------------------------------

FLOPS_FORMULA = (
    "6*N_active*T + 6*L*a*d*sum(s_i^2); N_active = matmul weights one token passes through "
    "(L*(h*(a*d+2*g*d) + a*d*h + mlp) + h*V, mlp = 3*h*ffn dense or k*3*h*ffn_e + h*E MoE), "
    "T = tokens, s_i = sample lengths (causal attention), no recompute counted"
)


def active_matmul_params(m: ModelCfg) -> int:
    """Weights of the matrix products one token passes through (biases, norms and the
    embedding lookup excluded; the output layer included)."""
    q = m.num_attention_heads * m.kv_channels
    kv = m.num_query_groups * m.kv_channels
    attn = m.hidden_size * (q + 2 * kv) + q * m.hidden_size
    if m.is_moe:
        mlp = m.moe_router_topk * 3 * m.hidden_size * m.moe_ffn_hidden_size
        mlp += m.hidden_size * m.num_experts
    else:
        mlp = 3 * m.hidden_size * m.ffn_hidden_size
    return m.num_layers * (attn + mlp) + m.hidden_size * m.vocab_size


def model_flops(m: ModelCfg, sequence_lengths: Sequence[int]) -> float:
    """Training FLOPs (forward + backward) of one pass over `sequence_lengths` (FLOPS_FORMULA)."""
    tokens = sum(sequence_lengths)
    sq = sum(s * s for s in sequence_lengths)
    q = m.num_attention_heads * m.kv_channels
    return 6.0 * active_matmul_params(m) * tokens + 6.0 * m.num_layers * q * sq


def peak_bf16_tflops(device_name: str) -> float | None:
    """Dense bf16 peak of the GPU named `device_name` (torch.cuda.get_device_name), from
    tuner.hardware's table; the longest matching name wins (h200 before h20)."""
    from tuner.hardware import GPUS

    name = device_name.lower()
    hits = [g for key, g in GPUS.items() if key in name]
    if not hits:
        return None
    return max(hits, key=lambda g: len(g.name)).bf16_tflops


# --------------------------------------------------------------------------------------------
# The result
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class WorkerResult:
    """result.json (schema 1). Times in seconds, memory in GiB (max over ranks)."""

    status: str
    phase: str
    reason: str = ""
    step_s: float | None = None
    step_times_s: list[float] = field(default_factory=list)
    tokens: int = 0
    tokens_per_s_per_gpu: float | None = None
    mfu_pct: float | None = None
    flops_formula: str = FLOPS_FORMULA
    model_tflops_per_step: float | None = None
    peak_mem_allocated_gib: float | None = None
    peak_mem_reserved_gib: float | None = None
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
    not a schema-1 result."""
    d = json.loads(data) if isinstance(data, (str, bytes)) else data
    if not isinstance(d, Mapping):
        raise ValueError("result is not a JSON object")
    if d.get("schema") != SCHEMA:
        raise ValueError(f"result schema {d.get('schema')!r} is not {SCHEMA}")
    if d.get("status") not in STATUSES:
        raise ValueError(f"result status {d.get('status')!r} is not one of {STATUSES}")
    if d.get("phase") not in PHASES:
        raise ValueError(f"result phase {d.get('phase')!r} is not one of {PHASES}")
    known = set(WorkerResult.__dataclass_fields__)
    kwargs = {k: v for k, v in d.items() if k in known}
    r = WorkerResult(**kwargs)
    if r.status == "ok":
        for k in ("step_s", "tokens_per_s_per_gpu", "peak_mem_allocated_gib"):
            v = getattr(r, k)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise ValueError(f"ok result lacks a finite {k}")
    return r


def write_json_atomic(path: str | Path, obj: Mapping[str, Any], *, exclusive: bool = False) -> bool:
    """Write `obj` to `path` through a temp file in the same folder. With `exclusive`, keep an
    existing file (the first failure wins) and return False."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        os.replace(tmp, path)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def is_oom(exc: BaseException) -> bool:
    """CUDA out-of-memory, however it surfaced (torch's error, cuBLAS or NCCL allocation)."""
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return any(
        s in text
        for s in (
            "CUDA out of memory",
            "CUBLAS_STATUS_ALLOC_FAILED",
            "NCCL error: unhandled cuda error",
            "cudaErrorMemoryAllocation",
            "out of memory",
        )
    )


def one_line(exc: BaseException, limit: int = 400) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:limit]


# --------------------------------------------------------------------------------------------
# The GPU part (torch and megatron imported here only)
# --------------------------------------------------------------------------------------------


def _log(msg: str) -> None:
    rank = os.environ.get("RANK", "0")
    print(f"[worker r{rank} {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class _Phase:
    name = "init"


def _gpu_main(spec: WorkerSpec, out: Path, phase: _Phase) -> WorkerResult:
    import torch
    import torch.distributed as dist

    t_start = time.monotonic()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world = dist.get_world_size()
    rank = dist.get_rank()
    lay = spec.layout
    dp = lay.dp(world)

    from megatron.core import parallel_state as mpu
    from megatron.core import tensor_parallel

    have_te = _have_te()
    if (lay.sp or lay.cp > 1) and not have_te:
        raise _SpecFailure(
            "sequence parallel and context parallel need transformer-engine, which is not "
            "installed on this host"
        )
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=lay.tp,
        pipeline_model_parallel_size=lay.pp,
        virtual_pipeline_model_parallel_size=lay.vpp if lay.vpp > 1 else None,
        context_parallel_size=lay.cp,
        expert_model_parallel_size=lay.ep,
        expert_tensor_parallel_size=lay.etp,
    )
    tensor_parallel.model_parallel_cuda_manual_seed(spec.seed)
    torch.manual_seed(spec.seed + rank)
    attn_impl = _choose_attention()
    experts, experts_name = _choose_experts() if spec.model.is_moe else (None, "")
    init_s = time.monotonic() - t_start
    _log(f"init {init_s:.1f}s world={world} dp={dp} attention={attn_impl.name} {experts_name}")

    phase.name = "build"
    t0 = time.monotonic()
    model, optimizer, tf_config, padded_vocab = _build(spec, attn_impl, experts)
    plan = _plan(spec, dp)
    dp_rank = mpu.get_data_parallel_rank()
    batches = _make_inputs(spec, plan, dp_rank, padded_vocab)
    build_s = time.monotonic() - t0
    n_params = sum(p.numel() for c in model for p in c.parameters())
    _log(
        f"build {build_s:.1f}s local params={n_params / 1e9:.3f}B "
        f"micro-batches/step={plan.num_micro_batches}"
    )

    from megatron.core.pipeline_parallel import get_forward_backward_func

    fb = get_forward_backward_func()
    offloader = _Offloader(model, optimizer, spec.offload)
    times: list[float] = []
    for step in range(spec.warmup_steps + spec.steps):
        phase.name = "warmup" if step < spec.warmup_steps else "step"
        torch.cuda.synchronize()
        dist.barrier()
        t = time.perf_counter()
        offloader.load()
        for mb_inputs in batches:
            optimizer.zero_grad()
            for chunk in model:
                chunk.zero_grad_buffer()
            iters: Any = [iter(mb_inputs) for _ in model] if len(model) > 1 else iter(mb_inputs)
            fb(
                forward_step_func=_forward_step,
                data_iterator=iters,
                model=model,
                num_microbatches=len(mb_inputs),
                seq_length=max(x["tokens"] for x in mb_inputs),
                micro_batch_size=1,
                forward_only=False,
            )
            ok, _grad_norm, _ = optimizer.step()
        offloader.offload()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
        if step >= spec.warmup_steps:
            times.append(dt)
        _log(f"{phase.name} {step} {dt:.3f}s")

    # Max over ranks: step times and peak memory.
    stats = torch.tensor(
        times
        + [torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30],
        dtype=torch.float64,
        device="cuda",
    )
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    stats_l = stats.tolist()
    times = stats_l[: len(times)]
    peak_alloc, peak_res = stats_l[-2], stats_l[-1]
    step_s = times[2] if len(times) >= 3 else times[-1]
    tokens = plan.total_tokens
    flops = model_flops(spec.model, plan.sequence_lengths)
    gpu = torch.cuda.get_device_name()
    peak = peak_bf16_tflops(gpu)
    mfu = 100.0 * flops / (step_s * world * peak * 1e12) if peak else None
    import megatron.core

    return WorkerResult(
        status="ok",
        phase="step",
        step_s=step_s,
        step_times_s=times,
        tokens=tokens,
        tokens_per_s_per_gpu=tokens / step_s / world,
        mfu_pct=mfu,
        flops_formula=f"{FLOPS_FORMULA}; peak {peak} TFLOP/s bf16 per GPU",
        model_tflops_per_step=flops / 1e12,
        peak_mem_allocated_gib=peak_alloc,
        peak_mem_reserved_gib=peak_res,
        num_micro_batches=plan.num_micro_batches,
        versions=_versions(megatron.core),
        gpu=gpu,
        world_size=world,
        extra={
            "init_s": round(init_s, 2),
            "build_s": round(build_s, 2),
            "attention": attn_impl.name,
            "experts": experts_name,
            "transformer_engine": have_te,
            "dp": dp,
            "padded_vocab_size": padded_vocab,
            "token_budget": plan.token_budget,
            "max_micro_batch_tokens": plan.max_micro_tokens(),
            "micro_batches_per_mini_batch": plan.micro_batch_counts(),
            "local_params": n_params,
        },
    )


class _SpecFailure(Exception):
    """A spec this host cannot run (ends as status failed, phase init)."""


def _have_te() -> bool:
    try:
        import transformer_engine  # type: ignore[import-not-found]  # noqa: F401
    except Exception:
        return False
    return True


def _versions(mcore: Any) -> dict[str, str]:
    import torch

    return {
        "torch": torch.__version__,
        "megatron_core": getattr(getattr(mcore, "package_info", None), "__version__", "")
        or getattr(mcore, "__version__", ""),
        "cuda": str(torch.version.cuda),
    }


def _plan(spec: WorkerSpec, dp: int) -> Any:
    from tuner.runners.batching import plan_step

    b = spec.batch
    return plan_step(
        b.sequence_lengths,
        dp=dp,
        mini_batch_size=b.mini_batch_size,
        use_dynamic_bsz=b.use_dynamic_bsz,
        max_token_len_per_gpu=b.max_token_len_per_gpu,
        micro_batch_size_per_gpu=b.micro_batch_size_per_gpu,
        cp=spec.layout.cp,
        micro_batch_multiple=spec.micro_batch_multiple,
    )


def _make_inputs(spec: WorkerSpec, plan: Any, dp_rank: int, vocab: int) -> list[list[dict]]:
    """Per mini-batch, this rank's packed micro-batches on the GPU (made once, reused)."""
    import torch
    from megatron.core import parallel_state as mpu
    from megatron.core.packed_seq_params import PackedSeqParams

    gen = torch.Generator(device="cuda")
    gen.manual_seed(spec.seed * 1000 + dp_rank)
    cp_group = mpu.get_context_parallel_group()
    minis = []
    for m in range(plan.num_mini_batches):
        mbs = []
        for lens in plan.rank_micro_lengths(m, dp_rank):
            t = sum(lens)
            cu = torch.tensor([0, *_cumsum(lens)], dtype=torch.int32, device="cuda")
            ids = torch.randint(0, vocab, (1, t), generator=gen, device="cuda")
            labels = torch.randint(0, vocab, (1, t), generator=gen, device="cuda")
            pos = torch.cat([torch.arange(s, device="cuda") for s in lens]).unsqueeze(0)
            psp = PackedSeqParams(
                qkv_format="thd",
                cu_seqlens_q=cu,
                cu_seqlens_kv=cu,
                max_seqlen_q=max(lens),
                max_seqlen_kv=max(lens),
                cp_group=cp_group,
            )
            mbs.append({"ids": ids, "labels": labels, "pos": pos, "psp": psp, "tokens": t})
        minis.append(mbs)
    return minis


def _cumsum(xs: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for x in xs:
        acc += x
        out.append(acc)
    return out


def _forward_step(data_iterator: Any, model: Any) -> Any:
    from functools import partial

    mb = next(data_iterator)
    out = model(mb["ids"], mb["pos"], None, labels=mb["labels"], packed_seq_params=mb["psp"])
    return out, partial(_loss_func, mb["tokens"])


def _loss_func(tokens: int, output: Any) -> Any:
    # `output` is the per-token cross-entropy [1, t] (fp32) on the last stage: -log p(label).
    loss = output.float().sum() / tokens
    return loss, {"loss": loss.detach()}


def _transformer_config(spec: WorkerSpec, **overrides: Any) -> Any:
    """megatron's TransformerConfig for the spec (local layers, no fused kernels that need
    transformer-engine or apex)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    m, lay, r = spec.model, spec.layout, spec.recompute
    kw: dict[str, Any] = {}
    if r.granularity == "selective":
        kw.update(recompute_granularity="selective")
    elif r.granularity == "full":
        kw.update(
            recompute_granularity="full",
            recompute_method=r.method,
            recompute_num_layers=r.num_layers,
        )
    if m.is_moe:
        kw.update(
            num_moe_experts=m.num_experts,
            moe_router_topk=m.moe_router_topk,
            moe_ffn_hidden_size=m.moe_ffn_hidden_size,
            moe_grouped_gemm=False,
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-3,
            moe_router_dtype="fp32",
            moe_permute_fusion=False,
        )
    base: dict[str, Any] = dict(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size if m.ffn_hidden_size > 0 else m.moe_ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        kv_channels=m.kv_channels,
        add_bias_linear=False,
        add_qkv_bias=m.qkv_bias,
        gated_linear_unit=True,
        activation_func=F.silu,
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,
        qk_layernorm=m.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=lay.tp,
        pipeline_model_parallel_size=lay.pp,
        virtual_pipeline_model_parallel_size=lay.vpp if lay.vpp > 1 else None,
        context_parallel_size=lay.cp,
        expert_model_parallel_size=lay.ep,
        expert_tensor_parallel_size=lay.etp,
        sequence_parallel=lay.sp,
        variable_seq_lengths=True,
        # megatron refuses variable lengths with the default allgather dispatcher, MoE or not.
        moe_token_dispatcher_type="alltoall",
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        cross_entropy_loss_fusion=False,
        deallocate_pipeline_outputs=True,
        init_method_std=0.02,
    )
    return TransformerConfig(**{**base, **kw, **overrides})


def _layer_spec(spec: WorkerSpec, core_attention: type, experts: type | None = None) -> Any:
    """megatron-core's local GPT layer spec with our flash core attention and, for MoE, our
    grouped-GEMM experts in place of SequentialMLP when `experts` is given."""
    import dataclasses
    from functools import partial

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    m = spec.model
    layer_spec = get_gpt_layer_local_spec(
        num_experts=m.num_experts or None,
        moe_grouped_gemm=False,
        qk_layernorm=m.qk_layernorm,
        normalization="RMSNorm",
    )
    layer_spec.submodules.self_attention.submodules.core_attention = core_attention
    if m.is_moe and experts is not None:
        moe = layer_spec.submodules.mlp  # partial(MoELayer, submodules=MoESubmodules(...))
        subs = dataclasses.replace(moe.keywords["submodules"], experts=experts)
        layer_spec.submodules.mlp = partial(
            moe.func, *moe.args, **{**moe.keywords, "submodules": subs}
        )
    return layer_spec


def _build_chunks(spec: WorkerSpec, config: Any, layer_spec: Any) -> tuple[list[Any], int]:
    """This rank's GPTModel chunks (one per virtual stage) and the padded vocabulary."""
    from megatron.core import parallel_state as mpu
    from megatron.core.models.gpt import GPTModel

    m, lay = spec.model, spec.layout
    padded_vocab = -(-m.vocab_size // lay.tp) * lay.tp
    max_len = max(spec.batch.sequence_lengths)

    def build_chunk(vp_stage: int | None) -> Any:
        kwargs = {} if vp_stage is None else {"ignore_virtual": False, "vp_stage": vp_stage}
        return GPTModel(
            config=config,
            transformer_layer_spec=layer_spec,
            vocab_size=padded_vocab,
            max_sequence_length=max_len,
            pre_process=mpu.is_pipeline_first_stage(**kwargs),
            post_process=mpu.is_pipeline_last_stage(**kwargs),
            share_embeddings_and_output_weights=m.tie_word_embeddings,
            position_embedding_type="rope",
            rotary_base=1_000_000,
            vp_stage=vp_stage,
        )

    if lay.vpp > 1:
        return [build_chunk(i) for i in range(lay.vpp)], padded_vocab
    return [build_chunk(None)], padded_vocab


def _build(spec: WorkerSpec, attn_impl: Any, experts: type | None) -> Any:
    import torch
    from megatron.core import tensor_parallel
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.module import Float16Module

    config = _transformer_config(spec)
    layer_spec = _layer_spec(spec, _core_attention_class(attn_impl), experts)
    chunks, padded_vocab = _build_chunks(spec, config, layer_spec)
    for c in chunks:
        for p in c.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(p)
        c.cuda(torch.cuda.current_device())
    chunks = [Float16Module(config, c) for c in chunks]
    # verl's DDP settings (verl/utils/megatron_utils.py): fp32 grad reduce, no overlap.
    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=True, grad_reduce_in_fp32=True, overlap_grad_reduce=False
    )
    model = [
        DistributedDataParallel(
            config=config, ddp_config=ddp_config, module=c, disable_bucketing=(i > 0)
        )
        for i, c in enumerate(chunks)
    ]
    for c in model:
        c.broadcast_params()
    opt_config = OptimizerConfig(
        optimizer="adam",
        lr=1e-6,
        weight_decay=0.01,
        clip_grad=1.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=True,
    )
    optimizer = get_megatron_optimizer(opt_config, model)
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = [c.no_sync for c in model] if len(model) > 1 else model[0].no_sync
    config.grad_scale_func = optimizer.scale_loss
    return model, optimizer, config, padded_vocab


# ---- attention ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _AttnImpl:
    name: str
    varlen: Any
    """fn(q, k, v, cu, max_len, scale) -> out for packed [t, heads, d] tensors."""
    expand_gqa: bool


def _choose_attention() -> _AttnImpl:
    """Pick the fastest varlen flash path that computes the right thing here: PyTorch's
    varlen_attn, or the aten flash ops, with native grouped-query heads or expanded ones,
    checked forward and backward against per-sequence SDPA on random data."""
    candidates = []
    fn = _torch_varlen_attn()
    if fn is not None:
        candidates += [("varlen_attn", fn, False), ("varlen_attn", fn, True)]
    candidates += [
        ("aten_flash_varlen", _aten_flash_varlen, False),
        ("aten_flash_varlen", _aten_flash_varlen, True),
    ]
    errors = []
    for name, f, expand in candidates:
        impl = _AttnImpl(f"{name}{' (gqa expanded)' if expand else ''}", f, expand)
        try:
            err = _check_attention(impl)
        except Exception as e:  # noqa: BLE001 (each candidate may be unsupported)
            errors.append(f"{impl.name}: {one_line(e, 200)}")
            continue
        if err < 2e-2:
            return impl
        errors.append(f"{impl.name}: relative error {err:.3g}")
    _log("no varlen flash attention passed: " + "; ".join(errors))
    return _AttnImpl("sdpa per sequence", None, False)


def _torch_varlen_attn() -> Any:
    import inspect

    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception:
        return None
    params = inspect.signature(varlen_attn).parameters

    def call(q: Any, k: Any, v: Any, cu: Any, max_len: int, scale: float) -> Any:
        kw: dict[str, Any] = {"scale": scale}
        if "is_causal" in params:
            kw["is_causal"] = True
        else:
            kw["window_size"] = (-1, 0)
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)

    return call


def _aten_flash_varlen(q: Any, k: Any, v: Any, cu: Any, max_len: int, scale: float) -> Any:
    return _AtenFlash.apply(q, k, v, cu, max_len, scale)


def _make_aten_flash() -> Any:
    import torch

    class AtenFlash(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, cu: Any, max_len: int, scale: float) -> Any:
            out, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(
                q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale
            )
            ctx.save_for_backward(q, k, v, out, lse, cu, seed, offset)
            ctx.max_len, ctx.scale = max_len, scale
            return out

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:
            q, k, v, out, lse, cu, seed, offset = ctx.saved_tensors
            dq, dk, dv = torch.ops.aten._flash_attention_backward(
                dout.contiguous(),
                q,
                k,
                v,
                out,
                lse,
                cu,
                cu,
                ctx.max_len,
                ctx.max_len,
                0.0,
                True,
                seed,
                offset,
                scale=ctx.scale,
            )
            return dq, dk, dv, None, None, None

    return AtenFlash


class _LazyAtenFlash:
    fn: Any = None

    def apply(self, *args: Any) -> Any:
        if self.fn is None:
            self.fn = _make_aten_flash()
        return self.fn.apply(*args)


_AtenFlash = _LazyAtenFlash()


def _sdpa_per_sequence(q: Any, k: Any, v: Any, cu_list: list[int], scale: float) -> Any:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    outs = []
    rep = q.shape[1] // k.shape[1]
    with sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    ):
        for a, b in zip(cu_list[:-1], cu_list[1:], strict=True):
            qs = q[a:b].transpose(0, 1).unsqueeze(0)
            ks = k[a:b].transpose(0, 1).unsqueeze(0)
            vs = v[a:b].transpose(0, 1).unsqueeze(0)
            if rep > 1:
                ks = ks.repeat_interleave(rep, dim=1)
                vs = vs.repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
            outs.append(o.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)


def _check_attention(impl: _AttnImpl) -> float:
    import torch

    g = torch.Generator(device="cuda")
    g.manual_seed(1234)
    lens = [37, 128, 5, 300]
    t, hq, hk, d = sum(lens), 8, 2, 128
    cu_list = [0, *_cumsum(lens)]
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    q, k, v = (
        torch.randn(t, h, d, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()
        for h in (hq, hk, hk)
    )
    dout = torch.randn(t, hq, d, generator=g, device="cuda", dtype=torch.bfloat16)
    scale = d**-0.5
    out = _run_varlen(impl, q, k, v, cu, cu_list, max(lens), scale)
    out.backward(dout)
    got: list[Any] = [out.detach().float(), *(x.grad.float() for x in (q, k, v))]  # type: ignore[union-attr]
    qr, kr, vr = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref_out = []
    for a, b in zip(cu_list[:-1], cu_list[1:], strict=True):
        qs, ks, vs = (
            qr[a:b],
            kr[a:b].repeat_interleave(hq // hk, 1),
            vr[a:b].repeat_interleave(hq // hk, 1),
        )
        s = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        mask = torch.ones(b - a, b - a, device="cuda", dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
        ref_out.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), vs))
    ref = torch.cat(ref_out)
    ref.backward(dout.double())
    refs: list[Any] = [ref.detach(), qr.grad, kr.grad, vr.grad]
    return max(float((a.double() - b).norm() / b.norm()) for a, b in zip(got, refs, strict=True))


def _run_varlen(
    impl: _AttnImpl,
    q: Any,
    k: Any,
    v: Any,
    cu: Any,
    cu_list: list[int] | None,
    max_len: int,
    scale: float,
) -> Any:
    if impl.varlen is None:
        if cu_list is None:
            cu_list = cu.tolist()
        return _sdpa_per_sequence(q, k, v, cu_list, scale)
    if impl.expand_gqa and k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return impl.varlen(q, k, v, cu, max_len, scale)


def _core_attention_class(impl: _AttnImpl) -> type:
    """A megatron core-attention module on flash kernels (replaces the local spec's unfused
    DotProductAttention). Packed (THD) input: [t, heads, d]; padded input: [s, b, heads, d]."""
    import math as _math

    import torch.nn.functional as F
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.utils import divide

    class FlashCoreAttention(MegatronModule):
        def __init__(
            self,
            config: Any,
            layer_number: int,
            attn_mask_type: Any,
            attention_type: str = "self",
            attention_dropout: Any = None,
            softmax_scale: Any = None,
            cp_comm_type: Any = None,
            pg_collection: Any = None,
            **_: Any,
        ) -> None:
            super().__init__(config=config)
            if config.context_parallel_size != 1:
                raise ValueError("the flash core attention does not do context parallelism")
            tp = config.tensor_model_parallel_size
            self.heads = divide(config.num_attention_heads, tp)
            self.groups = divide(config.num_query_groups, tp)
            self.head_dim = config.kv_channels
            self.scale = softmax_scale or 1.0 / _math.sqrt(self.head_dim)

        def forward(
            self,
            query: Any,
            key: Any,
            value: Any,
            attention_mask: Any,
            attn_mask_type: Any = None,
            attention_bias: Any = None,
            packed_seq_params: Any = None,
            **_: Any,
        ) -> Any:
            if attention_bias is not None:
                raise ValueError("attention bias is not supported")
            if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
                psp = packed_seq_params
                out = _run_varlen(
                    impl,
                    query,
                    key,
                    value,
                    psp.cu_seqlens_q,
                    None,
                    int(psp.max_seqlen_q),
                    self.scale,
                )
                return out.reshape(out.shape[0], -1)
            # [s, b, h, d] -> [b, h, s, d], causal, GQA in the kernel.
            q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(
                [
                    SDPBackend.FLASH_ATTENTION,
                    SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.EFFICIENT_ATTENTION,
                ]
            ):
                o = F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, scale=self.scale, enable_gqa=self.heads != self.groups
                )
            s, b = query.shape[0], query.shape[1]
            return o.permute(2, 0, 1, 3).reshape(s, b, -1)

    return FlashCoreAttention


# ---- MoE experts: one grouped GEMM per projection ---------------------------------------------

GROUP_ALIGN = 16
"""Tokens per expert are padded to a multiple of this inside the grouped GEMM (16-byte aligned
groups for the weight-gradient GEMM, as torchtitan does)."""


def _grouped_mm() -> Any:
    import torch

    return getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _choose_experts() -> tuple[type | None, str]:
    """Our grouped-GEMM experts if PyTorch's grouped_mm computes the right thing here (checked
    forward and backward against per-expert matmuls), else megatron's SequentialMLP."""
    if _grouped_mm() is None:
        return None, "SequentialMLP (no torch grouped_mm)"
    try:
        err = _check_grouped_experts()
    except Exception as e:  # noqa: BLE001 (unsupported here: fall back)
        _log(f"grouped experts unusable: {one_line(e, 300)}")
        return None, "SequentialMLP (grouped_mm failed its check)"
    if err > 2e-2:
        _log(f"grouped experts wrong: relative error {err:.3g}")
        return None, "SequentialMLP (grouped_mm failed its check)"
    return _grouped_experts_class(), "grouped_mm experts"


def _grouped_expert_forward(x: Any, counts: list[int], fc1: Any, fc2: Any, probs: Any) -> Any:
    """SwiGLU experts over tokens grouped by expert: x [T, h], fc1 [E, 2f, h], fc2 [E, h, f],
    probs [T] (applied after the activation, as megatron's MLP does)."""
    import torch
    import torch.nn.functional as F

    gmm = _grouped_mm()
    t = x.shape[0]
    if t == 0:
        return x.new_zeros(0, fc2.shape[1]) + 0.0 * (fc1.sum() + fc2.sum()).to(x.dtype)
    padded = [c + (-c) % GROUP_ALIGN for c in counts]
    idx = None
    if padded != counts:
        src = dst = 0
        shifts = []
        for c, p in zip(counts, padded, strict=True):
            shifts.append(dst - src)
            src += c
            dst += p
        shift = torch.tensor(shifts, device=x.device)
        reps = torch.tensor(counts, device=x.device)
        idx = torch.arange(t, device=x.device) + torch.repeat_interleave(shift, reps, output_size=t)
        x = x.new_zeros(dst, x.shape[1]).index_copy(0, idx, x)
        probs = probs.new_zeros(dst).index_copy(0, idx, probs)
    offs = torch.tensor(_cumsum(padded), dtype=torch.int32, device=x.device)
    h1 = gmm(x, fc1.transpose(1, 2), offs=offs)
    gate, up = torch.chunk(h1, 2, dim=-1)
    act = (F.silu(gate) * up * probs.unsqueeze(-1)).to(x.dtype)
    out = gmm(act, fc2.transpose(1, 2), offs=offs)
    return out if idx is None else out.index_select(0, idx)


def _check_grouped_experts() -> float:
    import torch
    import torch.nn.functional as F

    g = torch.Generator(device="cuda")
    g.manual_seed(4321)
    counts, h, f = [0, 5, 37, 16, 1], 128, 96
    e, t = len(counts), sum(counts)

    def rnd(*shape: int) -> Any:
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.bfloat16)

    x, w1, w2 = rnd(t, h), rnd(e, 2 * f, h) * 0.1, rnd(e, h, f) * 0.1
    probs = torch.rand(t, generator=g, device="cuda")
    dout = rnd(t, h)
    leaves = [a.clone().requires_grad_() for a in (x, w1, w2)]
    out = _grouped_expert_forward(leaves[0], counts, leaves[1], leaves[2], probs)
    out.backward(dout)
    got = [out.detach(), *(a.grad for a in leaves)]
    ref_leaves = [a.double().requires_grad_() for a in (x, w1, w2)]
    outs, start = [], 0
    for i, c in enumerate(counts):
        xs = ref_leaves[0][start : start + c]
        gate, up = torch.chunk(xs @ ref_leaves[1][i].T, 2, dim=-1)
        outs.append(
            (F.silu(gate) * up * probs[start : start + c, None].double()) @ ref_leaves[2][i].T
        )
        start += c
    ref = torch.cat(outs)
    ref.backward(dout.double())
    refs = [ref.detach(), *(a.grad for a in ref_leaves)]
    return max(
        float((a.double() - b).norm() / b.norm().clamp_min(1e-12))
        for a, b in zip(got, refs, strict=True)
    )


def _grouped_experts_class() -> type:
    """megatron experts module (SequentialMLP's interface) running all local experts in one
    grouped GEMM per projection; weights sharded over expert-tensor-parallel ranks like
    megatron's column/row parallel expert linears, with the same parallel attributes."""
    import torch
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
    from megatron.core.transformer.module import MegatronModule

    class GroupedMMExperts(MegatronModule):
        def __init__(
            self,
            num_local_experts: int,
            config: Any,
            submodules: Any = None,
            pg_collection: Any = None,
            name: str | None = None,
            **_: Any,
        ) -> None:
            super().__init__(config=config)
            etp = pg_collection.expt_tp.size() if pg_collection is not None else 1
            f = config.moe_ffn_hidden_size // etp
            h = config.hidden_size
            dev = torch.cuda.current_device()
            kw = {"device": dev, "dtype": config.params_dtype}
            self.num_local_experts = num_local_experts
            self.fc1 = torch.nn.Parameter(torch.empty(num_local_experts, 2 * f, h, **kw))
            self.fc2 = torch.nn.Parameter(torch.empty(num_local_experts, h, f, **kw))
            use_expert_pgs = config.expert_model_parallel_size > 1 or (
                config.expert_tensor_parallel_size != config.tensor_model_parallel_size
            )
            for p, dim in ((self.fc1, 1), (self.fc2, 2)):
                torch.nn.init.normal_(p, mean=0.0, std=config.init_method_std)
                set_tensor_model_parallel_attributes(p, is_parallel=True, dim=dim, stride=1)
                setattr(p, "allreduce", not use_expert_pgs)  # noqa: B010 (megatron's marker)

        def forward(
            self, permuted_local_hidden_states: Any, tokens_per_expert: Any, permuted_probs: Any
        ) -> Any:
            counts = [int(c) for c in tokens_per_expert.tolist()]
            out = _grouped_expert_forward(
                permuted_local_hidden_states, counts, self.fc1, self.fc2, permuted_probs
            )
            return out, None

        def backward_dw(self) -> None:
            pass

    return GroupedMMExperts


# ---- offload, as verl does around its update --------------------------------------------------


class _Offloader:
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
        if not (c.param or c.grad or c.optimizer):
            return
        self.saved = []
        n = 0
        for buf in self._buffers():
            for want, attr in ((c.param, "param_data"), (c.grad, "grad_data")):
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


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuner.runners.megatron_worker")
    ap.add_argument("--spec", required=True, type=Path, help="spec.json (schema 1)")
    ap.add_argument("--out", required=True, type=Path, help="result.json to write (rank 0)")
    args = ap.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    phase = _Phase()
    result: WorkerResult
    try:
        spec = load_spec(args.spec)
        result = _gpu_main(spec, args.out, phase)
    except BaseException as e:  # noqa: BLE001 (every failure must become a result)
        if isinstance(e, KeyboardInterrupt):
            raise
        status = "oom" if is_oom(e) else "failed"
        if not isinstance(e, (ValueError, _SpecFailure)) or status == "oom":
            traceback.print_exc()
        _log(f"{status} in {phase.name}: {one_line(e)}")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        res = WorkerResult(status=status, phase=phase.name, reason=one_line(e), world_size=world)
        res.extra["failed_rank"] = rank
        write_json_atomic(args.out, res.to_dict(), exclusive=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # Other ranks may wait in a collective for this one: end now, torchrun ends them.
        os._exit(1 if status == "failed" else 3)
    if rank == 0:
        write_json_atomic(args.out, result.to_dict())
        _log(
            f"ok step {result.step_s:.3f}s tokens/s/gpu {result.tokens_per_s_per_gpu:.0f} "
            f"mfu {result.mfu_pct or 0:.1f}% peak {result.peak_mem_allocated_gib:.1f} GiB"
        )
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
