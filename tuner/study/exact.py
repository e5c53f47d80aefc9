"""The cost model's best candidates over a whole colocated space, found exactly: the estimator's
answer (issue 38 item 7).

With the estimator as the runner the objective is the cost model, so the study's answer is its
best over the space, whatever the seed. qwen3-30b-moe on 32 GPUs has 840 layouts, each with
some 10^10 settings of the other knobs: far too many to score one by one. The cost model's
shape makes the best exact at some 90,000 calls of it (scripts/bench_main_job.out.txt):

1. The step is the sum of its parts: generation, the weight sync and training (log-probs,
   reference, update, critic), and a candidate fits when each phase's device total (with its
   headroom) fits the GPU and vLLM's KV cache holds a sequence (the estimator's memory_view).
2. Each knob reaches only some of those (`REACH`): vLLM's knobs generation's time and device
   total; the update's micro-batching the update alone and the log-prob passes' theirs; the
   training knobs training's time and device totals; the layout, the offloads and the rollout
   TP all. With the layout, offloads, rollout TP and training knobs set, every setting of vLLM
   and of the two micro-batchings is the sum of three parts and fits where each part's does,
   so they are taken fastest first, each part by a scan in order of its time.
3. Bounds: a knob at its `FASTEST` value makes no part slower, so a branch of the training
   knobs scored with its unset knobs at those values (memory ignored) is no slower than any
   setting in it; a branch whose bound is no faster than the `count`-th best found is not
   searched, nor a layout whose bound is not. Where the update phase's floor (the device total
   no training knob changes: update_floor_gib) does not fit, nothing is searched.
4. Values the cost model scores exactly alike (`ALIKE`) are searched once; a knob that reaches
   no device total is searched at its FASTEST value alone where it has one; of the settings of
   `JOINT` knobs whose device totals agree, one that another beats by FASTEST values alone is
   not searched.

Each is a property of the cost model that tests/test_exact_search.py holds it to, as it holds
the search to a brute force over small spaces. Every candidate is held to the study's own score
as it is found (exact_search): one it says cannot run, by a rule not modelled here, is passed
over; one it scores otherwise stops the search. An `--allow-off-policy` space (its step is
max(generation, training) + sync, not their sum) keeps the climb of warmstart.cost_model_search.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tuner.estimate import Profile
from tuner.estimate.device import phases_unfit
from tuner.estimate.memory import MemoryBreakdown, local_norms, memory
from tuner.estimate.runner_memory import phase_devices
from tuner.estimate.time import PhaseTimes, phase_times
from tuner.space import KNOBS, UNDECLARED, Candidate, Knob, SearchSpace, params_for, sample
from tuner.space.sampling import FollowSuggester, param_name

_SAMPLED: tuple[Knob, ...] = tuple(k for k in KNOBS if k.choices is not None)


def _reaching(test: Callable[[frozenset[str]], bool]) -> tuple[str, ...]:
    """The sampled knobs whose reach (`Knob.reaches`, the knob table's) passes `test`, in the
    table's order."""
    return tuple(k.name for k in _SAMPLED if test(frozenset(k.reaches)))


GENERATION = _reaching(lambda r: r == {"generation"})
"""vLLM's knobs that reach generation's time alone (and whether its KV cache holds one
sequence, which is part of it: infinite where not)."""
GENERATION_MEMORY = _reaching(lambda r: r == {"generation", "generation_device"})
"""vLLM's knobs that reach generation's device total too."""
UPDATE = _reaching(lambda r: r == {"update", "update_device"})
"""The update's micro-batching: the update's time and device total alone."""
LOG_PROB = _reaching(lambda r: r == {"log_prob", "log_prob_device"})
"""The log-prob passes' micro-batching: their time and device total alone."""
INTERFACE = _reaching(lambda r: {"generation_device", "update_device"} <= r)
"""Knobs that reach every phase's device total, so every part (rollout_gpus: colocated, 0,
only): the placement, the layout, the offloads, the rollout TP."""
FASTEST: dict[str, Any] = {k.name: k.fastest for k in KNOBS if k.fastest is not UNDECLARED}
"""A value of each knob that makes no part of the step slower (`Knob.fastest`: an offload adds
copies; recompute none repeats no forward, block recompute a share of the layers where uniform
repeats them all, its fewest layers the least; a fusion or fused kernel saves passes; CUDA graphs
save launches). Memory is not ordered by it."""
OFFLOAD = tuple(n for n in INTERFACE if n in FASTEST)
"""The interface knobs with a fastest value: the offloads."""
_TRAINING_PARTS = frozenset(("update", "log_prob"))
TRAINING_TIME_ONLY = _reaching(lambda r: r == _TRAINING_PARTS)
"""Training knobs that reach training's time and no device total."""
UPDATE_ONLY = _reaching(lambda r: "update" in r and "log_prob" not in r)
"""Knobs that reach training's time through the update alone (the optimizer step, recompute and
the weight gradients are the update's), not the log-prob passes' time."""
ALIKE: dict[str, tuple[Any, ...]] = {k.name: k.alike for k in KNOBS if k.alike}
"""Values the cost model scores exactly alike (`Knob.alike`, its neutral priors): searched as the
first of them the space offers (the knob table's order)."""
JOINT_KEYS: dict[str, Callable[[Candidate], Any]] = {
    "fusions": lambda c: (c.bias_activation_fusion, local_norms(c)),
}
"""The key through which the device totals read a `Knob.joint` group: the three fusions through
the fused activation and whether all three are off (megatron-core's local layers,
memory.local_norms)."""
JOINT: dict[tuple[str, ...], Callable[[Candidate], Any]] = {
    tuple(k.name for k in _SAMPLED if k.joint == group): key for group, key in JOINT_KEYS.items()
}
"""Knobs whose settings the device totals read only through a key of them (JOINT_KEYS), by
the group's knobs in the table's order."""
PHASES = ("generation", "old_log_prob", "update_actor")
"""The phases whose device totals decide a fit (runner_memory.memory_view's)."""


def update_floor_gib(mem: MemoryBreakdown) -> float:
    """The update phase's device total less its transient (activations, logits, dispatch
    buffers, the optimizer step's temporary) and the allocator's slack: the states, workspace
    and processes, which the layout, offloads and rollout TP set and no training knob changes;
    the transient and the slack are never negative, so no training setting's update device
    total is below it (tests hold the cost model to both)."""
    return mem.update_device_gib - mem.update_transient_gib - mem.slack_gib


_DEFAULTS: dict[str, Any] = {k.name: k.field_default for k in _SAMPLED if k.name != "layout"}
_ROLLOUT = ("rollout_tp", *GENERATION_MEMORY, *GENERATION)
_FIRST = ("use_dynamic_bsz", "moe_grouped_gemm")
"""Training knobs without a FASTEST value, set first in a branch: the bound of each branch below
them scores one setting (its unset knobs at their FASTEST values)."""
TRAINING = tuple(
    sorted(
        (k.name for k in _SAMPLED if k.name not in (*INTERFACE, *UPDATE, *LOG_PROB, *_ROLLOUT)),
        key=lambda n: _FIRST.index(n) if n in _FIRST else len(_FIRST),
    )
)
"""The training knobs (recompute, kernels, batching mode, sequence parallel), in the order a
branch sets them."""
_AFTER_TRAINING = (*UPDATE, *LOG_PROB, *_ROLLOUT)
_NO_DEVICE = frozenset((*TRAINING_TIME_ONLY, *GENERATION))


def _touching(*parts: str) -> frozenset[str]:
    """The sampled knobs that reach any of `parts` (REACH_PARTS)."""
    return frozenset(_reaching(lambda r: not r.isdisjoint(parts)))


_REACH_DEVICE: dict[str, frozenset[str]] = {
    "generation": _touching("generation_device"),
    "update_actor": _touching("update_device"),
    "old_log_prob": _touching("log_prob_device"),
}
"""The knobs that reach each phase's device total."""
_REACH_TIME: dict[str, frozenset[str]] = {
    "generation": _touching("generation"),
    "sync": _touching("sync"),
    "training": _touching(*_TRAINING_PARTS),
    "log_prob": _touching("log_prob"),
}
"""The knobs that reach each part of the step's time (log_prob: the log-prob passes' share of
training's)."""
REACH = {"device": _REACH_DEVICE, "time": _REACH_TIME}
"""What each knob reaches (tests hold the cost model to it): of a phase's device total, of a part
of the step's time."""


@dataclass(frozen=True, slots=True)
class Found:
    """A candidate of the exact search, with the step the search composed for it."""

    step_s: float
    candidate: Candidate
    params: dict[str, Any]
    """Its sampler parameters (what enqueue_trial takes)."""
    score: float | None = None
    """The study's score of it, where the search was given the study's score."""


def exact_search(
    space: SearchSpace,
    profile: Profile,
    headroom_gib: float | None = None,
    count: int = 1,
    score: Callable[[Candidate], float] | None = None,
) -> list[Found]:
    """The `count` fastest candidates of `space` that fit, fastest first: the first is the cost
    model's best over the space (of candidates the cost model scores alike, one; of those a
    FASTEST value beats, none: module docstring). Fewer where fewer fit. `headroom_gib`: the
    study's (None: each phase's own).

    `score`: the study's (objective.search_score: above 0 where a candidate can run, its
    tokens/s/GPU), and each candidate the search composes is held to it before it is kept. One
    it says cannot run (by a rule the search does not model: it models the phases' device totals
    and vLLM's KV cache) is passed over and the search goes on, so the answer is the best that
    runs; one it scores at another throughput than the step the search composed is a
    RuntimeError: the cost model has lost a property the search relies on
    (tests/test_exact_search.py says which)."""
    if space.allow_off_policy:
        raise ValueError("the exact search covers colocated spaces (a split step is a max)")
    s = _Search(space, profile, headroom_gib, count, score)
    s.run()
    out = []
    for step, _, values, v in sorted(s.found, key=lambda x: (-x[0], x[1])):
        c = s.model.candidate(values)
        params = params_for(c, space)
        if sample(FollowSuggester(params), space) != c:
            raise RuntimeError(f"the exact search made a candidate the space does not draw: {c}")
        out.append(Found(-step, c, params, v))
    return out


def exact_best(
    space: SearchSpace,
    profile: Profile,
    headroom_gib: float | None,
    count: int,
    score: Callable[[Candidate], float],
) -> list[tuple[float, dict[str, Any]]]:
    """`exact_search`'s candidates held to `score`, as (score, sampler parameters), best first."""
    found = exact_search(space, profile, headroom_gib, count, score)
    return [(f.score or 0.0, f.params) for f in found]


Values = dict[str, Any]
"""A setting of knobs by knob name (decoded values; the layout as a ParallelLayout)."""
Option = tuple[Values, dict[str, Any]]
"""A stage's setting (every knob of it: drawn, or its field's default where the others leave it
undrawn) and the sampler parameters it takes."""


class _Reads(dict[str, Any]):
    """The values drawn so far, recording which a choice (or a decoder) reads."""

    __slots__ = ("read",)

    def __init__(self, drawn: Values) -> None:
        super().__init__(drawn)
        self.read: list[str] = []

    def __getitem__(self, k: str) -> Any:
        self.read.append(k)
        return dict.__getitem__(self, k)

    def get(self, k: str, default: Any = None) -> Any:
        self.read.append(k)
        return dict.get(self, k, default)


class _Options:
    """The settings of a stage of knobs the space offers, the others' values given, as sample()
    draws them (each knob's choices given the values before it, its pin, a knob of one choice),
    cached by the values the walk read (the memo's way: estimate/memo.py)."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self._cache: dict[tuple[frozenset[str], frozenset[str], bool], list[Any]] = {}

    def of(
        self, stage: tuple[str, ...], values: Values, later: tuple[str, ...], relaxed: bool = False
    ) -> list[Option]:
        """Every setting of `stage`'s knobs valid with `values` for the others, except the
        knobs in `later`, chosen afterwards given these. A knob searched at fewer values
        (ALIKE, FASTEST where it reaches no device total) takes only those; `relaxed`: every
        knob with a FASTEST value the space offers takes it (a bound's setting)."""
        key = (frozenset(stage), frozenset(later), relaxed)
        entries = self._cache.setdefault(key, [])
        for names, table in entries:
            got = table.get(tuple(values[n] for n in names))
            if got is not None:
                return got  # type: ignore[no-any-return]
        out: list[Option] = []
        reads: list[str] = []
        # the knobs before the stage's first read none of it: their values are taken as given
        first = next(i for i, k in enumerate(_SAMPLED) if k.name in key[0])
        drawn = {k.name: values[k.name] for k in _SAMPLED[:first] if k.name not in later}
        self._walk(key, values, first, drawn, {}, out, reads)
        names = tuple(dict.fromkeys(r for r in reads if r not in key[0]))
        table = next((t for n, t in entries if n == names), None)
        if table is None:
            table = {}
            entries.append((names, table))
        table[tuple(values[n] for n in names)] = out
        return out

    def _walk(
        self,
        key: tuple[frozenset[str], frozenset[str], bool],
        values: Values,
        i: int,
        drawn: Values,
        params: dict[str, Any],
        out: list[Option],
        reads: list[str],
    ) -> None:
        stage, later, relaxed = key
        space = self.space
        while i < len(_SAMPLED):
            k = _SAMPLED[i]
            i += 1
            if k.name in later:
                continue
            d = _Reads(drawn)
            got = k.choices(space, d) if k.choices is not None else None
            if k.name not in stage:
                # another stage's value, checked where its choices read this stage's
                v = values[k.name]
                if got is not None and any(r in stage for r in d.read):
                    reads.extend(d.read)
                    ch = list(got)
                    enc = k.encode(v, space, d)
                    if not ((ch[0] <= enc <= ch[-1]) if k.int_range else enc in ch):
                        return
                drawn = {**drawn, k.name: v}
                continue
            reads.extend(d.read)
            if got is None:  # not drawn here: its field's default
                drawn = {**drawn, k.name: _DEFAULTS[k.name]}
                continue
            ch = list(got)
            pinned, pin = space.limits.pin(k.name)
            pin = k.encode(pin, space, d) if pinned else None
            answered = len(ch) == 1 or (pinned and pin in ch)
            for v in _visited(k.name, ch, pin if pinned and pin in ch else None, relaxed):
                d2 = _Reads(drawn)
                value = k.decode(v, space, d2)
                reads.extend(d2.read)
                p = params if answered else {**params, param_name(k, drawn): v}
                self._walk(key, values, i, {**drawn, k.name: value}, p, out, reads)
            return
        out.append(({n: v for n, v in drawn.items() if n in stage}, params))


def _visited(name: str, choices: list[Any], pin: Any, relaxed: bool) -> list[Any]:
    """The choices of knob `name` (as offered: encoded) the search visits."""
    if pin is not None:
        return [pin]
    fastest = FASTEST.get(name)
    if len(choices) > 1 and fastest in choices and (relaxed or name in _NO_DEVICE):
        return [fastest]
    alike = ALIKE.get(name, ())
    return [v for v in choices if v not in alike] + [v for v in choices if v in alike][:1]


class _Model:
    """The cost model's views the search asks of a setting: each part of the step's time and
    whether each phase's device total fits, memoized; a view is asked with every knob that does
    not reach it at its base value (REACH), so settings that differ only there share it."""

    def __init__(self, space: SearchSpace, profile: Profile, headroom_gib: float | None) -> None:
        self.space, self.profile, self.headroom_gib = space, profile, headroom_gib
        self.base: Values = {}
        self._rest: dict[frozenset[str], Values] = {}
        """Per reach: the base's values of the knobs outside it."""
        self._times: dict[Candidate, PhaseTimes] = {}
        self._fits: dict[Candidate, dict[str, bool]] = {}
        self._floors: dict[Candidate, bool] = {}
        self.timed = self.fitted = 0
        """Cost-model calls: phase times, and whole estimates (for their device totals)."""

    def candidate(self, values: Values) -> Candidate:
        v = dict(values)
        return Candidate(layout=v.pop("layout"), **v)

    def _at(self, values: Values, keep: frozenset[str]) -> Candidate:
        """The candidate of `values` with the knobs outside `keep` at the base's values."""
        return self.candidate({**values, **self._rest[keep]})

    def set_base(self, base: Values) -> None:
        self.base = base
        self._rest = {
            keep: {n: x for n, x in base.items() if n not in keep}
            for keep in (*_REACH_TIME.values(), *_REACH_DEVICE.values(), frozenset(INTERFACE))
        }

    def _phase_times(self, values: Values, part: str) -> PhaseTimes:
        c = self._at(values, _REACH_TIME[part])
        got = self._times.get(c)
        if got is None:
            s = self.space
            got = self._times[c] = phase_times(c, s.model, s.cluster, s.workload, self.profile)
            self.timed += 1
        return got

    def generation_s(self, values: Values) -> float:
        """Generation's seconds (infinite where vLLM's KV cache holds no sequence)."""
        return self._phase_times(values, "generation").generation_s

    def sync_s(self, values: Values) -> float:
        """The weight sync's seconds."""
        return self._phase_times(values, "sync").reshard_s

    def training_s(self, values: Values, part: str = "training") -> float:
        """The training phases' seconds (log-probs, reference, update, critic): the step less
        generation and the weight sync. `part` "log_prob": asked with the knobs that reach the
        update's time alone at their base values, where only the log-prob passes' share of it
        is wanted."""
        t = self._phase_times(values, part)
        return t.step_s - t.generation_s - t.reshard_s

    def update_floor_fits(self, values: Values) -> bool:
        """Whether the update phase's floor (update_floor_gib: what no training knob changes of
        its device total) fits the GPU beside `values`' layout, offloads and rollout TP; where
        it does not, no training setting fits there."""
        c = self._at(values, frozenset(INTERFACE))
        got = self._floors.get(c)
        if got is None:
            s = self.space
            floor = update_floor_gib(memory(c, s.model, s.cluster, s.workload, self.profile))
            cap = s.cluster.gpu.memory_gib
            got = self._floors[c] = not phases_unfit(
                {"update_actor": floor}, cap, self.headroom_gib
            )
            self.fitted += 1
        return got

    def fits(self, values: Values, phase: str) -> bool:
        """Whether `phase`'s device total (with the study's headroom, else the phase's own)
        fits the GPU."""
        c = self._at(values, _REACH_DEVICE[phase])
        got = self._fits.get(c)
        if got is None:
            s = self.space
            mem = memory(c, s.model, s.cluster, s.workload, self.profile)
            cap = s.cluster.gpu.memory_gib
            got = {
                p: not phases_unfit({p: dev}, cap, self.headroom_gib)
                for p, dev in phase_devices(mem, PHASES).items()
            }
            self._fits[c] = got
            self.fitted += 1
        return got[phase]


Scan = list[tuple[float, Values]]
"""Settings of a stage with their seconds, fastest first."""


@dataclass(slots=True)
class _Rollout:
    """A rollout TP beside a layout and its offloads: the weight sync, and which vLLM memory
    settings fit beside them (asked as the search needs them)."""

    values: Values
    """The layout, offloads and rollout TP (with the base's other values)."""
    sync_s: float
    least_s: float = math.inf
    """The weight sync plus the fastest generation that fits."""
    fit: dict[tuple[Any, ...], bool] = field(default_factory=dict)
    """Whether generation's device total fits, by the vLLM settings that reach it."""


Floor = dict[int, _Rollout]
"""Per rollout TP where a vLLM setting fits: its part."""


class _Search:
    """One exact search: branch and bound over layouts, offloads and the training knobs; the
    rest chosen by scans (module docstring). `found` holds the `count` best as a heap."""

    def __init__(
        self,
        space: SearchSpace,
        profile: Profile,
        headroom_gib: float | None,
        count: int,
        score: Callable[[Candidate], float] | None = None,
    ) -> None:
        self.space, self.count, self.score = space, count, score
        self.tokens: float | None = None
        """The study's score times the composed step, one number for every candidate (the step's
        tokens over the GPUs), from the first one held to `score`."""
        self.passed_over = 0
        """Candidates composed that `score` says cannot run."""
        self.options = _Options(space)
        self.model = _Model(space, profile, headroom_gib)
        self.found: list[tuple[float, int, Values, float | None]] = []
        """(-step, order found, values, score): a heap of the `count` fastest composed."""
        self._order = itertools.count()
        self._scans: dict[Candidate, tuple[Scan, Scan]] = {}
        self._log_prob: dict[Candidate, Scan] = {}
        self.generation: dict[int, Scan] = {}
        """Per rollout TP: the fastest generation of each vLLM memory setting (DP, memory
        share), fastest first."""

    @property
    def threshold(self) -> float:
        """A step no faster than this is not among the `count` best."""
        return -self.found[0][0] if len(self.found) >= self.count else math.inf

    def run(self) -> None:
        self.model.set_base(self._base())
        if not self._generation_table():
            return  # vLLM's KV cache holds no sequence in any setting
        base, opts = self.model.base, self.options
        layouts = [
            o["layout"]
            for o, _ in opts.of(("layout",), base, (*OFFLOAD, *TRAINING, *_AFTER_TRAINING))
        ]
        gmin = {rtp: scan[0][0] for rtp, scan in self.generation.items()}
        bounds = []
        for lay in layouts:
            b = {**base, "layout": lay, **{n: FASTEST[n] for n in OFFLOAD}}
            least = min(self.model.sync_s({**b, "rollout_tp": r}) + g for r, g in gmin.items())
            bounds.append((least + self._bound(b, TRAINING), next(self._order), lay))
        bounds.sort()
        for lb, _, lay in bounds:
            if lb >= self.threshold:
                break
            b = {**base, "layout": lay}
            offloads = []
            for o, _ in opts.of(OFFLOAD, b, (*TRAINING, *_AFTER_TRAINING)):
                bo = {**b, **o}
                floor = self._floor(bo)
                if floor:
                    least = min(r.least_s for r in floor.values())
                    lbo = least + self._bound(bo, TRAINING)
                    offloads.append((lbo, next(self._order), bo, floor))
            offloads.sort(key=lambda x: x[:2])
            for lbo, _, bo, floor in offloads:
                if lbo >= self.threshold:
                    break
                self._branch(floor, bo, list(TRAINING))

    def _base(self) -> Values:
        """Every knob at the first value the space offers: the settings' starting point."""
        values: Values = {**_DEFAULTS, "layout": None}
        order = [("layout",), OFFLOAD, TRAINING, UPDATE, LOG_PROB, ("rollout_tp",)]
        order += [GENERATION_MEMORY, GENERATION]
        for j, stage in enumerate(order):
            later = tuple(n for st in order[j + 1 :] for n in st)
            got = self.options.of(stage, values, later)
            if not got:
                raise ValueError(f"the space offers no setting of {', '.join(stage)}")
            values.update(got[0][0])
        return values

    def _generation_table(self) -> bool:
        """Fill `generation`; make the base's vLLM settings the fastest (a finite generation,
        so training's seconds can be read off a step). False where no setting holds a
        sequence."""
        base, opts, model = self.model.base, self.options, self.model
        for o, _ in opts.of(("rollout_tp",), base, (*GENERATION_MEMORY, *GENERATION)):
            b = {**base, **o}
            scan = [
                (model.generation_s({**b, **mem, **g}), {**mem, **g})
                for mem, _ in opts.of(GENERATION_MEMORY, b, GENERATION)
                for g, _ in opts.of(GENERATION, {**b, **mem}, ())
            ]
            scan = sorted((x for x in scan if math.isfinite(x[0])), key=_first)
            if scan:
                self.generation[o["rollout_tp"]] = scan
        if not self.generation:
            return False
        rtp = min(self.generation, key=lambda r: self.generation[r][0][0])
        self.model.set_base({**base, "rollout_tp": rtp, **self.generation[rtp][0][1]})
        return True

    def _floor(self, b: Values) -> Floor:
        """Per rollout TP, its part beside `b`'s layout and offloads, where a vLLM setting's
        generation device total fits beside them and the update phase's floor does."""
        out: Floor = {}
        for rtp in self.generation:
            br = {**b, "rollout_tp": rtp}
            if not self.model.update_floor_fits(br):
                continue
            r = _Rollout(br, self.model.sync_s(br))
            first = next(self._fitting(r), None)
            if first is not None:
                r.least_s = r.sync_s + first[0]
                out[rtp] = r
        return out

    def _fitting(self, r: _Rollout) -> Iterator[tuple[float, Values]]:
        """The vLLM settings whose generation device total fits beside `r`'s, fastest first
        (each memory setting asked once: what reaches that device total, REACH)."""
        for g, vllm in self.generation[r.values["rollout_tp"]]:
            key = tuple(vllm[n] for n in GENERATION_MEMORY)
            ok = r.fit.get(key)
            if ok is None:
                ok = r.fit[key] = self.model.fits({**r.values, **vllm}, "generation")
            if ok:
                yield g, vllm

    def _scans_of(self, b: Values) -> tuple[Scan, Scan]:
        """(the update's micro-batching settings, the log-prob passes') of training setting `b`,
        each by its share of training's seconds, fastest first: training is the update's share
        plus the passes' (REACH), the update's read with the passes at their first setting and
        the passes' as the difference they make from it."""
        key = self.model.candidate(b)
        got = self._scans.get(key)
        if got is None:
            model = self.model
            p0 = self.options.of(LOG_PROB, b, _ROLLOUT)[0][0]
            ups = self.options.of(UPDATE, b, (*LOG_PROB, *_ROLLOUT))
            up = sorted(((model.training_s({**b, **u, **p0}), u) for u, _ in ups), key=_first)
            got = self._scans[key] = (up, self._log_prob_scan(b))
        return got

    def _log_prob_scan(self, b: Values) -> Scan:
        model = self.model
        key = model._at(b, _REACH_TIME["log_prob"])
        got = self._log_prob.get(key)
        if got is None:
            lps = self.options.of(LOG_PROB, b, _ROLLOUT)
            u0 = self.options.of(UPDATE, b, (*LOG_PROB, *_ROLLOUT))[0][0]
            t0 = model.training_s({**b, **u0, **lps[0][0]}, "log_prob")
            got = sorted(
                ((model.training_s({**b, **u0, **p}, "log_prob") - t0, p) for p, _ in lps),
                key=_first,
            )
            self._log_prob[key] = got
        return got

    def _least(self, b: Values) -> float:
        up, lp = self._scans_of(b)
        return up[0][0] + lp[0][0]

    def _bound(self, b: Values, free: tuple[str, ...]) -> float:
        """Training's least seconds over the settings of `b`'s `free` knobs at their FASTEST
        values (memory ignored): no more than any setting's."""
        relaxed = self.options.of(free, b, _AFTER_TRAINING, relaxed=True)
        return min((self._least({**b, **o}) for o, _ in relaxed), default=math.inf)

    def _branch(self, floor: Floor, b: Values, free: list[str]) -> None:
        """Search the settings of `b`'s unset training knobs `free`, one knob (or JOINT group)
        at a time, fastest bound first, skipping a branch whose bound is not below the
        threshold."""
        while free:
            joint = next((j for j in JOINT if j[0] == free[0] and set(j) <= set(free)), None)
            rest = [n for n in free if n not in joint] if joint else free[1:]
            later = (*rest, *_AFTER_TRAINING)
            got = self.options.of(joint or (free[0],), b, later)
            if joint:
                got = self._undominated(joint, b, got)
            if len(got) != 1:
                break
            b, free = {**b, **got[0][0]}, rest
        if not free:
            self._leaf(floor, b)
            return
        least = min(r.least_s for r in floor.values())
        children = [
            (least + self._bound({**b, **o}, tuple(rest)), next(self._order), {**b, **o})
            for o, _ in got
        ]
        for lb, _, child in sorted(children, key=lambda x: x[:2]):
            if lb >= self.threshold:
                break
            self._branch(floor, child, rest)

    def _undominated(self, knobs: tuple[str, ...], b: Values, got: list[Option]) -> list[Option]:
        """The settings of JOINT `knobs` that no other of the same key beats by FASTEST values
        alone (another that differs only where it holds the FASTEST value is no slower and
        holds the same memory)."""
        key = JOINT[knobs]
        keyed = [(key(self.model.candidate({**b, **o})), o, p) for o, p in got]

        def beats(x: Values, y: Values) -> bool:
            return x != y and all(x[n] == y[n] or x[n] == FASTEST.get(n) for n in knobs)

        return [
            (o, p) for k, o, p in keyed if not any(k2 == k and beats(o2, o) for k2, o2, _ in keyed)
        ]

    def _leaf(self, floor: Floor, b: Values) -> None:
        """A whole training setting: per rollout TP (its weight sync and the vLLM settings that
        fit, `floor`), every setting of vLLM and of the update's and the log-prob passes'
        micro-batching that fits, fastest first, while it is among the `count` best."""
        up, lp = self._scans_of(b)
        least = up[0][0] + lp[0][0]
        fits = self.model.fits
        for r in sorted(floor.values(), key=lambda r: r.least_s):
            if r.least_s + least >= self.threshold:
                break
            br = {**b, "rollout_tp": r.values["rollout_tp"]}
            bar = self.threshold - r.least_s
            ups = [x for x in up if x[0] + lp[0][0] < bar and fits({**br, **x[1]}, "update_actor")]
            if not ups:
                continue
            lps = [x for x in lp if ups[0][0] + x[0] < bar and fits({**br, **x[1]}, "old_log_prob")]
            if not lps:
                continue
            for g, vllm in self._fitting(r):
                if r.sync_s + g + ups[0][0] + lps[0][0] >= self.threshold:
                    break
                for tu, u in ups:
                    if r.sync_s + g + tu + lps[0][0] >= self.threshold:
                        break
                    for tp, p in lps:
                        step = r.sync_s + g + tu + tp
                        if step >= self.threshold:
                            break
                        self._add(step, {**br, **vllm, **u, **p})

    def _add(self, step: float, values: Values) -> None:
        """Keep a composed candidate among the `count` fastest (held to `score` first)."""
        v = None
        if self.score is not None:
            c = self.model.candidate(values)
            v = self.score(c)
            if v <= 0:
                self.passed_over += 1
                return
            self.tokens = self.tokens or v * step
            if not math.isclose(v * step, self.tokens, rel_tol=1e-9):
                raise RuntimeError(
                    f"the exact search composed {step:.6g} s a step for {c}, which the study "
                    f"scores {v:.6g} tokens/s/GPU: the cost model no longer has the shape "
                    "tuner/study/exact.py relies on (run tests/test_exact_search.py)"
                )
        item = (-step, next(self._order), values, v)
        if len(self.found) < self.count:
            heapq.heappush(self.found, item)
        else:
            heapq.heapreplace(self.found, item)


def _first(x: tuple[float, Any]) -> float:
    return x[0]
