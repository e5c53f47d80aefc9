"""The estimate runner: the cost model alone, for machines without GPUs. Rows say so
(`source=estimate`, `hardware=cost model`): their memory columns, device total included, are
predictions, not measures."""

from __future__ import annotations

from tuner.fields import same_named
from tuner.results import Status, TrialResult
from tuner.runners.base import Runner, TrialSpec


class EstimateRunner(Runner):
    name = "estimate"

    def split_refusal(self) -> str | None:
        return None  # the cost model prices a split (tuner/estimate/split.py)

    def run(self, spec: TrialSpec) -> TrialResult:
        e = spec.prediction
        mem = e.memory
        memory = {  # every phase's device total is its reserved peak + the same outside part
            "peak_mem_gib": e.peak_mem_gib,
            "peak_mem_reserved_gib": e.device_peak_gib - e.outside_gib,
            "peak_mem_device_gib": e.device_peak_gib,
        }
        if not e.fits:
            return TrialResult(
                status=Status.OOM,
                source="estimate",
                reason=f"predicted {e.fit_reason} (estimate)",
                hardware="cost model",
                **memory,  # type: ignore[arg-type]
            )
        return TrialResult(
            status=Status.OK,
            source="estimate",
            **same_named(e, TrialResult, skip=("peak_mem_gib",)),  # the times; memory below
            tokens_per_s_per_gpu=e.throughput_tokens_per_s_per_gpu,
            mfu_update_pct=e.mfu * 100,
            hardware="cost model",
            extra={
                "memory": "estimate",
                "device_parts_gib": (
                    f"allocated={e.peak_mem_gib:.2f}/slack={e.slack_gib:.2f}/"
                    f"context={mem.cuda_context_gib:.2f}/nccl={mem.nccl_gib:.2f}"
                ),
            },
            **memory,  # type: ignore[arg-type]
        )
