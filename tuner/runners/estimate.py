"""The estimate runner: the cost model alone, for machines without GPUs. Rows say so."""

from __future__ import annotations

from tuner.results import Status, TrialResult
from tuner.runners.base import Runner, TrialSpec


class EstimateRunner(Runner):
    name = "estimate"

    def run(self, spec: TrialSpec) -> TrialResult:
        e = spec.prediction
        if not e.fits:
            return TrialResult(
                status=Status.OOM,
                source="estimate",
                reason=f"predicted peak {e.peak_mem_gib:.1f} GiB in {e.peak_phase} > "
                f"{spec.cluster.gpu.memory_gib:.1f} GiB",
                peak_mem_gib=e.peak_mem_gib,
                hardware="cost model",
            )
        return TrialResult(
            status=Status.OK,
            source="estimate",
            step_s=e.step_s,
            generation_s=e.generation_s,
            old_log_prob_s=e.old_log_prob_s,
            ref_s=e.ref_s,
            update_actor_s=e.update_actor_s,
            reshard_s=e.reshard_s,
            tokens_per_s_per_gpu=e.throughput_tokens_per_s_per_gpu,
            mfu_pct=e.mfu * 100,
            peak_mem_gib=e.peak_mem_gib,
            hardware="cost model",
        )
