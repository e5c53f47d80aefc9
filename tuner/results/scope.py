"""What a row's throughput covers: the whole RL step, generation + training, training alone, or
the cost model's prediction; one rule that `tune show`, `tune report` and pinned_knobs read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.results.record import parse_extra

WHOLE_STEP = "step"
"""verl measured the whole step (its perf/throughput): generation, log-probs, update, sync."""
GEN_TRAIN = "gen+train"
"""generation (vLLM) + old_log_prob + update measured; the weight sync predicted, not summed."""
TRAIN_ONLY = "train only"
"""old_log_prob + update measured; generation predicted (pred_generation_s), not summed."""
PREDICTED = "predicted"
"""The cost model's whole step; nothing measured."""
PUBLISHED = "published"
"""A reference leaderboard's row: someone else's whole step."""

MEANINGS = {
    WHOLE_STEP: "the whole step, measured by verl",
    GEN_TRAIN: "generation + old_log_prob + update, measured; the weight sync not in it",
    TRAIN_ONLY: "old_log_prob + update only, measured; generation not measured",
    PREDICTED: "the whole step, predicted by the cost model",
    PUBLISHED: "the whole step, as published",
}
"""Each scope in words, for headlines and notes."""


def scope_of(source: str, extra: Mapping[str, Any] | str) -> str:
    """The scope of a row's tokens_per_s_per_gpu from its source and `extra` (a record's dict or
    a CSV's `k=v;...` text); '' for rows that measured nothing (pruned, failed before a step)."""
    if isinstance(extra, str):
        extra = parse_extra(extra)
    if source == "verl":
        return WHOLE_STEP
    if source == "reference":
        return PUBLISHED
    if source == "estimate":
        return PREDICTED
    if source == "megatron":
        return GEN_TRAIN if str(extra.get("generation", "")).startswith("measured") else TRAIN_ONLY
    return ""


BREADTH = (WHOLE_STEP, GEN_TRAIN, TRAIN_ONLY, PREDICTED)
"""Scopes from the broadest measured to the narrowest, then the prediction: the order `tune show`
ranks them in by default (tuner.leaderboard.rank); a published row ranks as a whole step."""


def breadth(scope: str) -> int:
    """A scope's place in BREADTH (0 the whole step, also for a published row); rows that
    measured nothing ('') after every scope."""
    if scope == PUBLISHED:
        return 0
    return BREADTH.index(scope) if scope in BREADTH else len(BREADTH)


def comparable(scope: str) -> str:
    """Scopes whose throughputs may be set side by side (a ratio, a reference): the whole step
    however it was had (verl's, published, the cost model's), else only the same scope."""
    return WHOLE_STEP if scope in (WHOLE_STEP, PUBLISHED, PREDICTED) else scope
