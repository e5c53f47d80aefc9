"""The megatron worker's CPU side: spec parsing (schema 2), result JSON, FLOPs, the pipeline's
shape exchange (the pp2 vpp2 mismatch), and its failure path as a real program."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from tuner.models import get_model
from tuner.runners.megatron_worker import (
    WorkerResult,
    WorkerSpec,
    active_matmul_params,
    is_oom,
    model_flops,
    parse_result,
    peak_bf16_tflops,
    spec_to_dict,
    write_json_atomic,
)
from tuner.runners.megatron_worker.device_memory import release_storages
from tuner.runners.megatron_worker.pipeline import exchange_shapes, p2p_settings, steady_state_calls

REPO = Path(__file__).resolve().parents[2]
TINY = {
    "name": "tiny",
    "num_layers": 4,
    "hidden_size": 256,
    "ffn_hidden_size": 512,
    "num_attention_heads": 8,
    "num_kv_heads": 2,
    "head_dim": 32,
    "vocab_size": 1000,
}
SPEC = {
    "schema": 2,
    "model": TINY,
    "layout": {"world": 4, "tp": 1, "pp": 2, "vpp": 2},
    "recompute": {"granularity": "none"},
    "offload": {"param": False, "optimizer": False},
    "batch": {
        "sequence_lengths": [100, 200, 300, 400],
        "mini_batch_size": 2,
        "use_dynamic_bsz": True,
        "max_token_len_per_gpu": 1024,
        "log_prob_max_token_len_per_gpu": 2048,
    },
    "use_fused_kernels": True,
}


def _spec(**patch: dict) -> dict:
    d = copy.deepcopy(SPEC)
    for section, values in patch.items():
        if isinstance(values, dict):
            d[section].update(values)
        else:
            d[section] = values
    return d


def test_spec_round_trips_and_uses_the_project_types():
    s = WorkerSpec.from_dict(SPEC)
    assert s.layout.vpp == 2 and s.layout.dp == 2 and s.model.num_kv_heads == 2
    assert s.micro_batch_multiple == 2 and s.use_fused_kernels
    assert s.phases == ("old_log_prob", "update_actor")
    assert WorkerSpec.from_dict(json.loads(json.dumps(spec_to_dict(s)))) == s
    # old_log_prob: the whole step, its own budget; update: the mini-batch and the ppo budget
    assert s.batch.phase_batching("old_log_prob") == (4, 2048, 0)
    assert s.batch.phase_batching("update_actor") == (2, 1024, 0)


def test_short_steps_are_measured_until_the_window_is_long_enough():
    from tuner.runners.megatron_worker.trial import more_steps

    s = WorkerSpec.from_dict({**SPEC, "steps": 2, "min_measured_s": 12.0, "max_steps": 8})
    assert WorkerSpec.from_dict(json.loads(json.dumps(spec_to_dict(s)))) == s
    rule = {"steps": s.steps, "max_steps": s.max_steps, "min_measured_s": s.min_measured_s}
    # 2.7 s steps (the MoE study): 2 always, then until 12 s have been measured
    ran = 0
    while more_steps(ran, ran * 2.7, **rule):
        ran += 1
    assert ran == 5
    # 19 s steps (the 7B study) stop at 2; 0.1 s steps stop at max_steps
    assert not more_steps(2, 38.0, **rule)
    assert more_steps(7, 0.7, **rule) and not more_steps(8, 0.8, **rule)
    # without a window: exactly `steps`, as schema-2 specs without the fields ran
    plain = WorkerSpec.from_dict(SPEC)
    bare = {"steps": plain.steps, "max_steps": plain.max_steps, "min_measured_s": 0.0}
    assert plain.min_measured_s == 0.0
    assert more_steps(plain.steps - 1, 0.1, **bare) and not more_steps(plain.steps, 0.1, **bare)


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"schema": 1}, "schema 1 is not 2"),
        ({"min_measured_s": "long"}, "min_measured_s must be a number"),
        ({"max_steps": -1}, "must not be negative"),
        ({"model": {"num_layers": 6}}, r"pp\(2\) \* vpp\(2\) does not divide the 6 layers"),
        ({"layout": {"world": 3}}, r"tp\(1\) \* pp\(2\) \* cp\(1\)"),
        ({"layout": {"tp": 3, "pp": 1, "vpp": 1, "world": 3}}, r"\[tp_heads\] tp\(3\) does not"),
        ({"model": {"num_kv_heads": 3}}, "multiple of"),
        ({"batch": {"sequence_lengths": [1, -2]}}, "positive integers"),
        ({"recompute": {"granularity": "sometimes"}}, "granularity"),
        ({"phases": ["generation"]}, "phases"),
        ({"model": {"bogus": 1}}, "unknown fields"),
    ],
)
def test_bad_specs_say_what_is_wrong(patch, message):
    d = _spec(**{k: v for k, v in patch.items() if isinstance(v, dict)})
    d.update({k: v for k, v in patch.items() if not isinstance(v, dict)})
    with pytest.raises(ValueError, match=message):
        WorkerSpec.from_dict(d)


def test_flops_of_the_phases():
    m = get_model("qwen2.5-7b")
    lens = [1000, 3000]
    full = model_flops(m, lens)
    assert model_flops(m, lens, forward_only=True) == pytest.approx(full / 3)
    q = m.num_attention_heads * m.head_dim
    assert full == 6.0 * active_matmul_params(m) * 4000 + 6.0 * m.num_layers * q * (1e6 + 9e6)
    assert peak_bf16_tflops("NVIDIA H200") and peak_bf16_tflops("a toaster") is None


def test_result_round_trip_and_validation(tmp_path: Path):
    r = WorkerResult(
        status="ok",
        phase="update_actor",
        step_s=2.0,
        tokens_per_s_per_gpu=1.0,
        peak_mem_gib=3.0,
        peak_mem_device_gib=4.0,
        launch_s=5.0,
    )
    assert parse_result(json.dumps(r.to_dict())) == r
    old = {**r.to_dict(), "schema": 2, "peak_mem_allocated_gib": 3.0}  # schema 2's name
    del old["peak_mem_gib"]
    assert parse_result(old) == r
    with pytest.raises(ValueError, match="finite step_s"):
        parse_result({**r.to_dict(), "step_s": None})
    with pytest.raises(ValueError, match="phase"):
        parse_result({**r.to_dict(), "phase": "lunch"})
    p = tmp_path / "r.json"
    assert write_json_atomic(p, {"a": 1}, exclusive=True)
    assert not write_json_atomic(p, {"a": 2}, exclusive=True)
    assert json.loads(p.read_text()) == {"a": 1}
    assert is_oom(RuntimeError("NCCL error: unhandled cuda error")) and not is_oom(ValueError("x"))


# ---- the pp2 vpp2 mismatch, reproduced on the CPU --------------------------------------------


def test_combined_p2p_call_swaps_shapes_at_pp2():
    """megatron-core's shape exchange, both directions in one call (overlap_p2p_comm off, the
    default): at pp = 2 the activation buffer takes the gradient's length - the
    `split_with_sizes ... 6780 ... [7688]` crash of issue 9."""
    act, grad = {0: 7688, 1: 7500}, {0: 6780, 1: 6900}
    (call,) = steady_state_calls(2, act, grad, overlap_p2p_comm=False)
    got = exchange_shapes(2, call)
    assert got[1][0] == grad[0] != act[0]  # rank 1 expected rank 0's activation
    # pp = 4: prev and next are different ranks, nothing is swapped
    act4, grad4 = {r: 1000 + r for r in range(4)}, {r: 2000 + r for r in range(4)}
    (call4,) = steady_state_calls(4, act4, grad4, overlap_p2p_comm=False)
    got4 = exchange_shapes(4, call4)
    assert all(got4[r] == (act4[(r - 1) % 4], grad4[(r + 1) % 4]) for r in range(4))


def test_the_worker_settings_keep_shapes_matched():
    s = p2p_settings(2, 2)
    assert s == {"variable_seq_lengths": True, "overlap_p2p_comm": True, "batch_p2p_comm": False}
    assert p2p_settings(2, 1)["batch_p2p_comm"] and not p2p_settings(2, 1)["overlap_p2p_comm"]
    act, grad = {0: 7688, 1: 7500}, {0: 6780, 1: 6900}
    fwd, bwd = steady_state_calls(2, act, grad, overlap_p2p_comm=s["overlap_p2p_comm"])
    assert exchange_shapes(2, fwd) == {0: (act[1], None), 1: (act[0], None)}
    assert exchange_shapes(2, bwd) == {0: (None, grad[1]), 1: (None, grad[0])}


# ---- the program ------------------------------------------------------------------------------


def _run_worker(tmp: Path, spec: dict) -> tuple[int, dict]:
    sp, out = tmp / "spec.json", tmp / "result.json"
    sp.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "tuner.runners.megatron_worker", "--spec", str(sp), "--out",
         str(out)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return proc.returncode, json.loads(out.read_text())


def test_a_bad_spec_ends_as_a_failed_result_file(tmp_path: Path):
    rc, res = _run_worker(tmp_path, _spec(model={"num_layers": 6}))
    assert rc != 0
    assert res["status"] == "failed" and res["phase"] == "init"
    assert "6 layers" in res["reason"]
    parse_result(res)


def test_model_section_is_the_model_spec():
    m = get_model("qwen3-30b-moe")
    s = WorkerSpec.from_dict(_spec(model=asdict(m), layout={"world": 2, "pp": 2, "vpp": 1}))
    assert s.model == m


def test_release_frees_a_trial_that_a_hook_cycle_keeps_alive():
    """What a finished MoE trial looked like on the GPUs: megatron's DDP registers, on each
    parameter's autograd accumulator, a hook closing over the parameter; the model and its
    optimizer outlived the trial. Released, their storages hold no bytes, and a tensor the
    trial does not reach keeps its data."""
    import gc

    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.Adam(model.parameters())
    accs = []
    for p in model.parameters():
        p.main_grad = torch.zeros_like(p)  # megatron's extra attribute on parameters
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        acc.register_hook(lambda *_, p=p: (p.main_grad.add_(1), None)[1])
        accs.append(acc)
    model.accs = accs
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    kept = torch.arange(10.0)
    expected = sum(p.numel() * 4 * 4 for p in model.parameters())  # data, grad, main, 2 Adam
    freed = release_storages(model, opt, devices=("cpu",))
    assert freed >= expected
    for p in model.parameters():
        assert p.untyped_storage().nbytes() == 0 and p.main_grad.untyped_storage().nbytes() == 0
    for st in opt.state.values():
        assert st["exp_avg"].untyped_storage().nbytes() == 0
    del model, opt, accs
    gc.collect()
    assert kept.sum().item() == 45.0
