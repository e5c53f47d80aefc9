"""The exact search of the cost model (tuner/study/exact.py): its best equals a brute force over
small spaces, and the cost model has each property the search relies on (what a knob reaches,
the fastest values, the values scored alike, the fusions' memory key), checked on random
candidates of three spaces, so that a change of the cost model that breaks one fails here."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tuner.estimate import Profile
from tuner.estimate.memory import memory
from tuner.estimate.runner_memory import phase_devices
from tuner.estimate.time import phase_times
from tuner.hardware import Cluster, get_gpu
from tuner.models import ModelSpec, get_model
from tuner.runners.estimate import EstimateRunner
from tuner.space import (
    KNOBS,
    SAMPLER_PARAMS,
    Candidate,
    FollowSuggester,
    RandomSuggester,
    SearchSpace,
    SpaceLimits,
    sample,
    walk,
)
from tuner.study import TuneRequest, exact
from tuner.study.learn import StudyLearner
from tuner.study.objective import search_score
from tuner.workload import get_workload

REPO = Path(__file__).resolve().parents[1]
MOE_8L = str(REPO / "scripts" / "models" / "qwen3-30b-moe-8l" / "config.json")


def _pins(free: tuple[str, ...], values: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Every knob but `free` pinned: at `values`' value, else its Candidate field's default."""
    return tuple(
        (k.name, values.get(k.name, k.field_default))
        for k in KNOBS
        if k.name in SAMPLER_PARAMS and k.name not in free
    )


@dataclasses.dataclass(frozen=True)
class Small:
    """A space small enough to score every candidate of (a few thousand) in seconds."""

    model: str
    gpu: str
    gpus: int
    workload: str
    free: tuple[str, ...]
    pinned: dict[str, Any]


SMALL = {
    # the training knobs: recompute (its method and layer count), the fusions, fused kernels,
    # grouped GEMM, where memory decides (full block recompute of 5 of 8 layers wins)
    "training": Small(
        MOE_8L,
        "h100",
        2,
        "dapo-math",
        (
            "layout",
            "recompute_granularity",
            "recompute_method",
            "recompute_num_layers",
            "use_fused_kernels",
            "apply_rope_fusion",
            "bias_activation_fusion",
            "gradient_accumulation_fusion",
            "moe_grouped_gemm",
        ),
        {
            "ppo_max_token_len_per_gpu": 20480,
            "log_prob_max_token_len_per_gpu": 40960,
            "optimizer_offload": True,
            "gpu_memory_utilization": 0.4,
        },
    ),
    # the micro-batching (dynamic and fixed), vLLM's batching and graphs, the rollout TP
    "batching": Small(
        MOE_8L,
        "h100",
        2,
        "dapo-math",
        (
            "layout",
            "use_dynamic_bsz",
            "ppo_max_token_len_per_gpu",
            "log_prob_max_token_len_per_gpu",
            "ppo_micro_batch_size_per_gpu",
            "log_prob_micro_batch_size_per_gpu",
            "rollout_tp",
            "max_num_batched_tokens",
            "enforce_eager",
        ),
        {"optimizer_offload": True, "gpu_memory_utilization": 0.4},
    ),
    # a dense model: sequence parallel, selective recompute's modules, both offloads
    "dense": Small(
        "qwen2.5-7b",
        "h200",
        2,
        "grpo-short",
        (
            "layout",
            "sequence_parallel",
            "recompute_granularity",
            "recompute_modules",
            "param_offload",
            "optimizer_offload",
            "use_fused_kernels",
            "apply_rope_fusion",
            "bias_activation_fusion",
            "gradient_accumulation_fusion",
        ),
        {"gpu_memory_utilization": 0.4},
    ),
}


class _Pinned(EstimateRunner):
    def __init__(self, pinned: tuple[tuple[str, Any], ...]) -> None:
        self.pinned = pinned

    def space_limits(self, model: ModelSpec) -> SpaceLimits:
        return SpaceLimits(pinned=self.pinned)


def _small(name: str) -> tuple[SearchSpace, TuneRequest]:
    s = SMALL[name]
    runner = _Pinned(_pins(s.free, s.pinned))
    req = TuneRequest(
        model=get_model(s.model),
        model_arg=s.model,
        cluster=Cluster(gpu=get_gpu(s.gpu), num_gpus=s.gpus),
        workload=get_workload(s.workload),
        runner=runner,
        trials=1,
        results_dir=Path("results"),
        recipes_dir=Path("recipes"),
    )
    space = SearchSpace(
        model=req.model,
        cluster=req.cluster,
        workload=req.workload,
        limits=runner.space_limits(req.model),
    )
    return space, req


