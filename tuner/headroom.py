"""The headroom pruning keeps below a GPU's capacity, per phase: one fact the cost model
(tuner.estimate.device re-exports it), the memory fit and `--headroom-gib`'s help read. A leaf
module (like verl_settings): the command line reads it without importing the
cost model."""

from __future__ import annotations

MIN_HEADROOM_GIB = 2.0
"""The least headroom pruning keeps: allocations the model does not see (a lazily connected
NCCL algorithm, the allocator's next segment, another process on the GPU) come in GiB steps."""
PHASE_HEADROOM_GIB = {"generation": 2.0, "old_log_prob": 2.0, "update_actor": 3.8}
"""Headroom below the GPU's capacity that pruning keeps by default, per phase: a phase's device
total + its headroom must fit (`phase_headroom_gib`). Fitted by scripts/memory_fit.py (output
committed in scripts/memory_fit.out.txt; `tuner.fit.memory_fit.fit_phase_headroom`: per phase,
`fit_memory` of the raw model over the rows whose predicted device total peaks in it) on the 37
device-measured rows of results/ and the published runs of tests/data/anchors.

One headroom served neither: the rows' largest under-prediction asks 3.80 GiB (moe8k trial 11:
106.3 GiB measured, 103.0 predicted, + HEADROOM_MARGIN_GIB), and above 2.02 GiB four published runs
that completed on an H100 (79.6 GiB) would be pruned (dapo_moe30b trial 8 at 77.6 GiB,
grpo_qwen2.5_7b trials 2, 3, 7 at 76.0-76.4 GiB). Of the splits tried (MoE or dense, 16k
sequences, offload, expert parallel, recompute, the GPU, the peak phase), only the phase that
peaks separates them: every row under-predicted by more than 1 GiB (8 of the 32 that peak in
update_actor: moe8k trial 11 +3.30, small16k trials 4, 5, 15, 31, 41, 51, 52 +1.30..+2.14) peaks
in update_actor, the phase of the backward's and the optimizer's transients (all 8 have 27-41
GiB of them); the 5 rows that peak in old_log_prob are under-predicted by at most 0.90 GiB, and
the four tight published runs peak in old_log_prob (dapo_moe30b 8) and generation (grpo 2, 3, 7:
vLLM's fixed share), where no measured row asks more than MIN_HEADROOM_GIB. The published runs'
update_actor totals leave at least 9.2 GiB free (dapo_moe30b trial 4), so 3.8 GiB there prunes
none of them, and every OOM row stays unfit (all are predicted above the capacity). Not fitted:
the verl runner's rows of results/verl4k-h100-x1.csv (nvidia-smi's device peak, sampled over the
whole trial and its processes; listed in the output): their generation is predicted within 0.5
GiB since it counts verl 0.9.1's vLLM process (VLLM_PROCESS_GIB, VERL_ACTOR_RETAINED_GIB), trial
3's update peak 1.7 GiB above (4.5 before vLLM asleep and the actor's retained memory counted
there), trials 4/5/7's update 6.5 below (allocated over-predicted by 7.9 GiB;
scripts/verl_memory_check.py). The worker's rows of eager NCCL
count MEGATRON_WORKER_GIB + EAGER_NCCL_EXCESS_GIB outside PyTorch, 8.89 GiB where the fit had
8.9: each 0.01 GiB lower, update_actor's fit 3.81, kept at 3.8."""


def phase_headroom_gib(phase: str) -> float:
    """The default headroom of a phase (PHASE_HEADROOM_GIB; MIN_HEADROOM_GIB for any other)."""
    return PHASE_HEADROOM_GIB.get(phase, MIN_HEADROOM_GIB)
