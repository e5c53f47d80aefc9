"""The search space: every knob declared once, the Candidate, validate() and sample().

One table (`KNOBS`) declares each knob: its Candidate field, the choices the sampler offers
(derived from the model, cluster, workload and the values drawn before it), its validity rules,
the verl keys it sets, the argument of the megatron worker spec it maps to, and the term of the
cost model that scores it. `sample()`, `params_for()`, `knob_overrides()` (hence the recipes and
the verl runner), `validate()` and the CSV columns all read that table; adding a knob is one
entry here plus its cost-model term (torchtitan's parallel_dims / Optuna's distributions: one
declaration, many readers).

`sample()` draws only from choices that pass `validate()`, so a candidate the sampler emits is
always valid. `validate()` still checks every rule, because candidates also come from users,
reference recipes and resumed studies. Rules are the ones megatron-core 0.19, vLLM and verl 0.9.1
enforce, no stricter; each is named (`RULES`) and its message says what to change.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from typing import Any, Protocol

from tuner.errors import UserError
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.workload import Workload

# --------------------------------------------------------------------------------------------
# The parallel layout
# --------------------------------------------------------------------------------------------

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
    def parse(cls, text: str, world: int) -> ParallelLayout:
        """Read `tp4pp2vpp2`, `ep8cp2tp2`, `Tp4pp1cp1`, `all dp`, `pp8first10last12`; missing
        degrees are 1, a missing first/last means the even split.

        Without an explicit `etp`, expert tensor parallel is 1 (the references' MoE rows).
        """
        s = text.strip().lower().replace(" ", "")
        if not s or not s.isascii():
            raise UserError(
                f"cannot read layout {text!r}: write degrees in ASCII like tp4pp2vpp2, tp2cp2, "
                "tp4ep8 or dp8"
            )
        if s in ("alldp", "dp"):
            return cls(world=world)
        found = _DEGREE_RE.findall(s)
        if "".join(n + v for n, v in found) != s:
            raise UserError(
                f"cannot read layout {text!r}: write degrees like tp4pp2vpp2, tp2cp2, tp4ep8 or "
                "pp8first10last12"
            )
        repeated = sorted({n for n, _ in found if [m for m, _ in found].count(n) > 1})
        if repeated:
            raise UserError(
                f"layout {text!r} gives {', '.join(repeated)} more than once: "
                "write each degree once"
            )
        deg = {n: int(v) for n, v in found}
        dp = deg.pop("dp", None)
        for short, long in (("first", "first_stage_layers"), ("last", "last_stage_layers")):
            if short in deg:
                deg[long] = deg.pop(short)
        try:
            layout = cls(world=world, **deg)
        except ValueError as e:
            raise UserError(f"layout {text!r} does not fit {world} GPUs: {e}") from None
        if dp is not None and dp != layout.dp:
            raise UserError(f"layout {text!r}: dp({dp}) != world / (tp*pp*cp) = {layout.dp}")
        return layout


def balanced_split(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, int] | None:
    """(first, last) stage layers of the most balanced uneven split megatron-core accepts when
    pp·vpp does not divide the layers (94 layers on pp8: middle stages of 12, first and last
    of 11); None when the even split works or no uneven one exists. Ties go to lighter first and
    last stages (they also hold the embedding and the output layer)."""
    if pp < 2 or num_layers % (pp * vpp) == 0:
        return None
    best: tuple[tuple[int, int, int], tuple[int, int]] | None = None
    for f in range(0, num_layers + 1, vpp):
        for last in range(0, num_layers + 1 - f, vpp):
            if not (f or last):
                continue
            lay = ParallelLayout(
                world=pp, pp=pp, vpp=vpp, first_stage_layers=f, last_stage_layers=last
            )
            try:
                stages = lay.stage_layers(num_layers)
            except ValueError:
                continue
            if min(stages) <= 0:
                continue
            score = (max(stages), max(f, last), -min(f or 10**9, last or 10**9))
            if best is None or score < best[0]:
                best = (score, (f, last))
    return best[1] if best else None


# --------------------------------------------------------------------------------------------
# The candidate
# --------------------------------------------------------------------------------------------

RECOMPUTE_GRANULARITIES = ("none", "selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
RECOMPUTE_MODULES_ALLOWED = (
    "core_attn",
    "moe_act",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "shared_experts",
    "gdn_norm_out",
)
"""megatron-core 0.19 TransformerConfig: the modules selective recompute accepts."""
RECOMPUTE_MODULE_SETS_DENSE = ("core_attn", "core_attn,layernorm", "mlp", "core_attn,mlp")
RECOMPUTE_MODULE_SETS_MOE = (
    "core_attn",
    "core_attn,layernorm",
    "moe_act",
    "core_attn,moe_act",
    "moe",
)
"""What the sampler offers for selective recompute (comma-joined, as the CSV stores it)."""
ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local", "auto")
"""megatron-core 0.19 `AttnBackend` names (verl maps the string with AttnBackend[name])."""
ATTENTION_BACKEND_CHOICES = ("flash", "fused", "auto")
"""What the sampler offers: the flash-attention kernels (unfused/local build the full score
matrix, hopeless at RL sequence lengths)."""
MOE_DISPATCHERS = ("allgather", "alltoall", "flex")
"""megatron-core 0.19 `moe_token_dispatcher_type`."""
MOE_DISPATCHER_CHOICES = ("alltoall", "flex")
MAX_NUM_SEQS_CHOICES = (64, 128, 256, 512, 1024)
"""vLLM `max_num_seqs` the sampler offers; verl 0.9.1's default is 256 (rollout config)."""
VERL_DEFAULT_MAX_NUM_SEQS = 256
"""`actor_rollout_ref.rollout.max_num_seqs` in verl 0.9.1's ppo_megatron_trainer."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """One configuration of every knob; the unit a runner measures."""

    layout: ParallelLayout
    """Actor (and ref) parallel degrees."""
    sequence_parallel: bool = False
    """Megatron sequence parallel (needs tp > 1)."""
    recompute_granularity: str = "none"
    """Activation recompute: none, selective (the modules of recompute_modules) or full."""
    recompute_method: str = "uniform"
    """Full recompute: uniform (chunks of num_layers) or block (first num_layers per stage)."""
    recompute_num_layers: int = 1
    """Full recompute: layers per chunk (uniform) or layers recomputed per stage (block)."""
    recompute_modules: str = "core_attn"
    """Selective recompute: megatron-core module names, comma-joined (core_attn, layernorm, mlp,
    moe_act, moe, ...)."""
    param_offload: bool = False
    """Offload actor/ref parameters, and with them the gradients, to CPU between phases (verl
    0.9.1 has no separate gradient key)."""
    optimizer_offload: bool = False
    """Offload optimizer states to CPU between phases."""
    use_fused_kernels: bool = True
    """verl's fused log-prob/entropy kernels (no full-vocabulary logits in memory)."""
    apply_rope_fusion: bool = True
    """megatron-core fused RoPE kernel."""
    bias_activation_fusion: bool = True
    """megatron-core fused bias + activation (SwiGLU) kernel."""
    masked_softmax_fusion: bool = True
    """megatron-core fused scale-mask-softmax (used by the unfused attention backend only)."""
    gradient_accumulation_fusion: bool = True
    """Weight gradients accumulated into the fp32 main grad inside the GEMM."""
    attention_backend: str = "flash"
    """megatron-core attention backend: flash, fused (cuDNN), unfused, local or auto."""
    moe_token_dispatcher_type: str = "alltoall"
    """MoE token dispatcher: alltoall, flex (DeepEP) or allgather."""
    moe_grouped_gemm: bool = True
    """MoE experts as one grouped GEMM (else a loop over the local experts)."""
    moe_permute_fusion: bool = True
    """Fused token permute/unpermute of the MoE dispatcher."""
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
    """vLLM tensor parallel size (may span nodes)."""
    rollout_dp: int = 1
    """vLLM data parallel size inside one rollout replica (MoE: experts shard over tp*dp)."""
    rollout_ep: int = 1
    """vLLM expert parallel: 1 (off) or rollout_tp * rollout_dp (verl's rule)."""
    gpu_memory_utilization: float = 0.6
    """vLLM's share of GPU memory (weights + KV cache) during generation."""
    max_num_batched_tokens: int = 0
    """vLLM's token budget per scheduler step (0 = prompt + response)."""
    max_num_seqs: int = VERL_DEFAULT_MAX_NUM_SEQS
    """vLLM's most sequences running at once per engine (verl 0.9.1 default 256)."""

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
            "first_stage_layers": lay.first_stage_layers,
            "last_stage_layers": lay.last_stage_layers,
            **rec,
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any], world: int) -> Candidate:
        """Inverse of to_record (values may be strings, as read from a CSV). Columns of knobs
        that no longer exist (`grad_offload` of schema-1 files) are ignored; knobs a file lacks
        take their defaults."""
        deg = {k: int(rec[k]) for k in ("tp", "pp", "vpp", "cp", "ep", "etp")}
        for k in ("first_stage_layers", "last_stage_layers"):
            if rec.get(k) not in ("", None):
                deg[k] = int(rec[k])
        lay = ParallelLayout(world=world, **deg)
        kw: dict[str, Any] = {}
        for f in _FIELD_TYPES:
            if f not in rec or rec[f] in ("", None):
                continue
            kw[f] = _coerce(rec[f], _FIELD_TYPES[f])
        return cls(layout=lay, **kw)


