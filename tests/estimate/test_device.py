"""Device memory outside the tensors: the NCCL communicators of a layout."""

from __future__ import annotations

from tuner.estimate.device import communicators
from tuner.space import ParallelLayout


def test_communicators_follow_the_layout() -> None:
    names = {c.name for c in communicators(ParallelLayout.parse("tp2", 2), moe=False, tied=False)}
    assert names == {
        "WORLD",
        "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP",
        "TENSOR_MODEL_PARALLEL_GROUP",
    }
    moe = communicators(ParallelLayout.parse("ep8", 8), moe=True, tied=False)
    a2a = next(c for c in moe if c.name == "EXPERT_MODEL_PARALLEL_GROUP")
    assert a2a.p2p and a2a.peers == 7
    assert all(c.size > 1 for c in moe)
