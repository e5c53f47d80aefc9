"""One trial on GPUs whose process group is up: build, run the measured phases, tear down.

Per step, as verl's trainer does: old_log_prob (forward only, no grad, the whole step's samples
in micro-batches by `log_prob_max_token_len_per_gpu` with dynamic batching, else
`log_prob_micro_batch_size_per_gpu`), then update_actor (one optimizer step per mini-batch,
micro-batches by `ppo_max_token_len_per_gpu` or `ppo_micro_batch_size_per_gpu`). Samples are
placed by `tuner.batching` (verl's DP balancing); each micro-batch is one packed (THD)
sequence with `PackedSeqParams` through megatron's pipeline schedule with variable sequence
lengths (see `pipeline.py` for the p2p settings that make interleaving work).

`warmup_steps` then `steps` measured steps run, more while the measured window is shorter than
`min_measured_s` (at most `max_steps` measured, see `more_steps`); the reported phase times are
those of the median measured step. launch_s counts from `t_handover` (process start or pool
request) to the first measured step; measured_s is the wall time of the measured steps."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tuner.batching import BatchPlan, plan_step
from tuner.runners.megatron_worker.log import cumsum, log
from tuner.runners.megatron_worker.protocol import Progress, append_progress
from tuner.runners.megatron_worker.result import (
    FLOPS_FORMULA,
    WorkerResult,
    model_flops,
    peak_bf16_tflops,
)
from tuner.runners.megatron_worker.spec import WorkerSpec


class Phase:
    """Where the trial is (a failure is reported with it)."""

    name = "init"


@dataclass(frozen=True, slots=True)
class Files:
    """Where a trial reports to (empty path: not used)."""

    progress: str = ""
    abandon: str = ""


def plan_phase(spec: WorkerSpec, phase: str, dp: int) -> BatchPlan:
    b = spec.batch
    mini, budget, mbs = b.phase_batching(phase)
    return plan_step(
        b.sequence_lengths,
        dp=dp,
        mini_batch_size=mini,
        use_dynamic_bsz=b.use_dynamic_bsz,
        max_token_len_per_gpu=budget,
        micro_batch_size_per_gpu=mbs,
        cp=spec.layout.cp,
        micro_batch_multiple=spec.micro_batch_multiple,
    )


def te_padded_lengths(lens: list[int], tp: int, cp: int) -> list[int]:
    """Each sequence padded as verl packs it for its TE layers (verl 0.9.1
    models/mcore/util.py `preprocess_packed_seqs`): to a multiple of tp, or of tp*cp*2 with
    context parallelism (each cp rank holds two of 2*cp equal chunks of every sequence)."""
    align = tp * cp * 2 if cp > 1 else tp
    return [n + (-n) % align for n in lens]


def cp_positions(padded: list[int], cp: int, cp_rank: int) -> list[range]:
    """The positions this cp rank holds of each padded sequence, in packing order: chunk
    `cp_rank` and chunk `2*cp - 1 - cp_rank` of 2*cp (verl's load-balanced split for causal
    attention; the whole sequence without context parallelism)."""
    if cp == 1:
        return [range(n) for n in padded]
    out = []
    for n in padded:
        half = n // (2 * cp)
        out += [
            range(half * cp_rank, half * (cp_rank + 1)),
            range(n - half * (cp_rank + 1), n - half * cp_rank),
        ]
    return out


def make_inputs(spec: WorkerSpec, plan: BatchPlan, dp_rank: int, vocab: int, meter: Any) -> list:
    """Per mini-batch, this rank's packed micro-batches on the GPU (made once, reused). The
    local layers take the sequences as they are; the te layers as verl hands them to TE:
    padded (te_padded_lengths), this cp rank's chunks (cp_positions), the padded cumulative
    lengths as both cu_seqlens and cu_seqlens_padded (one tensor: TE then sees no padding
    between sequences and may use flash kernels, dot_product_attention.py pad_between_seqs)."""
    import torch
    from megatron.core import parallel_state as mpu
    from megatron.core.packed_seq_params import PackedSeqParams

    gen = torch.Generator(device="cuda")
    gen.manual_seed(spec.seed * 1000 + dp_rank)
    cp_group = mpu.get_context_parallel_group()
    te, lay = spec.layer_spec == "te", spec.layout
    minis = []
    for m in range(plan.num_mini_batches):
        mbs = []
        for lens in plan.rank_micro_lengths(m, dp_rank):
            if te:
                lens = te_padded_lengths(list(lens), lay.tp, lay.cp)
                spans = cp_positions(lens, lay.cp, mpu.get_context_parallel_rank())
            else:
                spans = [range(n) for n in lens]
            t = sum(len(r) for r in spans)
            cu = torch.tensor([0, *cumsum(lens)], dtype=torch.int32, device="cuda")
            psp = PackedSeqParams(
                qkv_format="thd",
                cu_seqlens_q=cu,
                cu_seqlens_kv=cu,
                max_seqlen_q=max(lens),
                max_seqlen_kv=max(lens),
                cp_group=cp_group,
                **({"cu_seqlens_q_padded": cu, "cu_seqlens_kv_padded": cu} if te else {}),
            )
            pos = [torch.arange(r.start, r.stop, device="cuda") for r in spans]
            mbs.append(
                {
                    "ids": torch.randint(0, vocab, (1, t), generator=gen, device="cuda"),
                    "labels": torch.randint(0, vocab, (1, t), generator=gen, device="cuda"),
                    "pos": torch.cat(pos).unsqueeze(0),
                    "psp": psp,
                    "tokens": t,
                    "meter": meter,
                }
            )
        minis.append(mbs)
    return minis


def run_trial(spec: WorkerSpec, **kw: Any) -> WorkerResult:
    """Build, measure and free one trial; raises on failure (the caller reports it). Everything
    the trial allocated is out of scope when this returns: collected, cache emptied."""
    import torch

    try:
        return _measure(spec, **kw)
    finally:
        gc.collect()
        torch.cuda.empty_cache()


def _measure(
    spec: WorkerSpec,
    *,
    phase: Phase,
    meter: Any,
    files: Files,
    t_handover: float,
    attn: Any,
    experts: tuple[type | None, str],
) -> WorkerResult:
    import torch
    import torch.distributed as dist

    from tuner.runners.megatron_worker import model as mdl
    from tuner.runners.megatron_worker.attention import core_attention_class
    from tuner.runners.megatron_worker.device_memory import release_storages
    from tuner.runners.megatron_worker.logprob import patch_fused
    from tuner.runners.megatron_worker.offload import Offloader

    world, rank = dist.get_world_size(), dist.get_rank()
    lay = spec.layout
    if lay.world != world:
        raise ValueError(f"the spec's layout is for {lay.world} GPUs, this worker has {world}")
    meter.reset()
    phase.name = "init"
    t0 = time.monotonic()
    mdl.init_parallel(spec)
    from megatron.core import parallel_state as mpu
    from megatron.core.pipeline_parallel import get_forward_backward_func

    state: dict[str, Any] = {}
    try:
        init_s = time.monotonic() - t0
        phase.name = "build"
        t0 = time.monotonic()
        te = spec.layer_spec == "te"
        core = None if te else core_attention_class(attn)
        model, optimizer, _cfg, vocab = mdl.build(spec, core, experts[0])
        state.update(model=model, optimizer=optimizer)
        if spec.use_fused_kernels:
            patch_fused(model)
        dp_rank = mpu.get_data_parallel_rank()
        plans = {p: plan_phase(spec, p, lay.dp) for p in spec.phases}
        inputs = {p: make_inputs(spec, plans[p], dp_rank, vocab, meter) for p in spec.phases}
        state["inputs"] = inputs
        build_s = time.monotonic() - t0
        n_params = sum(p.numel() for c in model for p in c.parameters())
        log(
            f"build {build_s:.1f}s local params={n_params / 1e9:.3f}B micro-batches "
            + " ".join(f"{p}={plans[p].num_micro_batches}" for p in spec.phases)
        )
        fb = get_forward_backward_func()
        offloader = Offloader(model, optimizer, spec.offload)
        state["offloader"] = offloader

        def run_phase(name: str) -> float:
            torch.cuda.synchronize()
            t = time.perf_counter()
            if name == "old_log_prob":
                offloader.load()
                with torch.no_grad():
                    for mb in inputs[name]:
                        _schedule(fb, model, mb, spec, forward_only=True, entropy=True)
            else:
                offloader.load()
                for mb in inputs[name]:
                    optimizer.zero_grad()
                    for chunk in model:
                        chunk.zero_grad_buffer()
                    _schedule(fb, model, mb, spec, forward_only=False, entropy=False)
                    optimizer.step()
                offloader.offload()
            torch.cuda.synchronize()
            meter.sample()
            return time.perf_counter() - t

        tokens = plans[spec.phases[0]].total_tokens
        steps: list[dict[str, float]] = []
        launch_s = measured_s = 0.0
        t_measure = 0.0
        abandoned = False
        step = 0
        while True:
            measured = step >= spec.warmup_steps
            dist.barrier()
            if measured and step == spec.warmup_steps:
                launch_s = time.monotonic() - t_handover
                t_measure = time.monotonic()
            times = {}
            for p in spec.phases:
                phase.name = p if measured else "warmup"
                times[p] = run_phase(p)
            log(
                f"{'step' if measured else 'warmup'} {step} "
                + " ".join(f"{p}={s:.3f}s" for p, s in times.items())
            )
            step += 1
            if not measured:
                continue
            steps.append(times)
            if rank == 0 and files.progress:
                append_progress(
                    files.progress,
                    Progress(
                        step=len(steps) - 1,
                        seconds=sum(times.values()),
                        tokens=tokens,
                        old_log_prob_s=times.get("old_log_prob", 0.0),
                        update_actor_s=times.get("update_actor", 0.0),
                    ),
                )
            # one collective decides for every rank: abandoned (the runner's flag file), and
            # whether the measured window is long enough (the slowest rank's clock)
            flags = torch.tensor(
                [
                    1.0 if files.abandon and Path(files.abandon).exists() else 0.0,
                    time.monotonic() - t_measure,
                ],
                device="cuda",
            )
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            if flags[0].item() > 0:
                abandoned = True
                break
            if not more_steps(
                len(steps),
                flags[1].item(),
                steps=spec.steps,
                max_steps=spec.max_steps,
                min_measured_s=spec.min_measured_s,
            ):
                break
        measured_s = time.monotonic() - t_measure if t_measure else 0.0
        phase.name = spec.phases[-1]
        return _result(
            spec,
            steps,
            plans,
            tokens,
            meter,
            world,
            abandoned=abandoned,
            extra={
                "init_s": round(init_s, 2),
                "build_s": round(build_s, 2),
                "layer_spec": spec.layer_spec,
                "attention": te_attention(spec) if te else attn.name,
                "experts": te_experts(spec) if te else experts[1],
                "dp": lay.dp,
                "padded_vocab_size": vocab,
                "fused_kernels": spec.use_fused_kernels,
                "memory_source": meter.source,
                "local_params": n_params,
                **{f"{p}_max_micro_batch_tokens": plans[p].max_micro_tokens() for p in plans},
                **{f"{p}_token_budget": plans[p].token_budget for p in plans},
                "update_micro_batches_per_mini_batch": plans[spec.phases[-1]].micro_batch_counts(),
            },
            launch_s=launch_s,
            measured_s=measured_s,
        )
    finally:
        # the trial's tensors may outlive it (see release_storages): free their memory now, the
        # pinned host copies of an offloaded trial too (on the GPUs, the offloaded MoE trial of
        # results/moe8k-h200-x2.csv released 0.1 GiB: the rest was on the host)
        freed = release_storages(*state.values(), devices=("cuda", "cpu"))
        state.clear()
        log(f"released {freed / 2**30:.1f} GiB of the trial's tensors")


def te_attention(spec: WorkerSpec) -> str:
    """The te layers' core attention as the row names it."""
    return f"TEDotProductAttention (attention_backend={spec.kernels.attention_backend})"


