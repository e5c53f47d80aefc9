"""The worker's spec (schema 2): what one trial measures, parsed and checked with no torch.

The model section is `tuner.models.ModelSpec`'s own fields and the layout is a
`tuner.space.ParallelLayout` (its world and LAYOUT_FIELDS); the knobs' keys and their types are
the knob table's (`tuner.space.WORKER_KEYS`: the runner writes them by it, `_knobs` reads them by
it into the field of the same name), and the rules a spec can break that the search space has
too are checked by the search space's own functions (`WorkerSpec.check`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.models import ModelSpec
from tuner.space import (
    ATTENTION_BACKENDS,
    LAYOUT_FIELDS,
    RECOMPUTE_GRANULARITIES,
    RECOMPUTE_METHODS,
    WORKER_KEYS,
    ParallelLayout,
    choice_problems,
    layout_model_rules,
    recompute_layers_problems,
    sequence_parallel_problems,
)

SCHEMA = 2
PHASES = ("old_log_prob", "update_actor")
"""The training-side phases of verl's step that the worker runs, in this order."""
LAYER_SPECS = ("local", "te")
"""The megatron-core layers the worker builds: `local` (megatron-core's local spec with the
worker's flash core attention and grouped-GEMM experts, what the committed leaderboards ran) or
`te` (transformer-engine layers, as verl builds its actor: model.te_block_spec)."""


def _get(d: Mapping[str, Any], key: str, kind: type, where: str, default: Any = ...) -> Any:
    """`d[key]` checked to be of `kind` (int, float, bool, str, or list of strings, read as a
    tuple); `default` where `d` lacks it (none: the key is required)."""
    at = f"{where}.{key}" if where else key
    if key not in d:
        if default is ...:
            raise ValueError(f"spec {where or 'top level'} lacks {key!r}")
        return default
    v = d[key]
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ValueError(f"spec {at} must be an integer, got {v!r}")
    if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise ValueError(f"spec {at} must be a number, got {v!r}")
    if kind is bool and not isinstance(v, bool):
        raise ValueError(f"spec {at} must be true or false, got {v!r}")
    if kind is str and not isinstance(v, str):
        raise ValueError(f"spec {at} must be a string, got {v!r}")
    if kind is list:
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ValueError(f"spec {at} must be a list of strings, got {v!r}")
        return tuple(v)
    return v


def _knobs(d: Mapping[str, Any], section: str, cls: type) -> dict[str, Any]:
    """The knobs of one section of the spec (`""`: its top level) by the knob table's keys and
    types (tuner.space.WORKER_KEYS), for `cls`'s fields of the same names, at `cls`'s default
    where the spec lacks one. A key the table has and `cls` does not is checked and left out (the
    worker runs without it)."""
    own = {f.name: f.default for f in fields(cls)}
    out = {}
    for k in WORKER_KEYS:
        if k.section != section:
            continue
        default = own.get(k.name)
        v = _get(d, k.name, k.kind, section, ... if default is MISSING else default)
        if k.name in own:
            out[k.name] = v
    return out


def _positive(where: str, **values: int) -> None:
    for k, v in values.items():
        if v <= 0:
            raise ValueError(f"spec {where}.{k} must be positive, got {v}")


def parse_model(d: Mapping[str, Any]) -> ModelSpec:
    """A ModelSpec from the spec's model section (ModelSpec's field names)."""
    known = {f.name: f for f in fields(ModelSpec)}
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ValueError(f"spec model has unknown fields {unknown}")
    try:
        return ModelSpec(**dict(d))
    except (TypeError, UserError) as e:
        raise ValueError(f"spec model: {e}") from None


_LAYOUT_DEFAULTS = {f.name: f.default for f in fields(ParallelLayout)}


