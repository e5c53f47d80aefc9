"""verl-tuner: find the fastest verl Megatron configuration for a model, an RL workload and a
GPU count. The command line is `tune` (tuner.cli); `tuner.load_leaderboard` reads leaderboards
into a pandas DataFrame."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.leaderboard import load_leaderboard

__all__ = ["load_leaderboard"]


def __getattr__(name: str) -> Any:
    # Lazy, so that `tune` and `python -m tuner` do not import pandas before they need it.
    if name == "load_leaderboard":
        from tuner.leaderboard import load_leaderboard

        return load_leaderboard
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")