def te_experts(spec: WorkerSpec) -> str:
    """The te layers' experts as the row names it ('' on a dense model), by megatron-core's
    TESpecProvider.grouped_mlp_modules."""
    if not spec.model.is_moe:
        return ""
    return "TEGroupedMLP" if spec.kernels.moe_grouped_gemm else "SequentialMLP (TE linears)"


def more_steps(
    measured: int, measured_s: float, *, steps: int, max_steps: int, min_measured_s: float
) -> bool:
    """Whether to run another measured step after `measured` of them lasting `measured_s`:
    `steps` always; then, while the measured window is shorter than `min_measured_s`, up to
    `max_steps` (short steps vary by up to 30% from one to the next, and a trial of seconds-long
    steps would otherwise spend most of its wall time launching). The runner predicts a trial's
    window with the same rule."""
    if measured < steps:
        return True
    return measured < max(steps, max_steps) and measured_s < min_measured_s


def _schedule(
    fb: Any, model: list, mbs: list, spec: WorkerSpec, *, forward_only: bool, entropy: bool
) -> None:
    from functools import partial

    from tuner.runners.megatron_worker.logprob import forward_step

    iters: Any = [iter(mbs) for _ in model] if len(model) > 1 else iter(mbs)
    fb(
        forward_step_func=partial(forward_step, spec.use_fused_kernels, entropy),
        data_iterator=iters,
        model=model,
        num_microbatches=len(mbs),
        seq_length=1,  # shapes go through p2p (variable_seq_lengths), as verl passes it
        micro_batch_size=1,
        forward_only=forward_only,
    )


