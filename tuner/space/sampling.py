"""Sampling: the SearchSpace of a model, cluster and workload, sample() and params_for().

`sample()` draws only from choices that pass `validate()`, so a candidate the sampler emits is
always valid.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from tuner.errors import UserError
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.space.candidate import Candidate
from tuner.space.choices import CP_CHOICES, MAX_PP, MAX_VPP, Drawn
from tuner.space.knobs import KNOBS, Knob
from tuner.space.layout import ParallelLayout, balanced_split
from tuner.space.placement import Pools, pools, split_sizes
from tuner.space.rules import rollout_width_problems, validate_layout
from tuner.workload import Workload


class Suggester(Protocol):
    """What sample() needs from an Optuna trial (a RandomSuggester offers the same)."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...

    def suggest_int(self, name: str, low: int, high: int) -> int: ...


SAMPLER_PARAMS: frozenset[str] = frozenset(k.name for k in KNOBS if k.choices is not None)
"""Every knob sample() suggests, by the knob's name (Optuna's parameter, a pin)."""
OLD_PARAMS: dict[str, str] = {k.old_param: k.name for k in KNOBS if k.old_param}
"""The sampler's parameter names before each knob had one name -> the knob (current_params)."""
OLD_PINS: dict[str, str] = {
    "rollout_dp_log2=0": "rollout_dp=1",
    "rollout_expert_parallel=False": "rollout_ep=1",
    "max_num_batched_tokens_factor=1": "max_num_batched_tokens=0",
}
"""The runners' pins as a study's fingerprint spelled them before pins held the knob's name and
value (tuner.runners.megatron's, tuner.runners.megatron_generation's): read as these
(current_fingerprint), so those studies resume."""


def current_params(params: dict[str, Any]) -> dict[str, Any]:
    """A trial's params with the sampler's older names (OLD_PARAMS) read as the knob's: what an
    Optuna storage made before each knob had one name holds. The draws are unchanged."""
    return {OLD_PARAMS.get(k, k): v for k, v in params.items()}


def current_fingerprint(fingerprint: str) -> str:
    """A study's fingerprint with its pins spelled as today (OLD_PINS)."""
    return "|".join(
        ",".join(OLD_PINS.get(x, x) for x in part.split(",")) for part in fingerprint.split("|")
    )


def check_pins(pinned: Collection[tuple[str, Any]]) -> None:
    """Raise ValueError for a pin of a name sample() never suggests: such a pin would pin
    nothing and its knob would still be searched. A sampler parameter's older name
    (rollout_dp_log2) is named with the knob to pin instead."""
    bad = [
        f"{n!r} (now the knob {OLD_PARAMS[n]!r}, pinned by its value)"
        if n in OLD_PARAMS
        else repr(n)
        for n, _ in pinned
        if n not in SAMPLER_PARAMS
    ]
    if bad:
        raise ValueError(
            f"pinned {', '.join(bad)}: not a knob sample() draws; pin a knob of "
            "tuner.space.SAMPLER_PARAMS by its name and value"
        )


