"""Runners measure (or estimate) one candidate: estimate, megatron, verl."""

from __future__ import annotations

import shutil
from typing import Any

from tuner.errors import UserError
from tuner.runners.base import Runner, TrialSpec
from tuner.runners.estimate import EstimateRunner

__all__ = [
    "EstimateRunner",
    "Runner",
    "TrialSpec",
    "gpu_available",
    "make_runner",
    "pinned_knobs",
]

RUNNER_NAMES = ("auto", "estimate", "megatron", "verl", "ladder")


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


def pinned_knobs(source: str, extra: object = "") -> tuple[tuple[str, Any], ...]:
    """The knobs a row of `source` (its runner) did not measure but pinned, as (name, pin):
    the megatron runner's generation and kernel knobs (megatron.MEGATRON_PINNED, less the
    kernels its te layers make where `extra` says `layer_spec=te`: megatron_layers), less the
    rollout knobs where its `extra` says `generation=measured(vllm)` (megatron_generation);
    none for the others (the verl runner runs every knob; the estimator measures nothing, as
    its rows say)."""
    if source == "megatron":
        from tuner.megatron_layers import layer_spec_of, layer_spec_pins
        from tuner.results import parse_extra
        from tuner.results.scope import GEN_TRAIN, scope_of
        from tuner.runners.megatron import MEGATRON_PINNED
        from tuner.runners.megatron_generation import measured_pins

        fields = extra if isinstance(extra, dict) else parse_extra(str(extra))
        pinned = layer_spec_pins(MEGATRON_PINNED, layer_spec_of(fields))
        measured = scope_of(source, fields) == GEN_TRAIN
        return measured_pins(pinned) if measured else pinned
    return ()


def make_runner(name: str, **options: object) -> Runner:
    """The runner called `name`; `auto` means megatron where there is a GPU, else estimate."""
    if name == "auto":
        name = "megatron" if gpu_available() else "estimate"
        if name == "estimate" and options.get("generation"):
            raise UserError(
                "--measure-generation needs a GPU: --runner auto found none and would use the "
                "estimator; run on a GPU host or leave --measure-generation out"
            )
    if name == "estimate":
        return EstimateRunner()
    if name == "megatron":
        from tuner.runners.megatron import MegatronRunner

        return MegatronRunner(**options)  # type: ignore[arg-type]
    if name == "verl":
        from tuner.runners.verl import VerlRunner

        return VerlRunner(**options)  # type: ignore[arg-type]
    if name == "ladder":  # options: fast= (the megatron runner's), confirm= (verl's), confirm_top=
        from tuner.runners.ladder_runner import LadderRunner

        fast, confirm = dict(options.pop("fast", {})), dict(options.pop("confirm", {}))  # type: ignore[call-overload]
        return LadderRunner(
            fast=make_runner("megatron", **fast),
            confirm=make_runner("verl", **confirm),
            **options,  # type: ignore[arg-type]
        )
    raise UserError(f"unknown runner {name!r}: use one of {', '.join(RUNNER_NAMES)}")
