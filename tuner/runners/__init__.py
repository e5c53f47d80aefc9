"""Runners measure (or estimate) one candidate: estimate, megatron, verl."""

from __future__ import annotations

import shutil

from tuner.errors import UserError
from tuner.runners.base import Runner, TrialSpec
from tuner.runners.estimate import EstimateRunner

__all__ = ["EstimateRunner", "Runner", "TrialSpec", "gpu_available", "make_runner"]

RUNNER_NAMES = ("auto", "estimate", "megatron", "verl")


def gpu_available() -> bool:
    """Whether this machine has an NVIDIA GPU (no torch import: nvidia-smi answers)."""
    if shutil.which("nvidia-smi") is None:
        return False
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def make_runner(name: str, **options: object) -> Runner:
    """The runner called `name`; `auto` means megatron where there is a GPU, else estimate."""
    if name == "auto":
        name = "megatron" if gpu_available() else "estimate"
    if name == "estimate":
        return EstimateRunner()
    if name == "megatron":
        from tuner.runners.megatron import MegatronRunner

        return MegatronRunner(**options)  # type: ignore[arg-type]
    if name == "verl":
        from tuner.runners.verl import VerlRunner

        return VerlRunner(**options)  # type: ignore[arg-type]
    raise UserError(f"unknown runner {name!r}: use one of {', '.join(RUNNER_NAMES)}")