def parse_layout(d: Mapping[str, Any]) -> ParallelLayout:
    w = "layout"
    kw = {k: _get(d, k, int, w, _LAYOUT_DEFAULTS[k]) for k in LAYOUT_FIELDS}
    try:
        return ParallelLayout(world=_get(d, "world", int, w), **kw)
    except ValueError as e:
        raise ValueError(f"spec layout: {e}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class RecomputeCfg:
    granularity: str = "none"
    """none, selective or full."""
    method: str = "uniform"
    num_layers: int = 0
    modules: tuple[str, ...] = ("core_attn",)
    """Selective recompute: megatron-core module names."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RecomputeCfg:
        return cls(**_knobs(d, "recompute", cls))


@dataclass(frozen=True, kw_only=True, slots=True)
class OffloadCfg:
    param: bool = False
    """Parameters and, with them, gradients (verl 0.9.1 `megatron.param_offload`)."""
    optimizer: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OffloadCfg:
        return cls(**_knobs(d, "offload", cls))


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelCfg:
    """The candidate's kernel choices the transformer-engine layers run (layer_spec te), each
    named as megatron-core's TransformerConfig names it (model.te_kernel_kwargs passes them on);
    the local layers build their own fixed set (model.config_kwargs) and ignore these."""

    apply_rope_fusion: bool = False
    bias_activation_fusion: bool = False
    moe_grouped_gemm: bool = False
    """MoE: TEGroupedMLP (True) or SequentialMLP of TE linears (False)."""
    moe_permute_fusion: bool = False
    attention_backend: str = "auto"
    """megatron-core AttnBackend name (TEDotProductAttention picks its kernel by it)."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KernelCfg:
        return cls(**_knobs(d, "kernels", cls))


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchCfg:
    sequence_lengths: tuple[int, ...]
    """One step's samples (of the mini-batches run), prompt + response tokens each."""
    mini_batch_size: int
    """Samples per optimizer step (verl: ppo_mini_batch_size * rollout.n)."""
    use_dynamic_bsz: bool
    max_token_len_per_gpu: int = 0
    """Update: ppo_max_token_len_per_gpu (dynamic batching)."""
    micro_batch_size_per_gpu: int = 0
    """Update: ppo_micro_batch_size_per_gpu (fixed batching)."""
    log_prob_max_token_len_per_gpu: int = 0
    """old_log_prob: log_prob_max_token_len_per_gpu (dynamic batching)."""
    log_prob_micro_batch_size_per_gpu: int = 0
    """old_log_prob: log_prob_micro_batch_size_per_gpu (fixed batching)."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BatchCfg:
        w = "batch"
        lens = d.get("sequence_lengths")
        if not isinstance(lens, list) or not lens:
            raise ValueError("spec batch.sequence_lengths must be a non-empty list of integers")
        if any(isinstance(x, bool) or not isinstance(x, int) or x <= 0 for x in lens):
            raise ValueError("spec batch.sequence_lengths must hold positive integers")
        b = cls(
            sequence_lengths=tuple(lens),
            mini_batch_size=_get(d, "mini_batch_size", int, w),
            **_knobs(d, w, cls),
        )
        _positive(w, mini_batch_size=b.mini_batch_size)
        if b.use_dynamic_bsz:
            _positive(w, max_token_len_per_gpu=b.max_token_len_per_gpu)
        else:
            _positive(w, micro_batch_size_per_gpu=b.micro_batch_size_per_gpu)
        return b

    def phase_batching(self, phase: str) -> tuple[int, int, int]:
        """(mini-batch size in samples, token budget, samples per micro-batch) of a phase:
        old_log_prob runs the whole step as one forward-only batch, by its own budget."""
        if phase == "old_log_prob":
            budget = self.log_prob_max_token_len_per_gpu or self.max_token_len_per_gpu
            mbs = self.log_prob_micro_batch_size_per_gpu or self.micro_batch_size_per_gpu
            return len(self.sequence_lengths), budget, mbs
        return self.mini_batch_size, self.max_token_len_per_gpu, self.micro_batch_size_per_gpu


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSpec:
    """What one worker trial measures; the JSON form is the runner's contract (schema 2)."""

    model: ModelSpec
    layout: ParallelLayout
    sequence_parallel: bool = False
    recompute: RecomputeCfg
    offload: OffloadCfg
    batch: BatchCfg
    use_fused_kernels: bool = False
    """verl's fused log-prob/entropy path (no full logits) instead of full vocab logits."""
    layer_spec: str = "local"
    """Which layers the worker builds (LAYER_SPECS); a spec without it is `local`."""
    kernels: KernelCfg = KernelCfg()
    """The kernel choices of the `te` layers (ignored by `local`)."""
    phases: tuple[str, ...] = PHASES
    steps: int = 3
    warmup_steps: int = 1
    min_measured_s: float = 0.0
    """Measured steps go on past `steps` until they last this long (at most `max_steps`)."""
    max_steps: int = 0
    """At most this many measured steps (0: `steps`)."""
    seed: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkerSpec:
        if not isinstance(d, Mapping):
            raise ValueError("spec must be a JSON object")
        if d.get("schema") != SCHEMA:
            raise ValueError(f"spec schema {d.get('schema')!r} is not {SCHEMA}")
        for key in ("model", "layout", "batch"):
            if not isinstance(d.get(key), Mapping):
                raise ValueError(f"spec lacks the {key!r} object")
        phases = d.get("phases", list(PHASES))
        if not isinstance(phases, list) or not phases or any(p not in PHASES for p in phases):
            raise ValueError(f"spec phases must be a non-empty list of {', '.join(PHASES)}")
        s = cls(
            model=parse_model(d["model"]),
            layout=parse_layout(d["layout"]),
            recompute=RecomputeCfg.from_dict(d.get("recompute") or {}),
            offload=OffloadCfg.from_dict(d.get("offload") or {}),
            batch=BatchCfg.from_dict(d["batch"]),
            **_knobs(d, "", cls),
            layer_spec=_get(d, "layer_spec", str, "", "local"),
            kernels=KernelCfg.from_dict(d.get("kernels") or {}),
            phases=tuple(p for p in PHASES if p in phases),
            steps=_get(d, "steps", int, "", 3),
            warmup_steps=_get(d, "warmup_steps", int, "", 1),
            min_measured_s=float(_get(d, "min_measured_s", float, "", 0.0)),
            max_steps=_get(d, "max_steps", int, "", 0),
            seed=_get(d, "seed", int, "", 0),
        )
        _positive("", steps=s.steps)
        if s.min_measured_s < 0 or s.max_steps < 0:
            raise ValueError("spec min_measured_s and max_steps must not be negative")
        if s.warmup_steps < 0:
            raise ValueError(f"spec warmup_steps must not be negative, got {s.warmup_steps}")
        s.check()
        return s

    def check(self) -> None:
        """Refuse a spec the worker cannot run, naming each rule it breaks.

        The search space's rules a spec can break, by its own functions (tuner.space.rules; the
        runner refused a candidate breaking them before writing its spec, but the worker also
        takes specs from files): the layout's rules that read the model (tp_heads, tp_kv_heads,
        vpp_needs_pp, pipeline_split, dense_no_ep, ep_experts), sp_needs_tp, the choices of
        recompute_granularity, recompute_method and attention_backend, and
        recompute_num_layers. The worker's own: layer_spec is one of LAYER_SPECS, and cp > 1
        needs the te layers. The batch's and the run's fields are bounded as they are read. (etp
        > 1 on a dense model runs in megatron-core: the search's rule dense_no_etp skips it.)"""
        m, lay, r, k = self.model, self.layout, self.recompute, self.kernels
        rules = {
            "sp_needs_tp": sequence_parallel_problems(self.sequence_parallel, lay.tp),
            "recompute_granularity": choice_problems(
                "recompute.granularity", r.granularity, RECOMPUTE_GRANULARITIES
            ),
            "recompute_method": choice_problems("recompute.method", r.method, RECOMPUTE_METHODS),
            "recompute_num_layers": recompute_layers_problems(r.granularity, r.num_layers, lay, m),
            "attention_backend": choice_problems(
                "kernels.attention_backend", k.attention_backend, ATTENTION_BACKENDS
            ),
            # the worker's own
            "layer_spec": choice_problems("layer_spec", self.layer_spec, LAYER_SPECS),
            "cp_needs_te": [
                f"cp ({lay.cp}) needs the transformer-engine layers (layer_spec te): the local "
                "layers' flash core attention has no context parallelism"
            ]
            if lay.cp > 1 and self.layer_spec == "local"
            else [],
        }
        broken = layout_model_rules(lay, m) + [(n, p) for n, ps in rules.items() for p in ps]
        if broken:
            raise ValueError("spec: " + "; ".join(f"[{n}] {p}" for n, p in broken))

    @property
    def micro_batch_multiple(self) -> int:
        """Interleaved stages need micro-batch counts in whole groups of pp (megatron's
        microbatch_group_size_per_vp_stage defaults to pp; verl rounds up to it)."""
        return self.layout.pp if self.layout.vpp > 1 else 1


def load_spec(path: str | Path) -> WorkerSpec:
    with open(path) as f:
        return WorkerSpec.from_dict(json.load(f))


def layout_to_dict(lay: ParallelLayout) -> dict[str, int]:
    """The spec's layout: the world and every degree and split of LAYOUT_FIELDS."""
    return {"world": lay.world, **{k: getattr(lay, k) for k in LAYOUT_FIELDS}}


def spec_to_dict(spec: WorkerSpec) -> dict[str, Any]:
    """The JSON form (schema 2) of a spec."""
    r = spec.recompute
    return {
        "schema": SCHEMA,
        "model": asdict(spec.model),
        "layout": layout_to_dict(spec.layout),
        "sequence_parallel": spec.sequence_parallel,
        "recompute": {
            "granularity": r.granularity,
            "method": r.method,
            "num_layers": r.num_layers,
            "modules": list(r.modules),
        },
        "offload": asdict(spec.offload),
        "batch": {**asdict(spec.batch), "sequence_lengths": list(spec.batch.sequence_lengths)},
        "use_fused_kernels": spec.use_fused_kernels,
        "layer_spec": spec.layer_spec,
        "kernels": asdict(spec.kernels),
        "phases": list(spec.phases),
        "steps": spec.steps,
        "warmup_steps": spec.warmup_steps,
        "min_measured_s": spec.min_measured_s,
        "max_steps": spec.max_steps,
        "seed": spec.seed,
    }
