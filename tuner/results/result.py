"""What a runner reports for one trial: its status (`Status`) and measures (`TrialResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tuner.measures import TrialMeasures


class Status(StrEnum):
    OK = "ok"
    OOM = "oom"
    FAILED = "failed"
    TIMEOUT = "timeout"
    PRUNED_INVALID = "pruned-invalid"
    PRUNED_OOM = "pruned-oom-predicted"
    PRUNED_SLOW = "pruned-slow"
    """Stopped early by Optuna's pruner: its first measured steps were far slower than the best."""
    INTERRUPTED = "interrupted"
    """Its worker was killed mid-trial; a resumed study re-runs it."""


ROW_SOURCES = ("estimate", "megatron", "verl", "tuner", "reference")
"""Every `source` a leaderboard row holds: the runner that measured it (estimate, megatron,
verl), `tuner` (refused before a runner saw it) or `reference` (a published row)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialResult(TrialMeasures):
    """What a runner reports for one trial: its measures (TrialMeasures: times in seconds,
    memory in GiB) and how it ended."""

    status: Status
    source: str
    """estimate, megatron or verl: where the numbers come from."""
    reason: str = ""
    """Why it failed or was pruned; a short line."""
    backend: str = ""
    """What actually ran, e.g. `megatron-core (update, old_log_prob); generation predicted`."""
    hardware: str = ""
    """What it ran on, e.g. `4x NVIDIA H200`; `model` for estimates."""
    versions: str = ""
    log_path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    """Runner-specific measures, kept in the row's `extra` column as k=v pairs."""

    @property
    def value(self) -> float | None:
        """The objective: tokens/s/GPU of a run that finished."""
        if self.status is Status.OK and self.tokens_per_s_per_gpu is not None:
            return self.tokens_per_s_per_gpu
        return None
