"""The launcher interface: start one job (a command, its environment, a node count), wait for it
with a timeout, keep its log, and say how it ended. Where it runs is the launcher's business:
this node, a Ray cluster, a Slurm allocation."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import UserError


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """One command to run to completion."""

    name: str
    """A short id (letters, digits, `-_.`), unique per trial: the Ray submission id, the Slurm
    job name."""
    cmd: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables set for the command and, on Ray and Slurm, for every worker it starts."""
    log_path: Path
    """Where the command's stdout and stderr end up (fetched from the cluster if need be)."""
    timeout_s: float
    """Wall-clock limit of the running command (time in a queue does not count)."""
    nnodes: int = 1
    gpus_per_node: int = 0
    prologue: str = ""
    """A shell line run just before the command, where the command runs (its output goes to
    the log): e.g. printing the versions installed there."""
    workdir: Path | None = None
    """Scratch files of the launch (scripts); the command's cwd for the local launcher."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchResult:
    returncode: int | None
    """Exit code of the command; None when it was stopped for the timeout or never ran."""
    timed_out: bool
    duration_s: float
    """Running time (after any queue wait)."""
    log_path: Path
    job_id: str = ""
    """The Ray submission id or the Slurm job id."""
    state: str = ""
    """The scheduler's last word: SUCCEEDED, FAILED, STOPPED, COMPLETED, OUT_OF_MEMORY, ..."""
    queued_s: float = 0.0


class Launcher(abc.ABC):
    """Runs a Job somewhere; never raises for a failed or hung job (that is the result)."""

    name: str = ""

    @abc.abstractmethod
    def launch(self, job: Job) -> LaunchResult:
        """Run the job to its end or its timeout."""

    def gpus_visible(self) -> int | None:
        """GPUs this launcher can reach now, or None where it cannot tell (a Slurm allocation is
        granted later: trust the request)."""
        return None

    def check(self, gpus: int, nnodes: int) -> None:
        """Raise UserError with one actionable line if `gpus` on `nnodes` cannot run here."""
        seen = self.gpus_visible()
        if seen is not None and seen < gpus:
            raise UserError(
                f"--runner verl --launcher {self.name} sees {seen} GPU(s), --gpus asks for "
                f"{gpus}: {self.more_gpus_hint()}"
            )

    def split_refusal(self) -> str | None:
        """Why this launcher cannot run verl's one-step-off-policy trainer (a split placement:
        two GPU pools of one Ray cluster), as the end of a sentence saying what to use
        instead; None where it can (local, ray and slurm all can: the trainer places its pools
        on the Ray cluster the job runs in)."""
        return None

    def more_gpus_hint(self) -> str:
        return "lower --gpus or run where there are more"

    @property
    def shared_ray(self) -> bool:
        """Whether the jobs join one Ray cluster the launcher keeps for the study (the local
        launcher's `--shared-ray`), so a job's environment reaches the cluster's workers only
        through the runtime env its driver passes."""
        return False

    def close(self) -> None:
        """End what the launcher keeps between jobs (the local launcher's shared Ray head);
        the runner calls it when the study ends). Nothing by default."""
        return None
