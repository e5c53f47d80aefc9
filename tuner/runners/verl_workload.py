"""The workload a verl trial ran against the one it declared: how its responses were made
(fixed, drawn from the length model, or the model's own), the synthetic data's overrides, and
the check that verl's measured lengths are the declared ones."""

from __future__ import annotations

from typing import Any

from tuner import verl_command
from tuner.dataset import Dataset
from tuner.workload import Workload

WORKLOAD_TOLERANCE = 0.05
"""How far verl's measured prompt or response mean may be off what the trial asked for."""


def response_mode(w: Workload, data: Dataset) -> str:
    """`fixed` (every response the cap), `drawn` (each its length from the workload's model)
    or `natural` (the model stops where it stops: the user's data)."""
    if verl_command.fixed_response_length(w):
        return "fixed"
    return "drawn" if data.response_caps_mean is not None else "natural"


def data_overrides(data: Dataset) -> dict[str, Any]:
    """The synthetic data's own overrides: with drawn responses, the loop that caps them (its
    config beside the data), EOS ignored so each response is its cap, and the rows read in
    order so that step s runs the rows drawn for it (verl 0.9.1 data.shuffle defaults True)."""
    if data.agent_loops is None:
        return {}
    return {
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(data.agent_loops),
        "actor_rollout_ref.rollout.ignore_eos": True,
        "data.shuffle": False,
    }


def workload_mismatch(w: Workload, data: Dataset, measured: dict[str, Any]) -> str:
    """Why a measured row is not the declared workload ('' where it is): verl's
    `prompt_length/mean` against the synthetic prompts' length, its `response_length/mean`
    against the fixed length or the mean of the drawn ones, each within WORKLOAD_TOLERANCE."""
    checks: list[tuple[str, str, float]] = []
    if data.synthetic:  # built to the length (exact), or one word a token (approximate)
        checks.append(("prompt", "prompt_length_mean", float(data.prompt_tokens)))
    mode = response_mode(w, data)
    if mode == "fixed":
        checks.append(("response", "response_length_mean", float(w.response_len)))
    elif mode == "drawn" and data.response_caps_mean is not None:
        checks.append(("response", "response_length_mean", data.response_caps_mean))
    for what, key, asked in checks:
        got = measured.get(key)
        if got is None or asked <= 0:
            continue
        if abs(float(got) - asked) > WORKLOAD_TOLERANCE * asked:
            return (
                f"not the declared workload: verl measured a mean {what} of {float(got):.0f} "
                f"tokens where {asked:.0f} were asked (more than "
                f"{WORKLOAD_TOLERANCE:.0%} off)"
            )
    return ""
