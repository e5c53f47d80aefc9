"""verl's full-logits passes, read once (tuner/estimate/logits.py): the time model's traffic and
the memory model's footprint come from the same list."""

from __future__ import annotations

import pytest

import tuner.estimate.generation as generation_mod
import tuner.estimate.memory as memory_mod
import tuner.estimate.time as time_mod
from tuner.estimate import Profile
from tuner.estimate.context import get_context
from tuner.estimate.logits import LOGIT_HELD_BYTES, LOGIT_TRAFFIC_BYTES, PASSES
from tuner.estimate.memory import memory_of
from tuner.estimate.micro_batches import peak_micro_tokens
from tuner.hardware import GIB, GPUS, Cluster
from tuner.models import get_model
from tuner.space import Candidate, ParallelLayout
from tuner.workload import get_workload


def test_each_phase_moves_and_holds_what_its_passes_do() -> None:
    # verl 0.9.1: fp32 copy 6, temperature 8, clone 8, entropy 40, cross-entropy 32 (time.py's
    # former hand sums), and the backward's 8 + 8 + 6
    assert LOGIT_TRAFFIC_BYTES["0.9.1"] == {"old_log_prob": 94, "ref": 46, "update_actor": 68}
    # fp32 logits + clone + the entropy's shifted copy; fp32 + bf16; saved softmax + div grad
    assert LOGIT_HELD_BYTES["0.9.1"] == {"old_log_prob": 12, "ref": 6, "update_actor": 8}
    assert set(PASSES) == {"old_log_prob", "ref", "update_actor"}
    # verl 0.4.1 (the reference rows before the megatron fused kernels): no division, no clone
    assert LOGIT_TRAFFIC_BYTES["0.4.1"] == {"old_log_prob": 78, "ref": 38, "update_actor": 52}
    assert LOGIT_HELD_BYTES["0.4.1"] == {"old_log_prob": 8, "ref": 6, "update_actor": 6}


def test_no_second_logit_constant_in_the_models() -> None:
    for mod in (memory_mod, time_mod, generation_mod):
        assert not [n for n in vars(mod) if n.startswith("LOGIT_BYTES")], mod.__name__


def test_memory_holds_the_full_logits_of_the_old_log_prob_pass() -> None:
    m, w = get_model("qwen2.5-7b"), get_workload("dapo-math")
    cl = Cluster(gpu=GPUS["h100"], num_gpus=8)
    c = Candidate(
        layout=ParallelLayout(world=8, tp=4),
        sequence_parallel=True,
        use_fused_kernels=False,
        ppo_max_token_len_per_gpu=10240,
        log_prob_max_token_len_per_gpu=30720,
    )
    ctx = get_context(m, cl, w, Profile())
    mem = memory_of(ctx, c)
    lp_tokens = peak_micro_tokens(ctx, c, log_prob=True)
    upd_tokens = peak_micro_tokens(ctx, c, log_prob=False)
    vocab_local = m.vocab_size / 4
    want = max(lp_tokens * 12, upd_tokens * 8) * vocab_local / GIB
    assert mem.logits_gib == pytest.approx(want, rel=1e-9)
    old = memory_of(ctx, c, verl_logits="0.4.1")
    assert old.logits_gib == pytest.approx(max(lp_tokens * 8, upd_tokens * 6) * vocab_local / GIB)
