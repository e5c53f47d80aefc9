"""Known-good layouts from the published reference recipes (ISEEKYAN/verl_megatron_practice,
summarised in shared/anchors): the warm start tries them first where they fit."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import UserError
from tuner.hardware import Cluster
from tuner.models import ModelSpec, get_model
from tuner.space import LAYOUT_DEGREES, Candidate, ParallelLayout
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
# 15, 16). The ep8 family (rows 11-16) recomputes full layers, as its scripts
# DAPO_MOE30B/1x.megatron_4node_tp1ep8_deepep_full_opt2.x.sh set (recompute_granularity=full,
# method uniform, 1 layer): without it 30k-token micro-batches need ~150 GB of MoE activations.
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
        ReferenceSetup(
            layout="ep8",
            rollout_tp=4,
            actor_tokens_k=30,
            log_prob_tokens_k=30,
            full_recompute=True,
        ),
        ReferenceSetup(
            layout="ep8cp2",
            rollout_tp=4,
            actor_tokens_k=30,
            log_prob_tokens_k=30,
            full_recompute=True,
        ),
        ReferenceSetup(
            layout="ep8cp4",
            rollout_tp=4,
            actor_tokens_k=30,
            log_prob_tokens_k=30,
            full_recompute=True,
        ),
    ),
}


def reference_family(m: ModelSpec) -> str:
    """The registry model whose reference setups apply to `m`: its own name, or for a
    config.json in a directory named `<registry name>-<anything>` (e.g. `qwen3-30b-moe-8l`, the
    layer shape with fewer layers) that registry model when the layer shape is the same."""
    if m.name in REFERENCE_SETUPS:
        return m.name
    for name in REFERENCE_SETUPS:
        if not m.name.startswith(name + "-"):
            continue
        base = get_model(name)
        same = ("hidden_size", "num_attention_heads", "num_kv_heads", "num_experts", "moe_topk")
        if all(getattr(base, k) == getattr(m, k) for k in same):
            return name
    return ""


_HALVING_ORDER = ("ep", "cp", "pp", "tp")


def scale_layout(text: str, world: int) -> ParallelLayout | None:
    """A reference layout at `world` GPUs: as written if it fits, else with its largest degree
    halved (ties: ep, cp, pp, tp) until it does, so `tp4ep8` at 2 GPUs is `tp2ep2`, `tp4pp2` is
    `tp2`; None if it cannot be read."""
    try:
        lay = ParallelLayout.parse(text, 1 << 20)
    except UserError:
        return None
    deg = {k: getattr(lay, k) for k in LAYOUT_DEGREES}
    for _ in range(64):
        try:
            return ParallelLayout(world=world, **deg)
        except ValueError:
            pass
        k = max(_HALVING_ORDER, key=lambda k: (deg[k], -_HALVING_ORDER.index(k)))
        if deg[k] == 1:
            return None
        deg[k] //= 2
        if k == "pp" and deg["pp"] == 1:
            deg["vpp"] = 1
        deg["etp"] = min(deg["etp"], deg["tp"])
    return None


def reference_candidates(m: ModelSpec, cl: Cluster, w: Workload) -> list[tuple[Candidate, str]]:
    """The reference setups of this model at this GPU count (DP re-derived; layouts for more
    GPUs scaled down by scale_layout), each with its origin, e.g. `reference ep8 as ep2`."""
    out: list[tuple[Candidate, str]] = []
    for s in REFERENCE_SETUPS.get(reference_family(m), ()):
        lay = scale_layout(s.layout, cl.num_gpus)
        if lay is None:
            continue
        origin = f"reference {s.layout}"
        if lay.notation != ParallelLayout.parse(s.layout, 1 << 20).notation:
            origin += f" as {lay.notation}"
        c = Candidate(
            layout=lay,
            sequence_parallel=lay.tp > 1,
            recompute_granularity="full" if s.full_recompute else "none",
            recompute_method="uniform",
            recompute_num_layers=1,
            param_offload=s.offload,
            optimizer_offload=s.offload,
            use_fused_kernels=True,
            use_dynamic_bsz=True,
            ppo_max_token_len_per_gpu=max(s.actor_tokens_k * 1024, w.max_seq_len),
            log_prob_max_token_len_per_gpu=max(s.log_prob_tokens_k * 1024, w.max_seq_len),
            rollout_tp=min(s.rollout_tp, cl.local_gpus),
            gpu_memory_utilization=0.6,
            max_num_batched_tokens=w.max_seq_len,
        )
        out.append((c, origin))
    return out
