"""Device memory beyond PyTorch's tensors, and the headroom that pruning keeps.

An OOM is decided on the device total (what `nvidia-smi` / `torch.cuda.mem_get_info` call used),
not on PyTorch's allocated peak. Per GPU:

    device = allocated + slack + context + nccl

- allocated: the tensors the cost model counts (tuner.estimate.memory), plus the cuBLAS /
  cuBLASLt / transformer-engine workspaces, which PyTorch's caching allocator hands out;
- slack: reserved - allocated, the caching allocator's fragmentation. It grows with the large
  short-lived tensors of a step (activations, logits, all-to-all buffers) and with micro-batches
  of varying length, whose blocks do not fit one another's holes:
  `slack = SLACK_FIXED_GIB + SLACK_FRACTION * transient`;
- context: the CUDA context and the kernel images loaded into it, per process;
- nccl: the buffers of each NCCL communicator the rank belongs to and uses (`nccl_gib`).

verl 0.9.1's generation phase has a second process on the GPU, vLLM's worker: its budget
(`gpu_memory_utilization` of the GPU) is among the allocated tensors, what it holds beyond the
budget is `vllm_outside_gib`, and the actor holds VERL_ACTOR_RETAINED_GIB more outside its
tensors there (tuner.estimate.rollout_memory `verl_generation_gib`); in old_log_prob and
update_actor vLLM's worker sleeps beside the actor, both still holding theirs
(`verl_training_outside_gib`).

The headroom kept below the capacity depends on the phase (`PHASE_HEADROOM_GIB`, fitted by
`tuner.fit.memory_fit.fit_phase_headroom` on the committed leaderboards, scripts/memory_fit.py);
what a study learns from its own trials is `tuner.fit.online.MemoryGuard`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from tuner.hardware import GIB, Cluster
from tuner.headroom import MIN_HEADROOM_GIB as MIN_HEADROOM_GIB  # re-exported
from tuner.headroom import PHASE_HEADROOM_GIB as PHASE_HEADROOM_GIB  # re-exported
from tuner.headroom import phase_headroom_gib
from tuner.space import ParallelLayout

MIB = 1024**2

# --------------------------------------------------------------------------------------------
# Constants (first principles; sources in the docstrings)
# --------------------------------------------------------------------------------------------

CUDA_CONTEXT_GIB = 1.0
"""CUDA context plus the kernel images a verl worker process (transformer-engine kernels)
loads, per GPU, outside PyTorch's allocator. With lazy module loading (CUDA_MODULE_LOADING=LAZY,
the default since CUDA 12.2) the bare context of a torch process on an H100 is ~0.5 GiB;
cuBLAS, cuDNN, NCCL, flash-attention, vLLM's and transformer-engine's kernels add a few hundred
MiB as they are first used. Not measured at device level yet (the anchors' verl rows carry no
device memory); MEGATRON_WORKER_GIB is what the megatron runner's worker process measured."""
MEGATRON_WORKER_GIB = 2.43
"""Device memory the megatron runner's worker process (tuner.runners.megatron_worker, te or
local layers alike) holds outside PyTorch's allocator beside nccl_gib, per GPU, since it
initialises NCCL lazily (WORKER_NCCL_INIT). Measured on one H100, world 1 (torch 2.11,
megatron-core 0.19.2; scripts/gpu_outside_probe.py, output gpu_outside_probe_lazy.out.txt):
device used (total - free) minus PyTorch's reserved peak in one Qwen3-1.7B full-recompute
trial, 2.43 GiB: CUDA context 0.60, cuBLAS 0.06, the default communicator 0.55 (made at the
first all_reduce), the attention check 0.06, and 1.14 during the trial, the communicators of
the megatron groups it used (~0.38 GiB each, one per group at its first collective, also for
a group of one rank). Larger worlds add nccl_gib as before (the communicators of more than one
rank; it counts the default and the used groups again: margin, not measured yet)."""
EAGER_NCCL_EXCESS_GIB = 6.46
"""What the worker held beyond MEGATRON_WORKER_GIB while it initialised NCCL eagerly
(init_process_group with device_id): each of the ~20 new_group calls of megatron's
initialize_model_parallel split a communicator at once (NCCL_DEBUG=INFO: 1 + 20
ncclCommSplit at world 1, ~0.38 GiB each, kept to the end). The same trial on the same H100:
8.89 GiB outside PyTorch eager (gpu_outside_probe.out.txt), 2.43 lazy, times and PyTorch peaks
equal. Rows measured then (their extra has no `nccl_init=lazy`): results/small16k-h100-x1.csv
8.88..8.96 GiB, dense8k/moe8k-h200-x2.csv 8.41..8.75 (world 2). tuner.fit.memory_fit adds it to
their prediction; nothing else does."""
NCCL_INIT_KEY = "nccl_init"
"""The extra key of a megatron-runner row that says how its worker initialised NCCL."""
WORKER_NCCL_INIT = "lazy"
"""How the megatron runner's worker initialises NCCL (runners/megatron_worker/main.py:
init_process_group without device_id, as verl 0.9.1's actor); its rows' extra records it."""
WORKSPACE_GIB = 0.1
"""cuBLAS (2 x 4 MiB per handle and stream, torch's Hopper default), cuBLASLt (32 MiB) and
transformer-engine (32 MiB per stream) workspaces. PyTorch's caching allocator provides them, so
they count in the allocated peak; the tensor model does not list them."""

