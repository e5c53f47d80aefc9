"""What the sampler offers each knob: the choice lists and the functions that derive a knob's
valid values from the model, cluster, workload and the values drawn before it (knobs.py's
`Knob.choices`, `decode` and `encode` point here)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.space.candidate import (
    MOE_DISPATCHER_CHOICES,
    RECOMPUTE_MODULE_SETS_DENSE,
    RECOMPUTE_MODULE_SETS_MOE,
)
from tuner.space.layout import ParallelLayout
from tuner.space.placement import Pools
from tuner.workload import Workload

TOKEN_BUDGET_FACTORS = (1.0, 1.5, 2.0, 3.0, 4.0)
"""ppo_max_token_len_per_gpu as multiples of one full sample per micro-batch of a CP group
(token_budget: factor * (prompt + response) / cp; references use 1x to 3x)."""
LOG_PROB_BUDGET_FACTORS = (1.0, 2.0, 3.0, 4.0, 6.0, 10.0)
"""log_prob_max_token_len_per_gpu the same way (references: 1x to 10x)."""
GPU_MEMORY_UTILIZATIONS = (0.4, 0.5, 0.6, 0.7, 0.8)
BATCHED_TOKEN_FACTORS = (1, 2)
MAX_MICRO_BATCH_LOG2 = 3
MAX_PP = 16
MAX_VPP = 4
CP_CHOICES = (1, 2, 4, 8)
ROLLOUT_DP_CHOICES = (1, 2, 4, 8)
BOOLS = (True, False)

Drawn = dict[str, Any]
"""Values drawn so far in sample()/params_for(), by knob name (`layout` included)."""


class Limits(Protocol):
    """What a choice reads of the runner's limits (sampling.SpaceLimits)."""

    @property
    def sequence_parallel(self) -> bool: ...

    @property
    def recompute_modules_refused(self) -> tuple[str, ...]: ...


class SpaceView(Protocol):
    """What the choices, decoders and encoders of the knob table read of the space they draw
    from: sampling.SearchSpace is one. Declared here, where they are, so that the table needs
    nothing of the sampler that reads it (no import circle)."""

    @property
    def model(self) -> ModelSpec: ...

    @property
    def cluster(self) -> Cluster: ...

    @property
    def workload(self) -> Workload: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def allow_off_policy(self) -> bool: ...

    @property
    def placements(self) -> list[int]: ...

    def pools_of(self, drawn: Drawn | int) -> Pools: ...

    def layouts_of(self, drawn: Drawn | int) -> dict[str, ParallelLayout]: ...

    def rollout_tps_of(self, drawn: Drawn | int) -> list[int]: ...


Choices = Callable[[SpaceView, Drawn], Sequence[Any] | None]


def min_token_budget(max_seq_len: int, cp: int) -> int:
    """The smallest `*_max_token_len_per_gpu` verl accepts: one whole sample must fit the
    micro-batch budget, which verl multiplies by cp (the actor's dynamic batching)."""
    return math.ceil(max_seq_len / cp)


def token_budget(factor: float, max_seq_len: int, cp: int) -> int:
    """The `*_max_token_len_per_gpu` of `factor` whole samples per micro-batch of a CP group:
    factor * (prompt + response) / cp, rounded up to 1024. verl multiplies the budget by cp
    (each CP rank holds 1/cp of every sequence), so factor 1 is the smallest budget that takes
    one sample (min_token_budget), and a long sequence fits where cp divides it."""
    return int(math.ceil(factor * max_seq_len / cp / 1024) * 1024)


def budget_factor(budget: int, max_seq_len: int, cp: int) -> float:
    """Inverse of token_budget: whole samples per micro-batch of a CP group."""
    return budget * cp / max_seq_len


def round_up(x: float, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)


def nearest(x: float, choices: Sequence[float]) -> Any:
    return min(choices, key=lambda ch: abs(math.log(ch) - math.log(max(x, 1e-9))))


def moe_space(choices: Sequence[Any]) -> Choices:
    return lambda s, d: list(choices) if s.model.is_moe else None


