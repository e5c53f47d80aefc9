"""The search space: every knob declared once with its verl key, the Candidate, and validate().

One table (`KNOBS`) drives sampling, the CSV columns and the verl overrides. `sample()` is the
only place values are drawn; it draws only from choices that pass `validate()`, so a candidate
the sampler emits is always valid. `validate()` still checks every rule, because candidates also
come from users, reference recipes and resumed studies.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Protocol

from tuner.errors import UserError
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.workload import Workload

# --------------------------------------------------------------------------------------------
# The parallel layout
# --------------------------------------------------------------------------------------------

_DEGREE_RE = re.compile(r"(vpp|etp|tp|pp|cp|ep|dp)(\d+)")


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

    def __post_init__(self) -> None:
        for name in ("world", "tp", "pp", "vpp", "cp", "ep", "etp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}({getattr(self, name)}) must be at least 1")
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
    def notation(self) -> str:
        """The reference leaderboards' notation: `tp4pp2vpp2`, `tp2cp2`, `tp4ep16` (etp 1 unless
        written, as the references mean it)."""
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

    @classmethod
    def parse(cls, text: str, world: int) -> ParallelLayout:
        """Read `tp4pp2vpp2`, `ep8cp2tp2`, `Tp4pp1cp1`, `all dp`; missing degrees are 1.

        Without an explicit `etp`, expert tensor parallel is 1 (the references' MoE rows).
        """
        s = text.strip().lower().replace(" ", "")
        if s in ("alldp", "dp", ""):
            return cls(world=world)
        found = _DEGREE_RE.findall(s)
        if "".join(n + v for n, v in found) != s:
            raise UserError(
                f"cannot read layout {text!r}: write degrees like tp4pp2vpp2, tp2cp2 or tp4ep8"
            )
        deg = {n: int(v) for n, v in found}
        dp = deg.pop("dp", None)
        try:
            layout = cls(world=world, **deg)
        except ValueError as e:
            raise UserError(f"layout {text!r} does not fit {world} GPUs: {e}") from None
        if dp is not None and dp != layout.dp:
            raise UserError(f"layout {text!r}: dp({dp}) != world / (tp*pp*cp) = {layout.dp}")
        return layout


# --------------------------------------------------------------------------------------------
# The candidate
# --------------------------------------------------------------------------------------------

RECOMPUTE_GRANULARITIES = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """One configuration of every knob; the unit a runner measures."""

    layout: ParallelLayout
    """Actor (and ref) parallel degrees."""
    sequence_parallel: bool = False
    """Megatron sequence parallel (needs tp > 1)."""
    recompute_granularity: str = "none"
    """Activation recompute: none, selective (attention core) or full (whole layers)."""
    recompute_method: str = "uniform"
    """Full recompute: uniform (chunks of num_layers) or block (first num_layers per stage)."""
    recompute_num_layers: int = 1
    """Full recompute: layers per chunk (uniform) or layers recomputed per stage (block)."""
    param_offload: bool = False
    """Offload actor/ref parameters to CPU between phases."""
    grad_offload: bool = False
    """Offload gradients to CPU between phases."""
    optimizer_offload: bool = False
    """Offload optimizer states to CPU between phases."""
    use_fused_kernels: bool = True
    """verl's fused log-prob/entropy kernels (no full-vocabulary logits in memory)."""
    use_dynamic_bsz: bool = True
    """Pack micro-batches by a token budget instead of a fixed sample count."""
    ppo_max_token_len_per_gpu: int = 0
    """Dynamic batching: tokens per micro-batch per GPU in the actor update."""
    log_prob_max_token_len_per_gpu: int = 0
    """Dynamic batching: tokens per micro-batch per GPU in old/ref log-prob."""
    ppo_micro_batch_size_per_gpu: int = 1
    """Fixed batching: samples per micro-batch per GPU in the actor update."""
    log_prob_micro_batch_size_per_gpu: int = 1
    """Fixed batching: samples per micro-batch per GPU in old/ref log-prob."""
    rollout_tp: int = 1
    """vLLM tensor parallel size."""
    gpu_memory_utilization: float = 0.6
    """vLLM's share of GPU memory (weights + KV cache) during generation."""
    max_num_batched_tokens: int = 0
    """vLLM's token budget per scheduler step (0 = prompt + response)."""

    def to_record(self) -> dict[str, Any]:
        """Flat knob values, as CSV columns and Optuna user_attrs."""
        rec = {k: v for k, v in asdict(self).items() if k != "layout"}
        lay = self.layout
        return {
            "train_parallel": lay.notation,
            "tp": lay.tp,
            "pp": lay.pp,
            "vpp": lay.vpp,
            "cp": lay.cp,
            "ep": lay.ep,
            "etp": lay.etp,
            "dp": lay.dp,
            **rec,
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any], world: int) -> Candidate:
        """Inverse of to_record (values may be strings, as read from a CSV)."""
        lay = ParallelLayout(
            world=world, **{k: int(rec[k]) for k in ("tp", "pp", "vpp", "cp", "ep", "etp")}
        )
        kw: dict[str, Any] = {}
        for f in CANDIDATE_FIELDS:
            if f not in rec or rec[f] in ("", None):
                continue
            kw[f] = _coerce(rec[f], _FIELD_TYPES[f])
        return cls(layout=lay, **kw)