def _score(req: TuneRequest) -> Callable[[Candidate], float]:
    return search_score(req, StudyLearner(capacity_gib=req.cluster.gpu.memory_gib))


@pytest.mark.parametrize("name", sorted(SMALL))
def test_the_exact_best_is_the_brute_force_best(name: str) -> None:
    """Every candidate of the space scored as the study scores it: the exact search's first is
    the best of them, and its list is in the study's order."""
    space, req = _small(name)
    score = _score(req)
    scores = [score(c) for c, _ in walk(space)]
    assert 2000 < len(scores) < 6000 and sum(v > 0 for v in scores) > 100
    found = exact.exact_best(space, req.profile, req.headroom_gib, 5, score)
    assert found[0][0] == pytest.approx(max(scores), rel=1e-12)
    assert [v for v, _ in found] == sorted((v for v, _ in found), reverse=True)


def test_the_exact_list_is_the_brute_force_list_of_the_settings_it_visits() -> None:
    """The `count` best are the brute force's best of the candidates the search visits: of the
    three fusions' settings with one memory key, the one no other beats by FASTEST values
    alone (all on; the activation's off with the other two on; all off), the rest a slower or
    an equal twin of one of these."""
    space, req = _small("training")
    score = _score(req)

    def visited(c: Candidate) -> bool:
        fusions = (c.apply_rope_fusion, c.bias_activation_fusion, c.gradient_accumulation_fusion)
        return fusions in ((True, True, True), (True, False, True), (False, False, False))

    want = sorted(v for v in (score(c) for c, _ in walk(space) if visited(c)) if v > 0)[::-1]
    got = [v for v, _ in exact.exact_best(space, req.profile, req.headroom_gib, 12, score)]
    assert got == pytest.approx(want[:12], rel=1e-12)


def test_an_off_policy_space_is_not_the_exact_searchs() -> None:
    space, req = _small("dense")
    split = dataclasses.replace(space, allow_off_policy=True)
    with pytest.raises(ValueError, match="colocated"):
        exact.exact_search(split, req.profile)


def test_a_candidate_the_score_says_cannot_run_is_passed_over() -> None:
    """A rule of the study's score the search does not model (here: no pipeline parallelism)
    passes the candidates it refuses over as the search goes on: the answer is the brute
    force's best of those that run."""
    space, req = _small("dense")
    score = _score(req)

    def no_pp(c: Candidate) -> float:
        return score(c) if c.layout.pp == 1 else -1.0

    best = max(no_pp(c) for c, _ in walk(space))
    found = exact.exact_search(space, req.profile, req.headroom_gib, 3, no_pp)
    assert found[0].score == pytest.approx(best, rel=1e-12)
    assert all(f.candidate.layout.pp == 1 for f in found)
    assert score(found[0].candidate) < max(map(score, (c for c, _ in walk(space))))  # pp > 1 wins


def test_a_score_the_search_does_not_compose_is_refused() -> None:
    """exact_best holds every candidate to the study's score: a score that is not the cost
    model's (here one that halves every other candidate's) is a RuntimeError, not a quietly
    wrong answer."""
    space, req = _small("dense")
    score = _score(req)
    calls = itertools.count()

    def odd(c: Candidate) -> float:
        return score(c) / (2 if next(calls) % 2 else 1)

    with pytest.raises(RuntimeError, match="no longer has the shape"):
        exact.exact_best(space, req.profile, req.headroom_gib, 4, odd)


# --- the cost model's properties the search relies on -------------------------------------

SPACES = (
    ("qwen3-30b-moe", "h100", 32, "dapo-math"),
    ("qwen2.5-7b", "h100", 8, "dapo-math"),
    ("qwen3-30b-moe", "h200", 8, "grpo-short"),
    ("qwen2.5-7b", "h200", 2, "ppo-gsm8k"),
)
"""A MoE and a dense model on several GPU counts, and a workload with a critic (PPO)."""
PROFILE = Profile()