def _coerce(value: Any, typ: type) -> Any:
    if typ is bool and isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    if typ is int and isinstance(value, str):
        return int(float(value))
    return typ(value)


_FIELD_TYPES: dict[str, type] = {
    f.name: {"bool": bool, "int": int, "float": float, "str": str}[str(f.type)]
    for f in fields(Candidate)
    if f.name != "layout"
}
CANDIDATE_FIELDS = ("first_stage_layers", "last_stage_layers", *_FIELD_TYPES)
"""CSV columns of the knobs besides the layout degrees: the uneven pipeline split, then the
Candidate fields in declaration order."""
LAYOUT_FIELDS = ("tp", "pp", "vpp", "cp", "ep", "etp", "first_stage_layers", "last_stage_layers")


def modules_of(c: Candidate) -> tuple[str, ...]:
    """The selective-recompute modules as a tuple."""
    return tuple(m for m in c.recompute_modules.split(",") if m)


# --------------------------------------------------------------------------------------------
# Shared rules other modules apply (one function each)
# --------------------------------------------------------------------------------------------


def min_token_budget(max_seq_len: int, cp: int) -> int:
    """The smallest `*_max_token_len_per_gpu` verl accepts: one whole sample must fit the
    micro-batch budget, which verl multiplies by cp (the actor's dynamic batching)."""
    return math.ceil(max_seq_len / cp)


def token_budget_problem(name: str, budget: int, cp: int, max_seq_len: int) -> str | None:
    """The sentence when a dynamic-batching budget times cp is below one sample; else None."""
    if budget * cp >= max_seq_len:
        return None
    return (
        f"{name}({budget}) * cp({cp}) is below one sample's {max_seq_len} tokens: raise it to "
        f"at least {min_token_budget(max_seq_len, cp)}"
    )


# --------------------------------------------------------------------------------------------
# Validity rules, each named
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    """One validity rule as megatron-core, vLLM or verl enforce it."""

    name: str
    """Short id, used by tests and in docs."""
    knob: str
    """The knob (Candidate field, or `layout`) the rule is about."""
    check: Callable[[Candidate, ModelSpec, Cluster, Workload], list[str]]
    """Sentences naming what to change; empty when the candidate passes."""


