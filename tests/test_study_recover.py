"""A trial whose worker died after its launch measured it keeps its row: a resumed study asks the
runner whether the trial's folder holds a finished measurement (`Runner.recover`) before it
re-runs it. With the real files of the verl study on one H100 whose trial 4 reached verl's 3rd
step seconds before the host was given back (tests/data/verl_trials/h100_trial4: verl's metrics
file, its log, the nvidia-smi samples, the command), a real SQLite storage holding the trial
RUNNING under a worker killed with SIGKILL, and the verl runner (tests/fake_verl.py in place of
main_ppo where a re-run launches, as on this CPU)."""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest

from tuner.hardware import Cluster, get_gpu
from tuner.models import ModelSpec, get_model
from tuner.results import read_raw
from tuner.runners.verl import VerlRunner
from tuner.space import SpaceLimits
from tuner.study import TuneRequest, run_study
from tuner.study.storage import RERUN_ORIGIN
from tuner.workload import get_workload

pytestmark = [
    pytest.mark.verl,
    pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="needs verl"),
]

TESTS = Path(__file__).resolve().parent
TRIAL4 = TESTS / "data" / "verl_trials" / "h100_trial4"
FAKE_VERL = TESTS / "fake_verl.py"
METRICS = Path("verl-tuner") / "qwen3-1.7b_dp1-rtp1_h100x1.jsonl"
MODEL = Path(__file__).resolve().parents[1] / "scripts" / "models" / "qwen3-1.7b" / "config.json"
TRIAL4_PARAMS = {
    "recompute_granularity": "selective",
    "recompute_modules": "mlp",
    "param_offload": True,
    "optimizer_offload": True,
    "use_fused_kernels": False,
    "apply_rope_fusion": True,
    "bias_activation_fusion": True,
    "use_dynamic_bsz": True,
    "ppo_max_token_len_per_gpu": 1.5,
    "log_prob_max_token_len_per_gpu": 4.0,
    "gpu_memory_utilization": 0.5,
    "max_num_batched_tokens": 1,
    "max_num_seqs": 128,
    "enforce_eager": False,
}
"""Trial 4's params as the study's storage holds them (/tmp/p56/studies.sqlite3), under the knobs'
names (issue 31; its storage has the older `*_factor` names, tuner.space.OLD_PARAMS). The token
budgets are drawn as multiples of one sample's tokens (Knob.decode)."""


class H100Runner(VerlRunner):
    """The verl runner as the H100's preflight left it: flash_attn and APEX missing, so
    attention_backend and gradient_accumulation_fusion pinned (the study's space)."""

    def space_limits(self, model: ModelSpec) -> SpaceLimits:
        return SpaceLimits(
            pinned=(("attention_backend", "auto"), ("gradient_accumulation_fusion", False))
        )


@pytest.fixture
def one_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi lists one H100 (the local launcher counts it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/usr/bin/env bash\necho "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _request(workdir: Path) -> TuneRequest:
    """The study of scripts/gpu_verl_study.sh: Qwen3-1.7B on one H100, 256-token prompts,
    4096-token responses, 8 prompts x 4, mini batch 4."""
    workload = get_workload("dapo-math").with_overrides(
        prompt_len=256,
        prompt_mean=256,
        response_len=4096,
        response_mean=4096,
        batch_size=8,
        n=4,
        mini_batch_size=4,
    )
    return TuneRequest(
        model=get_model(str(MODEL)),
        model_arg="scripts/models/qwen3-1.7b/config.json",
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=1, gpus_per_node=1),
        workload=workload,
        runner=H100Runner(model_path="fake/ok", entrypoint=[sys.executable, str(FAKE_VERL)]),
        trials=1,
        warm_start=False,
        study_name="verl4k-h100-x1",
        results_dir=workdir / "results",
        recipes_dir=workdir / "recipes",
    )


_WORKER = """
import sys, time, json, pathlib, optuna
import tuner.study.storage as st
from tuner.space import SearchSpace, sample
sys.path.insert(0, sys.argv[1])
from test_study_recover import _request
req = _request(pathlib.Path.cwd())
space = SearchSpace(model=req.model, cluster=req.cluster, workload=req.workload,
                    limits=req.runner.space_limits(req.model))
storage = st.open_storage(req.storage_url, on_stale=st.enqueue_rerun)
study = optuna.create_study(study_name=req.name, storage=storage, direction="maximize")
study.enqueue_trial(json.loads(sys.argv[2]), user_attrs={"origin": "estimator"})
with st.Heartbeat(storage, req.name) as beat:
    trial = study.ask()
    trial.set_user_attr("worker", st.WORKER)
    beat.start(trial)
    sample(trial, space)
    print(trial.number, flush=True)
    time.sleep(600)  # verl runs; the host is given back before the row is written
"""