def _result(
    spec: WorkerSpec,
    steps: list[dict[str, float]],
    plans: dict[str, BatchPlan],
    tokens: int,
    meter: Any,
    world: int,
    *,
    abandoned: bool,
    extra: dict[str, Any],
    launch_s: float,
    measured_s: float,
) -> WorkerResult:
    """Max over ranks of every step time and memory peak; the median measured step."""
    import torch
    import torch.distributed as dist

    phases = spec.phases
    flat = [s[p] for s in steps for p in phases]
    peaks = list(meter.peaks_gib())
    stats = torch.tensor(flat + peaks, dtype=torch.float64, device="cuda")
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    vals = stats.tolist()
    flat, (alloc, resv, dev) = vals[: len(flat)], vals[len(flat) :]
    per_step = [
        dict(zip(phases, flat[i : i + len(phases)], strict=True))
        for i in range(0, len(flat), len(phases))
    ]
    gpu = torch.cuda.get_device_name()
    import megatron.core

    base = WorkerResult(
        status="abandoned" if abandoned else "ok",
        phase=phases[-1],
        step_times_s=[round(sum(s.values()), 4) for s in per_step],
        tokens=tokens,
        peak_mem_gib=alloc,
        peak_mem_reserved_gib=resv,
        peak_mem_device_gib=dev,
        launch_s=launch_s,
        measured_s=measured_s,
        num_micro_batches=sum(plans[p].num_micro_batches for p in phases),
        versions=_versions(megatron.core),
        gpu=gpu,
        world_size=world,
        extra=extra,
    )
    if not per_step:
        return base
    med = sorted(per_step, key=lambda s: sum(s.values()))[(len(per_step) - 1) // 2]
    step_s = sum(med.values())
    flops = sum(
        model_flops(spec.model, plans[p].sequence_lengths, forward_only=p == "old_log_prob")
        for p in phases
    )
    peak = peak_bf16_tflops(gpu)
    return replace(
        base,
        old_log_prob_s=med.get("old_log_prob"),
        update_actor_s=med.get("update_actor"),
        step_s=step_s,
        tokens_per_s_per_gpu=tokens / step_s / world,
        mfu_pct=100.0 * flops / (step_s * world * peak * 1e12) if peak else None,
        model_tflops_per_step=flops / 1e12,
        flops_formula=f"{FLOPS_FORMULA}; peak {peak} TFLOP/s bf16 per GPU",
    )


def _versions(mcore: Any) -> dict[str, str]:
    import torch

    return {
        "torch": torch.__version__,
        "megatron_core": getattr(getattr(mcore, "package_info", None), "__version__", "")
        or getattr(mcore, "__version__", ""),
        "cuda": str(torch.version.cuda),
    }
