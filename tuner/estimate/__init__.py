"""The cost model: predicted memory and step time of a candidate, from first principles."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.estimate.memory import MemoryBreakdown, memory
from tuner.estimate.profile import Profile, load_profile
from tuner.estimate.time import phase_times
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.space import Candidate
from tuner.workload import Workload

__all__ = ["Estimate", "MemoryBreakdown", "Profile", "estimate", "load_profile"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    """Predicted values of one step; seconds, GiB, tokens/s/GPU."""

    step_s: float
    generation_s: float
    old_log_prob_s: float
    ref_s: float
    update_actor_s: float
    reshard_s: float
    throughput_tokens_per_s_per_gpu: float
    mfu: float
    """Actor-update model FLOPs utilisation, a fraction."""
    peak_mem_gib: float
    peak_phase: str
    fits: bool
    bottleneck: str
    memory: MemoryBreakdown

    def as_dict(self) -> dict[str, object]:
        d = {k: getattr(self, k) for k in self.__slots__ if k != "memory"}  # type: ignore[attr-defined]
        d["memory_gib"] = {k: getattr(self.memory, k) for k in self.memory.__slots__}  # type: ignore[attr-defined]
        return d


def estimate(
    c: Candidate, m: ModelSpec, cl: Cluster, w: Workload, profile: Profile | None = None
) -> Estimate:
    p = profile or Profile()
    mem = memory(c, m, cl, w, p)
    t = phase_times(c, m, cl, w, p)
    step = t.step_s
    mfu = t.update_flops / (cl.num_gpus * cl.gpu.bf16_tflops * 1e12 * t.update_actor_s)
    return Estimate(
        step_s=step,
        generation_s=t.generation_s,
        old_log_prob_s=t.old_log_prob_s,
        ref_s=t.ref_s,
        update_actor_s=t.update_actor_s,
        reshard_s=t.reshard_s,
        throughput_tokens_per_s_per_gpu=w.tokens_per_step / step / cl.num_gpus,
        mfu=mfu,
        peak_mem_gib=mem.peak_gib,
        peak_phase=mem.peak_phase,
        fits=mem.peak_gib <= cl.gpu.memory_gib,
        bottleneck=t.bottleneck,
        memory=mem,
    )