def _worker_killed_mid_trial(req: TuneRequest) -> int:
    """A real worker (in the working directory, as `req`) that asks the trial with trial 4's
    params, samples its candidate, beats its heartbeat and is SIGKILLed before it stores
    anything; its trial number."""
    p = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_WORKER), str(TESTS), json.dumps(TRIAL4_PARAMS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    number = int(p.stdout.readline())
    p.send_signal(signal.SIGKILL)
    p.wait()
    return number


def _trial_folder(req: TuneRequest, number: int) -> Path:
    """The killed trial's folder in the study's results, holding trial 4's files."""
    folder = req.results_dir / req.name / "trials" / str(number)
    shutil.copytree(TRIAL4, folder)
    return folder


def _step3() -> dict[str, float]:
    """verl's step-3 metrics, straight from its file."""
    lines = [json.loads(x) for x in (TRIAL4 / METRICS).read_text().splitlines()]
    (step3,) = [line["data"] for line in lines if line["step"] == 3]
    return dict(step3)


def test_a_trial_measured_before_its_worker_died_keeps_its_row(
    workdir: Path, one_gpu: None
) -> None:
    """verl logged step 3 of trial 4, then the host went away before the row was written: the
    resume reads the row from the trial's files (verl's step-3 numbers, the versions and GPU
    from the log's head, the device peak from the nvidia-smi samples), COMPLETE with the
    throughput as its value, and re-runs nothing (it was closed as FAIL with no record, an
    `interrupted` row, and the same params enqueued for another ~8 GPU minutes)."""
    req = _request(workdir)
    number = _worker_killed_mid_trial(req)
    _trial_folder(req, number)
    step3 = _step3()

    summary = run_study(req)

    study = optuna.load_study(study_name=req.name, storage=req.storage_url)
    (t,) = study.trials  # no re-run enqueued, nothing else asked: --trials 1 is done
    assert t.state is optuna.trial.TrialState.COMPLETE
    assert t.value == step3["perf/throughput"] == pytest.approx(4198.3956)
    assert t.user_attrs["status"] == "ok"
    assert t.user_attrs["record"]["tokens_per_s_per_gpu"] == step3["perf/throughput"]
    assert not any(
        str(x.user_attrs.get("origin", "")).startswith(RERUN_ORIGIN) for x in study.trials
    )
    assert summary.trials_run == 0 and summary.trials_total == 1

    (row,) = read_raw(req.csv_path)
    assert row["status"] == "ok"
    assert row["reason"].startswith(f"recovered from trials/{number}'s files after its worker ")
    assert float(row["tokens_per_s_per_gpu"]) == pytest.approx(step3["perf/throughput"], rel=1e-5)
    assert float(row["step_s"]) == pytest.approx(step3["timing_s/step"], rel=1e-5)
    assert float(row["generation_s"]) == pytest.approx(step3["timing_s/gen"], rel=1e-5)
    assert float(row["update_actor_s"]) == pytest.approx(step3["timing_s/update_actor"], rel=1e-5)
    assert float(row["peak_mem_gib"]) == pytest.approx(
        step3["actor/perf/max_memory_allocated_gb"], rel=1e-5
    )
    assert float(row["measured_s"]) == pytest.approx(step3["timing_s/step"], rel=1e-5)
    assert row["launch_s"] == ""  # the launch's end was not seen: nor the trial's
    assert row["started_at"] and (row["finished_at"], row["duration_s"]) == ("", "")
    peak_mib = max(
        float(line.split(",")[1]) for line in (TRIAL4 / "device-memory.csv").read_text().split("\n")
        if line
    )  # fmt: skip
    assert float(row["peak_mem_device_gib"]) == pytest.approx(peak_mib / 1024, abs=1e-3)
    assert row["hardware"] == "1x NVIDIA H100 80GB HBM3"
    assert row["versions"].startswith("verl=0.9.1 vllm=0.24.0 megatron-core=0.19.2")
    assert row["origin"] == "estimator"
    assert row["worker"] != "" and row["worker"] == t.user_attrs["worker"]
    # the candidate rebuilt from the trial's params is the one command.sh ran
    ran = (TRIAL4 / "command.sh").read_text()
    for knob, value in (
        ("ppo_max_token_len_per_gpu", 7168),
        ("log_prob_max_token_len_per_gpu", 17408),
        ("max_num_batched_tokens", 4352),
        ("max_num_seqs", 128),
    ):
        assert int(row[knob]) == value and f"{knob}={value} " in ran
    extra = t.user_attrs["record"]["extra"]
    assert extra["step"] == 3 and extra["metrics"] == "file" and extra["recovered"] is True
    assert "recovered=True" in row["extra"]
    assert row["pred_tokens_per_s_per_gpu"] != ""  # the prediction, proposed again


def test_a_packed_trial_folder_with_its_log_gzipped_is_recovered_too(
    workdir: Path, one_gpu: None
) -> None:
    """A study resumed from a pack (scripts/gpu_verl_study.sh gzips the logs): the log's head
    is read from verl.log.gz."""
    req = _request(workdir)
    number = _worker_killed_mid_trial(req)
    log = _trial_folder(req, number) / "verl.log"
    log.with_name("verl.log.gz").write_bytes(gzip.compress(log.read_bytes()))
    log.unlink()

    run_study(req)

    (row,) = read_raw(req.csv_path)
    assert row["status"] == "ok" and row["hardware"] == "1x NVIDIA H100 80GB HBM3"
    assert row["versions"].startswith("verl=0.9.1 ")
    assert row["log_path"].endswith("verl.log.gz")


def test_a_trial_that_died_before_step_3_is_interrupted_and_re_run(
    workdir: Path, one_gpu: None
) -> None:
    """The same trial's folder cut before verl logged step 3: nothing measured to keep, so as
    before: FAIL with no record, an `interrupted` row, the same params re-run once (here by the
    stand-in main_ppo)."""
    req = _request(workdir)
    number = _worker_killed_mid_trial(req)
    folder = _trial_folder(req, number)
    metrics = folder / METRICS
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:2]))
    log = folder / "verl.log"
    text = log.read_text()
    log.write_text(text[: text.index("step:3 - ")])

    run_study(req)

    study = optuna.load_study(study_name=req.name, storage=req.storage_url)
    ts = study.trials
    assert ts[number].state is optuna.trial.TrialState.FAIL
    assert "record" not in ts[number].user_attrs
    rows = {int(r["trial"]): r for r in read_raw(req.csv_path)}
    assert rows[number]["status"] == "interrupted"
    (rerun,) = [t for t in ts if t.user_attrs.get("origin") == f"{RERUN_ORIGIN}{number}"]
    assert rerun.params == TRIAL4_PARAMS and rerun.state is optuna.trial.TrialState.COMPLETE
    assert rows[rerun.number]["status"] == "ok"
    assert float(rows[rerun.number]["tokens_per_s_per_gpu"]) == 1030.0  # fake_verl's step 3


