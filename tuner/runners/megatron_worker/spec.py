"""The worker's spec (schema 2): what one trial measures, parsed and checked with no torch.

The model section is `tuner.models.ModelSpec`'s own fields and the layout is a
`tuner.space.ParallelLayout` (its world included), so the worker checks a layout with the same
code the search space uses; the runner writes the spec with `spec_to_dict`'s layout."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.models import ModelSpec
from tuner.space import (
    ATTENTION_BACKENDS,
    RECOMPUTE_GRANULARITIES,
    RECOMPUTE_METHODS,
    ParallelLayout,
)

SCHEMA = 2
PHASES = ("old_log_prob", "update_actor")
"""The training-side phases of verl's step that the worker runs, in this order."""
LAYER_SPECS = ("local", "te")
"""The megatron-core layers the worker builds: `local` (megatron-core's local spec with the
worker's flash core attention and grouped-GEMM experts, what the committed leaderboards ran) or
`te` (transformer-engine layers, as verl builds its actor: model.te_block_spec)."""


def _get(d: Mapping[str, Any], key: str, kind: type, where: str, default: Any = ...) -> Any:
    if key not in d:
        if default is ...:
            raise ValueError(f"spec {where} lacks {key!r}")
        return default
    v = d[key]
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise ValueError(f"spec {where}.{key} must be an integer, got {v!r}")
    if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise ValueError(f"spec {where}.{key} must be a number, got {v!r}")
    if kind is bool and not isinstance(v, bool):
        raise ValueError(f"spec {where}.{key} must be true or false, got {v!r}")
    if kind is str and not isinstance(v, str):
        raise ValueError(f"spec {where}.{key} must be a string, got {v!r}")
    return v


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


def parse_layout(d: Mapping[str, Any]) -> ParallelLayout:
    w = "layout"
    kw = {
        k: _get(d, k, int, w, 0 if k.endswith("_layers") else 1)
        for k in ("tp", "pp", "vpp", "cp", "ep", "etp", "first_stage_layers", "last_stage_layers")
    }
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
        w = "recompute"
        mods = d.get("modules", ["core_attn"])
        if not isinstance(mods, list) or not all(isinstance(x, str) for x in mods):
            raise ValueError("spec recompute.modules must be a list of module names")
        r = cls(
            granularity=_get(d, "granularity", str, w, "none"),
            method=_get(d, "method", str, w, "uniform"),
            num_layers=_get(d, "num_layers", int, w, 0),
            modules=tuple(mods),
        )
        if r.granularity not in RECOMPUTE_GRANULARITIES:
            raise ValueError(
                f"spec recompute.granularity {r.granularity!r} is not one of "
                f"{', '.join(RECOMPUTE_GRANULARITIES)}"
            )
        if r.method not in RECOMPUTE_METHODS:
            raise ValueError(
                f"spec recompute.method {r.method!r} is not one of {', '.join(RECOMPUTE_METHODS)}"
            )
        if r.granularity == "full" and r.num_layers <= 0:
            raise ValueError("spec recompute: full recompute needs num_layers >= 1")
        return r