def _divisors(n: int) -> list[int]:
    """The divisors of `n`, ascending, in √n steps (16.7M experts took seconds a call)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@dataclass(frozen=True, kw_only=True)
class SpaceLimits:
    """What a runner can measure: the space leaves out what it cannot run and pins the sampler
    parameters it does not measure, so no trial is spent on a difference it cannot see."""

    context_parallel: bool = True
    """Layouts with cp > 1 (megatron-core needs transformer-engine for them)."""
    sequence_parallel: bool = True
    """Sequence parallel (transformer-engine too); without it MoE layouts with tp > 1 are left
    out, as Megatron requires sequence parallel there."""
    pinned: tuple[tuple[str, Any], ...] = ()
    """Knobs (SAMPLER_PARAMS) fixed to a value: the knob's value as the CSV and the recipe show
    it, drawn as `Knob.encode` makes it given the values drawn before."""
    why: str = ""
    """One line for the study's first output: what is left out and why."""
    recompute_modules_refused: tuple[str, ...] = ()
    """Selective-recompute modules the runner cannot build: the module sets holding one are
    not offered (the megatron runner's worker: megatron_refusals.unbuilt_recompute_modules)."""

    def __post_init__(self) -> None:
        check_pins(self.pinned)

    def pin(self, name: str) -> tuple[bool, Any]:
        for k, v in self.pinned:
            if k == name:
                return True, v
        return False, None

    @property
    def summary(self) -> str:
        return self.summary_without(())

    def summary_without(self, omit: Collection[str]) -> str:
        """The summary with the pinned parameters in `omit` left out."""
        parts = [] if self.context_parallel else ["cp1"]
        if not self.sequence_parallel:
            parts.append("nosp")
        parts += [f"{k}={v}" for k, v in self.pinned if k not in omit]
        if self.recompute_modules_refused:
            parts.append("no_recompute=" + "+".join(self.recompute_modules_refused))
        return ",".join(parts)

    def added_at_default(self, old_summary: str) -> list[str]:
        """Pinned parameters an older summary does not list whose value is the Candidate
        field's default (verl's, unless `Knob.default_differs` says why not): a knob added to
        the table since, pinned where the older study ran."""
        listed = {part.split("=", 1)[0] for part in old_summary.split(",")}
        fields_ = Candidate.__dataclass_fields__
        return [
            k
            for k, v in self.pinned
            if k not in listed and k in fields_ and fields_[k].default == v
        ]


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """The valid choices for one (model, cluster, workload); fixed for a study's life."""

    model: ModelSpec
    cluster: Cluster
    workload: Workload
    limits: SpaceLimits = field(default_factory=SpaceLimits)
    allow_off_policy: bool = False
    """`--allow-off-policy`: placement is searched too (the knob rollout_gpus: colocated, or
    vLLM on r GPUs and the actor on N - r, one step off-policy); each pool's knobs are drawn
    within it. False: every candidate is colocated, as before the option existed."""

    @cached_property
    def layouts(self) -> dict[str, ParallelLayout]:
        """Every valid parallel layout of the whole cluster, by notation. Where pp·vpp does not
        divide the layers the most balanced uneven split megatron-core accepts stands for that
        (pp, vpp)."""
        return self._layouts_for(self.cluster)

    @cached_property
    def _pool_cache(self) -> dict[Any, Any]:
        return {}

    def pools_of(self, drawn: Drawn | int) -> Pools:
        """The pools of the drawn placement (or of `rollout_gpus` given as a number)."""
        r = drawn if isinstance(drawn, int) else drawn.get("rollout_gpus", 0)
        key = ("pools", r)
        if key not in self._pool_cache:
            self._pool_cache[key] = pools(r, self.cluster)
        return self._pool_cache[key]  # type: ignore[no-any-return]

    def layouts_of(self, drawn: Drawn | int) -> dict[str, ParallelLayout]:
        """The layouts of the trainer's pool of the drawn placement (colocated: `layouts`)."""
        p = self.pools_of(drawn)
        if not p.split:
            return self.layouts
        key = ("layouts", p.trainer.num_gpus)
        if key not in self._pool_cache:
            self._pool_cache[key] = self._layouts_for(p.trainer)
        return self._pool_cache[key]  # type: ignore[no-any-return]

    def rollout_tps_of(self, drawn: Drawn | int) -> list[int]:
        """The vLLM TP sizes of the rollout's pool of the drawn placement."""
        p = self.pools_of(drawn)
        return self._rollout_tps_for(p.rollout) if p.split else self.rollout_tps

    @cached_property
    def placements(self) -> list[int]:
        """0 (colocated) and every rollout GPU count r whose two pools each hold a valid
        layout (the trainer's N - r) and a valid vLLM TP (the rollout's r)."""
        return [0] + [
            r for r in split_sizes(self.cluster) if self.layouts_of(r) and self.rollout_tps_of(r)
        ]

    def check_splits(self) -> None:
        """Raise a UserError naming what to change when `allow_off_policy` is on and no split
        of the cluster has a valid layout in both pools."""
        if not self.allow_off_policy or len(self.placements) > 1:
            return
        c, w = self.cluster, self.workload
        sizes = split_sizes(c)
        if not sizes:
            raise UserError(
                f"--allow-off-policy on {c.num_gpus} GPU: a split needs 2 GPUs or more (one "
                "for the rollout, one for the actor); add GPUs or leave the option out"
            )
        raise UserError(
            f"--allow-off-policy: no split of {c.num_gpus} GPUs ({c.gpus_per_node} per node) "
            f"leaves {self.model.name} a valid layout on both pools (rollout GPUs tried: "
            f"{', '.join(map(str, sizes))}; the actor's data-parallel size must divide "
            f"{w.mini_batch_size * w.n} samples): choose another --gpus or leave the option out"
        )

    def _layouts_for(self, cluster: Cluster) -> dict[str, ParallelLayout]:
        m, world = self.model, cluster.num_gpus
        out: dict[str, ParallelLayout] = {}
        experts = _divisors(m.num_experts) if m.is_moe else [1]
        for tp in _divisors(cluster.local_gpus):
            if tp > 1 and m.is_moe and not self.limits.sequence_parallel:
                continue  # Megatron needs sequence parallel for MoE with tp > 1
            for pp in range(1, min(MAX_PP, m.num_layers) + 1):
                for cp in CP_CHOICES if self.limits.context_parallel else (1,):
                    if world % (tp * pp * cp):
                        continue
                    vpps = [1] + [v for v in range(2, MAX_VPP + 1) if pp > 1]
                    etps = sorted({1, tp}) if m.is_moe else [1]
                    for vpp in vpps:
                        split = _split(m.num_layers, pp, vpp)
                        if split is None:
                            continue
                        for ep in experts:
                            for etp in etps:
                                if (world // pp) % (ep * etp):
                                    continue
                                lay = ParallelLayout(
                                    world=world,
                                    tp=tp,
                                    pp=pp,
                                    vpp=vpp,
                                    cp=cp,
                                    ep=ep,
                                    etp=etp,
                                    first_stage_layers=split[0],
                                    last_stage_layers=split[1],
                                )
                                if not validate_layout(lay, m, cluster, self.workload):
                                    out.setdefault(lay.notation, lay)
        return out

    @cached_property
    def rollout_tps(self) -> list[int]:
        """vLLM TP sizes: divisors of a node, and whole multiples of a node (TP across nodes)."""
        return self._rollout_tps_for(self.cluster)

    def _rollout_tps_for(self, cl: Cluster) -> list[int]:
        m = self.model
        sizes = _divisors(cl.local_gpus) + [
            cl.local_gpus * k
            for k in range(2, cl.num_nodes + 1)
            if cl.num_gpus % (cl.local_gpus * k) == 0
        ]
        return [
            t
            for t in sizes
            if m.num_attention_heads % t == 0
            and (m.num_kv_heads % t == 0 or t % m.num_kv_heads == 0)
            and not rollout_width_problems(m, t, experts=False)  # ep > 1 may hold experts whole
        ]

    def check_nonempty(self) -> None:
        """Raise a UserError naming what to change when no layout fits."""
        if self.layouts and self.rollout_tps:
            return
        w, c = self.workload, self.cluster
        why = (
            f"{self.model.name} on {c.num_gpus} GPUs ({c.gpus_per_node} per node) with mini "
            f"batch {w.mini_batch_size} x n {w.n}"
        )
        raise UserError(
            f"no parallel layout fits {why}: choose --gpus so that the data-parallel size "
            f"divides {w.mini_batch_size * w.n} samples (e.g. a power of two)"
        )

    def fingerprint(self, omit: Collection[str] = ()) -> str:
        """Identifies the choices and what they are scored on; a study refuses to resume under
        different ones. `omit`: pinned parameters left out (see `added_since`). The workload's
        algorithm, mean lengths and clip fraction close it (`workload_part`): they change every
        prediction and the lengths a measuring runner draws."""
        return f"{self._choices_part(omit)}|{self.workload_part()}"

    def _choices_part(self, omit: Collection[str] = ()) -> str:
        w, c, m = self.workload, self.cluster, self.model
        limits = self.limits.summary_without(omit)
        return (
            f"{m.name}|{m.num_layers}x{m.hidden_size}|{c.gpu.name}x{c.num_gpus}/"
            f"{c.gpus_per_node}|{w.prompt_len}+{w.response_len}|{w.batch_size}x{w.n}/"
            f"{w.mini_batch_size}|{len(self.layouts)}"
            + (f"|{limits}" if limits else "")
            + (
                f"|{OFF_POLICY_TAG}{','.join(map(str, self.placements))}"
                if self.allow_off_policy
                else ""
            )
        )

    def workload_part(self) -> str:
        """`w=dapo/205/1229/0.03`: algorithm, mean prompt and response, clip fraction, and
        `/e1.5` where the MoE routing imbalance is declared (Workload.expert_imbalance; absent
        at its default 1, so the studies made before it resume)."""
        w = self.workload
        skew = f"/e{w.expert_imbalance:g}" if w.expert_imbalance != 1.0 else ""
        return (
            f"{WORKLOAD_TAG}{w.algorithm}/{w.mean_prompt_len:g}/{w.mean_response_len:g}/"
            f"{w.clip_fraction:g}{skew}"
        )

    def added_since(self, old: str) -> list[str]:
        """The pinned knobs this space lists and a study's older fingerprint `old` does not,
        if they are all at the Candidate field's default and account for the whole difference,
        else []: a study made before a knob existed resumes when the runner pins the new knob
        at its field's default, verl's where `Knob.default_differs` is empty: what the older
        study ran."""
        choices, _, wl = old.partition(f"|{WORKLOAD_TAG}")
        parts = choices.split("|")
        added = self.limits.added_at_default(parts[6] if len(parts) > 6 else "")
        if not added or self._choices_part(omit=added) != choices:
            return []
        return added if not wl or f"{WORKLOAD_TAG}{wl}" == self.workload_part() else []

    def predates_workload(self, old: str) -> bool:
        """`old` is a fingerprint made before it named the workload part and matches this space
        otherwise (directly or through `added_since`): the study's records must say whether it
        ran this workload."""
        if f"|{WORKLOAD_TAG}" in old:
            return False
        return old == self._choices_part() or bool(self.added_since(old))


WORKLOAD_TAG = "w="
"""Marks the workload part of a fingerprint."""
OFF_POLICY_TAG = "placements="
"""Marks an `--allow-off-policy` space's placements in its fingerprint (absent without it, so
the fingerprints of colocated studies are what they were)."""


_SPLITS: dict[tuple[int, int, int], tuple[int, int] | None] = {}


def _split(num_layers: int, pp: int, vpp: int) -> tuple[int, int] | None:
    """(first, last) of the layouts the space offers for (pp, vpp): (0, 0) for the even split,
    the balanced uneven one otherwise, None when there is none."""
    key = (num_layers, pp, vpp)
    if key not in _SPLITS:
        if num_layers % (pp * vpp) == 0:
            _SPLITS[key] = (0, 0)
        else:
            _SPLITS[key] = balanced_split(num_layers, pp, vpp)
    return _SPLITS[key]


def offered_choices(space: SearchSpace, drawn: Drawn) -> Iterator[tuple[Knob, list[Any]]]:
    """The sampled knobs in KNOBS order with the choices valid given `drawn` (the caller adds
    each knob's value to `drawn` before asking for the next); knobs not sampled here are
    skipped."""
    for k in KNOBS:
        if k.choices is None:
            continue
        ch = k.choices(space, drawn)
        if ch is not None:
            yield k, list(ch)


PER_POOL_PARAMS = ("layout", "rollout_tp")
"""Knobs whose categorical choices depend on the pool (its GPU count): under a split they are
suggested under a name of their own per placement (`layout_r2`), since Optuna keeps one choice
list per parameter name. Colocated candidates keep the plain names."""


def param_name(k: Knob, drawn: Drawn) -> str:
    """The sampler parameter of knob `k` given the values drawn before it."""
    r = drawn.get("rollout_gpus", 0)
    return f"{k.name}_r{r}" if r and k.name in PER_POOL_PARAMS else k.name


def sample(t: Suggester, space: SearchSpace) -> Candidate:
    """Draw one candidate, knob by knob in KNOBS order. Every value is drawn from choices valid
    for the values drawn before it, so the result passes validate() (a property test holds
    this). A knob with one valid choice takes it without a suggestion."""
    drawn: Drawn = {}
    for k, ch in offered_choices(space, drawn):
        pinned, pin = space.limits.pin(k.name)
        if pinned:
            pin = k.encode(pin, space, drawn)
        if len(ch) == 1:
            v = ch[0]
        elif pinned and pin in ch:  # answered here: a pinned knob is never suggested
            v = pin
        elif k.int_range:
            v = t.suggest_int(param_name(k, drawn), ch[0], ch[-1])
        else:
            v = t.suggest_categorical(param_name(k, drawn), ch)
        drawn[k.name] = k.decode(v, space, drawn)
    lay = drawn.pop("layout")
    return Candidate(layout=lay, **drawn)


def params_for(c: Candidate, space: SearchSpace) -> dict[str, Any]:
    """The sampler parameters that make sample() return `c` (for Optuna's enqueue_trial).

    Token budgets and shares snap to the nearest value the space offers."""
    drawn: Drawn = {}
    p: dict[str, Any] = {}
    for k, ch in offered_choices(space, drawn):
        v = k.value(c)
        if len(ch) > 1:
            p[param_name(k, drawn)] = k.encode(v, space, drawn)
        drawn[k.name] = v
    for name, _ in space.limits.pinned:
        p.pop(name, None)
    return p


class RandomSuggester:
    """Draws uniformly from the same choices an Optuna trial would offer (for ranking many
    candidates with the estimator before the study starts)."""

    def __init__(self, rng: Any) -> None:
        self.rng = rng
        self.params: dict[str, Any] = {}

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        v = choices[self.rng.randrange(len(choices))]
        self.params[name] = v
        return v

    def suggest_int(self, name: str, low: int, high: int) -> int:
        v = self.rng.randint(low, high)
        self.params[name] = v
        return v


class FollowSuggester:
    """Answers each suggestion with the value `params` gives it where that value is offered,
    else repairs it (an int to the nearest bound, a categorical to its first choice), and
    records what was offered: the neighbours of a candidate for a search that moves one
    sampler parameter at a time (tuner.study.warmstart.cost_model_search)."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.want = params
        self.params: dict[str, Any] = {}
        """The parameters suggested, as answered: what enqueue_trial takes for this candidate."""
        self.offered: dict[str, list[Any]] = {}
        """Each suggested parameter's choices, given the values answered before it."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        self.offered[name] = list(choices)
        v = self.want.get(name, choices[0])
        if v not in choices:
            v = choices[0]
        self.params[name] = v
        return v

    def suggest_int(self, name: str, low: int, high: int) -> int:
        self.offered[name] = list(range(low, high + 1))
        v = min(max(int(self.want.get(name, low)), low), high)
        self.params[name] = v
        return v


class _PathSuggester:
    """Takes the `path[i]`-th choice at the i-th suggestion (the first beyond the path) and
    records each suggestion's choice count: one leaf of the space's tree (`walk`)."""

    def __init__(self, path: list[int]) -> None:
        self.path = path
        self.taken: list[int] = []
        self.counts: list[int] = []
        self.params: dict[str, Any] = {}

    def _pick(self, name: str, choices: Sequence[Any]) -> Any:
        i = self.path[len(self.taken)] if len(self.taken) < len(self.path) else 0
        self.taken.append(i)
        self.counts.append(len(choices))
        self.params[name] = choices[i]
        return choices[i]

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self._pick(name, list(choices))

    def suggest_int(self, name: str, low: int, high: int) -> int:
        return int(self._pick(name, list(range(low, high + 1))))


def walk(space: SearchSpace) -> Iterator[tuple[Candidate, dict[str, Any]]]:
    """Every candidate sample() can draw from `space`, each once, with its sampler parameters:
    the exhaustive enumeration (depth first over the choices each suggestion offers given the
    values before it). Small spaces only: its size is the product of the choices."""
    path: list[int] = []
    while True:
        s = _PathSuggester(path)
        c = sample(s, space)
        yield c, s.params
        i = len(s.taken) - 1
        while i >= 0 and s.taken[i] + 1 >= s.counts[i]:
            i -= 1
        if i < 0:
            return
        path = [*s.taken[:i], s.taken[i] + 1]