# verl 0.9.1's rollout: a vLLM worker process beside the actor's -------------------------------
# verl 0.9.1 starts vLLM with its own worker processes (workers/rollout/vllm_rollout/
# vllm_async_server.py `launch_server`: distributed_executor_backend "mp") and syncs the weights
# to them by CUDA IPC; verl <= 0.5's sync-mode rollout built vLLM inside the actor's process
# (vllm_rollout_spmd.py: LLM(distributed_executor_backend="external_launcher")). Measured on one
# H100 by nvidia-smi every 0.5 s over verl4k-h100-x1 trial 4 (Qwen3-1.7B, param and optimizer
# offload, gpu_memory_utilization 0.5 of 81559 MiB: a budget of 40779.5 MiB;
# tests/data/verl_trials/h100_trial4/device-memory.csv, read by scripts/verl_memory_check.py).

VLLM_PROCESS_GIB = 0.78
"""What vLLM 0.24's worker process holds awake beyond its budget, per GPU of a rollout-TP-1
replica. vLLM charges `gpu_memory_utilization` x the GPU's total memory (v1/worker/utils.py
`request_memory`) only with what its process adds after a snapshot taken once the CUDA context
and the distributed set-up exist (v1/worker/gpu_worker.py `init_device`; KV cache = budget -
weights - the profiled activation peak - the non-torch increase - the CUDA-graph estimate,
`determine_available_memory`): the context is outside the budget, the CUDA-graph pool inside it
(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is on by default). Trial 4: the worker's start took the
device from 1631 to 2317 MiB (0.67 GiB, the context), and step 1's generation, while the actor
still held its start-up 1630 MiB, 43205 MiB: the budget + 795.5 MiB (0.78 GiB)."""
VLLM_ASLEEP_GIB = 1.18
"""What vLLM 0.24's worker keeps asleep, per GPU: verl puts it to sleep right after each
generation (trainer/ppo/ray_trainer.py `sleep_replicas` after generate_sequences), so through
old_log_prob and update_actor, at level 2 in the hybrid engine (vllm_async_server.py
`_sleep_hybrid`, `_resolve_sleep_level`: 1 only with LoRA adapters or MTP), which releases only
the allocations of its memory pool, weights and KV cache (device_allocator/cumem.py `sleep`);
the CUDA context, the CUDA-graph pool and its kernels stay. Trial 4: 2835 MiB with vLLM asleep
after its start-up, 1630 without it (1.18 GiB)."""
VERL_ACTOR_RETAINED_GIB = 1.60
"""What verl 0.9.1's actor process holds outside its tensors beyond CUDA_CONTEXT_GIB and
WORKSPACE_GIB in the generation phase, per GPU, from its second step on. Trial 4: alone after
its start-up (states offloaded) it held 1630 MiB (0.49 GiB over the model's 1.1); steps 2 and 3
generated at 44339 MiB, vLLM's 41575 of step 1 (the actor then had run no log-prob or update
pass) + 2764 MiB (2.70 GiB): 1.05 GiB more, kept since its first log-prob and update passes
(kernels and workspaces kept once loaded; not measured apart). Counted in the training phases
too (`verl_training_outside_gib`): trial 4's updates of steps 2 and 3 sampled 43749 MiB, 4.05
GiB over verl's reserved peak (38.67 GiB), where CUDA_CONTEXT_GIB + this + VLLM_ASLEEP_GIB count
3.78; verl4k trial 3 (update peak) 70.53 GiB sampled, 4.16 over its reserved 66.37. The megatron
runner's view counts its worker's MEGATRON_WORKER_GIB instead (runner_memory.memory_view
`process_gib`)."""

