"""Known-good layouts from the published reference recipes (ISEEKYAN/verl_megatron_practice,
summarised in shared/anchors): the warm start tries them first where they fit."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import UserError
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.space import Candidate, ParallelLayout
from tuner.workload import Workload


@dataclass(frozen=True, kw_only=True, slots=True)
class ReferenceSetup:
    layout: str
    """Reference notation, e.g. `tp4pp2`."""
    rollout_tp: int
    actor_tokens_k: int
    """ppo_max_token_len_per_gpu in thousands of tokens (1024), as the references write it."""
    log_prob_tokens_k: int
    full_recompute: bool = False
    offload: bool = True
    """The reference scripts offload params, grads and optimizer by default."""


# Megatron rows of the reference leaderboards, one per distinct setup (dapo7b.csv rows 4, 5,
# 11, 12, 13, 16, 17; grpo_qwen2.5_7b.csv rows 13, 14; dapo_moe30b.csv rows 3, 4, 7, 8, 11,
# 15, 16).
REFERENCE_SETUPS: dict[str, tuple[ReferenceSetup, ...]] = {
    "qwen2.5-7b": (
        ReferenceSetup(layout="tp4pp2", rollout_tp=4, actor_tokens_k=20, log_prob_tokens_k=30),
        ReferenceSetup(layout="tp4", rollout_tp=1, actor_tokens_k=20, log_prob_tokens_k=60),
        ReferenceSetup(layout="tp4cp2", rollout_tp=1, actor_tokens_k=18, log_prob_tokens_k=100),
        ReferenceSetup(layout="tp4pp2", rollout_tp=1, actor_tokens_k=20, log_prob_tokens_k=100),
        ReferenceSetup(layout="tp4pp2vpp2", rollout_tp=1, actor_tokens_k=20, log_prob_tokens_k=100),
        ReferenceSetup(layout="tp2", rollout_tp=1, actor_tokens_k=10, log_prob_tokens_k=30),
        ReferenceSetup(layout="tp2cp2", rollout_tp=1, actor_tokens_k=10, log_prob_tokens_k=30),
        ReferenceSetup(layout="tp4", rollout_tp=1, actor_tokens_k=10, log_prob_tokens_k=100),
        ReferenceSetup(
            layout="tp2", rollout_tp=1, actor_tokens_k=10, log_prob_tokens_k=30, full_recompute=True
        ),
    ),
    "qwen3-30b-moe": (
        ReferenceSetup(layout="tp4ep16", rollout_tp=4, actor_tokens_k=10, log_prob_tokens_k=100),
        ReferenceSetup(layout="tp4ep8", rollout_tp=2, actor_tokens_k=10, log_prob_tokens_k=30),
        ReferenceSetup(layout="tp4ep32", rollout_tp=2, actor_tokens_k=15, log_prob_tokens_k=100),
        ReferenceSetup(
            layout="tp2ep8",
            rollout_tp=4,
            actor_tokens_k=10,
            log_prob_tokens_k=100,
            full_recompute=True,
        ),
        ReferenceSetup(layout="ep8", rollout_tp=4, actor_tokens_k=30, log_prob_tokens_k=30),
        ReferenceSetup(layout="ep8cp2", rollout_tp=4, actor_tokens_k=30, log_prob_tokens_k=30),
        ReferenceSetup(layout="ep8cp4", rollout_tp=4, actor_tokens_k=30, log_prob_tokens_k=30),
    ),
}


def reference_candidates(m: ModelSpec, cl: Cluster, w: Workload) -> list[Candidate]:
    """The reference setups of this model whose layout fits this cluster (DP re-derived)."""
    out: list[Candidate] = []
    for s in REFERENCE_SETUPS.get(m.name, ()):
        try:
            lay = ParallelLayout.parse(s.layout, cl.num_gpus)
        except UserError:
            continue
        out.append(
            Candidate(
                layout=lay,
                sequence_parallel=lay.tp > 1,
                recompute_granularity="full" if s.full_recompute else "none",
                recompute_method="uniform",
                recompute_num_layers=1,
                param_offload=s.offload,
                grad_offload=s.offload,
                optimizer_offload=s.offload,
                use_fused_kernels=True,
                use_dynamic_bsz=True,
                ppo_max_token_len_per_gpu=s.actor_tokens_k * 1024,
                log_prob_max_token_len_per_gpu=s.log_prob_tokens_k * 1024,
                rollout_tp=s.rollout_tp,
                gpu_memory_utilization=0.6,
                max_num_batched_tokens=w.max_seq_len,
            )
        )
    return out