def _coerce(value: Any, typ: type) -> Any:
    if typ is bool and isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return typ(value)


_FIELD_TYPES: dict[str, type] = {
    "sequence_parallel": bool,
    "recompute_granularity": str,
    "recompute_method": str,
    "recompute_num_layers": int,
    "param_offload": bool,
    "grad_offload": bool,
    "optimizer_offload": bool,
    "use_fused_kernels": bool,
    "use_dynamic_bsz": bool,
    "ppo_max_token_len_per_gpu": int,
    "log_prob_max_token_len_per_gpu": int,
    "ppo_micro_batch_size_per_gpu": int,
    "log_prob_micro_batch_size_per_gpu": int,
    "rollout_tp": int,
    "gpu_memory_utilization": float,
    "max_num_batched_tokens": int,
}
CANDIDATE_FIELDS = tuple(_FIELD_TYPES)


# --------------------------------------------------------------------------------------------
# The knob table: verl keys beside each knob
# --------------------------------------------------------------------------------------------

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
TF_CONFIG = "megatron.override_transformer_config"


def _null_if_one(v: Any) -> Any:
    return None if v == 1 else v


@dataclass(frozen=True, slots=True)
class Knob:
    """A tuner knob and the verl keys it sets (actor and ref keys get the same value)."""

    name: str
    """Attribute of Candidate (or of its layout)."""
    verl_keys: tuple[str, ...]
    """Full dotted keys; a leading `+` adds a key verl's schema leaves open."""
    help: str
    to_verl: Callable[[Any], Any] = field(default=lambda v: v)
    """Value as verl wants it; None becomes `null`."""
    when: Callable[[Candidate], bool] = field(default=lambda c: True)
    """Whether the key is emitted for a candidate (e.g. recompute keys only when on)."""

    def value(self, c: Candidate) -> Any:
        if hasattr(c.layout, self.name) and self.name != "world":
            return getattr(c.layout, self.name)
        return getattr(c, self.name)


def _both(suffix: str) -> tuple[str, ...]:
    return (f"{ACTOR}.{suffix}", f"{REF}.{suffix}")


def _recompute_on(c: Candidate) -> bool:
    return c.recompute_granularity != "none"


def _full_recompute(c: Candidate) -> bool:
    return c.recompute_granularity == "full"


