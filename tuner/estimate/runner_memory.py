"""An estimate's memory as a runner sees it: the device totals of the phases it runs, with its
own training process in place of verl's where it is not verl (the megatron runner's worker).

It reads a finished Estimate (tuner.estimate) and its MemoryBreakdown (tuner.estimate.memory),
so it sits above both; the device terms it swaps are tuner.estimate.device's.
"""

from __future__ import annotations

from tuner.estimate import Estimate
from tuner.estimate.device import phases_unfit
from tuner.estimate.memory import ALLOCATED_OF, DEVICE_OF, MemoryBreakdown
from tuner.hardware import Cluster


def phase_devices(
    mem: MemoryBreakdown,
    phases: tuple[str, ...],
    *,
    drop_reference: bool = False,
    process_gib: float | None = None,
) -> dict[str, float]:
    """Each phase's device total as a runner sees it (`memory_view`'s `drop_reference` and
    `process_gib`, which replaces verl's processes: its context and `training_process_gib`)."""
    ref = mem.reference_gib if drop_reference else 0.0
    verl = mem.cuda_context_gib + mem.training_process_gib
    own = 0.0 if process_gib is None else process_gib - verl
    return {
        phase: getattr(mem, DEVICE_OF[phase]) - ref + (own if phase != "generation" else 0.0)
        for phase in phases
    }


def memory_view(
    pred: Estimate,
    cluster: Cluster,
    *,
    phases: tuple[str, ...] = ("generation", "old_log_prob", "update_actor"),
    drop_reference: bool = False,
    headroom_gib: float | None = None,
    process_gib: float | None = None,
) -> tuple[float, float, str, str]:
    """(allocated peak, device total, its phase, why unfit or '') over the `phases` a runner
    runs; `drop_reference` leaves out the reference model's weights (a runner that builds none);
    `process_gib`: what the runner's training process holds outside PyTorch beside NCCL, in
    place of verl's CUDA_CONTEXT_GIB and `verl_training_outside_gib` in the training phases
    (the megatron runner's worker:
    `megatron_worker_gib`; generation stays verl's). Unfit: a phase's device total + headroom >
    the GPU's memory; the headroom is `headroom_gib`, else the one `pred` was estimated with
    (`estimate(headroom_gib=...)`: the study's --headroom-gib where it gave one), else each
    phase's own (`phase_headroom_gib`)."""
    mem = pred.memory
    ref = mem.reference_gib if drop_reference else 0.0
    devices = phase_devices(mem, phases, drop_reference=drop_reference, process_gib=process_gib)
    device, phase = max((total, name) for name, total in devices.items())
    peak = max(getattr(mem, ALLOCATED_OF[name]) - ref for name in phases)
    headroom = pred.headroom_gib if headroom_gib is None else headroom_gib
    return peak, device, phase, phases_unfit(devices, cluster.gpu.memory_gib, headroom)