NCCL_SIMPLE_BUFFER_MIB = 4.0
"""NCCL_BUFFSIZE default: the Simple protocol's buffer per connection (4 MiB)."""
NCCL_LL128_BUFFER_MIB = 120 * 640 * 8 * 8 / MIB
"""LL128 protocol buffer per connection: elements per thread (120) x threads (640) x steps (8)
x 8 bytes = 4.69 MiB (NCCL's DEFAULT_LL128_BUFFSIZE)."""
NCCL_LL_BUFFER_MIB = 8 * 512 * 8 * 16 / MIB
"""LL protocol buffer per connection: lines per thread (8) x threads (512) x steps (8) x 16
bytes = 0.5 MiB (NCCL's DEFAULT_LL_BUFFSIZE)."""
NCCL_COLL_CHANNELS = 32
"""Channels NCCL opens for ring/tree collectives on NVLink-switch hosts (H100/H200: up to 32;
memory is linear in channels, NVIDIA/nccl#986)."""
NCCL_RING_CONNECTIONS = 2
"""Connections per channel a rank holds for a ring or tree collective (its neighbours)."""
NCCL_P2P_PEER_CHANNEL_MIB = 3.28e9 / (7 * 32) / MIB
"""Buffers of one point-to-point (send/recv, all-to-all) peer per channel: an 8 x H100
all-to-all took 3.28 GB of device memory outside PyTorch over 7 peers x 32 channels
(NVIDIA/nccl#1685), 14 MiB per peer and channel."""
NCCL_P2P_CHANNELS_LOCAL = 32
"""P2P channels per peer inside a node (NVIDIA/nccl#1685 shows 32 on an H100 host)."""
NCCL_P2P_CHANNELS_NET = 2
"""P2P channels per peer across nodes (NCCL_NCHANNELS_PER_NET_PEER's default)."""
SLACK_FIXED_GIB = 0.7
"""Caching-allocator slack (reserved - allocated) present in any training step, with
expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), which verl 0.9.1 turns
on for training (workers/engine_workers.py `set_expandable_segments(True)` after the weight
sync) and the megatron-core runner sets (tuner/runners/megatron.py): freed blocks are unmapped
and remapped in pages, so variable-length micro-batches leave no large holes. Least squares
over the measured rows of results/dense8k-h200-x2.csv, moe8k-h200-x2.csv and
small16k-h100-x1.csv as first measured: 0.70 GiB + 0.00 x transient (reserved - allocated
0.24..2.25 GiB, median 0.37); on the re-made leaderboards scripts/memory_fit.out.txt gives
0.29 GiB + 0.020 x transient (median 0.61), not adopted yet (the constants change together
with a re-run of scripts/validate_estimator.py). The rows of 2026-11-22 (results/dense-h200-x2.csv,
moe-h200-x2.csv), run before the runner set expandable segments, had 3.1..8.6 GiB
(2.5 + 0.24 x transient): those are not device-level rows and no longer set these."""
SLACK_FRACTION = 0.0
"""Slack per GiB of the step's transient tensors (activations, logits, dispatch buffers): none
measurable with expandable segments (the fit above)."""

# Headroom: tuner.headroom (a leaf module the command line reads without the cost model)


# --------------------------------------------------------------------------------------------
# NCCL communicators of a layout
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Communicator:
    """One NCCL communicator a rank uses."""

    name: str
    """megatron-core's group name (parallel_state.py), or `WORLD` for torch's default group."""
    size: int
    """Ranks in it."""
    stride: int
    """Rank distance between neighbours (tells whether peers share the node)."""
    p2p: bool = False
    """Point-to-point (send/recv, all-to-all) rather than a ring/tree collective."""
    peers: int = 0
    """P2P peers a rank connects to (all-to-all: size - 1; a pipeline: its neighbours)."""


