"""Real verl's device memory against the cost model: verl 0.9.1's generation as two processes.

    python scripts/verl_memory_check.py [CSV] [SAMPLES]
    # default: results/verl4k-h100-x1.csv and tests/data/verl_trials/h100_trial4/device-memory.csv

First the levels of one trial's nvidia-smi samples (every 0.5 s, MiB; trial 4: Qwen3-1.7B on one
H100, param and optimizer offload, gpu_memory_utilization 0.5) that set device.VLLM_PROCESS_GIB,
VLLM_ASLEEP_GIB and VERL_ACTOR_RETAINED_GIB, beside the constants. Then, per row of the verl
runner's leaderboard (a failed trial as the OOM its log shows), the device peak nvidia-smi
sampled over the whole trial against the cost model's device total per phase, before (vLLM in
the actor's process: the generation total the model had, `rollout_in_actor`) and after (verl
0.9.1's vLLM worker beside the actor, with its weight sync), the phase that peaks, the error of
that peak, and whether pruning keeps the row (each phase's device total + its headroom,
device.phases_unfit); then the training phases (vLLM asleep beside the actor): their errors,
verl's allocated peaks and device - reserved against the model's. Output committed as
scripts/verl_memory_check.out.txt.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tuner.estimate import estimate
from tuner.estimate.device import (
    CUDA_CONTEXT_GIB,
    VERL_ACTOR_RETAINED_GIB,
    VLLM_ASLEEP_GIB,
    VLLM_PROCESS_GIB,
    WORKSPACE_GIB,
    phases_unfit,
)
from tuner.estimate.memory import DEVICE_OF
from tuner.fit.validate import Case, case_from_row
from tuner.results import number, read_rows

ROOT = Path(__file__).resolve().parent.parent
CSV = ROOT / "results" / "verl4k-h100-x1.csv"
SAMPLES = ROOT / "tests" / "data" / "verl_trials" / "h100_trial4" / "device-memory.csv"
TOTAL_MIB = 81559
"""The H100's memory as nvidia-smi and cudaMemGetInfo give it (vLLM's budget is a share of it)."""
UTIL = 0.5
"""Trial 4's gpu_memory_utilization."""
MIB_PER_GIB = 1024
PLATEAU = 20
"""Samples (10 s) alike that make a level."""
STEP_MIB = 64
"""A rise that is a new process's, not a sample's jitter (the actor's level moves by 1 MiB)."""
SAMPLED_TRIAL = "/trials/4/"
"""The log folder of the trial whose samples SAMPLES holds (trial 5 repeats trial 4's row)."""
TRIAL4_RESERVED_GIB = 38.67
"""verl's actor/perf/max_memory_reserved_gb in trial 4's steps (verl.log, 38.669921875)."""
GOAL_GIB = 1.5
"""The generation-phase error aimed at on the verl rows."""


def training_levels(samples: list[int]) -> list[int]:
    """The highest sample between two generations (runs of PLATEAU samples above vLLM's
    budget), from step 2 on: old_log_prob, update_actor and the next weight sync, vLLM asleep."""
    budget = UTIL * TOTAL_MIB
    runs, start = [], None
    for k, v in enumerate([*samples, 0]):
        if v > budget and start is None:
            start = k
        elif v <= budget and start is not None:
            if k - start >= PLATEAU:
                runs.append((start, k))
            start = None
    return [max(samples[a[1] : b[0]]) for a, b in zip(runs[1:], runs[2:], strict=False)]


def levels(samples: list[int]) -> dict[str, int]:
    """The device levels (MiB) of a verl trial's samples: the actor alone after its start-up
    (the first plateau above 1 GiB, PLATEAU samples alike), the next sample above it by
    STEP_MIB (vLLM's worker started), vLLM asleep after
    its start-up (the first low after the device first passes the vLLM budget), step 1's
    generation (the highest sample before the training phases first leave vLLM asleep again)
    and the trial's peak (later generations)."""
    budget = UTIL * TOTAL_MIB
    i = next(
        k
        for k, v in enumerate(samples)
        if v > MIB_PER_GIB and samples[k : k + PLATEAU] == [v] * PLATEAU
    )
    actor = samples[i]
    started = next(v for v in samples[i:] if v > actor + STEP_MIB)
    up = next(k for k in range(i, len(samples)) if samples[k] > budget)
    down = next(k for k in range(up, len(samples)) if samples[k] < budget)
    asleep = samples[down]
    up2 = next(k for k in range(down, len(samples)) if samples[k] > budget)
    down2 = next(k for k in range(up2, len(samples)) if samples[k] < budget)
    return {
        "actor": actor,
        "started": started,
        "asleep": asleep,
        "step1": max(samples[up2:down2]),
        "peak": max(samples),
    }


