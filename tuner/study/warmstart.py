"""The warm start: the estimator's best candidates and the reference layouts, enqueued once
per study, the predicted-best first."""

from __future__ import annotations

import itertools
import json
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
from tuner.study.exact import exact_best

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
    None for the default. `search` (the study's score of a candidate, with the estimator as its
    runner): the estimator's best are then the cost model's `best` best over the whole space,
    found exactly (tuner.study.exact), so the first is its best and the same whatever the
    study's `seed` (issue 38.7: seeds 0 and 2 answered 2342 and 2420 tokens/s/GPU on
    qwen3-30b-moe x 32, and seed 0 later 2307 where the space's best scores 2420); in an
    --allow-off-policy space, those of `cost_model_search`'s climb from the best layouts of a
    pool drawn with SEARCH_SEED."""
    refs: list[tuple[float, dict[str, Any], str]] = []
    scored: list[tuple[float, dict[str, Any], str]] = []
    exact = search is not None and not space.allow_off_policy
    pool_seed = seed if search is None else SEARCH_SEED
    draws = 0 if exact else pool  # the exact search needs no pool
    for cand in scored_candidates(space, profile, runner, pool_seed, draws, headroom_gib):
        if not cand.predicted.unfit:
            into = scored if cand.origin == "estimator" else refs
            into.append((cand.predicted.tokens_per_s_per_gpu, cand.params, cand.origin))
    refs.sort(key=lambda x: -x[0])
    scored.sort(key=lambda x: -x[0])
    if exact and search is not None:
        scored = [
            (v, params, "estimator")
            for v, params in exact_best(space, profile, headroom_gib, best, search)
        ]
    elif search is not None:
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


WARM_START_CHUNK = 16
"""Warm-start trials enqueued at a time; the rest wait in the study's user attrs
(`PENDING_ATTR`) until the queue is empty (`enqueue_pending`). Optuna re-reads every unfinished
trial from an RDB storage at each read (and `skip_if_exists` reads them all per enqueue), so 200
waiting trials made every read of a 200-trial estimator study slow: measured on qwen3-30b-moe x
32, its enqueue took 35 s CPU and its trial loop 73 s, chunked 0.4 s and 54 s."""
PENDING_ATTR = "warm_start_pending"
"""Prefix of the study user attrs holding the warm start's later chunks: `<prefix>:<i>`, each
the JSON text of `{"names": [...], "rows": [[origin, value or null, ...], ...]}` (compact: every
reader of the study's user attrs reads them, and Optuna deep-copies the attrs at each read: one
string is copied at once, where nested lists were walked value by value, 3 s of a 200-trial
estimator study; one chunk per attr keeps each far under MySQL's 64 KiB TEXT), set to null once
enqueued. A study made before holds the object itself: read as well."""
PENDING_NEXT_ATTR = "warm_start_pending_next"
"""The index of the next chunk `enqueue_pending` enqueues."""


def _key(params: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted(params.items()))


def _packed(chunk: list[tuple[dict[str, Any], str]]) -> str:
    names = sorted({n for p, _ in chunk for n in p})
    rows = [[o, *(p.get(n) for n in names)] for p, o in chunk]
    return json.dumps({"names": names, "rows": rows}, separators=(",", ":"))


def _unpacked(got: Any) -> list[tuple[dict[str, Any], str]]:
    """A chunk `_packed` wrote (or, in a study made before chunks were text, its object), as
    (params, origin) pairs; what is not one reads as none."""
    if isinstance(got, str):
        try:
            got = json.loads(got)
        except ValueError:
            return []
    if not isinstance(got, dict):
        return []
    names, rows = got.get("names"), got.get("rows")
    if not isinstance(names, list) or not isinstance(rows, list):
        return []
    out = []
    for row in rows:
        if isinstance(row, list) and len(row) == len(names) + 1:
            params = {n: v for n, v in zip(names, row[1:], strict=True) if v is not None}
            out.append((params, str(row[0])))
    return out


def enqueue_warm_start(study: optuna.Study, params: list[tuple[dict[str, Any], str]]) -> bool:
    """Enqueue the warm start unless this study has it already; call under the study lock.
    Each candidate once (the first of its params); the first WARM_START_CHUNK go into Optuna's
    queue, the rest into the study's user attrs for `enqueue_pending`. Returns whether it
    enqueued."""
    if study.user_attrs.get(WARM_START_ATTR):
        return False
    seen: set[tuple[Any, ...]] = {
        _key(t.params) for t in study.get_trials(deepcopy=False) if t.params
    }
    once: list[tuple[dict[str, Any], str]] = []
    for p, origin in params:
        if _key(p) not in seen:
            seen.add(_key(p))
            once.append((p, origin))
    for p, origin in once[:WARM_START_CHUNK]:
        study.enqueue_trial(p, user_attrs={"origin": origin})
    rest = once[WARM_START_CHUNK:]
    for i in range(0, len(rest), WARM_START_CHUNK):
        chunk = _packed(rest[i : i + WARM_START_CHUNK])
        study.set_user_attr(f"{PENDING_ATTR}:{i // WARM_START_CHUNK}", chunk)
    study.set_user_attr(WARM_START_ATTR, len(params))
    return True


def enqueue_pending(study: optuna.Study, trials: list[optuna.trial.FrozenTrial]) -> bool:
    """Enqueue the warm start's next chunk where no trial waits in the queue (`trials`: the
    study's, as read under the study lock, which the caller holds); a candidate a trial already
    ran is not enqueued again. Returns whether it enqueued anything."""
    if any(t.state is optuna.trial.TrialState.WAITING for t in trials):
        return False
    attrs = study.user_attrs
    got = attrs.get(PENDING_NEXT_ATTR, 0)
    i = got if isinstance(got, int) else 0
    seen = {_key(t.params) for t in trials if t.params}
    while f"{PENDING_ATTR}:{i}" in attrs:
        chunk = _unpacked(attrs[f"{PENDING_ATTR}:{i}"])
        study.set_user_attr(f"{PENDING_ATTR}:{i}", None)
        i += 1
        study.set_user_attr(PENDING_NEXT_ATTR, i)
        added = False
        for p, origin in chunk:
            if _key(p) not in seen:
                seen.add(_key(p))
                study.enqueue_trial(p, user_attrs={"origin": origin})
                added = True
        if added:
            return True
    return False


BRANCH_COMBINATIONS = 512
"""The most combinations of a branch's new knobs `cost_model_search` scores for one move."""
SEARCH_STARTS = 4
"""Layouts whose best candidate in the warm start's pool `cost_model_search` climbs from."""
SEARCH_SEED = 0
"""The seed of the pool `cost_model_search` starts from, whatever the study's: its answer is then
the same for every --seed. Only an --allow-off-policy space's estimator climbs (a colocated one's
best is found exactly: tuner.study.exact); the climb is not exhaustive: on qwen3-30b-moe x 32
H100 the climbs from some seeds' pools ended at a local optimum below the best
(scripts/bench_main_job.py replaced scripts/bench_study.py, whose output said so: git history),
and on qwen3-30b-moe x 8 H200 grpo-short seed 0's ends below the exact best
(scripts/bench_main_job.out.txt)."""


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
    layout is never the end of it. Not exhaustive (a local optimum may end it): the estimator
    of a colocated space takes the exact best instead (tuner.study.exact); an --allow-off-policy
    space's climbs."""
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
                    v, p, o = branch(scored({**params, name: choice}), offered)
                    if v > best:
                        best, params, offered, improved = v, p, o, True
        return best, params, offered

    def branch(
        got: tuple[float, dict[str, Any], dict[str, list[Any]]], before: dict[str, list[Any]]
    ) -> tuple[float, dict[str, Any], dict[str, list[Any]]]:
        """The best of `got` with every combination of the knobs the move made appear (full
        recompute's method and layer count, selective recompute's modules, fixed micro-batch
        sizes): a move into a branch of the space is scored at the branch's best, not at the
        first choice of each of its knobs, which may not fit where another does."""
        new = [n for n in got[2] if n not in before and len(got[2][n]) > 1]
        if not new:
            return got
        top = got
        for combo in itertools.islice(
            itertools.product(*(got[2][n] for n in new)), BRANCH_COMBINATIONS
        ):
            cand = scored({**got[1], **dict(zip(new, combo, strict=True))})
            if cand[0] > top[0]:
                top = cand
        return top

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
