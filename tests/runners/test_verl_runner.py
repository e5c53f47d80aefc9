"""The verl runner end to end on this node: the real local launcher starts tests/fake_verl.py (a
stand-in for verl's main_ppo that logs with verl's own Tracking) with the trial's real command,
and the row comes from what it left: metrics file, log, exit. Plus the GPU checks and the CLI."""

from __future__ import annotations

import importlib.util
import os
import shlex
import stat
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tuner import verl_command
from tuner.cli import main
from tuner.errors import UserError
from tuner.hardware import Cluster, get_gpu
from tuner.results import Status
from tuner.runners import make_runner
from tuner.runners.launchers.local import count_local_gpus
from tuner.runners.verl import VerlRunner

pytestmark = [
    pytest.mark.verl,
    pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="needs verl"),
]


def _helpers() -> Any:
    """tests/verl_helpers.py, loaded by path (tests/ is not a package)."""
    path = Path(__file__).resolve().parents[1] / "verl_helpers.py"
    spec = importlib.util.spec_from_file_location("verl_helpers", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


H = _helpers()
FAKE_VERL = H.FAKE_VERL
spec_for = H.spec_for


def runner(mode: str, **kw: object) -> VerlRunner:
    return VerlRunner(
        model_path=f"fake/{mode}",
        entrypoint=[sys.executable, str(FAKE_VERL)],
        **kw,  # type: ignore[arg-type]
    )


def test_ok_trial_reads_step_3(tmp_path: Path) -> None:
    spec = spec_for(tmp_path)
    res = runner("ok").run(spec)
    assert res.status is Status.OK, res.reason
    assert res.source == "verl"
    assert res.tokens_per_s_per_gpu == 1030.0  # fake_verl: 1000 + 10 * step
    assert res.step_s == 103.0
    assert (res.generation_s, res.old_log_prob_s, res.ref_s) == (50.0, 10.0, 9.0)
    assert (res.update_actor_s, res.reshard_s) == (25.0, 4.0)
    assert res.verl_mfu_actor_pct == pytest.approx(31.0) and res.mfu_update_pct is None
    assert (res.peak_mem_gib, res.peak_mem_reserved_gib) == (60.5, 70.25)
    assert "verl=0.9.1" in res.versions
    assert res.extra["metrics"] == "file" and res.extra["step"] == 3
    assert res.extra["response_mode"] == "drawn"
    asked = res.extra["response_mean_asked"]
    assert asked == pytest.approx(spec.workload.mean_response_len, abs=0.01)
    assert res.extra["response_length_mean"] == pytest.approx(asked, abs=0.5)
    assert res.extra["dataset"] == "synthetic"
    trial = spec.trial_dir.resolve()
    assert res.log_path == str(trial / "verl.log")
    assert "step:3 - " in (trial / "verl.log").read_text()
    assert (trial / "verl-tuner").is_dir()
    cmd = (trial / "command.sh").read_text()
    assert "trainer.total_training_steps=3" in cmd and "VERL_FILE_LOGGER_ROOT" in cmd
    data = tmp_path / "results" / "study" / "data"
    (ds,) = data.iterdir()
    assert (ds / "train.parquet").is_file() and (ds / "reward.py").is_file()
    assert f"data.train_files={ds / 'train.parquet'}" in cmd


def test_oom_is_a_row_with_its_phase(tmp_path: Path) -> None:
    res = runner("oom").run(spec_for(tmp_path))
    assert res.status is Status.OOM
    assert res.reason.startswith("CUDA OOM in update_actor")
    assert res.extra["failure"] == "oom" and res.extra["phase"] == "update_actor"
    assert res.extra["last_step"] == 1
    assert res.tokens_per_s_per_gpu is None and res.value is None


def test_a_killed_run_is_failed_with_its_exit(tmp_path: Path) -> None:
    res = runner("die").run(spec_for(tmp_path))
    assert res.status is Status.FAILED
    assert res.reason == "verl was killed by signal 9 after step 1; no error in the log"


def test_config_error(tmp_path: Path) -> None:
    res = runner("config").run(spec_for(tmp_path))
    assert res.status is Status.FAILED
    assert res.extra["failure"] == "config-error"
    assert "grad_offload" in res.reason


def test_a_hang_ends_as_timeout_and_the_process_is_gone(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, timeout_s=6)
    res = runner("hang").run(spec)
    assert res.status is Status.TIMEOUT
    assert "last step logged: 1" in res.reason
    pid = int((spec.trial_dir / "fake_verl.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_users_dataset_and_reward(tmp_path: Path) -> None:
    train = tmp_path / "mine" / "train.parquet"
    train.parent.mkdir()
    train.write_bytes(b"PAR1")
    (train.parent / "reward.py").write_text("def compute_score(**kw):\n    return 0.0\n")
    spec = spec_for(tmp_path)
    res = runner("ok", train_file=train).run(spec)
    assert res.status is Status.OK
    cmd = (spec.trial_dir / "command.sh").read_text()
    assert f"reward.custom_reward_function.path={train.parent / 'reward.py'}" in cmd
    assert res.extra["dataset"] == str(train)


# --------------------------------------------------------------------------------------------
# GPUs seen, and the CLI
# --------------------------------------------------------------------------------------------


@pytest.fixture
def nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An nvidia-smi stand-in on PATH that lists two H100s."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-smi"
    exe.write_text(
        "#!/usr/bin/env bash\n"
        'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n'
        'echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"\n'
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return exe


def test_local_launcher_counts_gpus(nvidia_smi: Path) -> None:
    assert count_local_gpus() == 2
    r = runner("ok")
    r.check_available(Cluster(gpu=get_gpu("h100"), num_gpus=2))
    with pytest.raises(UserError, match="sees 2 GPU.*asks for 8"):
        r.check_available(Cluster(gpu=get_gpu("h100"), num_gpus=8))
    with pytest.raises(UserError, match="needs 2 nodes: use --launcher ray"):
        r.check_available(Cluster(gpu=get_gpu("h100"), num_gpus=16))


def test_runner_options_are_checked() -> None:
    with pytest.raises(UserError, match="--model-path"):
        make_runner("verl")
    with pytest.raises(UserError, match="--ray-address"):
        make_runner("verl", model_path="/m", launcher="ray")
    with pytest.raises(UserError, match="dashboard address"):
        make_runner("verl", model_path="/m", launcher="ray", ray_address="ray://head:10001")
    with pytest.raises(UserError, match="does not exist"):
        make_runner("verl", model_path="/nowhere/model").check_available(
            Cluster(gpu=get_gpu("h100"), num_gpus=1)
        )


def test_tune_refuses_more_gpus_than_it_sees(
    workdir: Path, nvidia_smi: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = workdir / "model"
    model.mkdir()
    argv = ["--model", "qwen2.5-7b", "--gpus", "8", "--runner", "verl", "--no-progress"]
    assert main([*argv, "--model-path", str(model)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sees 2 GPU(s), --gpus asks for 8" in err[0]
    assert main([*argv]) == 2
    assert "--model-path" in capsys.readouterr().err


def test_cli_passes_the_verl_options(monkeypatch: pytest.MonkeyPatch, workdir: Path) -> None:
    seen: dict[str, object] = {}

    def fake_make_runner(name: str, **options: object) -> object:
        seen.update(options, name=name)
        raise UserError("stop here")

    monkeypatch.setattr("tuner.runners.make_runner", fake_make_runner)
    argv = ["--model", "qwen2.5-7b", "--gpus", "16", "--runner", "verl", "--launcher", "slurm"]
    argv += ["--model-path", "/m", "--slurm-partition", "gpu", "--slurm-arg=--qos=high"]
    assert main([*argv, "--slurm-setup", "source /venv/bin/activate", "--no-progress"]) == 2
    assert seen["name"] == "verl" and seen["launcher"] == "slurm"
    assert seen["model_path"] == "/m" and seen["slurm_partition"] == "gpu"
    assert seen["slurm_args"] == ["--qos=high"]
    assert seen["slurm_setup"] == "source /venv/bin/activate"
    assert verl_command.CONFIG_NAME == "ppo_megatron_trainer"


# --------------------------------------------------------------------------------------------
# Wall time and device memory of a trial
# --------------------------------------------------------------------------------------------


def test_wall_time_splits_into_start_up_warm_up_and_the_measured_step() -> None:
    from tuner.runners.verl_log import split_wall_time

    steps = {s: {"timing_s/step": 40.0 + s} for s in (1, 2, 3)}
    extra: dict[str, object] = {}
    out = split_wall_time(steps, 3, 400.0, extra)
    assert out == {"measured_s": 43.0, "launch_s": 400.0 - 41 - 42 - 43}
    assert extra["warmup_s"] == 83.0
    assert split_wall_time({1: {"timing_s/step": 1.0}}, 3, 400.0, {}) == {}


def test_later_steps_are_measured_too_and_the_row_says_how_many(tmp_path: Path) -> None:
    """Issue 36 item 4: a run of 5 steps measures steps 3-5: each phase their mean, the
    throughput their tokens over their time, the measured time their sum; the first step's
    phases are kept beside (what it spends beyond a steady step)."""
    spec = spec_for(tmp_path)
    res = runner("ok", steps=5).run(spec)
    assert res.status is Status.OK, res.reason
    assert res.extra["step"] == 3 and res.extra["measured_steps"] == 3
    assert res.step_s == pytest.approx(104.0)  # fake_verl: 100 + step
    tokens = sum((1000.0 + 10 * s) * (100.0 + s) * 8 for s in (3, 4, 5))
    assert res.tokens_per_s_per_gpu == pytest.approx(tokens / (103 + 104 + 105) / 8)
    assert res.measured_s == pytest.approx(103 + 104 + 105)
    assert (res.extra["step_s_min"], res.extra["step_s_max"]) == (103.0, 105.0)
    assert res.extra["step1_s"] == 101.0 and res.extra["step1_update_actor_s"] == 25.0
    cmd = (spec.trial_dir.resolve() / "command.sh").read_text()
    assert "trainer.total_training_steps=5" in cmd


def test_a_split_rows_pools_are_told_apart_by_when_their_memory_rose(tmp_path: Path) -> None:
    """Issue 35 item 2: nvidia-smi's samples of a split run (timestamped); the actor's GPUs
    fill before vLLM's (verl's one-step-off trainer builds the actor first), so the first
    N - r GPUs to rise are the trainer's, whatever their indices."""
    from tuner.runners.verl_device import pool_peaks, read_device_peak, read_device_samples

    f = tmp_path / "device-memory.csv"
    rows = []
    for i, (g0, g1, g2, g3) in enumerate(
        [(500, 500, 500, 500), (500, 30000, 500, 40000), (110000, 90000, 500, 60000)]
    ):
        t = f"2026/11/28 22:30:0{i}.500"
        rows += [f"{t}, 0, {g0}", f"{t}, 1, {g1}", f"{t}, 2, {g2}", f"{t}, 3, {g3}"]
    rows.append("2026/11/28 22:30:04.000, 2, 120000")
    f.write_text("\n".join(rows) + "\n")
    samples = read_device_samples(f)
    assert samples[4] == (1.0, 0, 500.0) and samples[-1][0] == 3.5
    peaks = pool_peaks(samples, trainer_gpus=2)
    assert peaks["trainer_gpu_indices"] == "1+3"
    assert peaks["trainer_device_peak_gib"] == round(90000 / 1024, 3)
    assert peaks["rollout_device_peak_gib"] == round(120000 / 1024, 3)
    assert read_device_peak(f) == round(120000 / 1024, 3)
    assert pool_peaks(samples[:8], trainer_gpus=2) == {}  # the rollout's never rose


def test_device_peak_is_the_largest_sample_of_any_gpu(tmp_path: Path) -> None:
    from tuner.runners.verl_device import read_device_peak

    f = tmp_path / "device-memory.csv"
    f.write_text("0, 1024\n1, 80399\n0, 2048\ngarbage\n1, \n")
    assert read_device_peak(f) == round(80399 / 1024, 3)
    assert read_device_peak(tmp_path / "none.csv") is None
    f.write_text("")
    assert read_device_peak(f) is None


def test_drawn_responses_have_a_tail_and_their_loop(tmp_path: Path) -> None:
    """Responses drawn from the workload's length model: each row of the data carries the n
    lengths of its responses (a long tail, each step's mean the workload's), the rows name the
    capping agent loop, whose config lies beside the data, and verl is told to run it (EOS
    ignored, rows in order); the trial's PYTHONPATH leads to this tuner for verl's workers."""
    import pyarrow.parquet as pq

    spec = spec_for(tmp_path)
    w = spec.workload
    res = runner("ok").run(spec)
    assert res.status is Status.OK, res.reason
    (ds,) = (tmp_path / "results" / "study" / "data").iterdir()
    table = pq.read_table(ds / "train.parquet").to_pydict()
    assert set(table["agent_name"]) == {"verl_tuner_drawn"}
    caps = table["response_caps"]
    assert len(caps) == w.batch_size * 3 and all(len(c) == w.n for c in caps)
    for step in range(3):
        flat = [x for c in caps[step * w.batch_size : (step + 1) * w.batch_size] for x in c]
        assert sum(flat) / len(flat) == pytest.approx(w.mean_response_len, abs=0.01)
        assert max(flat) > 2 * w.mean_response_len and min(flat) < w.mean_response_len / 4
    loops = (ds / "agent_loops.yaml").read_text()
    assert "name: verl_tuner_drawn" in loops
    assert "_target_: tuner.verl_agent_loop.DrawnLengthAgentLoop" in loops
    cmd = (spec.trial_dir.resolve() / "command.sh").read_text()
    assert (
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={ds / 'agent_loops.yaml'}" in cmd
    )
    assert "actor_rollout_ref.rollout.ignore_eos=True" in cmd and "data.shuffle=False" in cmd
    root = str(Path(__import__("tuner").__file__).resolve().parent.parent)
    assert f"export PYTHONPATH={root}" in cmd


def test_fixed_responses_run_no_loop(tmp_path: Path) -> None:
    spec = spec_for(tmp_path)
    w = spec.workload
    spec = replace(spec, workload=w.with_overrides(response_mean=w.response_len))
    res = runner("ok").run(spec)
    assert res.status is Status.OK, res.reason
    assert res.extra["response_mode"] == "fixed" and "response_mean_asked" not in res.extra
    assert res.extra["response_length_mean"] == w.response_len
    cmd = (spec.trial_dir.resolve() / "command.sh").read_text()
    assert "agent_loop_config_path" not in cmd and "data.shuffle" not in cmd


def test_a_row_is_the_workload_that_ran(tmp_path: Path) -> None:
    """verl measured 1-token prompts where the data holds prompts of the workload's length: the
    row keeps its measures but is not ok, and its reason names both lengths."""
    spec = spec_for(tmp_path)
    res = runner("prompt1").run(spec)
    assert res.status is Status.FAILED and res.extra["failure"] == "workload"
    target = round(spec.workload.mean_prompt_len)
    assert res.reason == (
        f"not the declared workload: verl measured a mean prompt of 1 tokens where {target} "
        "were asked (more than 5% off)"
    )
    assert res.tokens_per_s_per_gpu == 1030.0


def test_the_launch_timeline(tmp_path: Path) -> None:
    """The log's clock splits the launch: start-up before step 1, teardown after the last."""
    spec = spec_for(tmp_path)
    res = runner("ok").run(spec)
    clock = (spec.trial_dir.resolve() / "log-clock.csv").read_text().splitlines()
    assert clock[0].startswith("# base ") and len(clock) >= 2
    assert res.extra["startup_s"] == 0.0  # the stand-in logs step 1 at once, "101 s" long
    assert 0 <= res.extra["teardown_s"] < 30


def test_vllms_compile_cache_is_the_studys(tmp_path: Path) -> None:
    """verl disables vLLM's compile cache unless the environment says otherwise: a local study
    keeps it in its own folder for its trials; the user's --verl-env value wins."""
    from tuner.verl_settings import VerlSettings

    spec = spec_for(tmp_path)
    res = runner("ok").run(spec)
    cmd = (spec.trial_dir.resolve() / "command.sh").read_text()
    cache = tmp_path / "results" / "study" / "vllm-cache"
    assert "export VLLM_DISABLE_COMPILE_CACHE=0" in cmd
    assert f"export VLLM_CACHE_ROOT={cache.resolve()}" in cmd
    assert res.extra["vllm_compile_cache"] == "study"
    own = VerlSettings(env=(("VLLM_DISABLE_COMPILE_CACHE", "1"),))
    spec = spec_for(tmp_path, number=1)
    res = runner("ok", settings=own).run(spec)
    cmd = (spec.trial_dir.resolve() / "command.sh").read_text()
    assert "export VLLM_DISABLE_COMPILE_CACHE=1" in cmd and "VLLM_CACHE_ROOT" not in cmd
    assert res.extra["vllm_compile_cache"] == "verl"


def test_a_split_trial_runs_one_step_off_and_its_row_says_so(tmp_path: Path) -> None:
    """Issue 29: a split candidate launches verl's one-step-off-policy trainer with the pools,
    and its row keeps the whole generation (`generate_async`, overlapped) as generation_s, the
    wait in `extra`, the sync as reshard_s, and says the placement and that it ran off-policy."""
    from tuner.dataset import user_dataset
    from tuner.space import ParallelLayout

    spec = spec_for(tmp_path)
    split = replace(
        spec.candidate, layout=ParallelLayout(world=4, tp=2, pp=2), rollout_gpus=4, rollout_tp=2
    )
    spec = replace(spec, candidate=split)
    res = runner("ok").run(spec)
    assert res.status is Status.OK, res.reason
    assert (res.generation_s, res.reshard_s) == (50.0, 4.5)
    assert res.extra["gen_wait_s"] == 5.0
    # issue 35: verl's perf/throughput counts its trainer pool alone (4 GPUs here); the row's is
    # the step's tokens over its time and all 8 GPUs of the study, verl's kept apart by name
    assert res.extra["verl_throughput"] == 1030.0
    assert res.tokens_per_s_per_gpu == pytest.approx(1030.0 * 4 / 8)
    tokens = res.extra["total_num_tokens"]
    assert res.tokens_per_s_per_gpu == pytest.approx(tokens / (res.step_s * 8))
    assert res.extra["placement"] == "split r4+t4"
    assert res.extra["off_policy"] == "one-step-off"
    cmd = (spec.trial_dir.resolve() / "command.sh").read_text()
    for word in (
        "actor_rollout_ref.hybrid_engine=False",
        "rollout.n_gpus_per_node=4",
        "trainer.n_gpus_per_node=4",
        "hydra.searchpath=",
    ):
        assert word in cmd, word
    # without a stand-in, the command is verl's one-step-off entry point
    real = VerlRunner(model_path="/m", python="python3")
    argv = real.command(spec, user_dataset(tmp_path / "t.parquet"))
    assert argv[:4] == ["python3", *verl_command.SPLIT_ENTRYPOINT[1:]]
    colocated = real.command(
        replace(spec, candidate=spec_for(tmp_path).candidate), user_dataset(tmp_path / "t.parquet")
    )
    assert colocated[:4] == ["python3", *verl_command.ENTRYPOINT[1:]]


@pytest.mark.ray
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
def test_shared_ray_runs_two_trials_on_one_head(tmp_path: Path) -> None:
    """--shared-ray: a real Ray head for the study; each trial's environment travels as verl's
    job runtime env (the fake applies it as verl's workers would: its logger finds the trial's
    metrics folder there, not in the driver's environment), so the head, started with the
    study's environment, serves both trials."""
    r = runner("ok", shared_ray=True)
    try:
        rows = [r.run(spec_for(tmp_path, number=n)) for n in (0, 1)]
        head = r.launcher._head  # type: ignore[attr-defined]
        assert head is not None and head.starts == 1
    finally:
        r.close()
    assert not head.running
    for n, res in enumerate(rows):
        assert res.status is Status.OK, res.reason
        assert res.tokens_per_s_per_gpu == 1030.0 and res.extra["ray_cluster"] == "study"
        trial = spec_for(tmp_path, number=n).trial_dir.resolve()
        command = (trial / "command.sh").read_text()
        arg = f"{verl_command.RUNTIME_ENV_VARS}.{verl_command.METRICS_ROOT_ENV}='{trial}'"
        assert shlex.quote(arg) in command
    assert "ray_cluster" not in runner("ok").run(spec_for(tmp_path, number=2)).extra
