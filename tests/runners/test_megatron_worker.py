"""The megatron worker's CPU side: spec parsing, result JSON, FLOPs, and its failure path."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.runners.megatron_worker import (
    FLOPS_FORMULA,
    ModelCfg,
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

REPO = Path(__file__).resolve().parents[2]

SPEC = {
    "schema": 1,
    "model": {
        "name": "tiny",
        "num_layers": 4,
        "hidden_size": 256,
        "ffn_hidden_size": 512,
        "num_attention_heads": 8,
        "num_query_groups": 2,
        "kv_channels": 32,
        "vocab_size": 1000,
        "num_experts": 0,
        "moe_router_topk": 0,
        "moe_ffn_hidden_size": 0,
        "qkv_bias": False,
        "tie_word_embeddings": False,
    },
    "layout": {"tp": 1, "pp": 2, "vpp": 2, "cp": 1, "ep": 1, "etp": 1, "sp": False},
    "recompute": {"granularity": "none", "method": "uniform", "num_layers": 0},
    "offload": {"param": False, "grad": False, "optimizer": False},
    "batch": {
        "sequence_lengths": [100, 200, 300, 400],
        "mini_batch_size": 2,
        "use_dynamic_bsz": True,
        "max_token_len_per_gpu": 1024,
        "micro_batch_size_per_gpu": 0,
    },
    "steps": 3,
    "warmup_steps": 1,
    "seed": 0,
}


def _spec(**patch: dict) -> dict:
    d = copy.deepcopy(SPEC)
    for section, values in patch.items():
        if isinstance(values, dict):
            d[section].update(values)
        else:
            d[section] = values
    return d


def test_spec_round_trips():
    s = WorkerSpec.from_dict(SPEC)
    assert s.layout.vpp == 2 and s.batch.sequence_lengths == (100, 200, 300, 400)
    assert s.micro_batch_multiple == 2
    assert WorkerSpec.from_dict(json.loads(json.dumps(spec_to_dict(s)))) == s
    assert s.layout.dp(8) == 4


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"schema": 2}, "schema"),
        ({"model": {"num_layers": 6}}, r"pp\(2\) \* vpp\(2\)"),
        ({"model": {"num_query_groups": 3}}, "multiple of num_query_groups"),
        ({"layout": {"tp": 4, "pp": 1, "vpp": 1}}, "tp .4. must divide"),
        ({"layout": {"vpp": 2, "pp": 1}}, "needs pp > 1"),
        ({"layout": {"sp": True}}, "sequence parallel needs tp > 1"),
        ({"layout": {"ep": 2}}, "dense model"),
        ({"model": {"num_experts": 8, "moe_router_topk": 9, "moe_ffn_hidden_size": 64}}, "topk"),
        ({"recompute": {"granularity": "all"}}, "granularity"),
        ({"recompute": {"granularity": "full", "num_layers": 0}}, "num_layers >= 1"),
        ({"recompute": {"granularity": "full", "method": "uniform", "num_layers": 3}}, "divide"),
        ({"batch": {"sequence_lengths": []}}, "non-empty"),
        ({"batch": {"sequence_lengths": [1, True]}}, "positive integers"),
        ({"batch": {"use_dynamic_bsz": False}}, "micro_batch_size_per_gpu"),
        ({"batch": {"mini_batch_size": "2"}}, "integer"),
        ({"steps": 0}, "steps must be positive"),
    ],
)
def test_bad_specs_say_what_is_wrong(patch, message):
    d = _spec(**{k: v for k, v in patch.items() if isinstance(v, dict)})
    d.update({k: v for k, v in patch.items() if not isinstance(v, dict)})
    with pytest.raises(ValueError, match=message):
        WorkerSpec.from_dict(d)


def test_dp_names_every_factor():
    s = WorkerSpec.from_dict(_spec(layout={"tp": 2, "pp": 1, "vpp": 1}))
    with pytest.raises(ValueError, match=r"tp\(2\) \* pp\(1\) \* cp\(1\)"):
        s.layout.dp(3)
    moe = WorkerSpec.from_dict(
        _spec(
            model={"num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 64},
            layout={"tp": 1, "pp": 1, "vpp": 1, "ep": 4},
        )
    )
    with pytest.raises(ValueError, match=r"ep\(4\) \* etp\(1\)"):
        moe.layout.dp(2)


def test_flops_against_a_hand_computed_case():
    m = ModelCfg(
        name="hand",
        num_layers=2,
        hidden_size=4,
        ffn_hidden_size=8,
        num_attention_heads=2,
        num_query_groups=1,
        kv_channels=2,
        vocab_size=10,
    )
    # attention: q=4, kv=2 -> 4*(4+2*2) + 4*4 = 48; mlp 3*4*8 = 96; 2 layers; head 4*10 = 40.
    assert active_matmul_params(m) == 2 * (48 + 96) + 40 == 328
    # 6 * 328 * (3+5) + 6 * 2 layers * 4 (q width) * (9+25)
    assert model_flops(m, [3, 5]) == 6 * 328 * 8 + 6 * 2 * 4 * 34 == 17376
    assert "sum(s_i^2)" in FLOPS_FORMULA


def test_moe_flops_count_only_routed_experts():
    dense = ModelCfg(
        name="d",
        num_layers=1,
        hidden_size=8,
        ffn_hidden_size=16,
        num_attention_heads=2,
        num_query_groups=2,
        kv_channels=4,
        vocab_size=4,
    )
    moe = ModelCfg(
        name="m",
        num_layers=1,
        hidden_size=8,
        ffn_hidden_size=0,
        num_attention_heads=2,
        num_query_groups=2,
        kv_channels=4,
        vocab_size=4,
        num_experts=64,
        moe_router_topk=2,
        moe_ffn_hidden_size=8,
    )
    # Two routed experts of width 8 equal one dense MLP of width 16, plus the router (8*64).
    assert active_matmul_params(moe) - active_matmul_params(dense) == 8 * 64


def test_peak_is_read_from_the_hardware_table():
    assert peak_bf16_tflops("NVIDIA H100 80GB HBM3") == pytest.approx(989, rel=0.01)
    assert peak_bf16_tflops("NVIDIA H200") == pytest.approx(989, rel=0.01)
    assert peak_bf16_tflops("NVIDIA H20") == pytest.approx(148, rel=0.01)
    assert peak_bf16_tflops("Some GPU") is None


def test_result_round_trip_and_validation():
    r = WorkerResult(
        status="ok",
        phase="step",
        step_s=1.5,
        step_times_s=[1.6, 1.5, 1.5],
        tokens=1000,
        tokens_per_s_per_gpu=333.3,
        mfu_pct=12.0,
        peak_mem_allocated_gib=10.0,
        peak_mem_reserved_gib=12.0,
        world_size=2,
    )
    text = json.dumps(r.to_dict())
    back = parse_result(text)
    assert back == r
    assert json.loads(text)["schema"] == 1
    with pytest.raises(ValueError, match="status"):
        parse_result({"schema": 1, "status": "great", "phase": "step"})
    with pytest.raises(ValueError, match="finite step_s"):
        parse_result({"schema": 1, "status": "ok", "phase": "step"})
    oom = parse_result({"schema": 1, "status": "oom", "phase": "warmup", "reason": "x", "new": 1})
    assert oom.status == "oom" and oom.phase == "warmup"


def test_atomic_write_and_first_failure_wins(tmp_path: Path):
    out = tmp_path / "sub" / "result.json"
    assert write_json_atomic(out, {"a": 1}, exclusive=True)
    assert not write_json_atomic(out, {"a": 2}, exclusive=True)
    assert json.loads(out.read_text()) == {"a": 1}
    write_json_atomic(out, {"a": 3})
    assert json.loads(out.read_text()) == {"a": 3}
    assert sorted(p.name for p in out.parent.iterdir()) == ["result.json"]


def test_oom_is_recognised():
    class OutOfMemoryError(RuntimeError):
        pass

    assert is_oom(OutOfMemoryError("x"))
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_oom(RuntimeError("shape mismatch"))


def _run_worker(tmp_path: Path, spec: dict) -> tuple[int, dict]:
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": "0", "WORLD_SIZE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner.runners.megatron_worker",
            "--spec",
            "spec.json",
            "--out",
            out,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, json.loads(out.read_text())


def test_a_bad_spec_ends_as_a_failed_result_file(tmp_path: Path):
    rc, res = _run_worker(tmp_path, _spec(model={"num_layers": 6}))
    assert rc != 0
    assert res["status"] == "failed" and res["phase"] == "init"
    assert "num_layers (6)" in res["reason"]
    parse_result(res)


def test_no_gpu_ends_as_a_failed_result_file_not_a_hang(tmp_path: Path):
    rc, res = _run_worker(tmp_path, SPEC)
    assert rc != 0
    assert res["status"] in ("failed", "oom") and res["phase"] == "init"
    assert res["reason"]
