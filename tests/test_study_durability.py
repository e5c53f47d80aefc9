"""Durability of a study's storage against dead workers: real processes, real SIGKILLs, real
Optuna storages. A journal left locked by a kill, workers racing to create a new SQLite file, a
killed worker not yet reaped, a worker of another host that died (Optuna's heartbeat)."""

from __future__ import annotations

import dataclasses
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
from tuner.space import SearchSpace
from tuner.study import TuneRequest, run_study, warm_start_params
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
    done = subprocess.run(  # no warm start: the 30 s are the lock's, not the estimator's search
        [*TUNE, "--storage", "results/x.log", "--trials", "2", "--no-warm-start"],
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
st.heartbeat.HEARTBEAT_S, st.heartbeat.GRACE_S = 1, 1
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
    study = optuna.load_study(study_name=req.name, storage=storage.open_storage(req.storage_url))
    ts = study.trials
    assert not [t.number for t in ts if t.state is RUNNING]
    assert ts[number].state is optuna.trial.TrialState.FAIL
    rows = {int(r["trial"]): r for r in read_raw(req.csv_path)}
    assert rows[number]["status"] == "interrupted"
    (rerun,) = [t for t in ts if t.user_attrs.get("origin") == f"{RERUN_ORIGIN}{number}"]
    assert rerun.params == ts[number].params and rerun.state.is_finished()
    assert rows[rerun.number]["status"] != "interrupted"


def _on(kind: str, req: TuneRequest, request: pytest.FixtureRequest) -> TuneRequest:
    """`req` on its default SQLite file, or on a fresh PostgreSQL database (`postgres_url`)."""
    if kind == "postgresql":
        return dataclasses.replace(req, storage=str(request.getfixturevalue("postgres_url")))
    return req


SERVERS = pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
"""The tests of dead workers that run on an RDB storage: an SQLite file, a PostgreSQL server."""


@SERVERS
def test_a_worker_of_another_host_that_died_is_reclaimed_by_its_heartbeat(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, kind: str, request: pytest.FixtureRequest
) -> None:
    """A worker on another host (its pid means nothing here) killed mid-trial: once its
    heartbeat is older than the grace period the next worker fails the trial and re-runs its
    candidate (it stayed RUNNING for good, counted as running elsewhere)."""
    monkeypatch.setattr(storage.heartbeat, "HEARTBEAT_S", 1)
    monkeypatch.setattr(storage.heartbeat, "GRACE_S", 1)
    req = _on(kind, _request(workdir, 2), request)
    number = _worker_killed_mid_trial(req, "gpu-node-7:4242", reap=True)
    time.sleep(2.2)  # past the grace period (SQLite's clock counts whole seconds)
    s = run_study(req)
    _check_reclaimed(req, number)
    assert s.trials_total == 2


def test_a_resume_inside_another_hosts_heartbeat_window_says_which_trial_it_waits_on(
    workdir: Path,
) -> None:
    """A worker of another host killed mid-trial, and a resume before its heartbeat is a minute
    old: the trial still counts as running elsewhere, so the resume ends one short of --trials;
    it says which trial it waits on, on which worker, and when a run can reclaim it (it ended
    "1 in all" for --trials 2 with exit 0 and no word; issue 38.6)."""
    req = _request(workdir, 2)
    number = _worker_killed_mid_trial(req, "gpu-node-7:4242", reap=True)
    s = run_study(req)
    assert s.trials_total == 1
    (note,) = [n for n in s.notes if f"trial {number} still runs on gpu-node-7:4242" in n]
    assert note.startswith("1 of --trials 2 finished")
    assert "run the same command again after" in note and " UTC (its heartbeat 60 s old)" in note


@SERVERS
def test_a_killed_worker_not_yet_reaped_is_reclaimed_at_once(
    workdir: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """kill -9 of a worker whose parent has not waited for it yet: its pid still answers
    (a zombie); the resume reclaims its trial at once all the same (it stayed RUNNING and
    the resume finished with a gap in the CSV)."""
    req = _on(kind, _request(workdir, 2), request)
    number = _worker_killed_mid_trial(req, "", reap=False)
    s = run_study(req)
    _check_reclaimed(req, number)
    assert s.trials_total == 2


def test_a_worker_killed_before_it_enqueued_a_re_run_leaves_it_to_the_next(
    workdir: Path,
) -> None:
    """kill -9 of a resuming worker after it closed a dead worker's trial as FAIL and before it
    enqueued the candidate's re-run: the next resume enqueues it (nothing looked at a trial
    once it had ended, so the candidate was never measured)."""
    req = _request(workdir, 2)
    number = _worker_killed_mid_trial(req, "", reap=True)
    killed = _python(
        """
        import os, sys, optuna
        import tuner.study.storage as st
        name, url = sys.argv[1:3]
        study = optuna.load_study(study_name=name, storage=st.open_storage(url))
        st.reclaim.enqueue_rerun = lambda study, t: os.kill(os.getpid(), 9)  # dies between the two
        with st.study_lock(url, name) as locked_:
            st.reclaim_interrupted(study, locked_)
        """.replace("sys.argv[1:3]", repr([req.name, req.storage_url]))
    )
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    ts = optuna.load_study(study_name=req.name, storage=req.storage_url).trials
    assert ts[number].state is optuna.trial.TrialState.FAIL  # closed, its re-run not enqueued
    assert not [t for t in ts if t.user_attrs.get("origin") == f"{RERUN_ORIGIN}{number}"]
    s = run_study(req)
    _check_reclaimed(req, number)
    assert s.trials_total == 2


def test_an_enqueued_candidate_killed_while_sampling_is_re_run_whole(workdir: Path) -> None:
    """kill -9 of a worker while it sampled a warm-start candidate (Optuna writes one param at
    a time): the trial holds only the params sampled before the kill. Its re-run is the
    candidate it was enqueued with, whole (it re-ran the few params sampled, the rest drawn
    anew: another candidate, the warm start's lost), and so is its `interrupted` row (it had
    no knobs)."""
    req = _request(workdir, 1)
    space = SearchSpace(
        model=req.model,
        cluster=req.cluster,
        workload=req.workload,
        limits=req.runner.space_limits(req.model),
    )
    (params, _), *_ = warm_start_params(space, req.profile, seed=0, runner=req.runner, pool=50)
    killed = _python(
        f"""
        import os, optuna
        import tuner.study.storage as st
        from optuna.trial import Trial
        from tuner.space import SearchSpace, sample
        from tuner.hardware import Cluster, get_gpu
        from tuner.models import REGISTRY
        from tuner.runners.estimate import EstimateRunner
        from tuner.workload import PRESETS
        model = REGISTRY["qwen2.5-7b"]
        space = SearchSpace(model=model, cluster=Cluster(gpu=get_gpu("h100"), num_gpus=8),
                            workload=PRESETS["dapo-math"],
                            limits=EstimateRunner().space_limits(model))
        study = optuna.create_study(study_name={req.name!r},
                                    storage=st.open_storage({req.storage_url!r}))
        study.enqueue_trial({params!r}, user_attrs={{"origin": "reference"}})
        trial = study.ask()
        trial.set_user_attr("worker", st.WORKER)
        suggest, drawn = Trial._suggest, []
        def dies_at_the_third(self, name, distribution):
            drawn.append(name)
            if len(drawn) == 3:
                os.kill(os.getpid(), 9)
            return suggest(self, name, distribution)
        Trial._suggest = dies_at_the_third
        sample(trial, space)
        """
    )
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    (partial,) = optuna.load_study(study_name=req.name, storage=req.storage_url).trials
    assert 0 < len(partial.params) < len(params)
    run_study(req)
    ts = optuna.load_study(study_name=req.name, storage=req.storage_url).trials
    (rerun,) = [t for t in ts if t.user_attrs.get("origin") == f"{RERUN_ORIGIN}0"]
    assert rerun.state.is_finished()
    assert rerun.params == {k: v for k, v in params.items() if k in rerun.params}
    assert len(rerun.params) > len(partial.params)
    row = read_raw(req.csv_path)[0]  # the interrupted row names the candidate, as enqueued
    assert (row["status"], row["train_parallel"]) == ("interrupted", params["layout"])


_WORKER_SUSPENDED = """
import dataclasses, pathlib, sys, time
import tuner.study.loop as loop
import tuner.study.storage as st
sys.path.insert(0, sys.argv[1])
from test_study_durability import _request
from tuner.runners.estimate import EstimateRunner
st.heartbeat.HEARTBEAT_S = st.heartbeat.GRACE_S = loop.HEARTBEAT_S = 1

class Slow(EstimateRunner):
    def run(self, spec):
        if not pathlib.Path("running").exists():
            pathlib.Path("running").write_text(str(spec.number))
            time.sleep(4)  # suspended in here
        return super().run(spec)

loop.run_study(dataclasses.replace(_request(pathlib.Path.cwd(), 1), runner=Slow()))
"""


def test_a_worker_suspended_past_the_grace_period_keeps_its_measurement(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker stopped (SIGSTOP: Ctrl-Z, a paused VM) mid-trial for longer than the heartbeat's
    grace period: another worker fails its trial as stale and enqueues the candidate again.
    Continued, the worker finishes the trial: its measurement is kept in a trial of its own
    with the same params, and the worker goes on (it stopped with a traceback,
    UpdateFinishedTrialError, its measurement lost)."""
    monkeypatch.setattr(storage.heartbeat, "HEARTBEAT_S", 1)
    monkeypatch.setattr(storage.heartbeat, "GRACE_S", 1)
    req = _request(workdir, 1)
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER_SUSPENDED, str(Path(__file__).parent)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while not Path("running").exists() or not Path("running").read_text():
            assert worker.poll() is None, worker.communicate()[1][-2000:]
            time.sleep(0.02)
        worker.send_signal(signal.SIGSTOP)
        number = int(Path("running").read_text())
        time.sleep(2.2)  # past the grace period (SQLite's clock counts whole seconds)
        study = optuna.load_study(
            study_name=req.name,
            storage=storage.open_storage(req.storage_url, storage.enqueue_rerun),
        )
        with storage.study_lock(req.storage_url, req.name) as locked_:
            storage.reclaim_interrupted(study, locked_)  # what another worker does first
        assert study.trials[number].state is optuna.trial.TrialState.FAIL
    finally:
        worker.send_signal(signal.SIGCONT)
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err[-2000:]
    ts = optuna.load_study(study_name=req.name, storage=req.storage_url).trials
    (rerun,) = [t for t in ts if t.user_attrs.get("origin") == f"{RERUN_ORIGIN}{number}"]
    assert rerun.state is optuna.trial.TrialState.WAITING  # --trials 1 is done
    (kept,) = [t for t in ts if t.number > number and t.state.is_finished()]
    assert kept.state is optuna.trial.TrialState.COMPLETE and kept.params == ts[number].params
    rows = {int(r["trial"]): r for r in read_raw(req.csv_path)}
    assert rows[number]["status"] == "interrupted"
    assert rows[kept.number]["status"] == "ok"
    assert f"measured as trial {number}, which another worker closed" in rows[kept.number]["reason"]


def test_a_study_killed_while_it_rewrote_its_csv_leaves_no_temporary_file(
    workdir: Path,
) -> None:
    """kill -9 while the CSV's replacement is written (its temporary file whole, not yet
    renamed): the file stays beside the CSV, as large as it (write_atomic's cleanup never
    runs); the resume's first rewrite removes it, and the CSV is whole."""
    killed = _python(
        """
        import os
        from tuner.cli import main
        fsync = os.fsync
        def dies_writing_the_csv(fd):
            fsync(fd)
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp") and ".csv." in os.readlink(
                f"/proc/self/fd/{fd}"
            ):
                os.kill(os.getpid(), 9)
        os.fsync = dies_writing_the_csv
        main(["--model", "qwen2.5-7b", "--gpus", "8", "--runner", "estimate", "--no-progress",
              "--trials", "2", "--no-warm-start"])
        """
    )  # no warm start, here and in the resume: the subject is the CSV's rewrite, not the search
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    (left,) = Path("results").glob(".*.csv.*.tmp")
    assert left.stat().st_size > 0
    done = subprocess.run(
        [*TUNE, "--trials", "2", "--no-warm-start"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not list(Path("results").glob(".*.tmp"))
    assert read_raw(Path("results") / "qwen2.5-7b-h100x8-estimate.csv")


def test_a_trial_told_between_two_reads_is_still_counted_as_running() -> None:
    """The budget check counts finished trials and running ones from one read of the study:
    a trial another worker tells in between is then one or the other. With a second read for
    the running ones, three workers on PostgreSQL ran 13 trials of --trials 12 (CI)."""
    study = optuna.create_study()
    trial = study.ask()
    trial.set_user_attr("worker", storage.WORKER)  # this process: alive
    snapshot = study.get_trials(deepcopy=False)
    study.tell(trial, 1.0)  # another worker's tell, after the finished ones were counted
    finished = [t for t in snapshot if t.state.is_finished()]
    running = storage.running_elsewhere(snapshot, True)
    assert len(finished) + len(running) == 1
