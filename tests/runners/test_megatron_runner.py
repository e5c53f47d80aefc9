"""The megatron runner on a CPU: the worker spec it writes, and rows from what a launch leaves
(a real small program stands in for torchrun + the worker)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from tuner.estimate import estimate
from tuner.estimate.device import CUDA_CONTEXT_GIB, MEGATRON_WORKER_GIB, WORKER_NCCL_INIT
from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.results import Status
from tuner.runners.base import TrialSpec
from tuner.runners.megatron import MegatronRunner, worker_spec
from tuner.runners.megatron_worker import WorkerSpec
from tuner.runners.process import run_process
from tuner.space import Candidate, ParallelLayout
from tuner.workload import get_workload

FAKE_WORKER = """
import json, sys, time
args = sys.argv[1:]
spec = json.load(open(args[args.index("--spec") + 1]))
out = args[args.index("--out") + 1]
progress = args[args.index("--progress") + 1]
mode = {mode!r}
print("fake worker", mode, flush=True)
if mode == "ok":
    r = {{"schema": 2, "status": "ok", "phase": "update_actor", "step_s": 3.0,
          "old_log_prob_s": 1.0, "update_actor_s": 2.0,
          "step_times_s": [3.1, 3.0, 3.0], "tokens": 1000, "tokens_per_s_per_gpu": 125.0,
          "mfu_pct": 30.0, "peak_mem_allocated_gib": 40.0, "peak_mem_reserved_gib": 44.0,
          "peak_mem_device_gib": 47.5, "launch_s": 20.0, "measured_s": 9.1,
          "num_micro_batches": 6, "versions": {{"torch": "2.11", "megatron_core": "0.19.2"}},
          "gpu": "NVIDIA H100 80GB HBM3", "world_size": 8,
          "extra": {{"attention": "varlen_attn", "init_s": 9.0}}}}
elif mode == "oom":
    r = {{"schema": 2, "status": "oom", "phase": "update_actor",
          "reason": "OutOfMemoryError: CUDA out of memory. Tried to allocate 9 GiB",
          "mem_at_failure": {{"allocated": 70.1, "reserved": 72.0, "device": 79.2}}}}
elif mode == "slow":
    for i in range(30):
        with open(progress, "a") as f:
            f.write(json.dumps({{"step": i, "seconds": 2.0, "tokens": 800,
                                 "old_log_prob_s": 0.5, "update_actor_s": 1.5}}) + "\\n")
        time.sleep(0.3)
elif mode == "crash-oom":
    print("torch.OutOfMemoryError: CUDA out of memory.", flush=True)
    sys.exit(1)
elif mode == "hang":
    import time
    time.sleep(60)
if mode in ("ok", "oom"):
    json.dump(r, open(out, "w"))
