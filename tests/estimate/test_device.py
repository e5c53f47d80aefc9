"""Device memory outside the tensors: the NCCL communicators of a layout, and what the megatron
runner's worker process holds outside PyTorch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tuner.estimate import estimate
from tuner.estimate.device import (
    CUDA_CONTEXT_GIB,
    EAGER_NCCL_EXCESS_GIB,
    MEGATRON_WORKER_GIB,
    VERL_ACTOR_RETAINED_GIB,
    VLLM_ASLEEP_GIB,
    communicators,
    megatron_worker_gib,
)
from tuner.estimate.memory import DEVICE_OF
from tuner.estimate.runner_memory import memory_view, phase_devices
from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.space import Candidate, ParallelLayout
from tuner.workload import get_workload


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


ROOT = Path(__file__).resolve().parents[2]
_STAGE = re.compile(
    r"^(?P<name>.*?)\s+used\s+(?P<used>[\d.]+)\s+reserved\s+(?P<reserved>[\d.]+)\s+allocated\s+"
    r"[\d.]+\s+outside\s+(?P<outside>[\d.]+)(?:\s+\((?P<delta>[+-][\d.]+)\))?"
)


def _probe(name: str) -> dict[str, tuple[float, float]]:
    """scripts/<name>: stage -> (outside GiB, its change) (the change 0 on the peaks line)."""
    out = {}
    for line in (ROOT / "scripts" / name).read_text().splitlines():
        m = _STAGE.match(line)
        assert m, line
        out[m["name"]] = (float(m["outside"]), float(m["delta"] or 0.0))
    return out


def test_the_workers_outside_memory_is_the_probes() -> None:
    """MEGATRON_WORKER_GIB and EAGER_NCCL_EXCESS_GIB are scripts/gpu_outside_probe.py's trial
    peaks, lazy (the worker now) and eager (--eager-nccl, the worker before): the same stages
    but for where the default communicator appears (init_process_group eager, the first
    all_reduce lazy), and per communicator the trial adds the same ~0.38 GiB, 20 of them
    eager (every megatron group split at once), 3 lazy (the groups the trial used)."""
    lazy, eager = _probe("gpu_outside_probe_lazy.out.txt"), _probe("gpu_outside_probe.out.txt")
    trial, after = "trial (peaks)", "after the trial (run_trial frees its tensors)"
    assert lazy[trial][0] == MEGATRON_WORKER_GIB == megatron_worker_gib()
    assert eager[trial][0] - lazy[trial][0] == pytest.approx(EAGER_NCCL_EXCESS_GIB, abs=0.005)
    assert megatron_worker_gib(eager_nccl=True) == pytest.approx(eager[trial][0], abs=0.005)
    init, first = "init_process_group (nccl)", "first all_reduce (NCCL communicator)"
    assert eager[init][1] == lazy[first][1] == 0.55 and eager[first][1] == lazy[init][1] == 0.0
    # the parts of MEGATRON_WORKER_GIB: context, cuBLAS, default communicator, attention check,
    # the trial's communicators (each rounded to 0.01 in the file)
    parts = [lazy[s][1] for s in lazy if s != trial]
    assert sum(parts) == pytest.approx(MEGATRON_WORKER_GIB, abs=0.03)
    assert lazy[after][1] / 3 == pytest.approx(eager[after][1] / 20, abs=0.01)


def test_the_megatron_runners_process_replaces_verls_context_in_training_phases() -> None:
    """memory_view's `process_gib` puts the worker's outside memory in place of verl's
    CUDA_CONTEXT_GIB in old_log_prob and update_actor; generation stays verl's."""
    m, cl = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=1, gpus_per_node=1)
    e = estimate(Candidate(layout=ParallelLayout(world=1)), m, cl, get_workload("grpo-short"))
    phases = tuple(DEVICE_OF)
    verl = phase_devices(e.memory, phases)
    worker = phase_devices(e.memory, phases, process_gib=megatron_worker_gib())
    assert worker["generation"] == verl["generation"]
    for p in ("old_log_prob", "update_actor"):
        # verl's two processes (vLLM asleep, the actor's retained memory) are not the worker's
        verls = CUDA_CONTEXT_GIB + VERL_ACTOR_RETAINED_GIB + VLLM_ASLEEP_GIB
        assert worker[p] - verl[p] == pytest.approx(MEGATRON_WORKER_GIB - verls)
    _, device, phase, _ = memory_view(e, cl, phases=phases[1:], process_gib=megatron_worker_gib())
    assert device == worker[phase] == max(worker["old_log_prob"], worker["update_actor"])