KNOBS: tuple[Knob, ...] = (
    Knob("tp", _both("megatron.tensor_model_parallel_size"), "tensor parallel"),
    Knob("pp", _both("megatron.pipeline_model_parallel_size"), "pipeline parallel"),
    Knob(
        "vpp",
        _both("megatron.virtual_pipeline_model_parallel_size"),
        "virtual pipeline stages (null = off)",
        to_verl=_null_if_one,
    ),
    Knob("cp", _both("megatron.context_parallel_size"), "context parallel"),
    Knob("ep", _both("megatron.expert_model_parallel_size"), "expert parallel"),
    Knob("etp", _both("megatron.expert_tensor_parallel_size"), "expert tensor parallel"),
    Knob("sequence_parallel", _both("megatron.sequence_parallel"), "sequence parallel"),
    # verl 0.9 declares these three (null by default), so they take no `+`; the ref's
    # override_transformer_config follows the actor's.
    Knob(
        "recompute_granularity",
        (f"{ACTOR}.{TF_CONFIG}.recompute_granularity",),
        "activation recompute granularity",
        when=_recompute_on,
    ),
    Knob(
        "recompute_method",
        (f"{ACTOR}.{TF_CONFIG}.recompute_method",),
        "full recompute method",
        when=_full_recompute,
    ),
    Knob(
        "recompute_num_layers",
        (f"{ACTOR}.{TF_CONFIG}.recompute_num_layers",),
        "full recompute layers",
        when=_full_recompute,
    ),
    Knob("param_offload", _both("megatron.param_offload"), "offload parameters"),
    # verl 0.9 has no gradient offload key: `megatron.param_offload` also releases the gradient
    # buffers between phases (McoreEngineConfig), so grad_offload sets nothing by itself.
    Knob("grad_offload", (), "offload gradients (verl: part of param_offload)"),
    Knob("optimizer_offload", (f"{ACTOR}.megatron.optimizer_offload",), "offload optimizer"),
    Knob("use_fused_kernels", ("actor_rollout_ref.model.use_fused_kernels",), "fused kernels"),
    Knob(
        "use_dynamic_bsz",
        (
            f"{ACTOR}.use_dynamic_bsz",
            f"{REF}.log_prob_use_dynamic_bsz",
            f"{ROLLOUT}.log_prob_use_dynamic_bsz",
        ),
        "dynamic batch size",
    ),
    Knob(
        "ppo_max_token_len_per_gpu",
        (f"{ACTOR}.ppo_max_token_len_per_gpu",),
        "actor tokens per micro-batch per GPU",
        when=lambda c: c.use_dynamic_bsz,
    ),
    Knob(
        "log_prob_max_token_len_per_gpu",
        (f"{REF}.log_prob_max_token_len_per_gpu", f"{ROLLOUT}.log_prob_max_token_len_per_gpu"),
        "log-prob tokens per micro-batch per GPU",
        when=lambda c: c.use_dynamic_bsz,
    ),
    Knob(
        "ppo_micro_batch_size_per_gpu",
        (f"{ACTOR}.ppo_micro_batch_size_per_gpu",),
        "actor samples per micro-batch per GPU",
        when=lambda c: not c.use_dynamic_bsz,
    ),
    Knob(
        "log_prob_micro_batch_size_per_gpu",
        (
            f"{REF}.log_prob_micro_batch_size_per_gpu",
            f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",
        ),
        "log-prob samples per micro-batch per GPU",
        when=lambda c: not c.use_dynamic_bsz,
    ),
    Knob("rollout_tp", (f"{ROLLOUT}.tensor_model_parallel_size",), "vLLM tensor parallel"),
    Knob("gpu_memory_utilization", (f"{ROLLOUT}.gpu_memory_utilization",), "vLLM memory share"),
    Knob(
        "max_num_batched_tokens",
        (f"{ROLLOUT}.max_num_batched_tokens",),
        "vLLM tokens per scheduler step",
    ),
)


def knob_overrides(c: Candidate) -> dict[str, Any]:
    """Every verl key the candidate sets, with its value (None means null)."""
    out: dict[str, Any] = {}
    for k in KNOBS:
        if not k.when(c):
            continue
        v = k.to_verl(k.value(c))
        for key in k.verl_keys:
            out[key] = v
    return out