def _parts(c: Candidate, space: SearchSpace) -> dict[str, float]:
    """What the search reads of the cost model: each part of the step's time (training: the
    step less generation and the weight sync, read where generation is finite, as the search
    reads it; NaN elsewhere) and each phase's device total."""
    m, cl, w = space.model, space.cluster, space.workload
    t = phase_times(c, m, cl, w, PROFILE)
    finite = math.isfinite(t.generation_s)
    out = {
        "time generation": t.generation_s,
        "time sync": t.reshard_s,
        "time training": t.step_s - t.generation_s - t.reshard_s if finite else math.nan,
    }
    devices = phase_devices(memory(c, m, cl, w, PROFILE), exact.PHASES)
    out.update({f"device {p}": d for p, d in devices.items()})
    return out


def _reach(part: str) -> frozenset[str]:
    kind, name = part.split(" ", 1)
    return exact.REACH[kind][name]


def _space(model: str, gpu: str, gpus: int, workload: str) -> SearchSpace:
    return SearchSpace(
        model=get_model(model),
        cluster=Cluster(gpu=get_gpu(gpu), num_gpus=gpus),
        workload=get_workload(workload),
    )


MOVES_PER_KNOB = 3
"""Other values of a knob tried per candidate (a random few: a layout has hundreds)."""


def _moves(space: SearchSpace, n: int, seed: int) -> Any:
    """(candidate, its params, knob, the candidate with that knob moved, the knobs the move
    changed): a few other values of every knob of `n` random candidates."""
    rng = random.Random(seed)
    for _ in range(n):
        s = RandomSuggester(rng)
        c = sample(s, space)
        f = FollowSuggester(dict(s.params))
        sample(f, space)
        for name, choices in f.offered.items():
            others = [v for v in choices if v != s.params[name]]
            for v in rng.sample(others, min(MOVES_PER_KNOB, len(others))):
                g = FollowSuggester({**s.params, name: v})
                moved = sample(g, space)
                changed = {name} | {
                    k for k in {*s.params, *g.params} if s.params.get(k) != g.params.get(k)
                }
                yield c, s.params, name, moved, changed


def _close(a: float, b: float) -> bool:
    """Equal to rounding (NaN, a part not read there, is close to anything)."""
    return a == b or math.isnan(a) or math.isnan(b) or math.isclose(a, b, rel_tol=1e-12)


@pytest.mark.parametrize("setup", SPACES, ids=lambda s: f"{s[0]}-{s[2]}-{s[3]}")
def test_a_knob_reaches_only_what_the_search_says(setup: tuple[str, str, int, str]) -> None:
    """A move of a knob changes a part of the step's time or a phase's device total only where
    the knobs it changed reach that part (exact.REACH): the stages are chosen on their own."""
    space = _space(*setup)
    wrong: set[tuple[str, str]] = set()
    for c, _, name, moved, changed in _moves(space, 12, seed=1):
        before, after = _parts(c, space), _parts(moved, space)
        for part, v in before.items():
            if not _close(v, after[part]) and not changed & _reach(part):
                wrong.add((name, part))
    assert not wrong, f"knob moves that change a part outside their reach: {sorted(wrong)}"


@pytest.mark.parametrize("setup", SPACES, ids=lambda s: f"{s[0]}-{s[2]}-{s[3]}")
def test_the_update_and_log_prob_shares_of_training_add_up(
    setup: tuple[str, str, int, str],
) -> None:
    """Training's seconds are the update's share plus the log-prob passes' (PPO's critic too):
    for two settings u1, u2 of a knob that reaches the update's time alone (UPDATE_ONLY) and
    two p1, p2 of the log-prob passes' micro-batching, t(u1, p1) + t(u2, p2) = t(u1, p2) +
    t(u2, p1). The search scores the update's settings once and the passes' once."""
    space = _space(*setup)
    rng = random.Random(2)
    checked = 0
    for _ in range(25):
        s = RandomSuggester(rng)
        sample(s, space)
        f = FollowSuggester(dict(s.params))
        sample(f, space)
        lp = [n for n in exact.LOG_PROB if n in f.offered]
        upd = [n for n in exact.UPDATE_ONLY if n in f.offered and n not in exact.LOG_PROB]
        for u, p in itertools.product(upd, lp):
            (u1, u2), (p1, p2) = f.offered[u][:2], f.offered[p][-2:]
            t = {
                (uv, pv): _parts(sample(FollowSuggester({**s.params, u: uv, p: pv}), space), space)
                for uv, pv in itertools.product((u1, u2), (p1, p2))
            }
            train = {k: v["time training"] for k, v in t.items()}
            if all(math.isfinite(v) for v in train.values()):
                got, want = train[u1, p1] + train[u2, p2], train[u1, p2] + train[u2, p1]
                assert _close(got, want), (u, p)
                checked += 1
    assert checked > 20