_STUDY_HANGING = """
import dataclasses, pathlib, sys
sys.path.insert(0, sys.argv[1])
from test_study_recover import FAKE_VERL, H100Runner, _request
from tuner.study import run_study
req = _request(pathlib.Path.cwd())
runner = H100Runner(model_path="fake/hang", entrypoint=[sys.executable, str(FAKE_VERL)])
run_study(dataclasses.replace(req, runner=runner))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_study_stopped_by_sigterm_or_sighup_stops_its_launch_and_closes_its_trial(
    workdir: Path, one_gpu: None, sig: signal.Signals
) -> None:
    """A scheduler's SIGTERM (or a closed terminal's SIGHUP) to a study whose trial runs verl:
    as Ctrl-C does, the launch's process group is stopped and the trial closed at once, its
    `interrupted` row in the CSV and its candidate enqueued again. It ended the process on the
    spot: verl ran on, holding the GPUs beside the resume's re-run, and the CSV said nothing
    of the trial until a resume."""
    if signal.getsignal(sig) is signal.SIG_IGN:
        # inherited (nohup, a background job): the study leaves an ignored signal ignored
        pytest.skip(f"{sig.name} is ignored in this test process, so in the study's too")
    p = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_STUDY_HANGING), str(TESTS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    req = _request(workdir)
    pid_file = req.results_dir / req.name / "trials" / "0" / "fake_verl.pid"
    for _ in range(600):  # main_ppo hangs after its first step
        if pid_file.exists() and pid_file.read_text():
            break
        assert p.poll() is None, p.communicate()[1][-2000:]
        time.sleep(0.05)
    verl = int(pid_file.read_text())
    try:
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 1 and "Terminated" in err  # the interrupt, not the signal
        for _ in range(100):  # the group's SIGKILL reaches it within a moment
            if not Path(f"/proc/{verl}").exists():
                break
            time.sleep(0.05)
        assert not Path(f"/proc/{verl}").exists(), "main_ppo outlived the study"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(verl, signal.SIGKILL)
    (row,) = read_raw(req.csv_path)
    assert (row["trial"], row["status"]) == ("0", "interrupted")
    ts = optuna.load_study(study_name=req.name, storage=req.storage_url).trials
    assert ts[0].state is optuna.trial.TrialState.FAIL
    (rerun,) = [t for t in ts if t.user_attrs.get("origin") == f"{RERUN_ORIGIN}0"]
    assert rerun.state is optuna.trial.TrialState.WAITING
