"""Seconds of each phase of one RL step: generation, old/ref log-prob, actor update, reshard."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.estimate.memory import BF16, micro_batch_tokens
from tuner.estimate.profile import Profile
from tuner.hardware import GIB, Cluster
from tuner.models import ModelSpec
from tuner.space import Candidate
from tuner.workload import Workload


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseTimes:
    generation_s: float
    old_log_prob_s: float
    ref_s: float
    update_actor_s: float
    reshard_s: float
    update_flops: float
    """Model FLOPs of the actor update (forward + backward, no recompute), all GPUs."""
    bottleneck: str

    @property
    def step_s(self) -> float:
        return (
            self.generation_s
            + self.old_log_prob_s
            + self.ref_s
            + self.update_actor_s
            + self.reshard_s
        )


def _generation_s(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload, p: Profile) -> float:
    rtp = c.rollout_tp
    engines = cl.num_gpus // rtp
    seqs = w.num_samples / engines
    weight_bytes = m.num_params * BF16 / rtp
    kv_heads_local = max(1, m.num_kv_heads // rtp)
    kv_per_token = 2 * m.num_layers * kv_heads_local * m.head_dim * BF16
    free = c.gpu_memory_utilization * cl.gpu.memory_gib * GIB - weight_bytes - 1.0 * GIB
    if free <= 0:
        return math.inf
    mean_ctx = w.prompt_len + w.mean_response_len / 2
    concurrent = max(1.0, min(seqs, free / (kv_per_token * (w.prompt_len + w.mean_response_len))))
    bw = cl.gpu.hbm_tb_s * 1e12 * p.hbm_efficiency
    step_bytes = weight_bytes + concurrent * mean_ctx * kv_per_token
    flops = concurrent * m.flops_per_token(int(mean_ctx)) / rtp
    compute = flops / (cl.gpu.bf16_tflops * 1e12 * p.forward_mfu)
    step = max(step_bytes / bw, compute) + p.decode_step_overhead_s
    # continuous batching: total decode steps ~ generated tokens / concurrency, but never fewer
    # than the longest response (the tail of the batch)
    steps = max(w.response_len, seqs * w.mean_response_len / concurrent)
    prefill = (
        seqs
        * w.prompt_len
        * m.flops_per_token(w.prompt_len)
        / rtp
        / (cl.gpu.bf16_tflops * 1e12 * p.train_mfu)
    )
    return steps * step + prefill


def _comm_factor(c: Candidate, cl: Cluster, p: Profile) -> float:
    """Multiplier (>= 1) on compute time for TP/CP/EP communication and the pipeline bubble."""
    lay = c.layout
    f = 1.0
    if lay.tp > 1:
        f *= 1 + 0.04 * math.log2(lay.tp) / p.comm_efficiency
    if lay.cp > 1:
        f *= 1 + 0.03 * math.log2(lay.cp) / p.comm_efficiency
    if lay.ep > 1:
        inter = lay.ep * lay.etp * lay.tp > cl.local_gpus
        f *= 1 + (0.15 if inter else 0.06) / p.comm_efficiency
    return f


def phase_times(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload, p: Profile) -> PhaseTimes:
    lay = c.layout
    peak = cl.gpu.bf16_tflops * 1e12
    fwd_flops = w.tokens_per_step * m.flops_per_token(int(w.mean_seq_len))
    # micro-batches that are small use the GPU less well
    tok = micro_batch_tokens(c, w) * lay.cp / max(1, lay.cp)
    small = min(1.0, tok / 8192) ** 0.25
    recompute = {"none": 0.0, "selective": 0.05, "full": 1.0}[c.recompute_granularity]
    n_micro = max(1.0, w.tokens_per_step / w.mini_batches_per_step / lay.dp / max(tok, 1))
    bubble = (lay.pp - 1) / lay.vpp / (n_micro + (lay.pp - 1) / lay.vpp) if lay.pp > 1 else 0.0
    comm = _comm_factor(c, cl, p)
    train_eff = p.train_mfu * small
    upd = fwd_flops * (3 + recompute) / (cl.num_gpus * peak * train_eff) * comm / (1 - bubble)
    lp_tok = micro_batch_tokens(c, w, log_prob=True)
    lp_small = min(1.0, lp_tok / 8192) ** 0.25
    lp = fwd_flops / (cl.num_gpus * peak * p.forward_mfu * lp_small) * comm
    # offload: states cross PCIe twice per phase change
    params_local = m.num_params / (lay.tp * lay.pp)
    moved = 0.0
    if c.param_offload:
        moved += 2 * params_local * BF16
    if c.grad_offload:
        moved += 2 * params_local * 4
    if c.optimizer_offload:
        moved += 2 * params_local * 12 / lay.dp
    offload = moved / (cl.gpu.pcie_gb_s * 1e9)
    reshard = (
        m.num_params * BF16 / (lay.tp * lay.pp) / (cl.gpu.nvlink_gb_s * 1e9 * p.comm_efficiency)
        + 1.0
    )
    gen = _generation_s(c, m, cl, w, p)
    ref = lp if w.algorithm in ("grpo", "dapo", "ppo") else 0.0
    parts = {"generation": gen, "log_prob": lp + ref, "update_actor": upd + offload}
    return PhaseTimes(
        generation_s=gen,
        old_log_prob_s=lp,
        ref_s=ref,
        update_actor_s=upd + offload,
        reshard_s=reshard,
        update_flops=fwd_flops * 3,
        bottleneck=max(parts, key=lambda k: parts[k]),
    )
