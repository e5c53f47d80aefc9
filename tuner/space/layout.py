"""The parallel layout: Megatron degrees of the actor (and ref) and the pipeline split."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Protocol

from tuner.errors import UserError

_DEGREE_RE = re.compile(r"(vpp|etp|tp|pp|cp|ep|dp|first|last)(\d+)")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelLayout:
    """Megatron degrees for the actor (and ref); DP is derived from the world size."""

    world: int
    """GPUs in all."""
    tp: int = 1
    """Tensor parallel."""
    pp: int = 1
    """Pipeline parallel."""
    vpp: int = 1
    """Virtual pipeline stages per pipeline rank (interleaved schedule); 1 = off."""
    cp: int = 1
    """Context parallel."""
    ep: int = 1
    """Expert parallel (MoE)."""
    etp: int = 1
    """Expert tensor parallel (MoE)."""
    first_stage_layers: int = 0
    """Layers of the first pipeline stage (megatron-core `num_layers_in_first_pipeline_stage`);
    0 = the even split."""
    last_stage_layers: int = 0
    """Layers of the last pipeline stage (`num_layers_in_last_pipeline_stage`); 0 = even."""

    def __post_init__(self) -> None:
        for name in ("world", "tp", "pp", "vpp", "cp", "ep", "etp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}({getattr(self, name)}) must be at least 1")
        for name in ("first_stage_layers", "last_stage_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}({getattr(self, name)}) must be 0 (even) or positive")
        if self.world % (self.tp * self.pp * self.cp):
            raise ValueError(
                f"tp({self.tp}) * pp({self.pp}) * cp({self.cp}) * dp({self.dp}) "
                f"!= world({self.world})"
            )
        if (self.world // self.pp) % (self.ep * self.etp):
            raise ValueError(
                f"ep({self.ep}) * etp({self.etp}) does not divide tp({self.tp}) * cp({self.cp})"
                f" * dp({self.dp}) = {self.world // self.pp}"
            )

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)

    @property
    def expert_dp(self) -> int:
        """Data parallel size of the expert weights."""
        return self.world // (self.pp * self.ep * self.etp)

    @property
    def uneven(self) -> bool:
        return bool(self.first_stage_layers or self.last_stage_layers)

    @property
    def notation(self) -> str:
        """The reference leaderboards' notation: `tp4pp2vpp2`, `tp2cp2`, `tp4ep16` (etp 1 unless
        written, as the references mean it). An uneven pipeline split is not part of it (the CSV
        has it in columns); `spec` writes it."""
        parts = [
            f"{n}{v}"
            for n, v in (
                ("tp", self.tp),
                ("pp", self.pp),
                ("vpp", self.vpp),
                ("cp", self.cp),
                ("ep", self.ep),
            )
            if v > 1
        ]
        if self.etp > 1:
            parts.append(f"etp{self.etp}")
        return "".join(parts) or f"dp{self.dp}"

    @property
    def spec(self) -> str:
        """The notation plus an uneven pipeline split (`pp8first10last12`): what `parse` reads
        back to this layout."""
        out = self.notation
        if self.first_stage_layers:
            out += f"first{self.first_stage_layers}"
        if self.last_stage_layers:
            out += f"last{self.last_stage_layers}"
        return out

    def stage_layers(self, num_layers: int) -> list[int]:
        """Layers of each pipeline rank (all virtual stages of it together). Raises ValueError
        with megatron-core's rule when the split is not one it builds
        (TransformerConfig.__post_init__ "Uneven PP" and transformer_block.get_num_layers_to_build,
        megatron-core 0.19)."""
        pp, vpp = self.pp, self.vpp
        f, last = self.first_stage_layers, self.last_stage_layers
        if not self.uneven:
            if num_layers % (pp * vpp):
                raise ValueError(
                    f"pp({pp}) * vpp({vpp}) does not divide the {num_layers} layers: pick degrees "
                    f"that divide it, or an uneven split (first<N>/last<N>)"
                )
            return [num_layers // pp] * pp
        if pp < 2:
            raise ValueError("first/last stage layers need pp > 1")
        middle_layers, middle_stages = num_layers, pp
        for name, n in (("first", f), ("last", last)):
            if n:
                if vpp > 1 and n % vpp:
                    raise ValueError(
                        f"num_layers_in_{name}_pipeline_stage({n}) must be divisible by vpp({vpp})"
                    )
                middle_layers -= n
                middle_stages -= 1
        if middle_layers < 0 or bool(middle_layers) != bool(middle_stages):
            raise ValueError(
                f"first({f}) and last({last}) stage layers leave {middle_layers} of the "
                f"{num_layers} layers for {middle_stages} middle stages"
            )
        per = 0
        if middle_stages:
            if middle_layers % middle_stages:
                raise ValueError(
                    f"the {middle_layers} middle layers (of {num_layers}, first({f}), last({last}))"
                    f" do not divide over the {middle_stages} middle pipeline stages"
                )
            per = middle_layers // middle_stages
            if vpp > 1 and per % vpp:
                raise ValueError(
                    f"the {per} layers of each middle pipeline stage are not divisible by "
                    f"vpp({vpp})"
                )
        out = [per] * pp
        if f:
            out[0] = f
        if last:
            out[-1] = last
        return out

    @classmethod
    def parse(cls, text: str, world: int, num_layers: int = 0) -> ParallelLayout:
        """Read `tp4pp2vpp2`, `ep8cp2tp2`, `Tp4pp1cp1`, `all dp`, `pp8first10last12`; missing
        degrees are 1, a missing first/last means the even split. With `num_layers` (the
        model's), a pipeline whose pp·vpp does not divide the layers and whose first/last are
        not written takes the most balanced uneven split megatron-core accepts
        (`balanced_split`, as the search does): `tp4pp8ep32` of a 94-layer model is
        `tp4pp8ep32last10`, seven stages of 12 layers and a last of 10.

        Without an explicit `etp`, expert tensor parallel is 1 (the references' MoE rows).
        """
        deg = read_degrees(text)
        dp = deg.pop("dp", None)
        for short, long in (("first", "first_stage_layers"), ("last", "last_stage_layers")):
            if short in deg:
                deg[long] = deg.pop(short)
        pp, vpp = deg.get("pp", 1), deg.get("vpp", 1)
        if num_layers and not ({"first_stage_layers", "last_stage_layers"} & set(deg)):
            split = balanced_split(num_layers, pp, vpp)
            if split is not None:
                deg["first_stage_layers"], deg["last_stage_layers"] = split
        try:
            layout = cls(world=world, **deg)
        except ValueError as e:
            raise UserError(f"layout {text!r} does not fit {world} GPUs: {e}") from None
        if dp is not None and dp != layout.dp:
            raise UserError(f"layout {text!r}: dp({dp}) != world / (tp*pp*cp) = {layout.dp}")
        return layout


LAYOUT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ParallelLayout) if f.name != "world")
"""The layout's knobs, as ParallelLayout declares them: the degrees, then the pipeline split."""
LAYOUT_DEGREES: tuple[str, ...] = tuple(f for f in LAYOUT_FIELDS if not f.endswith("_layers"))
"""The layout's parallel degrees (tp, pp, vpp, cp, ep, etp); dp follows from them and the
world."""
LAYOUT_EXAMPLES = "tp4pp2vpp2, tp2cp2, tp4ep8, dp8 or pp8first10last12"
"""What a layout looks like, for the messages of everything that reads one."""


def read_degrees(text: str) -> dict[str, int]:
    """The degrees a layout text writes, by name (`tp`, ..., `dp`, `first`, `last`): the one
    grammar of a layout, for `ParallelLayout.parse` and the CLI's argument check (tuner.cli_args)
    alike, so the CLI reads every layout the search writes (`ParallelLayout.spec`). `all dp` and
    `dp` alone are {}. UserError when it is not ASCII degrees or names one twice."""
    s = text.strip().lower().replace(" ", "")
    shown = repr(text if len(text) <= 40 else text[:37] + "...")
    if not s or not s.isascii():
        raise UserError(f"cannot read layout {shown}: write ASCII degrees like {LAYOUT_EXAMPLES}")
    if s in ("alldp", "dp"):
        return {}
    found = _DEGREE_RE.findall(s)
    if "".join(n + v for n, v in found) != s:
        raise UserError(f"cannot read layout {shown}: write degrees like {LAYOUT_EXAMPLES}")
    names = [n for n, _ in found]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserError(
            f"layout {shown} gives {', '.join(repeated)} more than once: write each degree once"
        )
    zero = [n for n, v in found if int(v) == 0 and n not in ("first", "last")]
    if zero:
        raise UserError(
            f"layout {shown} gives {zero[0]}0: a degree is at least 1: write {zero[0]}1 or leave "
            f"{zero[0]} out"
        )
    return {n: int(v) for n, v in found}


def balanced_split(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, int] | None:
    """(first, last) stage layers of the most balanced uneven split megatron-core accepts when
    pp·vpp does not divide the layers (94 layers on pp8: seven stages of 12 and a last stage of
    10, `last10`); None when the even split works or no uneven one exists. Ties go to lighter
    first and last stages (they also hold the embedding and the output layer).

    Of every (first, last) that `ParallelLayout.stage_layers` accepts, the one of the least
    (largest stage, larger of first and last, -smaller nonzero of them), the smallest (first,
    last) of equals. The split is found in time independent of the depth (`_split_in_units`):
    trying every pair took hours at 100,000 layers (issue 38)."""
    if pp < 2 or num_layers % (pp * vpp) == 0:
        return None
    if num_layers % vpp:  # first, last and the middle stages are each whole multiples of vpp
        return None
    found = _split_in_units(num_layers // vpp, pp)
    return None if found is None else (found[0] * vpp, found[1] * vpp)


def _split_in_units(n: int, pp: int) -> tuple[int, int] | None:
    """`balanced_split` of `n` units (vpp layers each) over `pp` stages, `n % pp` nonzero.

    Each accepted split is one of: last = n - (pp-1)·per with first 0 (the same split with
    first n - (pp-1)·per and last 0 scores the same and comes later in (first, last) order, so
    it never wins); or first + last = n - (pp-2)·per with both nonzero (for pp 2: first + last
    = n), whose best is the most even pair, the smaller first (any other pair of that `per`
    has a larger `max(first, last)`). Both scores fall then rise with `per` (the largest stage
    is at least `per` and at least what `per` leaves to the first and last), around n / pp: a
    window of `per` is widened until every `per` outside it has a largest stage above the best
    found, which makes the answer the one of trying every pair."""
    mid = pp - 2
    top_b = (n - 1) // (pp - 1)  # largest per leaving last >= 1
    top_c = (n - 2) // mid if mid else 0  # largest per leaving first, last >= 1

    def keyed(first: int, last: int, per: int) -> tuple[tuple[int, int, int], int, int]:
        stages = max(first, last, per)
        small = min(first or n + 1, last or n + 1)
        return ((stages, max(first, last), -small), first, last)

    fixed = []
    if mid == 0 and n >= 2:  # pp 2 with both stages named: first + last = n
        fixed.append(keyed(n // 2, n - n // 2, 0))
    centre, width = max(1, n // pp), 2
    while True:
        lo, hi = max(1, centre - width), centre + width
        keys = list(fixed)
        for per in range(lo, min(hi, top_b) + 1):
            keys.append(keyed(0, n - (pp - 1) * per, per))
        for per in range(lo, min(hi, top_c) + 1):
            s = n - mid * per
            keys.append(keyed(s // 2, s - s // 2, per))
        best = min(keys) if keys else None
        done_left = lo == 1
        done_right = hi >= max(top_b, top_c)
        if best is not None:
            most = best[0][0]
            below = lo - 1  # every per <= below leaves at least this much to the first or last
            left = min(n - (pp - 1) * below, -(-(n - mid * below) // 2) if mid else n)
            done_left = done_left or left > most
            done_right = done_right or hi + 1 > most
        if done_left and done_right:
            return None if best is None else (best[1], best[2])
        width *= 2


@dataclass(frozen=True, kw_only=True, slots=True)
class RolloutDims:
    """The rollout's (vLLM's) parallel degrees on the GPUs it runs on, and every degree derived
    from them, in one place (as torchtitan's ParallelDims owns the training's): a replica is one
    vLLM engine of `tp` x `dp` GPUs (verl 0.9.1: `data_parallel_size` engines inside a replica),
    `world` holds `replicas` of them, and expert parallel is off (1) or spans the replica."""

    world: int
    """GPUs the rollout runs on: the whole cluster colocated, the rollout's pool split."""
    tp: int
    """vLLM tensor parallel (`rollout_tp`)."""
    dp: int = 1
    """vLLM data parallel inside a replica (`rollout_dp`)."""
    ep: int = 1
    """vLLM expert parallel (`rollout_ep`): 1, or tp * dp (verl's RolloutConfig)."""

    def __post_init__(self) -> None:
        for name in ("world", "tp", "dp", "ep"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout {name}({getattr(self, name)}) must be at least 1")

    @classmethod
    def of(cls, c: HasRolloutDegrees, world: int) -> RolloutDims:
        """The rollout degrees of candidate `c` on `world` GPUs."""
        return cls(world=world, tp=c.rollout_tp, dp=c.rollout_dp, ep=c.rollout_ep)

    @property
    def replica_gpus(self) -> int:
        """GPUs of one replica (one engine's tensor x data parallel)."""
        return self.tp * self.dp

    @property
    def replicas(self) -> int:
        """Replicas on `world` (at least one): each generates its share of the step's prompts
        and takes the weights at every sync."""
        return max(1, self.world // self.replica_gpus)

    @property
    def schedulers(self) -> int:
        """vLLM schedulers on `world`: each data-parallel rank of each replica batches its own
        share of the sequences."""
        return self.replicas * self.dp

    @property
    def ep_problem(self) -> str:
        """Why `ep` is not one vLLM takes (verl RolloutConfig.__post_init__: expert_parallel_size
        == tp * dp when > 1), or ""."""
        if self.ep > 1 and self.ep != self.replica_gpus:
            return f"rollout ep({self.ep}) must be 1 or rollout tp * dp = {self.replica_gpus}"
        return ""


class HasRolloutDegrees(Protocol):
    """What RolloutDims.of reads of a candidate."""

    @property
    def rollout_tp(self) -> int: ...

    @property
    def rollout_dp(self) -> int: ...

    @property
    def rollout_ep(self) -> int: ...
