"""The candidate: one configuration of every knob, and the choices each knob may take."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from tuner.cells import cell_value
from tuner.space.layout import LAYOUT_DEGREES, LAYOUT_FIELDS, ParallelLayout

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
ENFORCE_EAGER_CHOICES = (False, True)
"""vLLM `enforce_eager` the sampler offers: CUDA graphs (False) or eager decode (True)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """One configuration of every knob; the unit a runner measures."""

    layout: ParallelLayout
    """Actor (and ref) parallel degrees."""
    rollout_gpus: int = 0
    """Placement (tuner/space/placement.py): 0 = colocated, vLLM and the actor take turns on all
    GPUs; r > 0 = split, vLLM on r GPUs of its own and the actor (whose `layout` is then a world
    of the other N - r) trained one step off-policy (verl's one_step_off_policy). Only
    `--allow-off-policy` studies draw r > 0."""
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
    """vLLM's share of GPU memory (weights + KV cache) during generation. 0.6 is what verl's
    Megatron GRPO example sets; verl 0.9.1's own default is 0.5 (the knob's `verl_default`,
    trainer/config/rollout/rollout.yaml), which the recipe never relies on: it always sets the
    value."""
    max_num_batched_tokens: int = 0
    """vLLM's token budget per scheduler step (0 = prompt + response)."""
    max_num_seqs: int = 256
    """vLLM's most sequences running at once per engine (verl 0.9.1's default, the knob's
    `verl_default`: tests/test_knob_table.py holds a field at verl's default equal to it)."""
    enforce_eager: bool = False
    """vLLM decodes without CUDA graphs, launching every kernel from Python (verl 0.9.1's
    default False, the knob's `verl_default`: graphs captured at vLLM's default batch sizes)."""

    def to_record(self) -> dict[str, Any]:
        """Flat knob values, as CSV columns and Optuna user_attrs."""
        rec = {k: v for k, v in asdict(self).items() if k != "layout"}
        lay = self.layout
        return {
            "train_parallel": lay.notation,
            **{k: getattr(lay, k) for k in LAYOUT_DEGREES},
            "dp": lay.dp,
            **{k: getattr(lay, k) for k in SPLIT_FIELDS},
            **rec,
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any], world: int) -> Candidate:
        """Inverse of to_record (values may be strings, as read from a CSV). Columns of knobs
        that no longer exist (`grad_offload` of schema-1 files) are ignored; knobs a file lacks
        take their defaults. `world` is the study's GPUs: a split row's layout is a world of the
        trainer's N - rollout_gpus."""
        deg = {k: _column(rec, k, int) for k in LAYOUT_DEGREES}
        if rec.get("rollout_gpus") not in ("", None):
            world -= _column(rec, "rollout_gpus", int)
        for k in SPLIT_FIELDS:
            if rec.get(k) not in ("", None):
                deg[k] = _column(rec, k, int)
        lay = ParallelLayout(world=world, **deg)
        kw: dict[str, Any] = {}
        for f in _FIELD_TYPES:
            if f not in rec or rec[f] in ("", None):
                continue
            kw[f] = _column(rec, f, _FIELD_TYPES[f])
        return cls(layout=lay, **kw)


def _coerce(value: Any, typ: type) -> Any:
    """A record's value as the field's type; a CSV cell's text strictly (tuner.cells: `15360.5`
    is no count, `maybe` no switch), with the column in the ValueError."""
    if isinstance(value, str):
        return cell_value(value, typ)
    return typ(value)


def _column(rec: dict[str, Any], name: str, typ: type) -> Any:
    """rec[name] as `typ` (KeyError where it is missing); a ValueError names the column."""
    try:
        return _coerce(rec[name], typ)
    except ValueError as e:
        raise ValueError(f"column {name}: {e}") from None


_FIELD_TYPES: dict[str, type] = {
    f.name: {"bool": bool, "int": int, "float": float, "str": str}[str(f.type)]
    for f in fields(Candidate)
    if f.name != "layout"
}
SPLIT_FIELDS = tuple(f for f in LAYOUT_FIELDS if f not in LAYOUT_DEGREES)
"""The layout's uneven pipeline split (first and last stage layers)."""
KNOB_COLUMN_TYPES: dict[str, type] = {**{f: int for f in SPLIT_FIELDS}, **_FIELD_TYPES}
"""The CSV columns of the knobs besides the layout degrees (the record's own fields), with their
Python type: the uneven pipeline split, then the Candidate fields in declaration order. Every
reader of knob columns (the record, the leaderboard's column types, the report) takes them from
here."""
CANDIDATE_FIELDS = tuple(KNOB_COLUMN_TYPES)
"""The names of KNOB_COLUMN_TYPES, in order."""


def modules_of(c: Candidate) -> tuple[str, ...]:
    """The selective-recompute modules as a tuple."""
    return tuple(m for m in c.recompute_modules.split(",") if m)
