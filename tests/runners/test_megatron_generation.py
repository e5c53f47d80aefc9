"""Generation measured with vLLM in the megatron runner, on a CPU: a real small stand-in for
vLLM (tests/fake_vllm, on the generation worker's PYTHONPATH only) serves the real generation
worker (`python -m tuner.runners.vllm_gen`) through a real pool, and a small program stands in
for the training worker, as in test_megatron_runner.py."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import tuner
from tuner.cli import main
from tuner.estimate import estimate
from tuner.estimate.device import (
    CUDA_CONTEXT_GIB,
    MEGATRON_WORKER_GIB,
    megatron_worker_gib,
)
from tuner.estimate.runner_memory import memory_view
from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.recipes import pinned_lines
from tuner.results import Status
from tuner.runners import pinned_knobs
from tuner.runners.base import TrialSpec
from tuner.runners.megatron import MEGATRON_PINNED, MegatronRunner
from tuner.runners.megatron_generation import MEASURED, measured_pins, unfit_in_generation
from tuner.runners.process import run_process
from tuner.runners.vllm_gen import GenSpec, classify_failure
from tuner.space import Candidate, ParallelLayout
from tuner.workload import get_workload

ROOT = Path(tuner.__file__).resolve().parents[1]
FAKE_VLLM = Path(__file__).resolve().parents[1] / "fake_vllm"
CONFIG = ROOT / "scripts" / "models" / "qwen3-1.7b" / "config.json"
TRAIN_OK = """
import json, sys
args = sys.argv[1:]
out = args[args.index("--out") + 1]
progress = args[args.index("--progress") + 1]
if {slow!r}:
    for i in range(6):
        with open(progress, "a") as f:
            f.write(json.dumps({{"step": i, "seconds": 2.0, "tokens": 800}}) + "\\n")
        import time; time.sleep(0.3)
json.dump({{"schema": 2, "status": "ok", "phase": "update_actor", "step_s": 3.0,
           "old_log_prob_s": 1.0, "update_actor_s": 2.0, "step_times_s": [3.0, 3.0],
           "tokens": 1000, "tokens_per_s_per_gpu": 250.0, "world_size": 2,
           "peak_mem_allocated_gib": 20.0, "peak_mem_reserved_gib": 22.0,
           "peak_mem_device_gib": 25.0, "launch_s": 5.0, "measured_s": 6.0}}, open(out, "w"))