# --------------------------------------------------------------------------------------------
# Validity rules
# --------------------------------------------------------------------------------------------


def validate_layout(
    lay: ParallelLayout, model: ModelSpec, cluster: Cluster, workload: Workload
) -> list[str]:
    """Reasons the layout cannot run this model on this cluster; empty when it can."""
    r: list[str] = []
    if lay.world != cluster.num_gpus:
        r.append(f"layout is for {lay.world} GPUs, the cluster has {cluster.num_gpus}")
    if lay.tp > cluster.local_gpus:
        r.append(
            f"tp({lay.tp}) is larger than the {cluster.local_gpus} GPUs of a node: "
            "keep tensor parallel inside a node"
        )
    if model.num_attention_heads % lay.tp:
        r.append(f"tp({lay.tp}) does not divide the {model.num_attention_heads} attention heads")
    if model.num_kv_heads % lay.tp and lay.tp % model.num_kv_heads:
        r.append(f"tp({lay.tp}) and the {model.num_kv_heads} kv heads do not divide one another")
    if lay.vpp > 1 and lay.pp == 1:
        r.append(f"vpp({lay.vpp}) needs pp > 1")
    if model.num_layers % (lay.pp * lay.vpp):
        r.append(f"pp({lay.pp}) * vpp({lay.vpp}) does not divide the {model.num_layers} layers")
    if not model.is_moe and (lay.ep > 1 or lay.etp > 1):
        r.append(f"ep({lay.ep}) / etp({lay.etp}) > 1 on a dense model: set both to 1")
    if model.is_moe and model.num_experts % lay.ep:
        r.append(f"ep({lay.ep}) does not divide the {model.num_experts} experts")
    if lay.cp > 1 and workload.max_seq_len % (2 * lay.cp):
        r.append(
            f"cp({lay.cp}) needs sequences divisible by 2*cp = {2 * lay.cp}; "
            f"prompt + response is {workload.max_seq_len}"
        )
    if (workload.mini_batch_size * workload.n) % lay.dp:
        r.append(
            f"mini batch {workload.mini_batch_size} * n {workload.n} is not divisible by "
            f"dp({lay.dp}): change --mini-batch or the layout"
        )
    return r


