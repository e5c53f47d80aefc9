"""The fidelity ladder (`--runner ladder`) as a whole study on this CPU: the megatron runner
screens each candidate (a real small program stands in for the training worker, tests/fake_vllm
for vLLM under the real generation worker, as in tests/runners/test_megatron_generation.py), real
verl's stand-in (tests/fake_verl.py, through the real local launcher) confirms the best; a real
SQLite storage, real files. Rows say which rung measured them (`source`), the study learns each
phase's verl/megatron ratio, the headline is a verl row, and a resumed study does not measure a
confirmed candidate again."""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import stat
import statistics
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

import tuner
from tuner.cli import summary_text
from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.results import read_raw
from tuner.runners.ladder_runner import LadderRunner
from tuner.runners.megatron import MegatronRunner
from tuner.runners.process import run_process
from tuner.runners.verl import VerlRunner
from tuner.study import TuneRequest, run_study
from tuner.study.learn import StudyLearner
from tuner.study.storage import CONFIRM_ORIGIN, RERUN_ORIGIN, record_of
from tuner.workload import get_workload

pytestmark = [
    pytest.mark.verl,
    pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="needs verl"),
]

ROOT = Path(tuner.__file__).resolve().parents[1]
TESTS = ROOT / "tests"
FAKE_VERL = TESTS / "fake_verl.py"
FAKE_VLLM = TESTS / "fake_vllm"
CONFIG = ROOT / "scripts" / "models" / "qwen3-1.7b" / "config.json"
TRAIN_OK = """
import json, sys
args = sys.argv[1:]
out = args[args.index("--out") + 1]
json.dump({"schema": 2, "status": "ok", "phase": "update_actor", "step_s": 3.0,
           "old_log_prob_s": 1.0, "update_actor_s": 2.0, "step_times_s": [3.0, 3.0],
           "tokens": 1000, "tokens_per_s_per_gpu": 250.0, "world_size": 2,
           "peak_mem_allocated_gib": 20.0, "peak_mem_reserved_gib": 22.0,
           "peak_mem_device_gib": 25.0, "launch_s": 5.0, "measured_s": 6.0}, open(out, "w"))
"""
"""The training worker's stand-in: old_log_prob 1 s, update 2 s (fake_verl's are 10 s and 25 s:
ratios 10 and 12.5)."""


class CpuMegatron(MegatronRunner):
    """The megatron runner with its host check left out (no megatron-core or GPU here); every
    trial still runs its real generation worker and the training stand-in."""

    def check_available(self, cluster: Cluster) -> None:
        pass


@pytest.fixture
def two_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi lists two H100s (the local launcher counts them)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/usr/bin/env bash\n"
        'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n'
        'echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"\n'
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _request(tmp: Path, trials: int, confirm_top: int = 2, verl: str = "ok") -> TuneRequest:
    script = tmp / "train.py"
    script.write_text(TRAIN_OK)

    def launch(cmd, **kw):  # type: ignore[no-untyped-def]
        return run_process([sys.executable, str(script), *cmd[cmd.index("--spec") :]], **kw)

    env = {
        "PYTHONPATH": os.pathsep.join((str(ROOT), str(FAKE_VLLM))),
        "FAKE_VLLM_LOG": str(tmp / "vllm.jsonl"),
        "FAKE_VLLM_MODE": "ok",
    }
    fast = CpuMegatron(launch=launch, env=env, model_config=str(CONFIG), generation=True)
    confirm = VerlRunner(model_path=f"fake/{verl}", entrypoint=[sys.executable, str(FAKE_VERL)])
    w = get_workload("dapo-math").with_overrides(
        prompt_len=64, response_len=128, batch_size=4, n=2, mini_batch_size=2
    )
    return TuneRequest(
        model=get_model(str(CONFIG)),
        model_arg=str(CONFIG),
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=2, gpus_per_node=2),
        workload=w,
        runner=LadderRunner(fast=fast, confirm=confirm, confirm_top=confirm_top),
        trials=trials,
        warm_start=False,
        study_name="ladder-h100-x2",
        results_dir=tmp / "results",
        recipes_dir=tmp / "recipes",
        recipes=1,
    )


def _study(req: TuneRequest) -> optuna.Study:
    return optuna.load_study(study_name=req.name, storage=req.storage_url)


def _confirmations(study: optuna.Study) -> dict[int, int]:
    """confirmation trial -> the screened trial it confirms."""
    out = {}
    for t in study.trials:
        origin = str(t.user_attrs.get("origin", ""))
        if origin.startswith(CONFIRM_ORIGIN):
            out[t.number] = int(origin.removeprefix(CONFIRM_ORIGIN))
    return out


