from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tuner.errors import UserError
from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY
from tuner.results import TrialResult, read_raw, upsert_row
from tuner.runners.base import TrialSpec
from tuner.runners.estimate import EstimateRunner
from tuner.space import SearchSpace
from tuner.study import TuneRequest, run_study, warm_start_params
from tuner.workload import PRESETS


def _request(workdir: Path, **kw: object) -> TuneRequest:
    base: dict[str, object] = dict(
        model=REGISTRY["qwen2.5-7b"],
        model_arg="qwen2.5-7b",
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=8),
        workload=PRESETS["dapo-math"],
        runner=EstimateRunner(),
        trials=12,
        results_dir=workdir / "results",
        recipes_dir=workdir / "recipes",
    )
    base.update(kw)
    return TuneRequest(**base)  # type: ignore[arg-type]


def test_study_writes_one_row_per_trial_and_recipes(workdir: Path) -> None:
    s = run_study(_request(workdir))
    rows = read_raw(s.csv_path)
    assert [int(r["trial"]) for r in rows] == list(range(12))
    assert {r["source"] for r in rows if r["status"] == "ok"} == {"estimate"}
    assert s.recipe_paths and all(p.exists() for p in s.recipe_paths)
    best = rows[int(s.best_rows[0]["trial"])]
    assert best["recipe"] == str(s.recipe_paths[0])
    assert float(best["tokens_per_s_per_gpu"]) == max(
        float(r["tokens_per_s_per_gpu"]) for r in rows if r["status"] == "ok"
    )


def test_pruned_rows_carry_the_reason(workdir: Path) -> None:
    # 32B on 8 H100: many candidates cannot fit; they end PRUNED with the predicted peak
    req = _request(workdir, model=REGISTRY["qwen2.5-32b"], model_arg="qwen2.5-32b", trials=30)
    s = run_study(req)
    rows = read_raw(s.csv_path)
    pruned = [r for r in rows if r["status"] == "pruned-oom-predicted"]
    assert pruned and all("predicted peak" in r["reason"] for r in pruned)
    study = optuna.load_study(study_name=s.name, storage=req.storage_url)
    states = {t.number: t.state for t in study.trials}
    for r in pruned:
        assert states[int(r["trial"])] == optuna.trial.TrialState.PRUNED
        assert study.trials[int(r["trial"])].user_attrs["reason"] == r["reason"]


def test_resume_continues_to_the_requested_count(workdir: Path) -> None:
    run_study(_request(workdir, trials=6))
    s = run_study(_request(workdir, trials=10))
    assert (s.resumed_from, s.trials_run, s.trials_total) == (6, 4, 10)
    assert [int(r["trial"]) for r in read_raw(s.csv_path)] == list(range(10))


def test_warm_start_tries_reference_layouts_first(workdir: Path) -> None:
    req = _request(workdir, trials=4)
    space = SearchSpace(model=req.model, cluster=req.cluster, workload=req.workload)
    params = warm_start_params(space, req.profile, seed=0, pool=200)
    s = run_study(req)
    rows = read_raw(s.csv_path)
    assert [r["train_parallel"] for r in rows] == [p["layout"] for p, _ in params[:4]]
    assert rows[0]["train_parallel"] in {"tp4pp2", "tp4", "tp4cp2", "tp2", "tp2cp2", "tp4pp2vpp2"}
    assert f"origin={params[0][1]}" in rows[0]["extra"].split(";")
    assert params[0][1].startswith("reference ")


def test_other_workload_on_the_same_study_is_refused(workdir: Path) -> None:
    run_study(_request(workdir, trials=2, study_name="s"))
    with pytest.raises(UserError, match="pass --study NEW_NAME"):
        run_study(_request(workdir, trials=4, study_name="s", workload=PRESETS["grpo-short"]))


def test_corrupt_storage_is_refused_and_left_alone(workdir: Path) -> None:
    db = workdir / "results" / "studies.sqlite3"
    db.parent.mkdir()
    db.write_bytes(b"this is not a database" * 100)
    before = db.read_bytes()
    with pytest.raises(UserError, match="cannot be opened"):
        run_study(_request(workdir))
    assert db.read_bytes() == before


def test_journal_file_storage(workdir: Path) -> None:
    s = run_study(_request(workdir, trials=5, storage=str(workdir / "journal.log")))
    assert s.trials_total == 5 and (workdir / "journal.log").stat().st_size > 0