def read_samples(path: Path) -> list[int]:
    """memory.used of GPU 0 per sample ('index, MiB' lines)."""
    out = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == "0" and parts[1].isdigit():
            out.append(int(parts[1]))
    return out


def print_levels(path: Path) -> None:
    lv = levels(read_samples(path))
    budget = UTIL * TOTAL_MIB
    process = lv["step1"] - lv["actor"] - budget
    actor_later = lv["peak"] - (budget + process)
    rows = [
        ("vLLM worker's start (its context)", lv["started"] - lv["actor"], None),
        ("VLLM_PROCESS_GIB: step 1 - actor - budget", process, VLLM_PROCESS_GIB),
        ("VLLM_ASLEEP_GIB: asleep - actor", lv["asleep"] - lv["actor"], VLLM_ASLEEP_GIB),
        (
            "VERL_ACTOR_RETAINED_GIB: actor later - context - workspaces",
            actor_later - (CUDA_CONTEXT_GIB + WORKSPACE_GIB) * MIB_PER_GIB,
            VERL_ACTOR_RETAINED_GIB,
        ),
    ]
    print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:")
    print(
        f"  levels (MiB): actor alone {lv['actor']}, vLLM started {lv['started']}, vLLM asleep "
        f"{lv['asleep']}, step 1 generation {lv['step1']}, later generations (peak) "
        f"{lv['peak']}; vLLM's budget {UTIL} x {TOTAL_MIB} = {budget:.1f}"
    )
    print(f"  actor in later generations: {actor_later:.0f} MiB ({actor_later / 1024:.2f} GiB)")
    train = training_levels(read_samples(path))
    outside = CUDA_CONTEXT_GIB + VERL_ACTOR_RETAINED_GIB + VLLM_ASLEEP_GIB
    print(
        f"  training phases between later generations (highest sample): {train} MiB; the "
        f"update's device - verl's reserved peak {TRIAL4_RESERVED_GIB}: "
        f"{max(train) / MIB_PER_GIB - TRIAL4_RESERVED_GIB:.2f} GiB against CUDA_CONTEXT_GIB + "
        f"VERL_ACTOR_RETAINED_GIB + VLLM_ASLEEP_GIB {outside:.2f}"
    )
    for name, mib, const in rows:
        told = f"  device.py {const:.2f}" if const is not None else ""
        print(f"  {name:58} {mib:7.1f} MiB = {mib / MIB_PER_GIB:5.2f} GiB{told}")


def _devices(case: Case, *, rollout_in_actor: bool) -> tuple[dict[str, float], float, str]:
    e = estimate(
        case.candidate,
        case.model,
        case.cluster,
        case.workload,
        verl_logits=case.verl_logits,
        rollout_in_actor=rollout_in_actor,
    )
    devices = {p: getattr(e.memory, f) for p, f in DEVICE_OF.items()}
    return (
        devices,
        e.memory.weight_sync_device_gib,
        phases_unfit(devices, case.cluster.gpu.memory_gib, None),
    )