def validate(c: Candidate, model: ModelSpec, cluster: Cluster, workload: Workload) -> list[str]:
    """Reasons the candidate cannot run; an empty list means valid."""
    lay = c.layout
    r = validate_layout(lay, model, cluster, workload)
    if c.sequence_parallel and lay.tp == 1:
        r.append("sequence parallel needs tp > 1: turn it off or raise tp")
    if model.is_moe and lay.tp > 1 and not c.sequence_parallel:
        # megatron-core raises at the first training step ("performance may degrade if MoE and
        # tensor parallelism are enabled without also enabling sequence parallelism"), measured
        r.append("Megatron needs sequence parallel for a MoE model with tp > 1: turn it on")
    if c.recompute_granularity not in RECOMPUTE_GRANULARITIES:
        r.append(
            f"recompute granularity {c.recompute_granularity!r} is not one of "
            f"{RECOMPUTE_GRANULARITIES}"
        )
    if c.recompute_method not in RECOMPUTE_METHODS:
        r.append(f"recompute method {c.recompute_method!r} is not one of {RECOMPUTE_METHODS}")
    stages = lay.pp * lay.vpp
    chunk = model.num_layers // stages if model.num_layers % stages == 0 else 0
    if c.recompute_granularity == "full" and chunk and not 1 <= c.recompute_num_layers <= chunk:
        r.append(
            f"recompute_num_layers({c.recompute_num_layers}) must lie in 1..{chunk}, the "
            "layers of one pipeline chunk"
        )
    seq = workload.max_seq_len
    per_rank = workload.mini_batch_size * workload.n // lay.dp
    if c.use_dynamic_bsz:
        for name in ("ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"):
            budget = getattr(c, name)
            if budget * lay.cp < seq:
                r.append(
                    f"{name}({budget}) * cp({lay.cp}) is below one sample's "
                    f"{seq} tokens: raise it to at least {math.ceil(seq / lay.cp)}"
                )
    else:
        mb = c.ppo_micro_batch_size_per_gpu
        if mb < 1 or per_rank % mb:
            r.append(
                f"ppo_micro_batch_size_per_gpu({mb}) does not divide the {per_rank} samples "
                f"each DP rank gets per mini batch"
            )
        lmb = c.log_prob_micro_batch_size_per_gpu
        if lmb < 1:
            r.append(f"log_prob_micro_batch_size_per_gpu({lmb}) must be at least 1")
    rtp = c.rollout_tp
    if rtp < 1 or cluster.local_gpus % rtp:
        r.append(f"rollout tp({rtp}) does not divide the {cluster.local_gpus} GPUs of a node")
    if model.num_attention_heads % rtp:
        r.append(f"rollout tp({rtp}) does not divide the {model.num_attention_heads} heads")
    if model.num_kv_heads % rtp and rtp % model.num_kv_heads:
        r.append(
            f"rollout tp({rtp}) and the {model.num_kv_heads} kv heads do not divide one another"
        )
    if not 0.1 <= c.gpu_memory_utilization <= 0.95:
        r.append(f"gpu_memory_utilization({c.gpu_memory_utilization}) must lie in 0.1..0.95")
    if c.max_num_batched_tokens and c.max_num_batched_tokens < seq:
        r.append(
            f"max_num_batched_tokens({c.max_num_batched_tokens}) is below one sample's {seq} tokens"
        )
    return r


# --------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------

TOKEN_BUDGET_FACTORS = (1.0, 1.5, 2.0, 3.0, 4.0)
"""ppo_max_token_len_per_gpu as multiples of one full sample (references use 1x to 3x)."""
LOG_PROB_BUDGET_FACTORS = (1.0, 2.0, 3.0, 4.0, 6.0, 10.0)
"""log_prob_max_token_len_per_gpu as multiples of one full sample (references: 1x to 10x)."""
GPU_MEMORY_UTILIZATIONS = (0.4, 0.5, 0.6, 0.7, 0.8)
BATCHED_TOKEN_FACTORS = (1, 2)
MAX_MICRO_BATCH_LOG2 = 3
MAX_PP = 16
MAX_VPP = 4
CP_CHOICES = (1, 2, 4, 8)


