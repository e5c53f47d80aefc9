"""verl 0.9.1's full-vocabulary logits path (use_fused_kernels=False), read once: the passes
each phase makes over a [tokens, vocab/tp] logits tensor, from which the cost model takes both
the HBM bytes they move (estimate/time.py) and the bytes they hold at once (estimate/memory.py).

Read from verl 0.9.1's megatron engine (verl/workers/engine/megatron/transformer_impl.py
`forward_step` -> `_lm_head_logits_processor`; old_log_prob asks for the entropy,
trainer/ppo/ray_trainer.py `_compute_old_log_prob` calculate_entropy=True, the reference pass
does not, `_compute_ref_log_prob`, nor does the update without an entropy coefficient):

- megatron-core's Float16Module hands the last stage's bf16 logits back in fp32 (`.float()`;
  the bf16 output is freed once converted);
- `logits.div_(temperature)`, in place;
- with the entropy, `logits.clone()` kept for the log-probs, because `vocab_parallel_entropy`
  (verl/utils/megatron/tensor_parallel.py `_VocabParallelEntropy`) works on a shifted copy
  (`logits - max`, then `exp_` and `div_` in place on it, and a compiled sum(p*z));
- `vocab_parallel_log_probs_from_logits`: megatron-core's vocab-parallel cross-entropy, in place
  on its input (max, subtract, exp, sum, divide), which keeps the softmax for the backward;
- the update's backward: the cross-entropy's gradient is the kept softmax scaled in place, the
  temperature division's gradient a new fp32 tensor, and the cast back to bf16 for the output
  layer's backward GEMMs a new bf16 one; each input gradient is freed once used.

The fused path (`linear_cross_entropy`, verl/utils/kernel/kernels.py) computes the logits tile
by tile with max, sum and entropy in registers: none of these passes (memory.py has its chunked
working set).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.estimate.context import BF16, FP32
from tuner.versions import VERL


@dataclass(frozen=True, slots=True)
class Pass:
    """One pass over the logits, per logit (a token times a vocab/tp column)."""

    name: str
    read: int
    """Bytes read."""
    write: int
    """Bytes written."""
    alloc: int = 0
    """Bytes of a new tensor it makes (held from here)."""
    free: int = 0
    """Bytes of tensors freed once it has run."""


_FORWARD = (
    # the output GEMM's own bf16 write is the GEMM's (time.py's head term), held on entry
    Pass("fp32 copy (Float16Module)", BF16, FP32, alloc=FP32, free=BF16),
    Pass("logits.div_(temperature)", FP32, FP32),
)
_ENTROPY = (
    Pass("logits.clone() for the log-probs", FP32, FP32, alloc=FP32),
    # _VocabParallelEntropy: max 4, logits - max 8 (a new tensor), exp_ 8, sum 4, div_ 8,
    # compiled sum(p*z) 8; the shifted copy is freed with the function's context
    Pass("vocab_parallel_entropy", 7 * FP32, 3 * FP32, alloc=FP32, free=FP32),
)
_CROSS_ENTROPY = (
    # megatron-core vocab-parallel cross-entropy, in place: max 4, subtract 8, exp 8, sum 4,
    # divide 8
    Pass("vocab_parallel_cross_entropy", 5 * FP32, 3 * FP32),
)
_BACKWARD = (
    Pass("cross-entropy grad (the kept softmax, in place)", FP32, FP32),
    Pass("div_ grad (grad / temperature)", FP32, FP32, alloc=FP32, free=FP32),
    Pass("fp32 grad cast to bf16", FP32, BF16, alloc=BF16, free=FP32),
)

PASSES: dict[str, tuple[Pass, ...]] = {
    "old_log_prob": _FORWARD + _ENTROPY + _CROSS_ENTROPY,
    "ref": _FORWARD + _CROSS_ENTROPY,
    "update_actor": _FORWARD + _CROSS_ENTROPY + _BACKWARD,
}
"""verl 0.9.1's passes of each phase, in order."""
_FP32_COPY, _ENTROPY_PASS = _FORWARD[0], _ENTROPY[1]
PASSES_0_4: dict[str, tuple[Pass, ...]] = {
    "old_log_prob": (_FP32_COPY, _ENTROPY_PASS, *_CROSS_ENTROPY),
    "ref": (_FP32_COPY, *_CROSS_ENTROPY),
    "update_actor": (_FP32_COPY, *_CROSS_ENTROPY, _BACKWARD[0], _BACKWARD[2]),
}
"""verl 0.4.1's (workers/actor/megatron_actor.py `logits_processor`, the path of the reference
runs published before verl's megatron fused kernels, `full_logits_trials` in
tests/data/anchors/fit.toml): no temperature division and no clone; the entropy's shifted copy,
then the cross-entropy in place."""
VERL_PASSES: dict[str, dict[str, tuple[Pass, ...]]] = {VERL: PASSES, "0.4.1": PASSES_0_4}
"""The passes by verl release; the cost model counts the installed one's (tuner.versions.VERL)
unless told otherwise."""
DEFAULT_VERL = VERL


def traffic_bytes(phase: str, verl: str = DEFAULT_VERL) -> int:
    """HBM bytes a phase moves per logit, beyond the output GEMM's own bf16 write."""
    return sum(logit_pass.read + logit_pass.write for logit_pass in VERL_PASSES[verl][phase])


def held_bytes(phase: str, verl: str = DEFAULT_VERL) -> int:
    """The most bytes per logit a phase holds at once (the bf16 GEMM output on entry)."""
    live = peak = BF16
    for logit_pass in VERL_PASSES[verl][phase]:
        live += logit_pass.alloc
        peak = max(peak, live)
        live -= logit_pass.free
    return peak


LOGIT_TRAFFIC_BYTES = {v: {ph: traffic_bytes(ph, v) for ph in PASSES} for v in VERL_PASSES}
"""HBM bytes per logit moved, by verl release and phase: 0.9.1 old_log_prob 94, ref 46,
update_actor 68; 0.4.1 78, 38, 52."""
LOGIT_HELD_BYTES = {v: {ph: held_bytes(ph, v) for ph in PASSES} for v in VERL_PASSES}
"""Bytes per logit held at the phase's peak: 0.9.1 old_log_prob 12 (fp32 logits, the clone and
the entropy's shifted copy), ref 6 and update_actor 8 (the fp32 logits or saved softmax beside
the bf16 output or the division's gradient); 0.4.1 8, 6, 6."""