def print_rows(path: Path) -> list[float]:
    """The rows' table; returns the generation errors (after) of the ok rows whose peak is
    their generation: predicted so, or so in the samples (trial 4's peak is a generation's)."""
    print(
        f"\n{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: device GiB "
        "(measured: nvidia-smi's sampled peak of the whole trial)"
    )
    head = (
        f"  {'trial':5} {'status':6} {'util':>4} {'off':3} {'eager':5} {'measured':>8} | "
        f"{'run':>5} | {'before: gen':>11} {'peak':>5} {'err':>5} {'fit':5} | "
        f"{'after: gen':>10} {'err':>5} {'sync':>5} {'logp':>5} {'upd':>5} {'peak':>5} "
        f"{'phase':12} {'err':>5} {'fit':5}"
    )
    print(head)
    gen_errors = []
    training = []
    for row in read_rows(path):
        status = row.get("status", "")
        as_oom = status == "failed" and "wake_up" in (row.get("reason") or "")
        case = case_from_row({**row, "status": "oom"} if as_oom else row)
        if case is None:
            continue
        md = number(row.get("peak_mem_device_gib")) or 0.0
        before, _, why_b = _devices(case, rollout_in_actor=True)
        after, sync, why_a = _devices(case, rollout_in_actor=False)
        phase = max(after, key=after.__getitem__)
        pb, pa = max(before.values()), after[phase]
        c = case.candidate
        off = "yes" if c.param_offload else "no"
        run = number(row.get("pred_device_mem_gib"))
        print(
            f"  {row.get('trial', ''):5} {'OOM' if as_oom else status:6} "
            f"{c.gpu_memory_utilization:4.1f} {off:3} {str(c.enforce_eager):5} {md:8.2f} | "
            f"{run if run is not None else float('nan'):5.1f} | "
            f"{before['generation']:11.2f} {pb:5.1f} {pb - md:+5.2f} "
            f"{'unfit' if why_b else 'fits':5} | "
            f"{after['generation']:10.2f} {after['generation'] - md:+5.2f} {sync:5.1f} "
            f"{after['old_log_prob']:5.1f} "
            f"{after['update_actor']:5.1f} {pa:5.1f} {phase:12} {pa - md:+5.2f} "
            f"{'unfit' if why_a else 'fits':5}"
        )
        if not as_oom:
            training.append((row, case, after, md))
        sampled = SAMPLED_TRIAL in (row.get("log_path") or "")
        if not as_oom and (phase == "generation" or sampled):
            gen_errors.append(after["generation"] - md)
    print_training(training)
    return gen_errors


def print_training(rows: list[tuple[dict[str, str], Case, dict[str, float], float]]) -> None:
    """The training phases: their device totals against the trial's sampled peak (a bound on
    each phase where it is not the peak), verl's allocated / reserved peaks (actor/perf) against
    the model's larger training allocated peak, and measured device - reserved against the
    outside the model counts there (context + NCCL + verl_training_outside_gib)."""
    print(
        "\n  training phases (after): logp/upd err = device total - the trial's sampled peak; "
        "alloc = PyTorch's allocated peak, verl's actor/perf against the model's; outside = "
        "device - reserved (measured only where the trial peaks in training; trial 4's "
        "samples above)"
    )
    print(
        f"  {'trial':5} {'logp err':>8} {'upd err':>7} | {'alloc meas':>10} {'pred':>5} "
        f"{'err':>5} | {'outside meas':>12} {'pred':>5}"
    )
    for row, case, after, md in rows:
        e = estimate(case.candidate, case.model, case.cluster, case.workload)
        m = e.memory
        alloc = max(m.log_prob_peak_gib, m.update_peak_gib)
        ma, mr = number(row.get("peak_mem_gib")), number(row.get("peak_mem_reserved_gib"))
        outside = m.cuda_context_gib + m.nccl_gib + m.training_process_gib
        # trial 4's samples peak in a generation (its training phases: print_levels)
        sampled = SAMPLED_TRIAL in (row.get("log_path") or "")
        peak_training = max(after, key=after.__getitem__) != "generation" and not sampled
        meas_out = f"{md - mr:12.2f}" if mr is not None and peak_training else f"{'-':>12}"
        a = f"{ma:10.2f} {alloc:5.1f} {alloc - ma:+5.2f}" if ma is not None else f"{'-':>10}"
        print(
            f"  {row.get('trial', ''):5} {after['old_log_prob'] - md:+8.2f} "
            f"{after['update_actor'] - md:+7.2f} | {a:>22} | {meas_out} {outside:5.2f}"
        )


def main(argv: list[str]) -> int:
    csv = Path(argv[0]) if argv else CSV
    samples = Path(argv[1]) if len(argv) > 1 else SAMPLES
    print_levels(samples)
    errors = print_rows(csv)
    worst = max(map(abs, errors), default=0.0)
    print(
        f"\nok rows whose peak is their generation (predicted so, or trial 4's samples): "
        f"largest |generation - measured| {worst:.2f} GiB (aim {GOAL_GIB}) over "
        f"{len(errors)} rows; 'run' is the prediction the study recorded; before = vLLM in the "
        "actor's process (the model's generation until now), after = verl 0.9.1's two processes; "
        "fit = every phase's device total + its headroom within the GPU's "
        "memory (device.phases_unfit)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