@dataclass(frozen=True, kw_only=True, slots=True)
class OffloadCfg:
    param: bool = False
    """Parameters and, with them, gradients (verl 0.9.1 `megatron.param_offload`)."""
    optimizer: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OffloadCfg:
        w = "offload"
        return cls(
            param=_get(d, "param", bool, w, False), optimizer=_get(d, "optimizer", bool, w, False)
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelCfg:
    """The candidate's kernel choices the transformer-engine layers run (layer_spec te); the
    local layers build their own fixed set (model.config_kwargs) and ignore these."""

    apply_rope_fusion: bool = False
    bias_activation_fusion: bool = False
    moe_grouped_gemm: bool = False
    """MoE: TEGroupedMLP (True) or SequentialMLP of TE linears (False)."""
    moe_permute_fusion: bool = False
    attention_backend: str = "auto"
    """megatron-core AttnBackend name (TEDotProductAttention picks its kernel by it)."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KernelCfg:
        w = "kernels"
        k = cls(
            apply_rope_fusion=_get(d, "apply_rope_fusion", bool, w, False),
            bias_activation_fusion=_get(d, "bias_activation_fusion", bool, w, False),
            moe_grouped_gemm=_get(d, "moe_grouped_gemm", bool, w, False),
            moe_permute_fusion=_get(d, "moe_permute_fusion", bool, w, False),
            attention_backend=_get(d, "attention_backend", str, w, "auto"),
        )
        if k.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"spec kernels.attention_backend {k.attention_backend!r} is not one of "
                f"{', '.join(ATTENTION_BACKENDS)}"
            )
        return k


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
            use_dynamic_bsz=_get(d, "use_dynamic_bsz", bool, w),
            max_token_len_per_gpu=_get(d, "max_token_len_per_gpu", int, w, 0),
            micro_batch_size_per_gpu=_get(d, "micro_batch_size_per_gpu", int, w, 0),
            log_prob_max_token_len_per_gpu=_get(d, "log_prob_max_token_len_per_gpu", int, w, 0),
            log_prob_micro_batch_size_per_gpu=_get(
                d, "log_prob_micro_batch_size_per_gpu", int, w, 0
            ),
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
            sequence_parallel=_get(d, "sequence_parallel", bool, "", False),
            recompute=RecomputeCfg.from_dict(d.get("recompute") or {}),
            offload=OffloadCfg.from_dict(d.get("offload") or {}),
            batch=BatchCfg.from_dict(d["batch"]),
            use_fused_kernels=_get(d, "use_fused_kernels", bool, "", False),
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
        """The rules the worker relies on (the runner's megatron_refusals has the full set)."""
        m, lay = self.model, self.layout
        if self.layer_spec not in LAYER_SPECS:
            raise ValueError(
                f"spec layer_spec {self.layer_spec!r} is not one of {', '.join(LAYER_SPECS)}"
            )
        if lay.cp > 1 and self.layer_spec != "te":
            raise ValueError(
                f"cp ({lay.cp}) needs the transformer-engine layers (layer_spec te): the local "
                "layers' flash core attention has no context parallelism"
            )
        if lay.vpp > 1 and lay.pp == 1:
            raise ValueError(f"vpp ({lay.vpp}) needs pp > 1")
        stages = lay.stage_layers(m.num_layers)  # raises with megatron-core's rule
        if m.num_attention_heads % lay.tp:
            raise ValueError(
                f"tp ({lay.tp}) must divide num_attention_heads ({m.num_attention_heads})"
            )
        if m.num_kv_heads % lay.tp and lay.tp % m.num_kv_heads:
            raise ValueError(
                f"tp ({lay.tp}) and the {m.num_kv_heads} kv heads do not divide one another"
            )
        if m.is_moe and m.num_experts % lay.ep:
            raise ValueError(f"ep ({lay.ep}) does not divide num_experts ({m.num_experts})")
        if not m.is_moe and (lay.ep > 1 or lay.etp > 1):
            raise ValueError("ep and etp must be 1 for a dense model")
        if self.sequence_parallel and lay.tp == 1:
            raise ValueError("sequence parallel needs tp > 1")
        r = self.recompute
        if r.granularity == "full":
            per_chunk = min(stages) // lay.vpp
            if r.method == "block" and r.num_layers > per_chunk:
                raise ValueError(
                    f"recompute num_layers ({r.num_layers}) exceeds the {per_chunk} layers of a "
                    "pipeline chunk (block method)"
                )
            if r.method == "uniform" and r.num_layers > per_chunk:
                raise ValueError(
                    f"recompute num_layers ({r.num_layers}) exceeds the {per_chunk} layers of a "
                    "pipeline chunk (uniform method)"
                )

    @property
    def micro_batch_multiple(self) -> int:
        """Interleaved stages need micro-batch counts in whole groups of pp (megatron's
        microbatch_group_size_per_vp_stage defaults to pp; verl rounds up to it)."""
        return self.layout.pp if self.layout.vpp > 1 else 1


def load_spec(path: str | Path) -> WorkerSpec:
    with open(path) as f:
        return WorkerSpec.from_dict(json.load(f))


def layout_to_dict(lay: ParallelLayout) -> dict[str, int]:
    return {k: v for k, v in asdict(lay).items()}


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
