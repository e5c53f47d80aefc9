"""The cost model's estimate as text: `tune estimate`'s breakdown (`tune calibrate`'s fit is
tuner.fit.leaderboards)."""

from __future__ import annotations

import math

from tuner.estimate import Estimate
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.space import Candidate
from tuner.workload import Workload


def format_estimate(
    estimate: Estimate, candidate: Candidate, model: ModelSpec, cluster: Cluster, workload: Workload
) -> str:
    """The breakdown of one estimate: time per phase, throughput, memory per GPU, the verdict."""
    layout, mem = candidate.layout, estimate.memory
    lines = [
        f"{model.name} on {cluster.num_gpus}x {cluster.gpu.name}, actor {layout.spec} (dp"
        f"{layout.dp}), rollout tp{candidate.rollout_tp}, {workload.algorithm} "
        f"{workload.batch_size}x{workload.n}, mean sample {workload.mean_seq_len:.0f} tokens "
        "(source=estimate)",
        "time per step",
    ]
    for label, v in (
        ("generation", estimate.generation_s),
        ("old log-prob", estimate.old_log_prob_s),
        ("ref log-prob", estimate.ref_s),
        ("update actor", estimate.update_actor_s),
        ("critic", estimate.critic_s),
        ("reshard", estimate.reshard_s),
        ("step", estimate.step_s),
    ):
        if label == "critic" and not v:
            continue
        lines.append(f"  {label:16} {v:9.1f} s")
    lines += [
        f"  {'of which offload':16} {estimate.offload_s:9.1f} s (PCIe)",
        f"  {'throughput':16} {estimate.throughput_tokens_per_s_per_gpu:9.0f} tokens/s/GPU",
        f"  {'mfu':16} {estimate.mfu * 100:9.1f} % (actor update)",
        f"  {'bottleneck':16} {estimate.bottleneck:>9}",
        "memory per GPU (GiB)",
    ]
    for label, v in (
        ("weights", mem.weights_gib),
        ("gradients", mem.grads_gib),
        ("optimizer", mem.optimizer_gib),
        ("activations", mem.activations_gib),
        ("logits", mem.logits_gib),
        ("moe dispatch", mem.dispatch_gib),
        ("reference", mem.reference_gib),
        ("vLLM share", mem.rollout_gib),
        ("vLLM KV cache", mem.kv_cache_gib),
        ("context etc.", mem.overhead_gib),
    ):
        if v:
            lines.append(f"  {label:16} {v:9.1f}")
    for label, v in (
        ("generation peak", mem.generation_peak_gib),
        ("log-prob peak", mem.log_prob_peak_gib),
        ("update peak", mem.update_peak_gib),
    ):
        lines.append(f"  {label:16} {v:9.1f}")
    verdict = "fits" if estimate.fits else f"does NOT fit: {estimate.fit_reason}"
    lines.append(
        f"  peak {estimate.peak_mem_gib:.1f} GiB in {estimate.peak_phase} of "
        f"{cluster.gpu.memory_gib:.1f} GiB: {verdict}"
    )
    node = f" of the node's {cluster.host_mem_gib:.1f}" if cluster.host_mem_gib is not None else ""
    lines.append(f"  host memory {estimate.host_mem_gib:.1f} GiB a node{node} (a fitted estimate)")
    return "\n".join(lines)


def out_of_range(
    e: Estimate, c: Candidate, model: ModelSpec, cluster: Cluster, workload: Workload
) -> str:
    """Why `tune estimate` has no breakdown of `e` to print: some value is not a finite number
    of 0 or more (a generation of `inf s` where vLLM has no room for one sequence, beside a
    negative KV cache: issue 38 item 4). A one-line sentence that says what does not fit and
    what to change; "" where every value is such a number."""
    values = e.as_dict()
    memory = values.pop("memory_gib")
    values.update(memory if isinstance(memory, dict) else {})
    bad = [
        f"{k} {v:.1f}"
        for k, v in values.items()
        if isinstance(v, int | float)
        and not isinstance(v, bool)
        and not (math.isfinite(v) and v >= 0)
    ]
    if not bad:
        return ""
    why = []
    if not math.isfinite(e.generation_s) or e.memory.kv_cache_gib < 0:
        why.append(
            f"vLLM's KV cache would be {e.memory.kv_cache_gib:.1f} GiB, too little for one "
            f"{workload.max_seq_len}-token sequence, so generation cannot run"
        )
    if e.fit_reason and "KV cache" not in e.fit_reason:
        why.append(e.fit_reason)
    return (
        f"{model.name} {c.layout.spec} on {cluster.num_gpus}x {cluster.gpu.name} does not fit "
        f"and has no step time to print ({', '.join(bad[:4])}): {'; '.join(why) or 'out of range'}"
        ": lower --response-len or --prompt-len, or raise --rollout-tp, "
        "--gpu-memory-utilization or --gpus"
    )
