"""Host memory (CPU RAM) of one node in a verl trial, and whether Ray lets it run.

Offloading moves the actor's states from the GPU to the host: what frees the device can fill
the node's RAM, and Ray's memory monitor then kills a worker (verl's rows: `failure=host-oom`,
results/moe2k-h200-x1 trials 0 and 2, a 5.6B MoE with param and optimizer offload on a host of
126 GiB). What verl 0.9.1 keeps on the host, per trainer GPU (verl/utils/megatron_utils.py):

- param_offload: the actor's bf16 parameter buffers, copied into pinned host buffers
  (`offload_megatron_model_to_cpu`; the fp32 gradient buffers are freed, not copied), and the
  reference model's parameters where the algorithm has one (ref.megatron.param_offload follows
  the actor's: trainer/config/ref/megatron_ref.yaml, the non-DDP branch of the same function);
- optimizer_offload: the distributed optimizer's shard, fp32 master weights and both Adam
  moments (`offload_megatron_optimizer`, `offload_megatron_copy_params`).

vLLM's sleep keeps nothing on the host: verl 0.9.1's async server sleeps at level 2 unless
LoRA or MTP asks for 1 (workers/rollout/vllm_rollout/vllm_async_server.py
`_resolve_sleep_level`).

Beyond these, the node's processes (Ray, the driver, the trainer and vLLM workers, the data
loader) hold memory that grows with the model. Neither that base nor how much the offloaded
bytes cost the host beyond their size (host allocator retention between offload cycles, pinned
buffers rounded up) is derived: both are fitted on the measured rows (verl's
`perf/cpu_memory_used_gb`, psutil's used memory of the whole node at the end of the update) by
scripts/host_memory_check.py, whose committed output holds the fit and each row's error. An
estimate, fitted on the colocated rows of 1- and 2-GPU hosts: the per-process share on a node of
8 is not separated. A split node (vLLM and the actor on GPUs of their own) is not modelled: the
one measured (results/split4k-h200-x2 trial 1) used 24.3 GiB where its colocated twins used
31.7 and 32.8, and is predicted at 31.5, above, so the pruning errs on the safe side there.
"""

from __future__ import annotations

from tuner.estimate.context import Context
from tuner.estimate.memory import BF16, OPTIMIZER_BYTES, params_local
from tuner.hardware import GIB
from tuner.space import Candidate

HOST_BASE_GIB = 20.4
"""The node's processes at a model of no size (scripts/host_memory_check.py's fit)."""
HOST_PER_MODEL_GIB = 1.93
"""GiB of host memory per GiB of the whole model's bf16 weights (the fit)."""
HOST_PER_OFFLOADED_GIB = 1.30
"""GiB of host memory per GiB the trainer GPUs offload (the fit; 1 would be their size)."""
RAY_KILL_FRACTION = 0.95
"""Ray's memory monitor kills a worker above this share of the node's memory
(RAY_memory_usage_threshold's default; the verl log of moe2k-h200-x1 trial 0: "exceeded
threshold of 128391135232B (95.0% of 135148564480B limit)")."""


def offloaded_bytes(ctx: Context, candidate: Candidate) -> float:
    """Bytes one trainer GPU (its heaviest pipeline stage) keeps on the host."""
    layout = candidate.layout
    dense, expert = params_local(ctx, layout)
    weights = (dense + expert) * BF16
    out = 0.0
    if candidate.param_offload:
        out += weights * (2 if ctx.uses_ref else 1)
    if candidate.optimizer_offload:
        out += OPTIMIZER_BYTES * (dense / (layout.dp * layout.cp) + expert / layout.expert_dp)
    return out


def host_memory_gib(ctx: Context, candidate: Candidate, trainer_gpus: int) -> float:
    """Predicted host memory of one node whose `trainer_gpus` GPUs run the actor, in GiB."""
    model = ctx.total_params * BF16 / GIB
    offloaded = offloaded_bytes(ctx, candidate) * trainer_gpus / GIB
    return HOST_BASE_GIB + HOST_PER_MODEL_GIB * model + HOST_PER_OFFLOADED_GIB * offloaded


HOST_UNFIT = "host memory"
"""How every reason `host_unfit` gives begins."""


def host_unfit(host_gib: float, node_gib: float | None, offloads: bool) -> str:
    """Why a node of `node_gib` GiB (None: not known, not checked) cannot hold `host_gib`, or
    ''. `offloads`: the candidate offloads something (the advice then says to offload less)."""
    if node_gib is None:
        return ""
    line = RAY_KILL_FRACTION * node_gib
    if host_gib <= line:
        return ""
    advice = (
        "offload less (optimizer_offload first) or spread the actor over more GPUs"
        if offloads
        else "use a node with more memory (--host-mem-gib)"
    )
    return (
        f"{HOST_UNFIT} {host_gib:.1f} GiB a node > {line:.1f} GiB (Ray kills above "
        f"{RAY_KILL_FRACTION:.0%} of {node_gib:.1f}): {advice}"
    )
