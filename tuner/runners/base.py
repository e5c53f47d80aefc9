"""The runner interface: run(TrialSpec) -> TrialResult, never raising for an expected failure."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuner.estimate import Estimate
from tuner.estimate.host_memory import HOST_UNFIT
from tuner.estimate.runner_memory import memory_view
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.results import TrialResult
from tuner.space import Candidate, SpaceLimits
from tuner.workload import Workload


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialSpec:
    """Everything a runner needs for one trial."""

    number: int
    """Optuna trial number."""
    candidate: Candidate
    model: ModelSpec
    cluster: Cluster
    workload: Workload
    trial_dir: Path
    """results/<study>/trials/<n>/: logs and scratch files of this trial."""
    timeout_s: float
    """Wall-clock limit of the launch; past it the trial ends as `timeout`."""
    prediction: Estimate
    """The cost model's numbers for this candidate (runners may use them to size things)."""
    seed: int = 0
    should_stop: Callable[[int, float], bool] | None = None
    """Called by a measuring runner after each measured step with (step index, that step's
    tokens/s/GPU); True means Optuna's pruner wants the trial stopped: the runner stops it and
    returns Status.PRUNED_SLOW with the partial times it has."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Predicted:
    """The cost model's view of one trial as a runner measures it: what ranks the warm start
    and what prunes a candidate before launch."""

    tokens_per_s_per_gpu: float
    peak_gib: float
    phase: str
    device_gib: float = 0.0
    """Predicted device total at the peak (PyTorch's peak plus what lies outside it: CUDA
    context, NCCL, workspaces, fragmentation); 0 where not modelled. Pruning compares this,
    plus the headroom, with the GPU's capacity."""
    unfit: str = ""
    """Why it cannot run (e.g. "peak 90.1 GiB in update_actor > 79.1 GiB"); empty if it can."""


class Runner(abc.ABC):
    """Measures (or estimates) one candidate."""

    name: str = ""
    """`estimate`, `megatron` or `verl`: the CLI's --runner and the rows' `runner`."""

    @abc.abstractmethod
    def run(self, spec: TrialSpec) -> TrialResult:
        """Run one trial. Expected failures (OOM, crash, timeout) are results, not raises."""

    def recover(self, spec: TrialSpec) -> TrialResult | None:
        """The result already in `spec.trial_dir` of a trial whose worker died after the launch
        measured it and before the study stored its record (a resumed study asks this before
        it re-runs the trial): read from the files the launch left, as `run` reads them, never
        launching anything. None where the folder holds no finished measurement, or where the
        runner cannot tell (the default)."""
        return None

    def check_available(self, cluster: Cluster) -> None:  # noqa: B027 (optional hook)
        """Raise UserError with one actionable line if this runner cannot run here."""

    def split_refusal(self) -> str | None:
        """Why this runner cannot run a split placement (`--allow-off-policy`: vLLM on GPUs of
        its own, verl's one-step-off-policy trainer), as the end of a sentence that says what
        to use instead; None where it can. Default: it cannot."""
        return (
            f"--runner {self.name} runs every candidate colocated; use --runner verl (real "
            "one-step-off runs) or --runner estimate"
        )

    def record_fields(self) -> dict[str, str]:
        """Settings of this runner every row of the study records (e.g. the verl runner's
        bridge, overrides and environment); none by default."""
        return {}

    def space_limits(self, model: ModelSpec) -> SpaceLimits:
        """What this runner can measure (default: everything)."""
        return SpaceLimits()

    def predicted(
        self, pred: Estimate, cluster: Cluster, *, headroom_gib: float | None = None
    ) -> Predicted:
        """The cost model's numbers for what this runner measures (default: the whole step).
        Unfit when the device total + `headroom_gib` (default: the headroom `pred` was
        estimated with, `estimate(headroom_gib=...)`) exceeds the GPU's memory, vLLM has no
        room for one sequence, or the node's host memory cannot hold what it offloads."""
        peak, device, phase, unfit = memory_view(pred, cluster, headroom_gib=headroom_gib)
        beyond_device = "KV cache" in pred.fit_reason or pred.fit_reason.startswith(HOST_UNFIT)
        if not unfit and not pred.fits and beyond_device:
            unfit = pred.fit_reason
        return Predicted(
            tokens_per_s_per_gpu=pred.throughput_tokens_per_s_per_gpu,
            peak_gib=peak,
            phase=phase,
            device_gib=device,
            unfit=unfit,
        )