sys.exit(0 if mode == "ok" else 1)
"""


def trial(tmp: Path, timeout_s: float = 60.0, **cand: object) -> TrialSpec:
    m, cl = get_model("qwen3-30b-moe"), Cluster(gpu=get_gpu("h100"), num_gpus=8)
    w = get_workload("dapo-math")
    cand.setdefault("ppo_max_token_len_per_gpu", 12288)
    cand.setdefault("log_prob_max_token_len_per_gpu", 12288)
    c = Candidate(
        layout=ParallelLayout(world=8, pp=2, vpp=2, ep=4),
        **cand,  # type: ignore[arg-type]
    )
    return TrialSpec(
        number=3,
        candidate=c,
        model=m,
        cluster=cl,
        workload=w,
        trial_dir=tmp / "trials" / "3",
        timeout_s=timeout_s,
        prediction=estimate(c, m, cl, w),
        seed=5,
    )


def fake_runner(tmp: Path, mode: str) -> MegatronRunner:
    script = tmp / f"fake_{mode}.py"
    script.write_text(FAKE_WORKER.format(mode=mode))

    def launch(cmd, **kw):
        assert cmd[1:4] == ["-m", "torch.distributed.run", "--standalone"]
        assert cmd[cmd.index("--nproc-per-node") + 1] == "8"
        assert kw["env"]["NCCL_NVLS_ENABLE"] == "0"
        return run_process([sys.executable, str(script), *cmd[cmd.index("--spec") :]], **kw)

    return MegatronRunner(launch=launch)


def test_worker_spec_follows_candidate_model_and_workload():
    t = trial(Path("/nonexistent"), recompute_granularity="full", recompute_num_layers=1)
    d = worker_spec(t.candidate, t.model, t.cluster, t.workload, seed=5, mini_batches=2)
    s = WorkerSpec.from_dict(json.loads(json.dumps(d)))
    w = t.workload
    assert s.layout == t.candidate.layout and s.layout.dp == 4
    assert s.model == t.model
    assert s.batch.mini_batch_size == w.mini_batch_size * w.n
    assert len(s.batch.sequence_lengths) == 2 * w.mini_batch_size * w.n
    assert max(s.batch.sequence_lengths) <= w.max_seq_len
    assert s.recompute.granularity == "full" and s.recompute.num_layers == 1
    assert s.phases == ("old_log_prob", "update_actor") and s.use_fused_kernels
    assert d["lengths"]["mini_batches_per_step"] == w.mini_batches_per_step
    assert d == worker_spec(t.candidate, t.model, t.cluster, t.workload, seed=5, mini_batches=2)


def test_the_spec_and_the_timeout_know_the_measured_window(tmp_path: Path):
    r = MegatronRunner(min_measured_s=12.0, max_steps=8)
    seen = {}

    def launch(cmd, **kw):
        seen.update(json.loads((tmp_path / "t" / "trials" / "3" / "spec.json").read_text()))
        raise RuntimeError("stop here")

    t = trial(tmp_path / "t")
    with pytest.raises(RuntimeError):
        MegatronRunner(min_measured_s=12.0, max_steps=8, pool=False, launch=launch).run(t)
    assert seen["min_measured_s"] == 12.0 and seen["max_steps"] == 8 and seen["steps"] == 2
    # the worker's rule, in seconds: 2 steps of 19 s; 5 of 2.7 s; at most 8 of 0.5 s
    assert r.measured_window_s(19.0) == 38.0
    assert r.measured_window_s(2.7) == pytest.approx(13.5)
    assert r.measured_window_s(0.5) == 4.0


def test_refused_candidates_cost_no_launch(tmp_path: Path):
    def launch(*a, **k):
        raise AssertionError("must not launch")

    t = trial(tmp_path, ppo_max_token_len_per_gpu=4096)
    row = MegatronRunner(launch=launch).run(t)
    assert row.status is Status.PRUNED_INVALID and "[token_budget]" in row.reason
    assert "ppo_max_token_len_per_gpu(4096) * cp(1) is below one sample's" in row.reason
    moe_tp = dataclasses.replace(
        t, candidate=dataclasses.replace(t.candidate, layout=ParallelLayout(world=8, tp=2, ep=4))
    )
    row = MegatronRunner(launch=launch).run(moe_tp)
    assert row.status is Status.PRUNED_INVALID and "sequence parallel" in row.reason


def test_ok_row_has_both_phases_memory_three_ways_and_launch_time(tmp_path: Path):
    t = trial(tmp_path)
    row = fake_runner(tmp_path, "ok").run(t)
    assert row.status is Status.OK, row.reason
    scale = t.workload.mini_batches_per_step / 2
    assert scale > 1  # the test means something only where the run is part of the step
    # both phases mean the whole step, as the cost model's and verl's do; the measured times of
    # the mini-batches run stay in `extra`
    assert row.update_actor_s == pytest.approx(2.0 * scale)
    assert row.old_log_prob_s == pytest.approx(1.0 * scale)
    assert row.extra["old_log_prob_s_run"] == 1.0 and row.extra["update_s_run"] == 2.0
    assert row.step_s is None and row.generation_s is None
    assert row.backend.startswith("megatron-core: old_log_prob + update_actor")
    assert row.tokens_per_s_per_gpu == 125.0
    # the update's MFU by the tuner's one formula over the update's measured time (the worker's
    # 30%, both phases' FLOPs over both phases' time, is not it)
    lengths = json.loads((t.trial_dir / "spec.json").read_text())["batch"]["sequence_lengths"]
    peak = t.cluster.gpu.bf16_tflops * 1e12 * t.cluster.num_gpus
    assert row.mfu_update_pct == pytest.approx(100 * t.model.training_flops(lengths) / 2.0 / peak)
    assert row.verl_mfu_actor_pct is None
    assert (row.peak_mem_gib, row.peak_mem_reserved_gib, row.peak_mem_device_gib) == (
        40.0, 44.0, 47.5)  # fmt: skip
    assert row.launch_s == 20.0 and row.measured_s == 9.1
    assert row.hardware == "8x NVIDIA H100 80GB HBM3"
    assert "megatron_core=0.19.2" in row.versions
    assert row.extra["attention"] == "varlen_attn" and row.extra["mini_batches_run"] == 2
    assert row.extra["nccl_init"] == "lazy"  # the fit tells the eager worker's rows by it
    assert (t.trial_dir / "spec.json").is_file()
    assert "fake worker ok" in Path(row.log_path).read_text()


def test_oom_result_and_oom_crash_are_oom_rows(tmp_path: Path):
    row = fake_runner(tmp_path, "oom").run(trial(tmp_path))
    assert row.status is Status.OOM and row.reason.startswith("update_actor: OutOfMemoryError")
    assert row.extra["oom_device_gib"] == 79.2 and row.extra["oom_allocated_gib"] == 70.1
    row = fake_runner(tmp_path, "crash-oom").run(trial(tmp_path))
    assert row.status is Status.OOM and "CUDA out of memory" in row.reason
    assert row.extra["nccl_init"] == "lazy"  # a row without the worker's result says it too


def test_a_hang_is_a_timeout_row(tmp_path: Path):
    row = fake_runner(tmp_path, "hang").run(trial(tmp_path, timeout_s=2))
    assert row.status is Status.TIMEOUT


def test_should_stop_prunes_a_slow_trial_with_its_partial_times(tmp_path: Path):
    asked: list[tuple[int, float]] = []

    def stop(step: int, tps: float) -> bool:
        asked.append((step, tps))
        return step >= 1

    t = dataclasses.replace(trial(tmp_path, timeout_s=60), should_stop=stop)
    row = fake_runner(tmp_path, "slow").run(t)
    assert row.status is Status.PRUNED_SLOW
    assert asked[:2] == [(0, 50.0), (1, 50.0)]  # 800 tokens / 2 s / 8 GPUs
    scale = t.workload.mini_batches_per_step / 2
    assert row.tokens_per_s_per_gpu == 50.0 and row.old_log_prob_s == pytest.approx(0.5 * scale)
    assert row.extra["old_log_prob_s_run"] == 0.5
    assert row.extra["wall_s"] < 30
    assert row.extra["pool_started"] is False  # one-shot launch: no pool


def test_stale_result_is_not_read(tmp_path: Path):
    t = trial(tmp_path)
    t.trial_dir.mkdir(parents=True)
    (t.trial_dir / "result.json").write_text('{"schema": 2, "status": "ok"}')
    row = fake_runner(tmp_path, "crash-oom").run(t)
    assert row.status is Status.OOM


def test_space_without_transformer_engine_has_no_cp_or_sp_and_pins_unmeasured_knobs() -> None:
    from tuner.space import SearchSpace, params_for

    m = get_model("qwen3-30b-moe")
    cl = Cluster(gpu=get_gpu("h200"), num_gpus=8)
    limits = MegatronRunner().space_limits(m)
    assert not limits.context_parallel and not limits.sequence_parallel  # no TE on CI
    assert "transformer-engine" in limits.why
    space = SearchSpace(model=m, cluster=cl, workload=get_workload("grpo-short"), limits=limits)
    assert all(lay.cp == 1 and lay.tp == 1 for lay in space.layouts.values())
    c = Candidate(layout=ParallelLayout.parse("ep8", 8), rollout_tp=2, use_fused_kernels=True)
    params = params_for(c, space)
    assert {"rollout_tp", "gpu_memory_utilization", "apply_rope_fusion"}.isdisjoint(params)
    assert "use_fused_kernels" in params  # measured now


def test_prediction_is_old_log_prob_and_update() -> None:
    m, w = get_model("qwen2.5-7b"), get_workload("grpo-short")
    cl = Cluster(gpu=get_gpu("h200"), num_gpus=2)
    c = Candidate(
        layout=ParallelLayout.parse("tp2", 2),
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=w.max_seq_len * 2,
        log_prob_max_token_len_per_gpu=w.max_seq_len * 2,
        gpu_memory_utilization=0.9,
    )
    e = estimate(c, m, cl, w)
    p = MegatronRunner().predicted(e, cl)
    assert p.phase == "update_actor"
    assert p.peak_gib == pytest.approx(e.memory.update_peak_gib - e.memory.reference_gib)
    # the device total is the worker process's: its outside memory for verl's context, whatever
    # layers it builds (these kernels are the te layers')
    mem = e.memory
    assert p.device_gib == pytest.approx(
        mem.update_device_gib
        - mem.reference_gib
        - CUDA_CONTEXT_GIB
        + MEGATRON_WORKER_GIB
        - mem.training_process_gib  # verl's vLLM asleep: not in the worker's process
    )
    # vLLM's 90% share makes the whole step not fit; the update alone does
    assert not e.fits and not p.unfit
    assert p.tokens_per_s_per_gpu == pytest.approx(
        e.tokens_per_step / (e.update_actor_s + e.old_log_prob_s) / 2
    )
    assert p.tokens_per_s_per_gpu > e.throughput_tokens_per_s_per_gpu


def test_space_offers_no_recompute_module_the_worker_cannot_build() -> None:
    """Issue 19 item 5: the runner pins moe_grouped_gemm on (its experts are grouped GEMMs) but
    the worker's TransformerConfig has megatron-core's flag off, which refuses moe_act: such a
    candidate is refused before a launch and never offered."""
    import random

    from tuner.runners.megatron_refusals import megatron_refusals, refusals
    from tuner.runners.megatron_worker.model import CONFIG_MOE_GROUPED_GEMM
    from tuner.space import RandomSuggester, SearchSpace, sample

    assert CONFIG_MOE_GROUPED_GEMM is False
    m = get_model("qwen3-30b-moe")
    cl, w = Cluster(gpu=get_gpu("h200"), num_gpus=8), get_workload("grpo-short")
    lay = ParallelLayout.parse("ep8", 8)
    pinned = Candidate(
        layout=lay,
        recompute_granularity="selective",
        recompute_modules="core_attn,moe_act",
        moe_grouped_gemm=True,
        ppo_max_token_len_per_gpu=w.max_seq_len,
        log_prob_max_token_len_per_gpu=w.max_seq_len,
    )
    assert {r.rule for r in refusals(pinned, m, cl, w)} == {"moe_act_needs_grouped_gemm"}
    kept = dataclasses.replace(pinned, recompute_modules="core_attn")
    assert not megatron_refusals(kept, m, cl, w)
    limits = MegatronRunner().space_limits(m)
    assert limits.recompute_modules_refused == ("moe_act",)
    space = SearchSpace(model=m, cluster=cl, workload=w, limits=limits)
    rng = random.Random(0)
    seen = set()
    for _ in range(300):
        c = sample(RandomSuggester(rng), space)
        if c.recompute_granularity == "selective":
            seen.add(c.recompute_modules)
            assert "moe_act" not in c.recompute_modules.split(",")
            assert not [r for r in refusals(c, m, cl, w) if r.rule == "moe_act_needs_grouped_gemm"]
    assert "moe" in seen  # the other MoE sets are still offered
    # a dense model's space (no MoE module offered) keeps its fingerprint
    dense = get_model("qwen2.5-7b")
    assert MegatronRunner().space_limits(dense).recompute_modules_refused == ()


def test_the_worker_starts_nccl_lazily() -> None:
    """The worker's init_process_group passes no device_id (WORKER_NCCL_INIT, what its rows
    record): with one, torch initialises NCCL eagerly and each of megatron's groups splits a
    communicator at once, 6.46 GiB more outside PyTorch on one H100 (estimate/device.py
    EAGER_NCCL_EXCESS_GIB). Megatron cannot run here, so the call is read from the source."""
    import ast

    import tuner.runners.megatron_worker.main as worker_main

    tree = ast.parse(Path(worker_main.__file__).read_text())
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "init_process_group"
    ]
    assert len(calls) == 1
    assert [k.arg for k in calls[0].keywords] == []
    assert [a.value for a in calls[0].args if isinstance(a, ast.Constant)] == ["nccl"]
    assert WORKER_NCCL_INIT == "lazy"