class _CountingRunner(EstimateRunner):
    """The estimator under another name, counting launches; raises on launch number fail_on."""

    name = "counting"

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[int] = []
        self.fail_on = fail_on

    def run(self, spec: TrialSpec) -> TrialResult:
        self.calls.append(spec.number)
        if len(self.calls) - 1 == self.fail_on:
            raise RuntimeError("worker exploded")
        return super().run(spec)


def test_a_runner_error_is_a_failed_row_and_the_study_goes_on(workdir: Path) -> None:
    runner = _CountingRunner(fail_on=0)
    s = run_study(
        _request(
            workdir,
            runner=runner,
            trials=12,
            warm_start=False,
            cluster=Cluster(gpu=get_gpu("h200"), num_gpus=8),
        )
    )
    rows = read_raw(s.csv_path)
    assert len(rows) == 12 and len(runner.calls) >= 2
    first = rows[runner.calls[0]]
    assert first["status"] == "failed" and "worker exploded" in first["reason"]
    assert rows[runner.calls[1]]["status"] == "ok"


def test_repeated_candidates_are_not_relaunched(workdir: Path) -> None:
    runner = _CountingRunner()
    # a 1-GPU space is tiny, so the sampler repeats itself quickly
    req = _request(
        workdir,
        runner=runner,
        trials=40,
        cluster=Cluster(gpu=get_gpu("h200"), num_gpus=1),
        model=REGISTRY["qwen3-8b"],
        model_arg="qwen3-8b",
        workload=PRESETS["grpo-short"],
    )
    s = run_study(req)
    rows = read_raw(s.csv_path)
    copies = [r for r in rows if "not re-run" in r["reason"]]
    launched = [r for r in rows if r["status"] == "ok" and "not re-run" not in r["reason"]]
    assert len(runner.calls) == len(launched) + sum(r["status"] in ("oom", "failed") for r in rows)
    for r in copies:
        assert r["status"] in ("ok", "oom", "failed")


def test_trial_killed_between_row_and_tell_is_closed_from_its_row(workdir: Path) -> None:
    req = _request(workdir, trials=3, warm_start=False)
    run_study(req)
    study = optuna.load_study(study_name=req.name, storage=req.storage_url)
    # a worker that died after writing trial 3's row but before telling the storage
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    t = study.ask()
    t.set_user_attr("worker", f"{os.uname().nodename}:{dead}")
    row0 = {k: v for k, v in read_raw(req.csv_path)[0].items() if v}
    upsert_row(
        req.csv_path, {**row0, "trial": t.number, "status": "ok", "tokens_per_s_per_gpu": 1234.0}
    )
    s = run_study(_request(workdir, trials=5, warm_start=False))
    study = optuna.load_study(study_name=req.name, storage=req.storage_url)
    assert study.trials[3].state == optuna.trial.TrialState.COMPLETE
    assert study.trials[3].value == 1234.0
    rows = read_raw(s.csv_path)
    assert [int(r["trial"]) for r in rows] == [0, 1, 2, 3, 4]


def test_sigkill_mid_study_loses_and_doubles_nothing(workdir: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "tuner.cli",
        "--model",
        "qwen3-30b-moe",
        "--gpus",
        "32",
        "--no-progress",
        "--no-warm-start",
    ]
    csv_path = workdir / "results" / "qwen3-30b-moe-h100x32-estimate.csv"
    proc = subprocess.Popen(
        [*cmd, "--trials", "2000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if csv_path.exists() and len(read_raw(csv_path)) >= 15:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    before = {r["trial"]: r for r in read_raw(csv_path)}
    assert len(before) >= 15
    total = len(before) + 10
    subprocess.run([*cmd, "--trials", str(total)], check=True, stdout=subprocess.DEVNULL)
    after = read_raw(csv_path)
    numbers = [r["trial"] for r in after]
    assert len(numbers) == len(set(numbers))
    for k, r in before.items():
        assert {c: v for c, v in r.items() if c != "recipe"} == {
            c: v for c, v in next(a for a in after if a["trial"] == k).items() if c != "recipe"
        }
    con = sqlite3.connect(workdir / "results" / "studies.sqlite3")
    finished = con.execute(
        "select count(*) from trials where state in ('COMPLETE','PRUNED','FAIL')"
    ).fetchone()[0]
    assert finished >= total
    ok_in_storage = con.execute("select count(*) from trials where state='COMPLETE'").fetchone()[0]
    assert ok_in_storage == sum(r["status"] == "ok" for r in after)