def dispatcher_choices(s: SpaceView, d: Drawn) -> Sequence[Any] | None:
    """The MoE token dispatchers this layout can build: `flex` (DeepEP) needs tp x ep > 1
    (rules.flex_needs_tp_ep)."""
    if not s.model.is_moe:
        return None
    lay = d["layout"]
    return [x for x in MOE_DISPATCHER_CHOICES if x != "flex" or lay.tp * lay.ep > 1]


def sp_choices(s: SpaceView, d: Drawn) -> Sequence[Any]:
    lay = d["layout"]
    if lay.tp == 1 or not s.limits.sequence_parallel:
        return [False]
    return [True] if s.model.is_moe else [True, False]


def chunk(s: SpaceView, lay: ParallelLayout) -> int:
    return max(1, min(lay.stage_layers(s.model.num_layers)) // lay.vpp)


def nlayers_choices(s: SpaceView, d: Drawn) -> Sequence[Any] | None:
    if d["recompute_granularity"] != "full":
        return None
    return list(range(1, chunk(s, d["layout"]) + 1))


def modules_choices(s: SpaceView, d: Drawn) -> Sequence[Any] | None:
    if d["recompute_granularity"] != "selective":
        return None
    # a fixed list per model and runner (Optuna's categorical choices may not change between
    # trials); moe_grouped_gemm, drawn after, follows it (moe_act needs the grouped GEMM); sets
    # with a module the runner cannot build are left out (SpaceLimits.recompute_modules_refused)
    sets = RECOMPUTE_MODULE_SETS_MOE if s.model.is_moe else RECOMPUTE_MODULE_SETS_DENSE
    refused = set(s.limits.recompute_modules_refused)
    return [m for m in sets if refused.isdisjoint(m.split(","))]


def grouped_gemm_choices(s: SpaceView, d: Drawn) -> Sequence[Any] | None:
    if not s.model.is_moe:
        return None
    needs = d.get("recompute_granularity") == "selective" and "moe_act" in str(
        d.get("recompute_modules", "")
    )
    return [True] if needs else list(BOOLS)


def budget_fields(factors: Sequence[float]) -> dict[str, Any]:
    """Budgets in whole samples per micro-batch of the drawn layout's CP group, so context
    parallel can fit a sequence no single GPU holds (token_budget)."""
    return dict(
        choices=lambda s, d: list(factors) if d["use_dynamic_bsz"] else None,
        decode=lambda f, s, d: token_budget(float(f), s.workload.max_seq_len, d["layout"].cp),
        encode=lambda v, s, d: nearest(
            budget_factor(v, s.workload.max_seq_len, d["layout"].cp), factors
        ),
    )


def micro_choices(s: SpaceView, d: Drawn) -> Sequence[Any] | None:
    if d["use_dynamic_bsz"]:
        return None
    w, lay = s.workload, d["layout"]
    per_rank = w.mini_batch_size * w.n // lay.dp
    twos = (per_rank & -per_rank).bit_length() - 1  # largest power of two dividing it
    return list(range(0, min(MAX_MICRO_BATCH_LOG2, twos) + 1))


def log2(v: Any, *_: Any) -> int:
    return int(math.log2(v))


def pow2(k: Any, *_: Any) -> int:
    return int(2 ** int(k))


def rollout_dp_choices(s: SpaceView, d: Drawn) -> Sequence[Any] | None:
    """log2 of the rollout DP sizes valid with the drawn rollout TP (an int range: Optuna lets
    int ranges change between trials, not categorical lists)."""
    if not s.model.is_moe:
        return None
    rtp, cl = d["rollout_tp"], s.pools_of(d).rollout
    out = [0]
    for k, x in enumerate(ROLLOUT_DP_CHOICES[1:], start=1):
        ok = (
            cl.local_gpus % rtp == 0
            and cl.num_gpus % (rtp * x) == 0
            and (rtp * x) % min(cl.local_gpus, rtp * x) == 0
        )
        if not ok:
            break
        out.append(k)
    return out


def rollout_ep_choices(s: SpaceView, d: Drawn) -> Sequence[Any] | None:
    """Whether vLLM runs the experts expert-parallel (ep = tp * dp, verl's rule)."""
    if not s.model.is_moe:
        return None
    g = d["rollout_tp"] * d.get("rollout_dp", 1)
    return [False, True] if g > 1 and s.model.num_experts % g == 0 else [False]