@pytest.mark.parametrize("setup", SPACES, ids=lambda s: f"{s[0]}-{s[2]}-{s[3]}")
def test_a_fastest_value_makes_no_part_slower(setup: tuple[str, str, int, str]) -> None:
    """A knob moved to its FASTEST value (where the space offers it; the knobs only its other
    values draw go with them) makes no part of the step slower: the bound of a branch is a
    bound."""
    space = _space(*setup)
    rng = random.Random(3)
    slower: set[str] = set()
    moved = 0
    for _ in range(20):
        s = RandomSuggester(rng)
        c = sample(s, space)
        f = FollowSuggester(dict(s.params))
        sample(f, space)
        before = _parts(c, space)
        for name, fastest in exact.FASTEST.items():
            if fastest not in f.offered.get(name, ()) or s.params[name] == fastest:
                continue
            after = _parts(sample(FollowSuggester({**s.params, name: fastest}), space), space)
            moved += 1
            for part, v in before.items():
                if part.startswith("time") and after[part] > v and not _close(after[part], v):
                    slower.add(f"{name}: {part}")
    assert moved > 30
    assert not slower, f"FASTEST values that make a part slower: {sorted(slower)}"


@pytest.mark.parametrize("setup", SPACES, ids=lambda s: f"{s[0]}-{s[2]}-{s[3]}")
def test_alike_values_score_alike_and_joint_keys_hold_memory(
    setup: tuple[str, str, int, str],
) -> None:
    """Values of an ALIKE knob change nothing the search reads; settings of JOINT knobs with
    one key leave every device total as it is."""
    space = _space(*setup)
    rng = random.Random(4)
    for _ in range(30):
        c = sample(RandomSuggester(rng), space)
        base = _parts(c, space)
        for name, values in exact.ALIKE.items():
            for v in values:
                other = dataclasses.replace(c, **{name: v})
                if space.model.is_moe or name == "attention_backend":
                    assert _parts(other, space) == base, (name, v)
        for knobs, key in exact.JOINT.items():
            for setting in itertools.product((True, False), repeat=len(knobs)):
                other = dataclasses.replace(c, **dict(zip(knobs, setting, strict=True)))
                if key(other) != key(c):
                    continue
                got = _parts(other, space)
                assert {p: got[p] for p in got if p.startswith("device")} == {
                    p: base[p] for p in base if p.startswith("device")
                }, (knobs, setting)


@pytest.mark.parametrize("setup", SPACES, ids=lambda s: f"{s[0]}-{s[2]}-{s[3]}")
def test_the_update_floor_is_the_interfaces_and_below_every_setting(
    setup: tuple[str, str, int, str],
) -> None:
    """update_floor_gib: the same for every training setting of a layout, offloads and rollout
    TP (a move of any other knob leaves it), and its transient and slack are never negative,
    so no setting's update device total is below it: where it does not fit, nothing does."""
    space = _space(*setup)
    m, cl, w = space.model, space.cluster, space.workload
    moved = 0
    for c, _, name, other, changed in _moves(space, 8, seed=5):
        mem, mem2 = memory(c, m, cl, w, PROFILE), memory(other, m, cl, w, PROFILE)
        assert mem.update_transient_gib >= 0 and mem.slack_gib >= 0
        assert exact.update_floor_gib(mem) <= mem.update_device_gib
        if not changed & set(exact.INTERFACE):
            moved += 1
            assert _close(exact.update_floor_gib(mem), exact.update_floor_gib(mem2)), name
    assert moved > 100


def test_every_knob_the_sampler_draws_has_a_stage() -> None:
    """A knob added to the table is placed in a stage of the search (its reach declared),
    else the search would hold it at its first value."""
    staged = {
        *exact.INTERFACE,
        *exact.TRAINING,
        *exact.UPDATE,
        *exact.LOG_PROB,
        *exact.GENERATION,
        *exact.GENERATION_MEMORY,
    }
    assert {k.name for k in KNOBS if k.choices is not None} <= staged
