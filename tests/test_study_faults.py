"""Fault injection: a real `tune` process killed with SIGKILL at seeded random moments; the
rerun's CSV must be exactly the view of the storage, every finished trial once."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY
from tuner.results import TrialRecord, read_raw
from tuner.runners.estimate import EstimateRunner
from tuner.space import SearchSpace, sample
from tuner.study import TuneRequest, run_study, warm_start_params
from tuner.study.storage import RECORD_ATTR, RERUN_ORIGIN, open_storage
from tuner.workload import PRESETS

CMD = [
    sys.executable,
    "-m",
    "tuner.cli",
    "--model",
    "qwen2.5-7b",
    "--gpus",
    "8",
    "--no-progress",
]
STUDY = "qwen2.5-7b-h100x8-estimate"
UNCOUNTED = {"pruned-invalid", "pruned-oom-predicted", "interrupted"}


def _check_csv_is_the_storage_view(workdir: Path, url: str = "") -> list[dict[str, str]]:
    rows = read_raw(workdir / "results" / f"{STUDY}.csv")
    numbers = [int(r["trial"]) for r in rows]
    assert numbers == sorted(set(numbers)), "a trial twice or out of order"
    url = url or f"sqlite:///{workdir / 'results' / 'studies.sqlite3'}"
    study = optuna.load_study(study_name=STUDY, storage=open_storage(url))
    states = optuna.trial.TrialState
    assert not study.get_trials(states=(states.RUNNING,)), "a trial left running"
    finished = [t for t in study.trials if t.state.is_finished()]
    assert [t.number for t in finished] == numbers
    by_number = {int(r["trial"]): r for r in rows}
    for t in finished:
        got = by_number[t.number]
        if RECORD_ATTR not in t.user_attrs:  # interrupted: its row is made from the trial
            assert got["status"] == "interrupted" and t.state is states.FAIL
            continue
        row = TrialRecord.from_dict(t.user_attrs[RECORD_ATTR]).to_row()
        assert {k: v for k, v in row.items() if k != "recipe"} == {
            k: v for k, v in got.items() if k != "recipe"
        }
        # Optuna's state agrees with the row: nothing interrupted is counted as done
        if got["status"] == "ok":
            assert t.state is states.COMPLETE
        elif got["status"] == "interrupted":
            assert t.state is states.FAIL
    return rows


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_sigkill_at_random_moments_then_rerun(
    workdir: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    url = str(request.getfixturevalue("postgres_url")) if kind == "postgresql" else ""
    cmd = [*CMD, "--storage", url] if url else CMD
    rng = random.Random(1234)
    csv_path = workdir / "results" / f"{STUDY}.csv"
    killed_with_rows = []
    for _ in range(3):
        start = len(read_raw(csv_path)) if csv_path.exists() else 0
        more = rng.randint(1, 6)  # kill after a few more trials, at a random moment
        proc = subprocess.Popen(
            [*cmd, "--trials", "5000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if csv_path.exists() and len(read_raw(csv_path)) >= start + more:
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))
        proc.kill()
        proc.wait()
        killed_with_rows.append(len(read_raw(csv_path)))
    assert killed_with_rows[-1] > killed_with_rows[0] > 0
    have = (
        len([r for r in read_raw(csv_path) if r["status"] not in UNCOUNTED])
        if (csv_path.exists())
        else 0
    )
    total = have + 3
    done = subprocess.run(
        [*cmd, "--trials", str(total)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _check_csv_is_the_storage_view(workdir, url)
    assert len([r for r in rows if r["status"] not in UNCOUNTED]) == total


def _dead_worker() -> str:
    pid = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    return f"{os.uname().nodename}:{pid}"


def test_an_interrupted_trial_is_recorded_and_its_candidate_re_run_once(workdir: Path) -> None:
    def request(trials: int) -> TuneRequest:
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

    req = request(1)
    space = SearchSpace(
        model=req.model,
        cluster=req.cluster,
        workload=req.workload,
        limits=req.runner.space_limits(req.model),
    )
    study = optuna.create_study(
        study_name=req.name, storage=open_storage(req.storage_url), direction="maximize"
    )
    # a candidate that fits, so its re-run is measured
    fits = warm_start_params(space, req.profile, seed=0, runner=req.runner, pool=50)
    study.enqueue_trial(fits[0][0])
    # a worker killed mid-trial: asked, sampled, marked, never recorded nor told
    killed = study.ask()
    killed.set_user_attr("worker", _dead_worker())
    sample(killed, space)
    params = dict(study.trials[killed.number].params)
    assert params

    def reruns(of: int) -> list[optuna.trial.FrozenTrial]:
        ts = optuna.load_study(study_name=req.name, storage=req.storage_url).trials
        return [t for t in ts if t.user_attrs.get("origin") == f"{RERUN_ORIGIN}{of}"]

    s = run_study(request(1))
    rows = {int(r["trial"]): r for r in read_raw(s.csv_path)}
    assert rows[killed.number]["status"] == "interrupted"
    (rerun,) = reruns(killed.number)
    assert rerun.params == params and rerun.state == optuna.trial.TrialState.COMPLETE
    assert rerun.number == killed.number + 1  # next in line, not left for later
    row = rows[rerun.number]
    assert row["status"] == "ok" and row["origin"] == f"{RERUN_ORIGIN}{killed.number}"
    assert not row["reason"]  # measured, not copied from the interrupted row
    # a resume (or a second worker) does not enqueue it again
    run_study(request(2))
    assert len(reruns(killed.number)) == 1
    # the re-run killed too: recorded, not retried forever
    study = optuna.load_study(study_name=req.name, storage=req.storage_url)
    study.enqueue_trial(params, user_attrs={"origin": f"{RERUN_ORIGIN}{killed.number}"})
    again = study.ask()
    again.set_user_attr("worker", _dead_worker())
    sample(again, space)
    s = run_study(request(3))
    rows = {int(r["trial"]): r for r in read_raw(s.csv_path)}
    assert rows[again.number]["status"] == "interrupted"
    assert not reruns(again.number)
    ts = optuna.load_study(study_name=req.name, storage=req.storage_url).trials
    assert sum(t.params == params for t in ts) == 3  # killed, re-run, killed re-run
