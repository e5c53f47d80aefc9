"""The warm start: the estimator's best candidates and the reference layouts, enqueued once
per study, the predicted-best first."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import optuna

from tuner.estimate import Profile, estimate
from tuner.references import reference_candidates
from tuner.runners.base import Predicted, Runner
from tuner.runners.estimate import EstimateRunner
from tuner.space import (
    Candidate,
    FollowSuggester,
    RandomSuggester,
    SearchSpace,
    params_for,
    sample,
    validate,
)

WARM_START_POOL = 2000
"""Random candidates the estimator ranks before a new study starts."""
WARM_START_BEST = 3
"""How many of the estimator's best are tried first."""
WARM_START_ATTR = "warm_start_enqueued"
"""Study user attr set once the warm start is enqueued (under the study lock)."""


@dataclass(frozen=True, slots=True)
class Scored:
    """A candidate of the warm start's pool with the runner's view of the cost model."""

    candidate: Candidate
    origin: str
    """A reference setup's label, or `estimator` for a random draw."""
    predicted: Predicted
    params: dict[str, Any]
    """Its sampler parameters."""


def scored_candidates(
    space: SearchSpace,
    profile: Profile,
    runner: Runner | None,
    seed: int,
    pool: int,
    headroom_gib: float | None,
) -> Iterator[Scored]:
    """The valid reference layouts this space holds (scaled to its GPU count), then `pool`
    random draws of `seed` (not validated: the sampler's), each with the runner's prediction,
    lazily: one pool for the warm start and for the check that anything fits."""
    m, cl, w = space.model, space.cluster, space.workload
    runner = runner or EstimateRunner()

    def scored(c: Candidate, origin: str, params: dict[str, Any]) -> Scored:
        e = estimate(c, m, cl, w, profile, headroom_gib=headroom_gib)
        return Scored(c, origin, runner.predicted(e, cl), params)

    for c, origin in reference_candidates(m, cl, w):
        if c.layout.notation in space.layouts and not validate(c, m, cl, w):
            yield scored(c, origin, params_for(c, space))
    rng = random.Random(seed)
    for _ in range(pool):
        s = RandomSuggester(rng)
        c = sample(s, space)
        yield scored(c, "estimator", s.params)


def warm_start_params(
    space: SearchSpace,
    profile: Profile,
    seed: int,
    runner: Runner | None = None,
    pool: int = WARM_START_POOL,
    best: int = WARM_START_BEST,
    headroom_gib: float | None = None,
    search: Callable[[Candidate], float] | None = None,
) -> list[tuple[dict[str, Any], str]]:
    """(sampler params, origin) pairs in launch order: the estimator's best of a random pool
    and the reference layouts valid here (scaled to this GPU count where the reference used
    more), each ordered by predicted throughput, interleaved with the predicted best first:
    best, reference, 2nd best, reference, ... A slow (e.g. offloaded) reference layout thus
    never goes first; each candidate appears once. `headroom_gib`: the study's (--headroom-gib),
    None for the default. `search` (the study's score of a candidate, `cost_model_search`'s):
    the estimator's best are then those of a search climbing from the pool's best layouts,
    not the pool's own, so they hold the cost model's best over the space."""
    refs: list[tuple[float, dict[str, Any], str]] = []
    scored: list[tuple[float, dict[str, Any], str]] = []
    for cand in scored_candidates(space, profile, runner, seed, pool, headroom_gib):
        if not cand.predicted.unfit:
            into = scored if cand.origin == "estimator" else refs
            into.append((cand.predicted.tokens_per_s_per_gpu, cand.params, cand.origin))
    refs.sort(key=lambda x: -x[0])
    scored.sort(key=lambda x: -x[0])
    if search is not None:
        starts: dict[Any, dict[str, Any]] = {}  # the pool's best candidate of each layout
        for _, p, _ in scored:
            starts.setdefault(p.get("layout"), p)
        found = cost_model_search(space, search, list(starts.values())[:SEARCH_STARTS])
        scored = sorted(
            ((v, p, "estimator") for v, p in found.values() if v > 0), key=lambda x: -x[0]
        )
    out: list[tuple[dict[str, Any], str]] = []
    seen: set[tuple[Any, ...]] = set()

    def add(params: dict[str, Any], origin: str) -> bool:
        key = tuple(sorted(params.items()))
        if key in seen:
            return False
        seen.add(key)
        out.append((params, origin))
        return True

    ests = iter(scored)
    n_est = 0
    for i in range(max(best, len(refs))):
        while n_est < best:
            nxt = next(ests, None)
            if nxt is None:
                break
            if add(nxt[1], nxt[2]):
                n_est += 1
                break
        if i < len(refs):
            add(refs[i][1], refs[i][2])
    return out


FIT_CHECK_POOL = 400
"""Random candidates scored before a study starts to tell whether anything fits at all."""