class Suggester(Protocol):
    """What sample() needs from an Optuna trial (a RandomSuggester offers the same)."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...

    def suggest_int(self, name: str, low: int, high: int) -> int: ...


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def round_up(x: float, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple)


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
    """Sampler parameters (names as sample() suggests them) fixed to a value."""
    why: str = ""
    """One line for the study's first output: what is left out and why."""

    def pin(self, name: str) -> tuple[bool, Any]:
        for k, v in self.pinned:
            if k == name:
                return True, v
        return False, None

    @property
    def summary(self) -> str:
        parts = [] if self.context_parallel else ["cp1"]
        if not self.sequence_parallel:
            parts.append("nosp")
        parts += [f"{k}={v}" for k, v in self.pinned]
        return ",".join(parts)


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """The valid choices for one (model, cluster, workload); fixed for a study's life."""

    model: ModelSpec
    cluster: Cluster
    workload: Workload
    limits: SpaceLimits = field(default_factory=SpaceLimits)

    @cached_property
    def layouts(self) -> dict[str, ParallelLayout]:
        """Every valid parallel layout, by notation."""
        m, world = self.model, self.cluster.num_gpus
        out: dict[str, ParallelLayout] = {}
        experts = _divisors(m.num_experts) if m.is_moe else [1]
        for tp in _divisors(self.cluster.local_gpus):
            if tp > 1 and m.is_moe and not self.limits.sequence_parallel:
                continue  # Megatron needs sequence parallel for MoE with tp > 1
            for pp in [p for p in _divisors(m.num_layers) if p <= MAX_PP]:
                for cp in CP_CHOICES if self.limits.context_parallel else (1,):
                    if world % (tp * pp * cp):
                        continue
                    vpps = [1] + [v for v in range(2, MAX_VPP + 1) if pp > 1]
                    etps = sorted({1, tp}) if m.is_moe else [1]
                    for vpp in vpps:
                        for ep in experts:
                            for etp in etps:
                                if (world // pp) % (ep * etp):
                                    continue
                                lay = ParallelLayout(
                                    world=world, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=etp
                                )
                                if not validate_layout(lay, m, self.cluster, self.workload):
                                    out.setdefault(lay.notation, lay)
        return out

    @cached_property
    def rollout_tps(self) -> list[int]:
        m = self.model
        return [
            t
            for t in _divisors(self.cluster.local_gpus)
            if m.num_attention_heads % t == 0
            and (m.num_kv_heads % t == 0 or t % m.num_kv_heads == 0)
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

    def fingerprint(self) -> str:
        """Identifies the choices; a study refuses to resume under different choices."""
        w, c, m = self.workload, self.cluster, self.model
        return (
            f"{m.name}|{m.num_layers}x{m.hidden_size}|{c.gpu.name}x{c.num_gpus}/"
            f"{c.gpus_per_node}|{w.prompt_len}+{w.response_len}|{w.batch_size}x{w.n}/"
            f"{w.mini_batch_size}|{len(self.layouts)}"
            + (f"|{self.limits.summary}" if self.limits.summary else "")
        )


class _Limited:
    """A Suggester that answers pinned parameters itself (they are never suggested)."""

    def __init__(self, t: Suggester, limits: SpaceLimits) -> None:
        self.t, self.limits = t, limits

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        pinned, v = self.limits.pin(name)
        return v if pinned and v in choices else self.t.suggest_categorical(name, choices)

    def suggest_int(self, name: str, low: int, high: int) -> int:
        pinned, v = self.limits.pin(name)
        return int(v) if pinned and low <= v <= high else self.t.suggest_int(name, low, high)


def sample(t: Suggester, space: SearchSpace) -> Candidate:
    """Draw one candidate. Every value is drawn from choices valid for the layouts drawn so far,
    so the result passes validate() (a property test holds this)."""
    m, w = space.model, space.workload
    if space.limits.pinned:
        t = _Limited(t, space.limits)
    lay = space.layouts[t.suggest_categorical("layout", sorted(space.layouts))]
    if lay.tp == 1 or not space.limits.sequence_parallel:
        sp = False
    elif m.is_moe:
        sp = True
    else:
        sp = bool(t.suggest_categorical("sequence_parallel", [True, False]))
    gran = str(t.suggest_categorical("recompute_granularity", list(RECOMPUTE_GRANULARITIES)))
    method, nlayers = "uniform", 1
    if gran == "full":
        method = str(t.suggest_categorical("recompute_method", list(RECOMPUTE_METHODS)))
        chunk = m.num_layers // (lay.pp * lay.vpp)
        nlayers = t.suggest_int("recompute_num_layers", 1, chunk) if chunk > 1 else 1
    dyn = bool(t.suggest_categorical("use_dynamic_bsz", [True, False]))
    seq = w.max_seq_len
    kw: dict[str, Any] = {}
    if dyn:
        f = float(t.suggest_categorical("ppo_max_token_len_factor", list(TOKEN_BUDGET_FACTORS)))
        g = float(
            t.suggest_categorical("log_prob_max_token_len_factor", list(LOG_PROB_BUDGET_FACTORS))
        )
        kw["ppo_max_token_len_per_gpu"] = round_up(f * seq, 1024)
        kw["log_prob_max_token_len_per_gpu"] = round_up(g * seq, 1024)
    else:
        per_rank = w.mini_batch_size * w.n // lay.dp
        twos = (per_rank & -per_rank).bit_length() - 1  # largest power of two dividing it
        k = t.suggest_int("ppo_micro_batch_log2", 0, min(MAX_MICRO_BATCH_LOG2, twos))
        kw["ppo_micro_batch_size_per_gpu"] = 2**k
        kl = t.suggest_int("log_prob_micro_batch_log2", 0, MAX_MICRO_BATCH_LOG2 + 1)
        kw["log_prob_micro_batch_size_per_gpu"] = 2**kl
    return Candidate(
        layout=lay,
        sequence_parallel=sp,
        recompute_granularity=gran,
        recompute_method=method,
        recompute_num_layers=nlayers,
        param_offload=bool(t.suggest_categorical("param_offload", [False, True])),
        grad_offload=bool(t.suggest_categorical("grad_offload", [False, True])),
        optimizer_offload=bool(t.suggest_categorical("optimizer_offload", [False, True])),
        use_fused_kernels=bool(t.suggest_categorical("use_fused_kernels", [True, False])),
        use_dynamic_bsz=dyn,
        rollout_tp=int(t.suggest_categorical("rollout_tp", space.rollout_tps)),
        gpu_memory_utilization=float(
            t.suggest_categorical("gpu_memory_utilization", list(GPU_MEMORY_UTILIZATIONS))
        ),
        max_num_batched_tokens=seq
        * int(t.suggest_categorical("max_num_batched_tokens_factor", list(BATCHED_TOKEN_FACTORS))),
        **kw,
    )


def params_for(c: Candidate, space: SearchSpace) -> dict[str, Any]:
    """The sampler parameters that make sample() return `c` (for Optuna's enqueue_trial).

    Token budgets snap to the nearest factor the space offers."""
    seq = space.workload.max_seq_len
    p: dict[str, Any] = {"layout": c.layout.notation}
    lay = c.layout
    if lay.tp > 1 and space.limits.sequence_parallel and not space.model.is_moe:
        p["sequence_parallel"] = c.sequence_parallel
    p["recompute_granularity"] = c.recompute_granularity
    if c.recompute_granularity == "full":
        p["recompute_method"] = c.recompute_method
        if space.model.num_layers // (lay.pp * lay.vpp) > 1:
            p["recompute_num_layers"] = c.recompute_num_layers
    p["use_dynamic_bsz"] = c.use_dynamic_bsz
    if c.use_dynamic_bsz:
        p["ppo_max_token_len_factor"] = _nearest(
            c.ppo_max_token_len_per_gpu / seq, TOKEN_BUDGET_FACTORS
        )
        p["log_prob_max_token_len_factor"] = _nearest(
            c.log_prob_max_token_len_per_gpu / seq, LOG_PROB_BUDGET_FACTORS
        )
    else:
        p["ppo_micro_batch_log2"] = int(math.log2(c.ppo_micro_batch_size_per_gpu))
        p["log_prob_micro_batch_log2"] = int(math.log2(c.log_prob_micro_batch_size_per_gpu))
    p.update(
        param_offload=c.param_offload,
        grad_offload=c.grad_offload,
        optimizer_offload=c.optimizer_offload,
        use_fused_kernels=c.use_fused_kernels,
        rollout_tp=c.rollout_tp,
        gpu_memory_utilization=_nearest(c.gpu_memory_utilization, GPU_MEMORY_UTILIZATIONS),
        max_num_batched_tokens_factor=_nearest(
            (c.max_num_batched_tokens or seq) / seq, BATCHED_TOKEN_FACTORS
        ),
    )
    for name, _ in space.limits.pinned:
        p.pop(name, None)
    return p


def _nearest(x: float, choices: Sequence[float]) -> Any:
    return min(choices, key=lambda ch: abs(math.log(ch) - math.log(max(x, 1e-9))))


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