def test_the_ladder_screens_every_candidate_and_verl_confirms_the_best(
    tmp_path: Path, two_gpus: None
) -> None:
    req = _request(tmp_path, trials=4, confirm_top=2)
    summary = run_study(req)

    rows = {int(r["trial"]): r for r in read_raw(req.csv_path)}
    screened = {n: r for n, r in rows.items() if r["source"] == "megatron" and r["status"] == "ok"}
    verl = {n: r for n, r in rows.items() if r["source"] == "verl"}
    assert len(screened) == 4, {n: (r["status"], r["reason"]) for n, r in rows.items()}
    assert all(r["runner"] == "ladder" for r in rows.values())
    # screened rows: generation measured by vLLM at the rollout TP, one replica's share
    for r in screened.values():
        assert "generation=measured(vllm)" in r["extra"]
        if r["infer_parallel"] == "tp1":  # 2 replicas on 2 GPUs
            assert "gen_replicas=1 of 2 measured with its share of the sequences" in r["extra"]
    # confirmations: verl rows, each of a screened trial, once each, not counted in --trials
    links = _confirmations(_study(req))
    assert set(links) == set(verl) and all(r["status"] == "ok" for r in verl.values())
    assert all(f"confirms={links[n]}" in verl[n]["extra"] for n in verl)
    assert len(set(links.values())) == len(links) and set(links.values()) <= set(screened)
    assert summary.trials_total == 4
    # the first screened candidate is confirmed at once (the first ratios), before the next screen
    first = min(screened)
    first_confirmation = min(n for n, s in links.items() if s == first)
    assert first_confirmation == first + 1
    # the top 2 screened candidates by the predicted verl step are confirmed
    learner = StudyLearner(capacity_gib=80.0, screen_source="megatron")
    for t in sorted(_study(req).trials, key=lambda t: t.number):
        rec = record_of(t)
        if rec is not None:
            learner.observe(rec)
    from tuner.study.ladder import predicted_verl_tps

    pred = {
        n: predicted_verl_tps(learner.screens[n], learner.rung_ratios_for(False))
        for n in learner.screens
    }
    top2 = sorted(pred, key=lambda n: (-(pred[n] or 0.0), n))[:2]
    assert set(top2) <= set(links.values())
    # the learned ratios, verl over megatron: fake_verl's 10 s and 25 s against 1 s and 2 s
    assert learner.rung_ratios["old_log_prob"] == pytest.approx(10.0)
    assert learner.rung_ratios["update_actor"] == pytest.approx(12.5)
    # and the step's: the screen's throughput over verl's (a time ratio), median of the pairs
    logs = sorted(
        math.log(
            float(rows[links[n]]["tokens_per_s_per_gpu"]) / float(verl[n]["tokens_per_s_per_gpu"])
        )
        for n in verl
    )
    assert learner.rung_ratios["step"] == pytest.approx(math.exp(statistics.median(logs)), rel=1e-4)
    # the headline is a verl row (the whole step), never a screen's partial step
    assert summary.best_rows[0]["source"] == "verl"
    text = summary_text(summary)
    assert "GPU-hours by rung: " in text and "verl " in text and "megatron " in text
    assert dict(summary.gpu_hours).keys() == {"megatron", "verl"}


_KILLED = """
import pathlib, sys
sys.path.insert(0, sys.argv[1])
from test_study_ladder import _request
from tuner.study import run_study
run_study(_request(pathlib.Path.cwd(), trials=2, confirm_top=1, verl="hang"))
"""


def test_a_killed_ladder_study_resumes_without_re_running_confirmations(
    tmp_path: Path, two_gpus: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker SIGKILLed while verl confirmed the first screened candidate: the resume closes
    that confirmation as interrupted (no re-run enqueued as a screen), confirms the candidate
    once more, and a later resume launches no finished confirmation again."""
    monkeypatch.chdir(tmp_path)
    p = subprocess.Popen([sys.executable, "-c", _KILLED, str(TESTS)], cwd=tmp_path)
    req = _request(tmp_path, trials=2, confirm_top=1)
    log = req.results_dir / req.name / "trials" / "1" / "verl.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and "step:1 - " in log.read_text()) and time.monotonic() < deadline:
        assert p.poll() is None, "the study ended before its confirmation hung"
        time.sleep(0.2)
    p.send_signal(signal.SIGKILL)
    p.wait()
    killed = _study(req).trials[1]
    assert killed.user_attrs["origin"] == f"{CONFIRM_ORIGIN}0"
    assert killed.state is optuna.trial.TrialState.RUNNING

    run_study(req)

    study = _study(req)
    assert study.trials[1].state is optuna.trial.TrialState.FAIL  # interrupted
    assert "record" not in study.trials[1].user_attrs
    assert not any(
        str(t.user_attrs.get("origin", "")).startswith(RERUN_ORIGIN) for t in study.trials
    )
    links = _confirmations(study)
    done = {n: s for n, s in links.items() if "record" in study.trials[n].user_attrs}
    assert sorted(done.values()).count(0) == 1  # trial 0 confirmed again, once
    assert all(study.trials[n].user_attrs["status"] == "ok" for n in done)
    mtimes = {
        n: (req.results_dir / req.name / "trials" / str(n) / "command.sh").stat().st_mtime_ns
        for n in done
    }

    summary = run_study(_request(tmp_path, trials=3, confirm_top=1))

    study = _study(req)
    for n, mtime in mtimes.items():  # the finished confirmations were not launched again
        folder = req.results_dir / req.name / "trials" / str(n)
        assert (folder / "command.sh").stat().st_mtime_ns == mtime
    again = [s for n, s in _confirmations(study).items() if "record" in study.trials[n].user_attrs]
    assert len(again) == len(set(again))  # no screened candidate confirmed twice
    assert summary.trials_total == 3 and summary.trials_run == 1


def test_the_progress_bars_best_is_a_whole_step_once_there_is_one() -> None:
    """A screened row (the megatron rung: generation + training, no weight sync) can be faster
    than every verl row; the progress bar's best is the verl whole step once one exists, and
    the screen's until then: a partial step is never shown as the best above a whole one."""
    from tuner.results import Status, TrialRecord
    from tuner.study.loop import progress_best

    screen = TrialRecord(
        study="s",
        trial=0,
        status=Status.OK,
        source="megatron",
        tokens_per_s_per_gpu=5000.0,
        train_parallel="tp2",
        extra={"generation": "measured"},
    )
    confirm = TrialRecord(
        study="s",
        trial=1,
        status=Status.OK,
        source="verl",
        tokens_per_s_per_gpu=3000.0,
        train_parallel="pp2",
    )
    assert progress_best([screen]) == (5000.0, "tp2")
    assert progress_best([screen, confirm]) == (3000.0, "pp2")
