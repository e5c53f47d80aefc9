"""Which layers the megatron runner's worker builds, `te` or `local`, and what each leaves pinned.

`te`: megatron-core's transformer-engine layers, as verl builds its actor (the worker's
model.te_block_spec); chosen by `auto` where transformer_engine imports. `local`: megatron-core's
local layers with the worker's flash core attention and grouped-GEMM experts, what the committed
leaderboards were measured with; chosen by `auto` elsewhere. The knobs the local layers cannot
make are pinned (megatron.MEGATRON_PINNED); the te layers make some of them, which are then
searched (TE_MEASURED), as each knob's entry says (`Knob.te_runs`). The command line reads its
choices without importing the runners."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from tuner.errors import UserError
from tuner.space.knobs import AS_CANDIDATE, KNOBS

LAYER_SPEC_CHOICES = ("auto", "te", "local")
"""`--layer-spec` values (auto: te where transformer_engine imports, else local)."""

TE_MEASURED = tuple(k.name for k in KNOBS if k.te_runs is AS_CANDIDATE)
"""Pinned knobs the te layers run as the candidate says (`Knob.te_runs` AS_CANDIDATE;
megatron-core 0.19.2, transformer-engine 2.20.2): fused RoPE is TE's
fused_apply_rotary_pos_emb_thd (models/common/embeddings/rope_utils.py); the SwiGLU fusion is read
by the MLP and TEGroupedMLP of the te layers (transformer/mlp.py, moe/experts.py; the local layers
keep it off, as the committed rows ran); moe_grouped_gemm picks TEGroupedMLP or SequentialMLP of
TE linears (TESpecProvider.grouped_mlp_modules); the fused permute is TE's (moe/moe_utils.py
fused_permute). Still pinned with te: gradient_accumulation_fusion (APEX's
fused_weight_gradient_mlp_cuda, also for the output layer next to TE's layers:
tensor_parallel/layers.py raises without it) and the MoE dispatcher (flex needs DeepEP, not
TE)."""

TE_PINS = tuple(
    (k.name, k.te_runs) for k in KNOBS if k.te_runs is not None and k.te_runs is not AS_CANDIDATE
)
"""Pins the te layers set to another value (`Knob.te_runs`): TEDotProductAttention's kernel is
left to TE (`auto`, as verl's preflight pins it where flash_attn is missing). `flash` needs the
flash_attn package, which the kit does not carry, and on Hopper TE prefers its cuDNN fused
attention to flash-attn when both can run (attention/dot_product_attention/utils.py
get_attention_backend), so auto is fused there."""


def te_present() -> bool:
    """transformer_engine imports here (what `auto` decides on)."""
    return importlib.util.find_spec("transformer_engine") is not None


def resolve_layer_spec(requested: str) -> str:
    """`te` or `local` for `--layer-spec` auto, te or local; te where transformer_engine does
    not import is a UserError saying what to change."""
    if requested not in LAYER_SPEC_CHOICES:
        raise UserError(f"--layer-spec {requested!r} is not one of {', '.join(LAYER_SPEC_CHOICES)}")
    if requested == "auto":
        return "te" if te_present() else "local"
    if requested == "te" and not te_present():
        raise UserError(
            "--layer-spec te needs transformer-engine, which does not import here: install "
            "transformer-engine 2.20.2 or pass --layer-spec local"
        )
    return requested


def layer_spec_pins(
    pinned: tuple[tuple[str, Any], ...], layer_spec: str
) -> tuple[tuple[str, Any], ...]:
    """The runner's pins for these layers: `pinned` (the local layers') as they are for local;
    for te, less TE_MEASURED and with TE_PINS' values."""
    if layer_spec != "te":
        return pinned
    te = dict(TE_PINS)
    return tuple((k, te.get(k, v)) for k, v in pinned if k not in TE_MEASURED)


def layer_spec_of(extra: Mapping[str, Any]) -> str:
    """The layers a megatron row was measured with (its extra's `layer_spec`; rows from before
    it was recorded ran the local layers)."""
    return "te" if str(extra.get("layer_spec", "")) == "te" else "local"