def communicators(layout: ParallelLayout, *, moe: bool, tied: bool) -> list[Communicator]:
    """The NCCL communicators (size > 1) one actor rank connects in a verl Megatron step.

    megatron-core 0.19 `parallel_state.initialize_model_parallel` creates ~20 NCCL groups, but
    torch creates a communicator lazily at a group's first collective (where init_process_group
    had no device_id: verl 0.9.1, WORKER_NCCL_INIT) and NCCL connects the
    buffers of the algorithms used (NCCL_RUNTIME_CONNECT), so only the groups a step uses cost
    memory: the distributed optimizer's reduce-scatter/all-gather over DATA_PARALLEL_GROUP_WITH_CP
    (EXPERT_DATA_PARALLEL_GROUP for experts), its grad-norm all-reduce over
    INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP (the whole world), tensor-parallel collectives,
    pipeline send/recv (and verl's weight broadcast to the rollout over the same group),
    context-parallel ring send/recv, MoE all-to-all over EXPERT_MODEL_PARALLEL_GROUP plus the
    dispatcher's gathers over EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP, EXPERT_TENSOR_PARALLEL
    collectives, the tied-embedding all-reduce over EMBEDDING_GROUP (finalize_model_grads.py), and
    torch's default group (verl's barriers and metrics). Megatron's rank order is tp-cp-ep-dp-pp
    (tp fastest), which gives each group's stride."""
    tp, cp, pp, dp, ep, etp = layout.tp, layout.cp, layout.pp, layout.dp, layout.ep, layout.etp
    world = layout.world
    out: list[Communicator] = []

    def coll(name: str, size: int, stride: int) -> None:
        if size > 1:
            out.append(Communicator(name=name, size=size, stride=stride))

    def p2p(name: str, size: int, stride: int, peers: int) -> None:
        if size > 1:
            out.append(Communicator(name=name, size=size, stride=stride, p2p=True, peers=peers))

    coll("WORLD", world, 1)
    coll("INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP", world, 1)
    coll("TENSOR_MODEL_PARALLEL_GROUP", tp, 1)
    coll("DATA_PARALLEL_GROUP_WITH_CP", dp * cp, tp)
    p2p("CONTEXT_PARALLEL_GROUP", cp, tp, min(2, cp - 1))
    p2p("PIPELINE_MODEL_PARALLEL_GROUP", pp, world // pp, min(2, pp - 1))
    coll("PIPELINE_MODEL_PARALLEL_GROUP (weight broadcast)", pp, world // pp)
    if tied:
        coll("EMBEDDING_GROUP", min(2, pp), world // pp)
    if moe:
        expert_dp = layout.expert_dp
        p2p("EXPERT_MODEL_PARALLEL_GROUP", ep, etp, ep - 1)
        coll("EXPERT_TENSOR_PARALLEL_GROUP", etp, 1)
        coll("EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP", etp * ep, 1)
        coll("EXPERT_DATA_PARALLEL_GROUP", expert_dp, etp * ep)
    return out


def _peers_in_node(stride: int, peers: int, local_gpus: int) -> int:
    """How many of a rank's `peers` (at multiples of `stride`) share its node."""
    same = max(1, local_gpus // max(1, stride)) - 1
    return min(peers, same)


def communicator_gib(comm: Communicator, local_gpus: int) -> float:
    """Device buffers of one communicator on one rank, GiB.

    Collective: channels x connections x (Simple + LL128 + LL buffers), about 0.57 GiB (an A100
    pair measured 544 MB per communicator, larger groups 688 MB: NVIDIA/nccl#964). P2P: per peer,
    channels x the per-channel buffers measured for all-to-all; peers on other nodes get
    NCCL_NCHANNELS_PER_NET_PEER channels."""
    if not comm.p2p:
        per_conn = NCCL_SIMPLE_BUFFER_MIB + NCCL_LL128_BUFFER_MIB + NCCL_LL_BUFFER_MIB
        return NCCL_COLL_CHANNELS * NCCL_RING_CONNECTIONS * per_conn * MIB / GIB
    local = _peers_in_node(comm.stride, comm.peers, local_gpus)
    remote = comm.peers - local
    channels = local * NCCL_P2P_CHANNELS_LOCAL + remote * NCCL_P2P_CHANNELS_NET
    return channels * NCCL_P2P_PEER_CHANNEL_MIB * MIB / GIB


def nccl_gib(layout: ParallelLayout, cluster: Cluster, *, moe: bool, tied: bool) -> float:
    """NCCL buffers of one actor rank, GiB (the sum over `communicators`)."""
    return sum(
        communicator_gib(comm, cluster.local_gpus)
        for comm in communicators(layout, moe=moe, tied=tied)
    )


def vllm_outside_gib(rollout_tp: int, cluster: Cluster, *, asleep: bool = False) -> float:
    """vLLM's worker process per GPU beyond its budget awake (VLLM_PROCESS_GIB) or as it sleeps
    (VLLM_ASLEEP_GIB), plus with rollout TP > 1 its tensor-parallel NCCL communicator, connected
    before vLLM's snapshot (distributed/device_communicators/pynccl.py warms it up with an
    all_reduce when the group is made) and kept asleep."""
    own = VLLM_ASLEEP_GIB if asleep else VLLM_PROCESS_GIB
    if rollout_tp <= 1:
        return own
    return own + _vllm_tp_gib(rollout_tp, cluster.local_gpus)


@functools.lru_cache(maxsize=64)
def _vllm_tp_gib(rollout_tp: int, local_gpus: int) -> float:
    """vLLM's tensor-parallel communicator (cached: estimate() asks for it three times a call)."""
    group = Communicator(name="vLLM TP group", size=rollout_tp, stride=1)
    return communicator_gib(group, local_gpus)


def verl_training_outside_gib(rollout_tp: int, cluster: Cluster) -> float:
    """What verl 0.9.1's two processes hold in old_log_prob and update_actor beyond the actor's
    CUDA_CONTEXT_GIB and NCCL buffers, per GPU: the actor's VERL_ACTOR_RETAINED_GIB and vLLM's
    worker asleep (`vllm_outside_gib`). Not where vLLM ran in the actor's process (verl <= 0.5)
    nor in the megatron runner's worker (view.phase_devices `process_gib` leaves it out)."""
    return VERL_ACTOR_RETAINED_GIB + vllm_outside_gib(rollout_tp, cluster, asleep=True)


def slack_gib(transient_gib: float) -> float:
    """Caching-allocator slack (reserved - allocated) of a phase with these transients."""
    return SLACK_FIXED_GIB + SLACK_FRACTION * max(0.0, transient_gib)


def device_unfit(device_gib: float, capacity_gib: float, headroom_gib: float, phase: str) -> str:
    """One line with the numbers when `device_gib` + headroom exceeds the capacity, else ''."""
    if device_gib + headroom_gib <= capacity_gib:
        return ""
    return (
        f"device {device_gib:.1f} GiB in {phase} + headroom {headroom_gib:.1f} GiB > "
        f"{capacity_gib:.1f} GiB"
    )


def phases_unfit(
    devices_gib: Mapping[str, float], capacity_gib: float, headroom_gib: float | None
) -> str:
    """Why the phases' device totals do not fit ('' if they do): the phase that passes the
    capacity by the most, each with `headroom_gib` (a study's --headroom-gib), else with its
    own `phase_headroom_gib`."""
    worst, why = 0.0, ""
    for phase, device in devices_gib.items():
        headroom = phase_headroom_gib(phase) if headroom_gib is None else headroom_gib
        over = device + headroom - capacity_gib
        if over > worst:
            worst, why = over, device_unfit(device, capacity_gib, headroom, phase)
    return why


def megatron_worker_gib(*, eager_nccl: bool = False) -> float:
    """What the megatron runner's worker process holds outside PyTorch beside nccl_gib, per GPU:
    MEGATRON_WORKER_GIB, plus EAGER_NCCL_EXCESS_GIB where it initialised NCCL eagerly (a row
    measured before WORKER_NCCL_INIT)."""
    return MEGATRON_WORKER_GIB + (EAGER_NCCL_EXCESS_GIB if eager_nccl else 0.0)