def _lay_rules(
    lay: ParallelLayout, m: ModelSpec, cl: Cluster, w: Workload
) -> list[tuple[str, str]]:
    r: list[tuple[str, str]] = []
    if lay.world != cl.num_gpus:
        r.append(("world", f"layout is for {lay.world} GPUs, the cluster has {cl.num_gpus}"))
    if m.num_attention_heads % lay.tp:
        r.append(
            (
                "tp_heads",
                f"tp({lay.tp}) does not divide the {m.num_attention_heads} attention heads",
            )
        )
    # megatron-core: num_query_groups must be a multiple or a divisor of tp; above the kv heads
    # each rank holds a replica of its group (TransformerConfig.__post_init__)
    if m.num_kv_heads % lay.tp and lay.tp % m.num_kv_heads:
        r.append(
            (
                "tp_kv_heads",
                f"tp({lay.tp}) and the {m.num_kv_heads} kv heads do not divide one another",
            )
        )
    if lay.vpp > 1 and lay.pp == 1:
        r.append(("vpp_needs_pp", f"vpp({lay.vpp}) needs pp > 1"))
    else:
        try:
            lay.stage_layers(m.num_layers)
        except ValueError as e:
            r.append(("pipeline_split", f"megatron-core refuses the pipeline split: {e}"))
    if not m.is_moe and (lay.ep > 1 or lay.etp > 1):
        r.append(
            ("dense_no_ep", f"ep({lay.ep}) / etp({lay.etp}) > 1 on a dense model: set both to 1")
        )
    if m.is_moe and m.num_experts % lay.ep:
        r.append(("ep_experts", f"ep({lay.ep}) does not divide the {m.num_experts} experts"))
    if lay.cp > 1 and w.max_seq_len % (2 * lay.cp):
        r.append(
            (
                "cp_seq",
                f"cp({lay.cp}) needs sequences divisible by 2*cp = {2 * lay.cp}; "
                f"prompt + response is {w.max_seq_len}",
            )
        )
    if (w.mini_batch_size * w.n) % lay.dp:
        r.append(
            (
                "mini_batch_dp",
                f"mini batch {w.mini_batch_size} * n {w.n} is not divisible by dp({lay.dp}): "
                "change --mini-batch or the layout",
            )
        )
    return r


LAYOUT_RULE_NAMES = (
    "world",
    "tp_heads",
    "tp_kv_heads",
    "vpp_needs_pp",
    "pipeline_split",
    "dense_no_ep",
    "ep_experts",
    "cp_seq",
    "mini_batch_dp",
)


def validate_layout(
    lay: ParallelLayout, model: ModelSpec, cluster: Cluster, workload: Workload
) -> list[str]:
    """Reasons the layout cannot run this model on this cluster; empty when it can."""
    return [msg for _, msg in _lay_rules(lay, model, cluster, workload)]


def _one(cond: bool, msg: str) -> list[str]:
    return [msg] if cond else []


def _sp_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    return _one(
        c.sequence_parallel and c.layout.tp == 1,
        "sequence parallel needs tp > 1: turn it off or raise tp",
    )


def _moe_sp_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    # megatron-core raises at the first training step ("performance may degrade if MoE and
    # tensor parallelism are enabled without also enabling sequence parallelism"), measured
    return _one(
        m.is_moe and c.layout.tp > 1 and not c.sequence_parallel,
        "Megatron needs sequence parallel for a MoE model with tp > 1: turn it on",
    )


