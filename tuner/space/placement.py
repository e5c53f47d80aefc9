"""Placement: where generation runs beside training.

Colocated (`rollout_gpus == 0`, the default and the only placement without
`--allow-off-policy`): vLLM and the Megatron actor take turns on all N GPUs, the step is
generation + training. Split (`rollout_gpus == r > 0`): verl 0.9.1's
`verl.experimental.one_step_off_policy` runs vLLM on r GPUs of its own and the actor (old
log-prob, reference, update) on the other N - r; the next step's generation overlaps this
step's training and the weights go over NCCL (`checkpoint_engine.backend: nccl`). Each step
then trains on rollouts of the weights one step old (verl's `rollout_correction` bypass): the
algorithm changes, so it is the user's choice.

verl builds the two pools as `[n_gpus_per_node] * nnodes` each (`trainer.*` and `rollout.*`,
verl/experimental/separation/utils.py create_resource_pool_manager): on one node any r of 1..N-1
splits it; on several nodes the rollout takes whole nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.hardware import Cluster

COLOCATED = "colocated"
"""The placement column's value for rollout_gpus == 0."""
OFF_POLICY = "one-step-off"
"""What a split row's and recipe's algorithm note says: rollouts one step stale."""


def split_sizes(cl: Cluster) -> list[int]:
    """Every rollout GPU count r that splits `cl` into two pools verl can place: 1..N-1 on one
    node, whole nodes (k * gpus_per_node, 0 < k < nodes) on several; [] for one GPU."""
    if cl.num_nodes == 1:
        return list(range(1, cl.num_gpus))
    return [k * cl.gpus_per_node for k in range(1, cl.num_nodes)]


@dataclass(frozen=True, kw_only=True, slots=True)
class Pools:
    """The two GPU pools of a split candidate (or the whole cluster twice, colocated)."""

    trainer: Cluster
    """The actor's GPUs (old_log_prob, reference, update): N - r."""
    rollout: Cluster
    """vLLM's GPUs: r."""
    split: bool
    """False: colocated, both are the whole cluster."""


def pools(rollout_gpus: int, cl: Cluster) -> Pools:
    """The pools of placement `rollout_gpus` on `cl`; ValueError naming the valid sizes when
    it does not split `cl`."""
    if rollout_gpus == 0:
        return Pools(trainer=cl, rollout=cl, split=False)
    sizes = split_sizes(cl)
    if rollout_gpus not in sizes:
        valid = ", ".join(map(str, sizes)) if sizes else "none (one GPU)"
        raise ValueError(
            f"rollout_gpus({rollout_gpus}) does not split {cl.num_gpus} GPUs "
            f"({cl.gpus_per_node} per node) into two pools: use 0 (colocated) or one of {valid}"
        )
    per = cl.gpus_per_node
    return Pools(
        trainer=Cluster(gpu=cl.gpu, num_gpus=cl.num_gpus - rollout_gpus, gpus_per_node=per),
        rollout=Cluster(gpu=cl.gpu, num_gpus=rollout_gpus, gpus_per_node=per),
        split=True,
    )


def placement_label(rollout_gpus: int, num_gpus: int) -> str:
    """`colocated`, or `split r<r>+t<N-r>` (rollout GPUs + trainer GPUs): the placement
    column of `tune show` and the report."""
    if not rollout_gpus:
        return COLOCATED
    return f"split r{rollout_gpus}+t{num_gpus - rollout_gpus}"


def pool_counts(rollout_gpus: int, cl: Cluster) -> dict[str, int]:
    """verl's pool sizes of a split: `rollout.nnodes`, `rollout.n_gpus_per_node`,
    `trainer.nnodes`, `trainer.n_gpus_per_node`."""
    p = pools(rollout_gpus, cl)
    return {
        "rollout.nnodes": p.rollout.num_nodes,
        "rollout.n_gpus_per_node": p.rollout.local_gpus,
        "trainer.nnodes": p.trainer.num_nodes,
        "trainer.n_gpus_per_node": p.trainer.local_gpus,
    }
