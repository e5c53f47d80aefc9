"""Durability of a study's storage against dead workers: real processes, real SIGKILLs, real
Optuna storages. A journal left locked by a kill, workers racing to create a new SQLite file, a
killed worker not yet reaped, a worker of another host that died (Optuna's heartbeat)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest

import tuner.study.storage as storage
from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY
from tuner.results import read_raw
from tuner.runners.estimate import EstimateRunner
from tuner.study import TuneRequest, run_study
from tuner.study.storage import RERUN_ORIGIN
from tuner.workload import PRESETS

TUNE = [sys.executable, "-m", "tuner.cli", "--model", "qwen2.5-7b", "--gpus", "8", "--no-progress"]
RUNNING = optuna.trial.TrialState.RUNNING


def _python(code: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,  # type: ignore[call-overload]
    )


def test_a_journal_killed_mid_append_resumes_within_seconds(workdir: Path) -> None:
    """kill -9 while the journal's append lock is held, the path relative as the README
    writes it: the resume breaks the lock within seconds (it spun for good: Optuna's lock
    was a symbolic link to the relative path, dangling, so never found stale)."""
    killed = _python(
        """
        import os, optuna
        from tuner.study import open_storage
        storage = open_storage("results/x.log")
        os.fsync = lambda fd: os.kill(os.getpid(), 9)  # dies inside the append, lock held
        optuna.create_study(study_name="other", storage=storage)
        """
    )
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert os.path.lexists("results/x.log.lock")  # what the kill left
    t0 = time.monotonic()
    done = subprocess.run(
        [*TUNE, "--storage", "results/x.log", "--trials", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert time.monotonic() - t0 < 30
    # a lock link the old lock left behind (dangling, relative) is no obstacle either
    os.symlink("results/x.log", "results/x.log.lock")
    again = _python(
        """
        import optuna
        from tuner.study import open_storage
        optuna.create_study(study_name="another", storage=open_storage("results/x.log"))
        """
    )
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0, err[-2000:]


def test_workers_starting_together_on_a_new_sqlite_file_all_open_it(workdir: Path) -> None:
    """Several workers opening a storage file that does not exist yet, at the same moment:
    every one opens it (unserialized, all but one could die: "table studies already
    exists")."""
    n = 6
    procs = [
        _python(
            f"""
            import pathlib, time
            from tuner.study import open_storage
            pathlib.Path("ready-{i}").touch()
            while len(list(pathlib.Path().glob("ready-*"))) < {n}:
                time.sleep(0.001)
            open_storage("results/studies.sqlite3")
            """
        )
        for i in range(n)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err[-1000:]


def _request(workdir: Path, trials: int) -> TuneRequest:
    return TuneRequest(
        model=REGISTRY["qwen2.5-7b"],
        model_arg="qwen2.5-7b",
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=8),
        workload=PRESETS["dapo-math"],
        runner=EstimateRunner(),
        trials=trials,
        results_dir=workdir / "results",
        recipes_dir=workdir / "recipes",
        warm_start=False,
    )


_WORKER_MID_TRIAL = """
import sys, time, optuna
import tuner.study.storage as st
from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY
from tuner.space import SearchSpace, sample
from tuner.runners.estimate import EstimateRunner
from tuner.workload import PRESETS
st.HEARTBEAT_S, st.GRACE_S = 1, 1
name, url, worker = sys.argv[1:4]
storage = st.open_storage(url, on_stale=st.enqueue_rerun)
study = optuna.create_study(study_name=name, storage=storage, direction="maximize",
                            load_if_exists=True)
space = SearchSpace(model=REGISTRY["qwen2.5-7b"], cluster=Cluster(gpu=get_gpu("h100"),
                    num_gpus=8), workload=PRESETS["dapo-math"],
                    limits=EstimateRunner().space_limits(REGISTRY["qwen2.5-7b"]))
with st.Heartbeat(storage, name) as beat:
    trial = study.ask()
    trial.set_user_attr("worker", worker or st.WORKER)
    beat.start(trial)
    sample(trial, space)
    print(trial.number, flush=True)
    time.sleep(600)  # mid-trial, beating, until killed
"""


_UNREAPED: list[subprocess.Popen[str]] = []
"""Killed workers not waited for: a Popen object collected would reap its process."""


def _worker_killed_mid_trial(req: TuneRequest, worker: str, reap: bool) -> int:
    """A real worker process that asks a trial, samples it, beats its heartbeat and is
    SIGKILLed mid-trial; returns the trial's number. `reap`: wait for the dead process (else
    it stays a zombie, as under a parent that has not waited for it yet)."""
    p = subprocess.Popen(
        [sys.executable, "-c", _WORKER_MID_TRIAL, req.name, req.storage_url, worker],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    number = int(p.stdout.readline())
    p.send_signal(signal.SIGKILL)
    if reap:
        p.wait()
    else:
        _UNREAPED.append(p)
        while Path(f"/proc/{p.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            time.sleep(0.01)  # dead, not reaped: its pid still answers
    return number


def _check_reclaimed(req: TuneRequest, number: int) -> None:
    """The dead worker's trial: FAIL, an `interrupted` row, its candidate re-run once (to the
    end: measured, or pruned as not fitting, as any candidate)."""
    study = optuna.load_study(study_name=req.name, storage=req.storage_url)
    ts = study.trials
    assert not [t.number for t in ts if t.state is RUNNING]
    assert ts[number].state is optuna.trial.TrialState.FAIL
    rows = {int(r["trial"]): r for r in read_raw(req.csv_path)}
    assert rows[number]["status"] == "interrupted"
    (rerun,) = [t for t in ts if t.user_attrs.get("origin") == f"{RERUN_ORIGIN}{number}"]
    assert rerun.params == ts[number].params and rerun.state.is_finished()
    assert rows[rerun.number]["status"] != "interrupted"


def test_a_worker_of_another_host_that_died_is_reclaimed_by_its_heartbeat(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker on another host (its pid means nothing here) killed mid-trial: once its
    heartbeat is older than the grace period the next worker fails the trial and re-runs its
    candidate (it stayed RUNNING for good, counted as running elsewhere)."""
    monkeypatch.setattr(storage, "HEARTBEAT_S", 1)
    monkeypatch.setattr(storage, "GRACE_S", 1)
    req = _request(workdir, 2)
    number = _worker_killed_mid_trial(req, "gpu-node-7:4242", reap=True)
    time.sleep(2.2)  # past the grace period (SQLite's clock counts whole seconds)
    s = run_study(req)
    _check_reclaimed(req, number)
    assert s.trials_total == 2


def test_a_killed_worker_not_yet_reaped_is_reclaimed_at_once(workdir: Path) -> None:
    """kill -9 of a worker whose parent has not waited for it yet: its pid still answers
    (a zombie); the resume reclaims its trial at once all the same (it stayed RUNNING and
    the resume finished with a gap in the CSV)."""
    req = _request(workdir, 2)
    number = _worker_killed_mid_trial(req, "", reap=False)
    s = run_study(req)
    _check_reclaimed(req, number)
    assert s.trials_total == 2