def _choice_rule(name: str, allowed: Sequence[Any]) -> Callable[..., list[str]]:
    def check(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
        v = getattr(c, name)
        return _one(v not in allowed, f"{name} {v!r} is not one of {tuple(allowed)}")

    return check


def _recompute_layers_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    if c.recompute_granularity != "full":
        return []
    lay = c.layout
    try:
        stages = lay.stage_layers(m.num_layers)
    except ValueError:
        return []
    chunk = min(stages) // lay.vpp
    return _one(
        not 1 <= c.recompute_num_layers <= max(1, chunk),
        f"recompute_num_layers({c.recompute_num_layers}) must lie in 1..{max(1, chunk)}, the "
        "layers of one pipeline chunk",
    )


def _recompute_modules_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    if c.recompute_granularity != "selective":
        return []
    mods = modules_of(c)
    bad = sorted(set(mods) - set(RECOMPUTE_MODULES_ALLOWED))
    r = _one(
        bool(bad),
        f"recompute_modules {bad} are not megatron-core modules: use some of "
        f"{', '.join(RECOMPUTE_MODULES_ALLOWED)}",
    )
    # TransformerConfig: moe_act recompute needs the grouped GEMM
    r += _one(
        "moe_act" in mods and not c.moe_grouped_gemm,
        "recompute module moe_act needs moe_grouped_gemm: turn it on or drop moe_act",
    )
    r += _one("mla_up_proj" in mods, "recompute module mla_up_proj needs multi-latent attention")
    r += _one("gdn_norm_out" in mods, "recompute module gdn_norm_out needs gated delta net")
    return r


def _budget_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    if not c.use_dynamic_bsz:
        return []
    out = []
    for name in ("ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"):
        p = token_budget_problem(name, getattr(c, name), c.layout.cp, w.max_seq_len)
        if p:
            out.append(p)
    return out


def _micro_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    if c.use_dynamic_bsz:
        return []
    per_rank = w.mini_batch_size * w.n // c.layout.dp
    mb = c.ppo_micro_batch_size_per_gpu
    r = _one(
        mb < 1 or per_rank % mb != 0,
        f"ppo_micro_batch_size_per_gpu({mb}) does not divide the {per_rank} samples each DP rank "
        "gets per mini batch",
    )
    lmb = c.log_prob_micro_batch_size_per_gpu
    r += _one(lmb < 1, f"log_prob_micro_batch_size_per_gpu({lmb}) must be at least 1")
    return r


def _rollout_tp_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    rtp, local = c.rollout_tp, cl.local_gpus
    if rtp < 1:
        return [f"rollout tp({rtp}) must be at least 1"]
    r: list[str] = []
    # verl RolloutReplica: a replica of tp*dp GPUs is whole nodes or part of one node; vLLM runs
    # TP across nodes (Ray), so tp may exceed a node
    world = rtp * c.rollout_dp
    r += _one(
        world % min(local, world) != 0 or cl.num_gpus % world != 0,
        f"rollout tp({rtp}) * dp({c.rollout_dp}) = {world} must divide the {cl.num_gpus} GPUs and "
        f"be whole {local}-GPU nodes or fit in one",
    )
    r += _one(
        m.num_attention_heads % rtp != 0,
        f"rollout tp({rtp}) does not divide the {m.num_attention_heads} heads",
    )
    # vLLM: kv heads are split when tp divides them and replicated when kv heads divide tp
    r += _one(
        m.num_kv_heads % rtp != 0 and rtp % m.num_kv_heads != 0,
        f"rollout tp({rtp}) and the {m.num_kv_heads} kv heads do not divide one another",
    )
    return r


def _rollout_dp_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    d = c.rollout_dp
    if d < 1:
        return [f"rollout dp({d}) must be at least 1"]
    # vllm_async_server: data parallel needs gpus_per_node divisible by tp
    return _one(
        d > 1 and cl.local_gpus % c.rollout_tp != 0,
        f"rollout dp({d}) > 1 needs rollout tp({c.rollout_tp}) to divide the {cl.local_gpus} GPUs "
        "of a node",
    )


def _rollout_ep_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    e = c.rollout_ep
    # verl RolloutConfig.__post_init__: expert_parallel_size == tp * dp when > 1
    r = _one(
        e > 1 and e != c.rollout_tp * c.rollout_dp,
        f"rollout ep({e}) must be 1 or rollout tp * dp = {c.rollout_tp * c.rollout_dp}",
    )
    r += _one(e > 1 and not m.is_moe, f"rollout ep({e}) > 1 on a dense model: set it to 1")
    r += _one(
        e > 1 and m.is_moe and m.num_experts % e != 0,
        f"rollout ep({e}) does not divide the {m.num_experts} experts",
    )
    return r


def _util_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    u = c.gpu_memory_utilization
    return _one(not 0.1 <= u <= 0.95, f"gpu_memory_utilization({u}) must lie in 0.1..0.95")


def _mnbt_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    t, seq = c.max_num_batched_tokens, w.max_seq_len
    return _one(
        bool(t) and t < seq,
        f"max_num_batched_tokens({t}) is below one sample's {seq} tokens",
    )


def _max_num_seqs_rule(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
    return _one(c.max_num_seqs < 1, f"max_num_seqs({c.max_num_seqs}) must be at least 1")


def _layout_rule(name: str) -> Callable[..., list[str]]:
    def check(c: Candidate, m: ModelSpec, cl: Cluster, w: Workload) -> list[str]:
        return [msg for n, msg in _lay_rules(c.layout, m, cl, w) if n == name]

    return check


RULES: tuple[Rule, ...] = (
    *(Rule(n, "layout", _layout_rule(n)) for n in LAYOUT_RULE_NAMES),
    Rule("sp_needs_tp", "sequence_parallel", _sp_rule),
    Rule("moe_tp_needs_sp", "sequence_parallel", _moe_sp_rule),
    Rule(
        "recompute_granularity",
        "recompute_granularity",
        _choice_rule("recompute_granularity", RECOMPUTE_GRANULARITIES),
    ),
    Rule(
        "recompute_method", "recompute_method", _choice_rule("recompute_method", RECOMPUTE_METHODS)
    ),
    Rule("recompute_num_layers", "recompute_num_layers", _recompute_layers_rule),
    Rule("recompute_modules", "recompute_modules", _recompute_modules_rule),
    Rule(
        "attention_backend",
        "attention_backend",
        _choice_rule("attention_backend", ATTENTION_BACKENDS),
    ),
    Rule(
        "moe_token_dispatcher_type",
        "moe_token_dispatcher_type",
        _choice_rule("moe_token_dispatcher_type", MOE_DISPATCHERS),
    ),
    Rule("token_budget", "ppo_max_token_len_per_gpu", _budget_rule),
    Rule("micro_batch", "ppo_micro_batch_size_per_gpu", _micro_rule),
    Rule("rollout_tp", "rollout_tp", _rollout_tp_rule),
    Rule("rollout_dp", "rollout_dp", _rollout_dp_rule),
    Rule("rollout_ep", "rollout_ep", _rollout_ep_rule),
    Rule("gpu_memory_utilization", "gpu_memory_utilization", _util_rule),
    Rule("max_num_batched_tokens", "max_num_batched_tokens", _mnbt_rule),
    Rule("max_num_seqs", "max_num_seqs", _max_num_seqs_rule),
)


def broken_rules(
    c: Candidate, model: ModelSpec, cluster: Cluster, workload: Workload
) -> list[tuple[str, str]]:
    """(rule name, sentence) of every rule the candidate breaks."""
    return [(rule.name, msg) for rule in RULES for msg in rule.check(c, model, cluster, workload)]


def validate(c: Candidate, model: ModelSpec, cluster: Cluster, workload: Workload) -> list[str]:
    """Reasons the candidate cannot run; an empty list means valid."""
    return [msg for _, msg in broken_rules(c, model, cluster, workload)]


def check_candidate(c: Candidate, model: ModelSpec, cluster: Cluster, workload: Workload) -> None:
    """Raise one UserError line naming every broken rule (what `tune estimate --layout` shows)."""
    broken = broken_rules(c, model, cluster, workload)
    if broken:
        raise UserError(
            f"layout {c.layout.spec}: " + "; ".join(f"[{n}] {msg}" for n, msg in broken)
        )


# --------------------------------------------------------------------------------------------
# The knob table
# --------------------------------------------------------------------------------------------

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
TF_CONFIG = "megatron.override_transformer_config"

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
ROLLOUT_DP_CHOICES = (1, 2, 4, 8)
BOOLS = (True, False)

Drawn = dict[str, Any]
"""Values drawn so far in sample()/params_for(), by knob name (`layout` included)."""
Choices = Callable[["SearchSpace", Drawn], Sequence[Any] | None]


def _identity(v: Any, *_: Any) -> Any:
    return v


def _always(c: Candidate, m: ModelSpec | None) -> bool:
    return True


def _null_if_one(v: Any) -> Any:
    return None if v == 1 else v


def _null_if_zero(v: Any) -> Any:
    return None if v == 0 else v


@dataclass(frozen=True, slots=True, kw_only=True)
class Knob:
    """One tuner knob, declared once: what it is, what the sampler offers, what verl key it sets,
    what the megatron worker calls it and what the cost model reads."""

    name: str
    """Candidate field (or ParallelLayout field; `layout` is the layout itself)."""
    help: str
    """One line for docs and `tune show`."""
    verl_keys: tuple[str, ...] = ()
    """Full dotted keys (actor and ref get the same value); a leading `+` adds a key verl's
    schema leaves open. Empty only for `layout` (its degrees are knobs of their own)."""
    worker_arg: str = ""
    """Argument of the megatron worker spec (`section.name`); empty for rollout knobs."""
    cost: str
    """The cost-model term that scores it (tuner/estimate), or `neutral prior: <why>` where no
    model exists yet and the measured runner decides."""
    choices: Choices | None = None
    """Sampler values valid given what was drawn before (None: not sampled, the default or the
    layout's value stands; one value: fixed, not suggested)."""
    param: str = ""
    """Sampler parameter name (default: the knob name)."""
    int_range: bool = False
    """The choices are a contiguous int range drawn with suggest_int."""
    decode: Callable[[Any, SearchSpace, Drawn], Any] = _identity
    """Sampler value -> field value."""
    encode: Callable[[Any, SearchSpace, Drawn], Any] = _identity
    """Field value -> sampler value (params_for)."""
    to_verl: Callable[[Any], Any] = _identity
    """Value as verl wants it; None becomes `null`."""
    when: Callable[[Candidate, ModelSpec | None], bool] = _always
    """Whether the keys are emitted (e.g. recompute keys only when on, MoE keys on MoE models)."""

    @property
    def sampler_param(self) -> str:
        return self.param or self.name

    def value(self, c: Candidate) -> Any:
        if self.name == "layout":
            return c.layout
        if self.name in LAYOUT_FIELDS:
            return getattr(c.layout, self.name)
        return getattr(c, self.name)

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in RULES if r.knob == self.name)


def _both(suffix: str) -> tuple[str, ...]:
    return (f"{ACTOR}.{suffix}", f"{REF}.{suffix}")


def _tf(key: str, declared: bool = False) -> tuple[str, ...]:
    """An override_transformer_config key of the actor (the ref's follows it by interpolation);
    `+` unless verl declares the key."""
    return (("" if declared else "+") + f"{ACTOR}.{TF_CONFIG}.{key}",)


def _moe(c: Candidate, m: ModelSpec | None) -> bool:
    return m is not None and m.is_moe


def _moe_space(choices: Sequence[Any]) -> Choices:
    return lambda s, d: list(choices) if s.model.is_moe else None


def _sp_choices(s: SearchSpace, d: Drawn) -> Sequence[Any]:
    lay = d["layout"]
    if lay.tp == 1 or not s.limits.sequence_parallel:
        return [False]
    return [True] if s.model.is_moe else [True, False]


def _chunk(s: SearchSpace, lay: ParallelLayout) -> int:
    return max(1, min(lay.stage_layers(s.model.num_layers)) // lay.vpp)


def _nlayers_choices(s: SearchSpace, d: Drawn) -> Sequence[Any] | None:
    if d["recompute_granularity"] != "full":
        return None
    return list(range(1, _chunk(s, d["layout"]) + 1))


def _modules_choices(s: SearchSpace, d: Drawn) -> Sequence[Any] | None:
    if d["recompute_granularity"] != "selective":
        return None
    # a fixed list per model (Optuna's categorical choices may not change between trials);
    # moe_grouped_gemm, drawn after, follows it (moe_act needs the grouped GEMM)
    return list(RECOMPUTE_MODULE_SETS_MOE if s.model.is_moe else RECOMPUTE_MODULE_SETS_DENSE)


def _grouped_gemm_choices(s: SearchSpace, d: Drawn) -> Sequence[Any] | None:
    if not s.model.is_moe:
        return None
    needs = d.get("recompute_granularity") == "selective" and "moe_act" in str(
        d.get("recompute_modules", "")
    )
    return [True] if needs else list(BOOLS)


def _budget(factors: Sequence[float]) -> dict[str, Any]:
    return dict(
        choices=lambda s, d: list(factors) if d["use_dynamic_bsz"] else None,
        decode=lambda f, s, d: round_up(float(f) * s.workload.max_seq_len, 1024),
        encode=lambda v, s, d: _nearest(v / s.workload.max_seq_len, factors),
    )


def _micro_choices(s: SearchSpace, d: Drawn) -> Sequence[Any] | None:
    if d["use_dynamic_bsz"]:
        return None
    w, lay = s.workload, d["layout"]
    per_rank = w.mini_batch_size * w.n // lay.dp
    twos = (per_rank & -per_rank).bit_length() - 1  # largest power of two dividing it
    return list(range(0, min(MAX_MICRO_BATCH_LOG2, twos) + 1))


def _log2(v: Any, *_: Any) -> int:
    return int(math.log2(v))


def _pow2(k: Any, *_: Any) -> int:
    return int(2 ** int(k))


def _rollout_dp_choices(s: SearchSpace, d: Drawn) -> Sequence[Any] | None:
    """log2 of the rollout DP sizes valid with the drawn rollout TP (an int range: Optuna lets
    int ranges change between trials, not categorical lists)."""
    if not s.model.is_moe:
        return None
    rtp, cl = d["rollout_tp"], s.cluster
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


def _rollout_ep_choices(s: SearchSpace, d: Drawn) -> Sequence[Any] | None:
    """Whether vLLM runs the experts expert-parallel (ep = tp * dp, verl's rule)."""
    if not s.model.is_moe:
        return None
    g = d["rollout_tp"] * d.get("rollout_dp", 1)
    return [False, True] if g > 1 and s.model.num_experts % g == 0 else [False]


KNOBS: tuple[Knob, ...] = (
    Knob(
        name="layout",
        help="actor/ref parallel layout (degrees below)",
        cost="time: every training phase (_layout_lin, phase_times_of); memory: every shard",
        choices=lambda s, d: sorted(s.layouts),
        decode=lambda v, s, d: s.layouts[v],
        encode=lambda lay, s, d: lay.notation,
    ),
    Knob(
        name="tp",
        help="tensor parallel",
        verl_keys=_both("megatron.tensor_model_parallel_size"),
        worker_arg="layout.tp",
        cost="time: _layout_lin(tp)",
    ),
    Knob(
        name="pp",
        help="pipeline parallel",
        verl_keys=_both("megatron.pipeline_model_parallel_size"),
        worker_arg="layout.pp",
        cost="time: pipeline bubble and p2p (phase_times_of)",
    ),
    Knob(
        name="vpp",
        help="virtual pipeline stages (null = off)",
        verl_keys=_both("megatron.virtual_pipeline_model_parallel_size"),
        worker_arg="layout.vpp",
        cost="time: bubble / vpp",
        to_verl=_null_if_one,
    ),
    Knob(
        name="first_stage_layers",
        help="layers of the first pipeline stage (0 = even split)",
        verl_keys=_tf("num_layers_in_first_pipeline_stage"),
        worker_arg="layout.first_stage_layers",
        cost="time: the slowest stage's layers (phase_times_of)",
        to_verl=_null_if_zero,
        when=lambda c, m: c.layout.first_stage_layers > 0,
    ),
    Knob(
        name="last_stage_layers",
        help="layers of the last pipeline stage (0 = even split)",
        verl_keys=_tf("num_layers_in_last_pipeline_stage"),
        worker_arg="layout.last_stage_layers",
        cost="time: the slowest stage's layers (phase_times_of)",
        to_verl=_null_if_zero,
        when=lambda c, m: c.layout.last_stage_layers > 0,
    ),
    Knob(
        name="cp",
        help="context parallel",
        verl_keys=_both("megatron.context_parallel_size"),
        worker_arg="layout.cp",
        cost="time: _layout_lin(cp) ring exchange",
    ),
    Knob(
        name="ep",
        help="expert parallel",
        verl_keys=_both("megatron.expert_model_parallel_size"),
        worker_arg="layout.ep",
        cost="time: _layout_lin(ep) all-to-all",
    ),
    Knob(
        name="etp",
        help="expert tensor parallel",
        verl_keys=_both("megatron.expert_tensor_parallel_size"),
        worker_arg="layout.etp",
        cost="time: _layout_lin(etp)",
    ),
    Knob(
        name="sequence_parallel",
        help="sequence parallel",
        verl_keys=_both("megatron.sequence_parallel"),
        worker_arg="layout.sp",
        cost="time: _layout_lin(sp) collectives; memory: activations / tp",
        choices=_sp_choices,
    ),
    Knob(
        name="moe_token_dispatcher_type",
        help="MoE token dispatcher",
        verl_keys=_tf("moe_token_dispatcher_type"),
        worker_arg="transformer.moe_token_dispatcher_type",
        cost="time: _layout_lin dispatch (allgather volume); flex vs alltoall is a neutral prior",
        choices=_moe_space(MOE_DISPATCHER_CHOICES),
        when=_moe,
    ),
    Knob(
        name="moe_permute_fusion",
        help="MoE fused permute",
        verl_keys=_tf("moe_permute_fusion"),
        worker_arg="transformer.moe_permute_fusion",
        cost="time: _layout_lin permute passes",
        choices=_moe_space(BOOLS),
        when=_moe,
    ),
    Knob(
        name="recompute_granularity",
        help="activation recompute granularity",
        verl_keys=_tf("recompute_granularity", declared=True),
        worker_arg="recompute.granularity",
        cost="time: recompute term (phase_times_of); memory: kept activations",
        choices=lambda s, d: list(RECOMPUTE_GRANULARITIES),
        to_verl=lambda v: None if v == "none" else v,  # megatron-core: None = no recompute
    ),
    Knob(
        name="recompute_method",
        help="full recompute method",
        verl_keys=_tf("recompute_method", declared=True),
        worker_arg="recompute.method",
        cost="time: recompute fraction (block)",
        choices=lambda s, d: (
            list(RECOMPUTE_METHODS) if d["recompute_granularity"] == "full" else None
        ),
        when=lambda c, m: c.recompute_granularity == "full",
    ),
    Knob(
        name="recompute_num_layers",
        help="full recompute layers",
        verl_keys=_tf("recompute_num_layers", declared=True),
        worker_arg="recompute.num_layers",
        cost="time: recompute fraction (block)",
        choices=_nlayers_choices,
        int_range=True,
        when=lambda c, m: c.recompute_granularity == "full",
    ),
    Knob(
        name="recompute_modules",
        help="selective recompute modules",
        verl_keys=_tf("recompute_modules", declared=True),
        worker_arg="recompute.modules",
        cost="time: forward of each listed module repeated (_Lin.*_fwd_slope)",
        choices=_modules_choices,
        to_verl=lambda v: [x for x in str(v).split(",") if x],
        when=lambda c, m: c.recompute_granularity == "selective",
    ),
    Knob(
        name="moe_grouped_gemm",
        help="MoE grouped GEMM",
        verl_keys=_tf("moe_grouped_gemm"),
        worker_arg="transformer.moe_grouped_gemm",
        cost="time: _layout_lin per-expert GEMM launches when off",
        choices=_grouped_gemm_choices,
        when=_moe,
    ),
    Knob(
        name="param_offload",
        help="offload parameters and gradients",
        verl_keys=_both("megatron.param_offload"),
        worker_arg="offload.param",
        cost="time: PCIe copies of weights and grads; memory: weights and grads leave the GPU",
        choices=lambda s, d: [False, True],
    ),
    Knob(
        name="optimizer_offload",
        help="offload optimizer",
        verl_keys=(f"{ACTOR}.megatron.optimizer_offload",),
        worker_arg="offload.optimizer",
        cost="time: PCIe copies of the optimizer shard; memory: optimizer leaves the GPU",
        choices=lambda s, d: [False, True],
    ),
    Knob(
        name="use_fused_kernels",
        help="verl fused log-prob kernels",
        verl_keys=("actor_rollout_ref.model.use_fused_kernels",),
        worker_arg="",
        cost="time: _logits_slope; memory: logits",
        choices=lambda s, d: [True, False],
    ),
    Knob(
        name="apply_rope_fusion",
        help="fused RoPE",
        verl_keys=_tf("apply_rope_fusion"),
        worker_arg="transformer.apply_rope_fusion",
        cost="time: _layout_lin elementwise passes over q and k",
        choices=lambda s, d: list(BOOLS),
    ),
    Knob(
        name="bias_activation_fusion",
        help="fused bias + SwiGLU",
        verl_keys=_tf("bias_activation_fusion"),
        worker_arg="transformer.bias_activation_fusion",
        cost="time: _layout_lin elementwise passes over the MLP activation",
        choices=lambda s, d: list(BOOLS),
    ),
    Knob(
        name="masked_softmax_fusion",
        help="fused masked softmax (unfused attention backend only)",
        verl_keys=_tf("masked_softmax_fusion"),
        worker_arg="transformer.masked_softmax_fusion",
        cost="time: score-matrix passes of the unfused/local backend; neutral under flash/fused",
        choices=lambda s, d: None,
    ),
    Knob(
        name="gradient_accumulation_fusion",
        help="wgrad accumulated in the GEMM",
        verl_keys=_tf("gradient_accumulation_fusion"),
        worker_arg="transformer.gradient_accumulation_fusion",
        cost="time: _layout_lin backward fp32 main-grad read/write",
        choices=lambda s, d: list(BOOLS),
    ),
    Knob(
        name="attention_backend",
        help="megatron attention backend",
        verl_keys=_tf("attention_backend", declared=True),
        worker_arg="transformer.attention_backend",
        cost="neutral prior: flash, fused and auto score alike (no measured model yet, the "
        "measured runner decides); unfused/local: score-matrix cost in _layout_lin",
        choices=lambda s, d: list(ATTENTION_BACKEND_CHOICES),
    ),
    Knob(
        name="use_dynamic_bsz",
        help="dynamic batch size",
        verl_keys=(
            f"{ACTOR}.use_dynamic_bsz",
            f"{REF}.log_prob_use_dynamic_bsz",
            f"{ROLLOUT}.log_prob_use_dynamic_bsz",
        ),
        worker_arg="batch.use_dynamic_bsz",
        cost="time: micro-batch count (phase_times_of)",
        choices=lambda s, d: [True, False],
    ),
    Knob(
        name="ppo_max_token_len_per_gpu",
        help="actor tokens per micro-batch per GPU",
        verl_keys=(f"{ACTOR}.ppo_max_token_len_per_gpu",),
        worker_arg="batch.max_token_len_per_gpu",
        cost="time: update micro-batches; memory: activations",
        param="ppo_max_token_len_factor",
        when=lambda c, m: c.use_dynamic_bsz,
        **_budget(TOKEN_BUDGET_FACTORS),
    ),
    Knob(
        name="log_prob_max_token_len_per_gpu",
        help="log-prob tokens per micro-batch per GPU",
        verl_keys=(
            f"{REF}.log_prob_max_token_len_per_gpu",
            f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
        ),
        cost="time: log-prob micro-batches; memory: log-prob activations",
        param="log_prob_max_token_len_factor",
        when=lambda c, m: c.use_dynamic_bsz,
        **_budget(LOG_PROB_BUDGET_FACTORS),
    ),
    Knob(
        name="ppo_micro_batch_size_per_gpu",
        help="actor samples per micro-batch per GPU",
        verl_keys=(f"{ACTOR}.ppo_micro_batch_size_per_gpu",),
        worker_arg="batch.micro_batch_size_per_gpu",
        cost="time: update micro-batches; memory: activations",
        param="ppo_micro_batch_log2",
        choices=_micro_choices,
        int_range=True,
        decode=_pow2,
        encode=_log2,
        when=lambda c, m: not c.use_dynamic_bsz,
    ),
    Knob(
        name="log_prob_micro_batch_size_per_gpu",
        help="log-prob samples per micro-batch per GPU",
        verl_keys=(
            f"{REF}.log_prob_micro_batch_size_per_gpu",
            f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",
        ),
        cost="time: log-prob micro-batches; memory: log-prob activations",
        param="log_prob_micro_batch_log2",
        choices=lambda s, d: (
            None if d["use_dynamic_bsz"] else list(range(0, MAX_MICRO_BATCH_LOG2 + 2))
        ),
        int_range=True,
        decode=_pow2,
        encode=_log2,
        when=lambda c, m: not c.use_dynamic_bsz,
    ),
    Knob(
        name="rollout_tp",
        help="vLLM tensor parallel (may span nodes)",
        verl_keys=(f"{ROLLOUT}.tensor_model_parallel_size",),
        cost="time: _generation engines, _decode_step_s TP all-reduce (inter-node beyond a node)",
        choices=lambda s, d: s.rollout_tps,
    ),
    Knob(
        name="rollout_dp",
        help="vLLM data parallel inside a replica (MoE)",
        verl_keys=(f"{ROLLOUT}.data_parallel_size",),
        cost="time: _decode_step_s expert weights over tp*dp and their collectives",
        param="rollout_dp_log2",
        choices=_rollout_dp_choices,
        int_range=True,
        decode=_pow2,
        encode=_log2,
    ),
    Knob(
        name="rollout_ep",
        help="vLLM expert parallel (1 or tp*dp)",
        verl_keys=(f"{ROLLOUT}.expert_parallel_size",),
        cost="time: _decode_step_s all-to-all instead of expert-TP all-reduce",
        param="rollout_expert_parallel",
        choices=_rollout_ep_choices,
        decode=lambda on, s, d: d["rollout_tp"] * d.get("rollout_dp", 1) if on else 1,
        encode=lambda v, s, d: v > 1,
    ),
    Knob(
        name="gpu_memory_utilization",
        help="vLLM memory share",
        verl_keys=(f"{ROLLOUT}.gpu_memory_utilization",),
        cost="memory: KV cache -> time: _generation concurrency",
        choices=lambda s, d: list(GPU_MEMORY_UTILIZATIONS),
        encode=lambda v, s, d: _nearest(v, GPU_MEMORY_UTILIZATIONS),
    ),
    Knob(
        name="max_num_batched_tokens",
        help="vLLM tokens per scheduler step",
        verl_keys=(f"{ROLLOUT}.max_num_batched_tokens",),
        cost="time: _generation concurrency bound; memory: vLLM activations",
        param="max_num_batched_tokens_factor",
        choices=lambda s, d: list(BATCHED_TOKEN_FACTORS),
        decode=lambda f, s, d: s.workload.max_seq_len * int(f),
        encode=lambda v, s, d: _nearest(
            (v or s.workload.max_seq_len) / s.workload.max_seq_len, BATCHED_TOKEN_FACTORS
        ),
    ),
    Knob(
        name="max_num_seqs",
        help="vLLM sequences per engine at once",
        verl_keys=(f"{ROLLOUT}.max_num_seqs",),
        cost="time: _generation concurrency (busy phase steps); memory: sampler logits",
        choices=lambda s, d: list(MAX_NUM_SEQS_CHOICES),
    ),
)
KNOB_BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
NEUTRAL_PRIOR = "neutral prior"
"""Prefix of `Knob.cost` for knobs the cost model scores alike on purpose."""


def knob_overrides(c: Candidate, m: ModelSpec | None = None) -> dict[str, Any]:
    """Every verl key the candidate sets, with its value (None means null). MoE knobs are
    emitted only with a MoE `m`."""
    out: dict[str, Any] = {}
    for k in KNOBS:
        if not k.verl_keys or not k.when(c, m):
            continue
        v = k.to_verl(k.value(c))
        for key in k.verl_keys:
            out[key] = v
    return out


def worker_args(c: Candidate) -> dict[str, Any]:
    """Candidate values by megatron worker spec argument (`section.name`), for the runner that
    builds the worker spec."""
    return {k.worker_arg: k.value(c) for k in KNOBS if k.worker_arg}


# --------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------


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
        """Every valid parallel layout, by notation. Where pp·vpp does not divide the layers the
        most balanced uneven split megatron-core accepts stands for that (pp, vpp)."""
        m, world = self.model, self.cluster.num_gpus
        out: dict[str, ParallelLayout] = {}
        experts = _divisors(m.num_experts) if m.is_moe else [1]
        for tp in _divisors(self.cluster.local_gpus):
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
                                if not validate_layout(lay, m, self.cluster, self.workload):
                                    out.setdefault(lay.notation, lay)
        return out

    @cached_property
    def rollout_tps(self) -> list[int]:
        """vLLM TP sizes: divisors of a node, and whole multiples of a node (TP across nodes)."""
        m, cl = self.model, self.cluster
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
    """Draw one candidate, knob by knob in KNOBS order. Every value is drawn from choices valid
    for the values drawn before it, so the result passes validate() (a property test holds
    this). A knob with one valid choice takes it without a suggestion."""
    if space.limits.pinned:
        t = _Limited(t, space.limits)
    drawn: Drawn = {}
    for k in KNOBS:
        if k.choices is None:
            continue
        ch = k.choices(space, drawn)
        if ch is None:
            continue
        ch = list(ch)
        if len(ch) == 1:
            v = ch[0]
        elif k.int_range:
            v = t.suggest_int(k.sampler_param, ch[0], ch[-1])
        else:
            v = t.suggest_categorical(k.sampler_param, ch)
        drawn[k.name] = k.decode(v, space, drawn)
    lay = drawn.pop("layout")
    return Candidate(layout=lay, **drawn)


def params_for(c: Candidate, space: SearchSpace) -> dict[str, Any]:
    """The sampler parameters that make sample() return `c` (for Optuna's enqueue_trial).

    Token budgets and shares snap to the nearest value the space offers."""
    drawn: Drawn = {}
    p: dict[str, Any] = {}
    for k in KNOBS:
        if k.choices is None:
            continue
        ch = k.choices(space, drawn)
        if ch is None:
            continue
        v = k.value(c)
        if len(ch) > 1:
            p[k.sampler_param] = k.encode(v, space, drawn)
        drawn[k.name] = v
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