"""


def trial(
    tmp: Path, number: int = 1, timeout_s: float = 60.0, gpus: int = 2, **cand: object
) -> TrialSpec:
    m, cl = get_model(str(CONFIG)), Cluster(gpu=get_gpu("h100"), num_gpus=gpus)
    w = get_workload("dapo-math").with_overrides(
        prompt_len=64, response_len=128, batch_size=4, n=2, mini_batch_size=2
    )
    cand.setdefault("ppo_max_token_len_per_gpu", 4096)
    cand.setdefault("log_prob_max_token_len_per_gpu", 4096)
    c = Candidate(layout=ParallelLayout(world=gpus), **cand)  # type: ignore[arg-type]
    return TrialSpec(
        number=number,
        candidate=c,
        model=m,
        cluster=cl,
        workload=w,
        trial_dir=tmp / "trials" / str(number),
        timeout_s=timeout_s,
        prediction=estimate(c, m, cl, w),
        seed=3,
    )


def runner(tmp: Path, mode: str = "ok", *, slow: bool = False, train: bool = True,
           generation: bool | None = None) -> MegatronRunner:  # fmt: skip
    script = tmp / "train.py"
    script.write_text(TRAIN_OK.format(slow=slow))

    def launch(cmd, **kw):
        if not train:
            raise AssertionError("the training phases must not launch")
        return run_process([sys.executable, str(script), *cmd[cmd.index("--spec") :]], **kw)

    env = {
        "PYTHONPATH": os.pathsep.join((str(ROOT), str(FAKE_VLLM))),
        "FAKE_VLLM_LOG": str(tmp / "vllm.jsonl"),
        "FAKE_VLLM_MODE": mode,
    }
    return MegatronRunner(launch=launch, env=env, model_config=str(CONFIG), generation=generation)


def events(tmp: Path, kind: str | None = None) -> list[dict]:
    path = tmp / "vllm.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [e for e in lines if kind is None or e["event"] == kind]


def test_one_engine_for_matching_rollout_settings_another_for_others(tmp_path: Path):
    r = runner(tmp_path)
    try:
        rows = [
            r.run(trial(tmp_path, 1)),
            r.run(trial(tmp_path, 2, recompute_granularity="full")),  # same rollout settings
            r.run(trial(tmp_path, 3, gpu_memory_utilization=0.5)),
            r.run(trial(tmp_path, 4, gpu_memory_utilization=0.5, max_num_seqs=64)),
        ]
    finally:
        r.close()
    assert [x.status for x in rows] == [Status.OK] * 4, [x.reason for x in rows]
    built = events(tmp_path, "engine")
    assert len(built) == 3  # trial 2 reused trial 1's engine
    assert len({e["pid"] for e in built}) == 3  # each new engine in a new worker process
    assert [e["kwargs"]["gpu_memory_utilization"] for e in built] == [0.6, 0.5, 0.5]
    assert [e["kwargs"]["max_num_seqs"] for e in built] == [256, 256, 64]
    kw = built[0]["kwargs"]
    assert kw["load_format"] == "dummy" and kw["enable_sleep_mode"] and kw["skip_tokenizer_init"]
    assert kw["max_model_len"] == 40960  # verl's rule: the config's max_position_embeddings
    assert kw["max_num_batched_tokens"] == 64 + 128 and kw["dtype"] == "bfloat16"
    assert [x.extra["gen_engine_reused"] for x in rows] == [False, True, False, False]
    assert "gen_engine_start_s" in rows[0].extra and "gen_wake_s" in rows[1].extra
    # every generate is followed by the engine's sleep before the training phases run, and the
    # reused engine woke up first
    seq = [e["event"] for e in events(tmp_path) if e["pid"] == built[0]["pid"]]
    assert seq == ["engine", "generate", "reset_prefix_cache", "generate", "sleep", "wake_up",
                   "generate", "reset_prefix_cache", "generate", "sleep"]  # fmt: skip
    assert all(e["level"] == 1 for e in events(tmp_path, "sleep"))


def test_exact_lengths_of_the_replicas_share_are_requested(tmp_path: Path):
    r = runner(tmp_path)
    t = trial(tmp_path)
    try:
        row = r.run(t)
    finally:
        r.close()
    assert row.status is Status.OK, row.reason
    spec = GenSpec.from_dict(json.loads((t.trial_dir / "gen-spec.json").read_text()))
    # rollout tp 1 on 2 GPUs: 2 replicas, each half of the 4 prompts x n 2
    assert len(spec.response_lengths) == 2 * 2 and spec.group_size == 2
    warm, timed = events(tmp_path, "generate")
    assert timed["max_tokens"] == timed["min_tokens"] == list(spec.response_lengths)
    assert all(timed["ignore_eos"]) and not any(timed["detokenize"])
    assert timed["prompt_lens"] == list(spec.prompt_lengths)
    assert spec.prompt_lengths[0] == spec.prompt_lengths[1]  # a prompt's n samples share it
    assert warm["max_tokens"] == [min(32, min(spec.response_lengths))] * 4
    assert min(spec.response_lengths) >= 1 and max(spec.response_lengths) <= 128
    assert row.extra["gen_tokens_generated"] == sum(spec.response_lengths)
    assert row.extra["gen_sequences"] == 4


def test_generation_lands_in_the_row_as_measured_and_in_the_objective(tmp_path: Path):
    r = runner(tmp_path)
    try:
        row = r.run(trial(tmp_path))
    finally:
        r.close()
    assert row.status is Status.OK, row.reason
    assert row.extra["generation"] == "measured(vllm)"
    assert row.generation_s is not None and 0.02 < row.generation_s < 5
    train = row.old_log_prob_s + row.update_actor_s
    assert row.extra["train_tokens_per_s_per_gpu"] == 250.0
    assert row.tokens_per_s_per_gpu == pytest.approx(250.0 * train / (train + row.generation_s))
    assert row.backend.endswith("vLLM 0.24.0+fake: generation")
    assert "vllm=0.24.0+fake" in row.versions
    assert row.extra["gen_kv_cache_blocks"] == 6000 and row.extra["gen_kv_block_size"] == 16
    assert row.extra["gen_max_concurrency"] == pytest.approx(6000 / math.ceil(40960 / 16), 0.01)


def _run_asking(tmp_path: Path, answer: bool) -> tuple[Any, Any, list[float]]:
    """A slow trial whose early-stop question is answered `answer`: (trial, row, what the
    pruner was told at each step)."""
    asked: list[float] = []

    def stop(step: int, tps: float) -> bool:
        asked.append(tps)
        return answer

    r = runner(tmp_path, slow=True)
    t = dataclasses.replace(trial(tmp_path), should_stop=stop)
    try:
        row = r.run(t)
    finally:
        r.close()
    return t, row, asked


def test_early_stop_is_told_the_throughput_with_generation(tmp_path: Path):
    t, row, asked = _run_asking(tmp_path, False)
    assert row.status is Status.OK, row.reason
    lens = json.loads((t.trial_dir / "spec.json").read_text())["lengths"]
    g_run = row.generation_s * lens["mini_batches_run"] / lens["mini_batches_per_step"]
    assert asked and asked[0] == pytest.approx(800 / (2.0 + g_run) / 2)


def test_a_stopped_trial_keeps_the_throughput_the_pruner_was_told(tmp_path: Path):
    """A pruned-slow row of a whole-step study is a whole step's number, not the training
    phases' alone (gen8k-h200-x1 trial 8 showed 13066, its training rate, where the pruner had
    been told the step with its 134 s of generation)."""
    _, row, asked = _run_asking(tmp_path, True)
    assert row.status is Status.PRUNED_SLOW, row.reason
    assert row.generation_s is not None and row.generation_s > 0
    assert row.tokens_per_s_per_gpu == pytest.approx(asked[-1])
    assert f"{asked[-1]:.0f} tokens/s/GPU" in row.reason


def test_without_vllm_or_a_config_json_generation_stays_predicted(tmp_path: Path):
    r = MegatronRunner(model_config=str(CONFIG), env={"PYTHONPATH": str(ROOT)})
    on, line = r.generation.decide()
    assert not on and "pip install vllm==0.24.0" in line
    assert r.space_limits(get_model(str(CONFIG))).pinned == MEGATRON_PINNED
    on, line = MegatronRunner(model_config="qwen2.5-7b").generation.decide()
    assert not on and "config.json" in line
    r = runner(tmp_path, generation=False)
    assert r.generation.decide() == (False, "generation predicted (--no-measure-generation)")
    row = r.run(trial(tmp_path))
    assert row.generation_s is None and row.extra["generation"] == "predicted"
    assert not events(tmp_path)


def test_space_searches_the_rollout_knobs_and_the_recipe_says_so(tmp_path: Path):
    r = runner(tmp_path)
    limits = r.space_limits(get_model(str(CONFIG)))
    names = {k for k, _ in limits.pinned}
    assert not names & {"rollout_tp", "gpu_memory_utilization", "max_num_seqs", "enforce_eager",
                        "max_num_batched_tokens"}  # fmt: skip
    assert {"rollout_dp", "rollout_ep", "attention_backend"} <= names
    assert "generation measured with vLLM 0.24.0+fake" in limits.why
    measured = pinned_knobs("megatron", {"generation": "measured(vllm)"})
    assert measured == pinned_knobs("megatron", f"a=1;{MEASURED}") != MEGATRON_PINNED
    assert pinned_knobs("megatron", "generation=predicted") == MEGATRON_PINNED
    c = trial(tmp_path).candidate
    assert "ran no generation" in pinned_lines(c, MEGATRON_PINNED, "megatron")[0]
    text = "\n".join(pinned_lines(c, measured, "megatron"))
    assert "measured generation with vLLM" in text and "was not measured" not in text


@pytest.mark.parametrize(
    ("cand", "why"),
    [
        ({"rollout_tp": 4}, "rollout tp(4)"),  # the shared rule says it first
        ({"rollout_tp": 2, "rollout_dp": 2, "gpus": 4}, "rollout dp(2) / ep(1)"),
    ],
)
def test_rollout_refusals_cost_no_launch(tmp_path: Path, cand: dict, why: str):
    r = runner(tmp_path, train=False)
    row = r.run(trial(tmp_path, **cand))
    assert row.status is Status.PRUNED_INVALID and why in row.reason, row.reason
    assert not events(tmp_path)  # no engine was built


def test_vllm_heads_rules_are_the_shared_ones_plus_one_engine():
    from tuner.runners.megatron_generation import GENERATION_RULES, vllm_refusals
    from tuner.space.rules import RULES

    shared = [r for r in RULES if r.name.startswith("rollout_")]
    assert all(any(r is g for g in GENERATION_RULES) for r in shared)  # the same objects
    cl = Cluster(gpu=get_gpu("h100"), num_gpus=8)
    w = get_workload("dapo-math")
    m = get_model(str(CONFIG))  # 16 heads, 8 kv heads
    lay = ParallelLayout(world=8)
    assert not vllm_refusals(Candidate(layout=lay, rollout_tp=8), m, cl, w)
    # tp across nodes passes the shared rules; one engine on one host cannot run it
    two_nodes = Cluster(gpu=get_gpu("h100"), num_gpus=8, gpus_per_node=4)
    why = vllm_refusals(Candidate(layout=lay, rollout_tp=8), m, two_nodes, w)
    assert len(why) == 1 and why[0].startswith("[one_engine] rollout tp(8) > the 4 GPUs on")
    m3 = dataclasses.replace(m, num_attention_heads=12, num_kv_heads=4)
    got = vllm_refusals(Candidate(layout=lay, rollout_tp=8), m3, cl, w)
    assert any("[rollout_tp]" in g and "does not divide the 12 heads" in g for g in got)
    m6 = dataclasses.replace(m, num_attention_heads=24, num_kv_heads=6)
    got = vllm_refusals(Candidate(layout=lay, rollout_tp=4), m6, cl, w)
    assert any("6 kv heads" in g for g in got)


@pytest.mark.parametrize(
    ("mode", "status", "words"),
    [
        ("refuse", Status.FAILED, "generation: vLLM refused: To serve at least one request"),
        ("oom", Status.OOM, "CUDA out of memory"),
        ("short", Status.FAILED, "were requested"),
    ],
)
def test_vllm_failures_are_rows_and_skip_training(tmp_path: Path, mode, status, words):
    r = runner(tmp_path, mode, train=False)
    try:
        row = r.run(trial(tmp_path))
    finally:
        r.close()
    assert row.status is status and words in row.reason, row.reason
    assert row.extra["phase"] == "generation"


def test_classify_failure_reads_vllms_root_cause():
    front = "RuntimeError: Engine core initialization failed. See root cause above."
    log = (
        "Traceback (most recent call last):\n"
        "ValueError: Total number of attention heads (12) must be divisible by tensor parallel "
        "size (8).\n"
    )
    assert classify_failure(front, log) == (
        "refused",
        "vLLM refused: Total number of attention heads (12) must be divisible by tensor "
        "parallel size (8).",
    )
    free = "ValueError: Free memory on device cuda:0 (10.1/79.2 GiB) on startup is less than"
    assert classify_failure(front, free)[0] == "refused"
    assert classify_failure("CUDA Error: out of memory at cumem_allocator.cpp:62")[0] == "oom"
    assert classify_failure("RuntimeError: boom") == ("failed", "RuntimeError: boom")


def test_a_utilization_the_actor_leaves_no_room_for_is_unfit():
    m, cl = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=8)
    w = get_workload("dapo-math")
    lay = ParallelLayout(world=8, tp=2)
    e = estimate(Candidate(layout=lay, gpu_memory_utilization=0.8), m, cl, w)
    why = unfit_in_generation(e, cl, None)
    assert why.startswith("gpu_memory_utilization(0.80) leaves no room for the actor"), why
    offloaded = Candidate(
        layout=lay, gpu_memory_utilization=0.4, param_offload=True, optimizer_offload=True
    )
    assert unfit_in_generation(estimate(offloaded, m, cl, w), cl, None) == ""


def test_a_weight_sync_that_does_not_fit_is_not_blamed_on_the_utilization():
    """verl's weight sync holds no vLLM budget (its KV cache asleep): where it is generation's
    peak, no gpu_memory_utilization makes room, and the reason says so."""
    m, cl = get_model("qwen2.5-14b"), Cluster(gpu=get_gpu("h100"), num_gpus=8)
    w = get_workload("dapo-math")
    lay = ParallelLayout(world=8, tp=1)
    whys = set()
    for util in (0.2, 0.3):
        e = estimate(
            Candidate(layout=lay, gpu_memory_utilization=util, optimizer_offload=True), m, cl, w
        )
        assert e.memory.weight_sync_device_gib == e.memory.generation_device_gib
        why = unfit_in_generation(e, cl, None)
        assert why.startswith("verl's weight sync holds "), why
        assert "gpu_memory_utilization(" not in why
        whys.add(why)
    assert len(whys) == 1  # the utilization changes nothing in it


def test_generation_fit_is_verls_whatever_kernels_the_local_layers_pin():
    """Real verl ran results/verl4k-h100-x1.csv trial 1 (gpu_memory_utilization 0.5, device
    72.6 GiB sampled); the fast runner's local layers pin the fusions off, and their worker's
    outside memory (8.9 GiB, eager NCCL then) once made the same candidate unfit in generation
    (77.6 GiB). The worker's outside memory is its training phases' (the runner's view)."""
    import csv

    rows = list(csv.DictReader((ROOT / "results" / "verl4k-h100-x1.csv").open()))
    row = next(r for r in rows if r["trial"] == "1")
    assert float(row["peak_mem_device_gib"]) < 79.0 and row["status"] == "ok"
    m, cl = get_model(str(CONFIG)), Cluster(gpu=get_gpu("h100"), num_gpus=1, gpus_per_node=1)
    w = get_workload("dapo-math").with_overrides(
        prompt_len=256, prompt_mean=256, response_len=4096, response_mean=4096,
        batch_size=8, n=4, mini_batch_size=4,
    )  # fmt: skip
    verl = Candidate.from_record(row, 1)
    kernels = {k: v for k, v in measured_pins(MEGATRON_PINNED) if not k.startswith("rollout_")}
    local = dataclasses.replace(verl, **kernels)
    e_verl, e_local = estimate(verl, m, cl, w), estimate(local, m, cl, w)
    assert e_local.memory.update_device_gib > e_verl.memory.update_device_gib  # local tensors
    _, worker, _, _ = memory_view(
        e_local, cl, phases=("update_actor",), process_gib=megatron_worker_gib()
    )
    verl_update = e_verl.memory.update_device_gib - e_verl.memory.training_process_gib
    assert worker > verl_update + MEGATRON_WORKER_GIB - CUDA_CONTEXT_GIB  # the worker's process
    assert e_local.memory.generation_device_gib == e_verl.memory.generation_device_gib
    assert unfit_in_generation(e_local, cl, None) == ""


def test_measure_generation_without_vllm_is_exit_2_and_writes_nothing(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.chdir(tmp_path)
    args = ["--model", str(CONFIG), "--gpus", "1", "--runner", "megatron",
            "--measure-generation", "--results-dir", "r", "--recipes-dir", "rc"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install vllm==0.24.0" in err, err
    assert list(tmp_path.iterdir()) == []
    assert main([*args[:5], "estimate", "--measure-generation"]) == 2
    assert "applies to the megatron runner" in capsys.readouterr().err