def nothing_fits_why(
    space: SearchSpace,
    profile: Profile,
    runner: Runner | None = None,
    *,
    seed: int = 0,
    headroom_gib: float | None = None,
    pool: int = FIT_CHECK_POOL,
) -> str:
    """Why no configuration of this space can run ('' when one of the reference layouts or of
    `pool` random candidates is predicted to fit): the smallest predicted device total against
    the GPU's memory. A study of such a space would only prune; the CLI refuses it before it
    writes anything."""
    m, cl, w = space.model, space.cluster, space.workload
    smallest, why, n = float("inf"), "", 0
    for cand in scored_candidates(space, profile, runner, seed, pool, headroom_gib):
        n += 1
        if validate(cand.candidate, m, cl, w):
            continue
        if not cand.predicted.unfit:
            return ""
        gib = cand.predicted.device_gib or cand.predicted.peak_gib
        if gib < smallest:
            smallest, why = gib, cand.predicted.unfit
    fix = (
        "use more GPUs (--gpus), a GPU with more memory (--gpu) or a shorter workload "
        "(--prompt-len, --response-len, --batch)"
    )
    head = f"no configuration of {m.name} fits {cl.num_gpus}x {cl.gpu.name}"
    if smallest < cl.gpu.memory_gib - (headroom_gib or 0.0) and why:
        # under the cap, unfit for another reason (vLLM's KV cache cannot hold one sequence):
        # "63 GiB, under the cap" read as if memory were the reason (issue 38)
        return (
            f"{head}: the smallest of {n} candidates, {smallest:.0f} GiB a GPU, still cannot "
            f"run ({why.rstrip('.')}): {fix}"
        )
    return (
        f"{head}: the smallest of {n} candidates is predicted at {smallest:.0f} GiB a GPU "
        f"({cl.gpu.memory_gib:g} GiB, less the headroom): {fix}"
    )


def enqueue_warm_start(study: optuna.Study, params: list[tuple[dict[str, Any], str]]) -> bool:
    """Enqueue the warm start unless this study has it already; call under the study lock.
    Returns whether it enqueued."""
    if study.user_attrs.get(WARM_START_ATTR):
        return False
    for p, origin in params:
        study.enqueue_trial(p, user_attrs={"origin": origin}, skip_if_exists=True)
    study.set_user_attr(WARM_START_ATTR, len(params))
    return True


SEARCH_STARTS = 8
"""Layouts whose best candidate in the warm start's pool `cost_model_search` climbs from."""


def cost_model_search(
    space: SearchSpace,
    score: Callable[[Candidate], float],
    starts: Iterable[dict[str, Any]],
) -> dict[tuple[Any, ...], tuple[float, dict[str, Any]]]:
    """The cost model's best over `space`, by coordinate ascent from each of `starts` (sampler
    parameters): one sampler parameter at a time, every value the space offers it given the
    others (the parameters after it repaired where that value changes their choices:
    FollowSuggester), the best taken, until a whole pass over the parameters improves nothing.
    When no single move improves, the best move of two parameters at once (the layout aside)
    is taken and the climb goes on: the best lies on the memory limit, where one knob must give
    what another takes. `score`: higher is better, above 0 where the candidate can run, below
    where it cannot. Returns every candidate scored, by its sampler parameters: (score,
    parameters).

    Each pass scores every layout of the space against the current other knobs, so a start's
    layout is never the end of it; tests/test_estimator_search.py checks the result against
    an exhaustive enumeration (space.walk) of smaller spaces."""
    seen: dict[tuple[Any, ...], tuple[float, dict[str, Any]]] = {}

    def scored(want: dict[str, Any]) -> tuple[float, dict[str, Any], dict[str, list[Any]]]:
        s = FollowSuggester(want)
        c = sample(s, space)
        key = tuple(sorted(s.params.items()))
        if key not in seen:
            seen[key] = (score(c), s.params)
        return seen[key][0], s.params, s.offered

    def climb(
        best: float, params: dict[str, Any], offered: dict[str, list[Any]]
    ) -> tuple[float, dict[str, Any], dict[str, list[Any]]]:
        improved = True
        while improved:
            improved = False
            for name in list(offered):
                if name not in offered:  # a move made it a knob this candidate does not draw
                    continue
                for choice in offered[name]:
                    if choice == params[name]:
                        continue
                    v, p, o = scored({**params, name: choice})
                    if v > best:
                        best, params, offered, improved = v, p, o, True
        return best, params, offered

    def pair_move(
        best: float, params: dict[str, Any], offered: dict[str, list[Any]]
    ) -> tuple[float, dict[str, Any], dict[str, list[Any]]] | None:
        names = [n for n in offered if n != "layout" and len(offered[n]) > 1]
        top = None
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                for va in offered[a]:
                    for vb in offered[b]:
                        if va == params[a] or vb == params[b]:
                            continue
                        v, p, o = scored({**params, a: va, b: vb})
                        if v > best and (top is None or v > top[0]):
                            top = (v, p, o)
        return top

    for start in starts:
        got: tuple[float, dict[str, Any], dict[str, list[Any]]] | None = climb(*scored(start))
        while got is not None:
            got = pair_move(*got)
            if got is not None:
                got = climb(*got)
    return seen
