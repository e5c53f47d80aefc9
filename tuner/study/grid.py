"""The hand grid: what an engineer tuning by hand tries first, measured in the same study as the
search so that "how much better is the tuned answer" is a measured ratio, not a claim.

The grid is the plain layouts (one parallel degree over the whole world, the way a hand-written
recipe starts: `tp2`, `pp2`, `ep2`, `dp2`), times recompute none/full, times a token budget of
one and two full samples; every other knob keeps verl's default. Each candidate is enqueued
once (before the warm start), with `origin=hand grid`; the ones the cost model says cannot fit
end as `pruned-oom-predicted` rows without a launch, like any other candidate.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tuner.space import (
    Candidate,
    ParallelLayout,
    SearchSpace,
    params_for,
    round_up,
    token_budget,
    validate,
)

HAND_GRID_ORIGIN = "hand grid"
HAND_RECOMPUTE = ("none", "full")
HAND_BUDGET_FACTORS = (1.0, 2.0)
"""ppo_max_token_len_per_gpu as multiples of one full sample (prompt + response)."""
HAND_LAYOUTS = 2
"""Plain layouts in the grid at most (largest single degree first: tp, then ep, pp, dp)."""


def _plain(lay: ParallelLayout) -> bool:
    degrees = [d for d in (lay.tp, lay.pp, lay.cp, lay.ep) if d > 1]
    return lay.vpp == 1 and lay.etp == 1 and len(degrees) <= 1 and lay.cp == 1


def _order(lay: ParallelLayout) -> tuple[int, int]:
    kind = 0 if lay.tp > 1 else 1 if lay.ep > 1 else 2 if lay.pp > 1 else 3
    return (kind, -max(lay.tp, lay.pp, lay.ep))


def plain_layouts(space: SearchSpace, limit: int = HAND_LAYOUTS) -> list[ParallelLayout]:
    """The layouts a hand-written recipe starts from, valid in this space."""
    lays = sorted((lay for lay in space.layouts.values() if _plain(lay)), key=_order)
    seen: set[str] = set()
    out: list[ParallelLayout] = []
    for lay in lays:
        kind = "tp" if lay.tp > 1 else "ep" if lay.ep > 1 else "pp" if lay.pp > 1 else "dp"
        if kind not in seen:
            seen.add(kind)
            out.append(lay)
    return out[:limit]


def hand_grid(space: SearchSpace, layouts: int = HAND_LAYOUTS) -> list[tuple[Candidate, str]]:
    """(candidate, label) pairs of the hand grid; only candidates that pass validate()."""
    m, cl, w = space.model, space.cluster, space.workload
    seq = w.max_seq_len
    out: list[tuple[Candidate, str]] = []
    for lay in plain_layouts(space, layouts):
        for gran in HAND_RECOMPUTE:
            for f in HAND_BUDGET_FACTORS:
                budget = token_budget(f, seq, lay.cp)
                c = Candidate(
                    layout=lay,
                    sequence_parallel=False,
                    recompute_granularity=gran,
                    use_dynamic_bsz=True,
                    ppo_max_token_len_per_gpu=budget,
                    log_prob_max_token_len_per_gpu=round_up(2 * budget, 1024),
                )
                if m.is_moe and lay.tp > 1:
                    c = dataclasses.replace(c, sequence_parallel=True)
                if validate(c, m, cl, w):
                    continue
                out.append((c, f"{lay.notation} recompute {gran} budget {f:g}x"))
    return out


def hand_grid_params(space: SearchSpace) -> list[tuple[dict[str, Any], str]]:
    """The grid as (sampler params, origin) pairs for Optuna's enqueue_trial."""
    out: list[tuple[dict[str, Any], str]] = []
    seen: set[tuple[Any, ...]] = set()
    for c, label in hand_grid(space):
        p = params_for(c, space)
        key = tuple(sorted(p.items()))
        if key not in seen:
            seen.add(key)
            out.append((p, f"{HAND_GRID_ORIGIN}: {label}"))
    return out
