from __future__ import annotations

import dataclasses
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
from tuner.results import Status, TrialRecord, TrialResult, read_raw
from tuner.runners.base import TrialSpec
from tuner.runners.estimate import EstimateRunner
from tuner.space import SearchSpace, SpaceLimits
from tuner.study import TuneRequest, run_study, warm_start_params
from tuner.study import loop as study_loop
from tuner.study.learn import FIRST_LAUNCH_S, StudyLearner
from tuner.study.objective import search_score
from tuner.study.storage import RECORD_ATTR, open_storage, storage_label
from tuner.workload import PRESETS

UNCOUNTED = {"pruned-invalid", "pruned-oom-predicted", "interrupted"}


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


def _counted(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [r for r in rows if r["status"] not in UNCOUNTED]


def test_study_writes_one_row_per_trial_and_recipes(workdir: Path) -> None:
    s = run_study(_request(workdir))
    rows = read_raw(s.csv_path)
    assert len(_counted(rows)) == 12 == s.trials_total
    assert [int(r["trial"]) for r in rows] == list(range(len(rows)))
    assert {r["source"] for r in rows if r["status"] == "ok"} == {"estimate"}
    assert {r["backend"] for r in rows} == {"estimate (cost model)"}
    assert {r["storage"] for r in rows} == {storage_label(s.storage, s.csv_path.parent)}
    assert s.recipe_paths and all(p.exists() for p in s.recipe_paths)
    best = rows[int(s.best_rows[0]["trial"])]
    assert best["recipe"] == str(s.recipe_paths[0])
    assert float(best["tokens_per_s_per_gpu"]) == max(
        float(r["tokens_per_s_per_gpu"]) for r in rows if r["status"] == "ok"
    )
    w = PRESETS["dapo-math"]
    assert float(best["prompt_mean_len"]) == pytest.approx(w.mean_prompt_len)
    assert float(best["response_mean_len"]) == pytest.approx(w.mean_response_len)
    # the file follows the umask (0644 under 022), not mkstemp's 0600
    mask = os.umask(0o022)
    os.umask(mask)
    assert s.csv_path.stat().st_mode & 0o777 == 0o666 & ~mask


def test_storage_holds_the_whole_record(workdir: Path) -> None:
    req = _request(workdir, trials=4)
    s = run_study(req)
    study = optuna.load_study(study_name=s.name, storage=req.storage_url)
    rows = {int(r["trial"]): r for r in read_raw(s.csv_path)}
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == len(rows) >= 4
    for t in finished:
        rec = TrialRecord.from_dict(t.user_attrs[RECORD_ATTR])
        row = rec.to_row()
        assert {k: v for k, v in row.items() if k != "recipe"} == {
            k: v for k, v in rows[t.number].items() if k != "recipe"
        }


def test_pruned_rows_carry_the_reason_and_do_not_count(workdir: Path) -> None:
    # 14B on 8 H100: most candidates cannot fit; they end PRUNED with the predicted peak
    req = _request(
        workdir, model=REGISTRY["qwen2.5-14b"], model_arg="qwen2.5-14b", trials=3, warm_start=False
    )
    s = run_study(req)
    rows = read_raw(s.csv_path)
    pruned = [r for r in rows if r["status"] == "pruned-oom-predicted"]
    assert pruned and all(r["reason"].startswith("predicted ") for r in pruned)
    assert all(r["pred_fits"] == "False" for r in pruned)
    assert len(_counted(rows)) == 3 and s.pruned_before_launch == len(pruned)
    study = optuna.load_study(study_name=s.name, storage=req.storage_url)
    states = {t.number: t.state for t in study.trials}
    for r in pruned:
        assert states[int(r["trial"])] == optuna.trial.TrialState.PRUNED
        assert study.trials[int(r["trial"])].user_attrs["reason"] == r["reason"]


def test_a_space_where_nothing_fits_ends_with_a_note(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(study_loop, "MAX_CONSECUTIVE_UNFIT", 15)
    req = _request(
        workdir,
        model=REGISTRY["qwen2.5-32b"],
        model_arg="qwen2.5-32b",
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=2),
        warm_start=False,
        trials=5,
    )
    s = run_study(req)
    assert s.trials_total == 0 and s.pruned_before_launch == 15
    assert any("predicted not to fit" in n for n in s.notes)
    assert len(read_raw(s.csv_path)) == 15


def test_resume_continues_to_the_requested_count(workdir: Path) -> None:
    run_study(_request(workdir, trials=6))
    s = run_study(_request(workdir, trials=10))
    assert (s.resumed_from, s.trials_run, s.trials_total) == (6, 4, 10)
    rows = read_raw(s.csv_path)
    assert len(_counted(rows)) == 10
    assert [int(r["trial"]) for r in rows] == list(range(len(rows)))


def test_warm_start_puts_the_predicted_best_first_and_interleaves_references(
    workdir: Path,
) -> None:
    req = _request(workdir, trials=4)
    space = SearchSpace(model=req.model, cluster=req.cluster, workload=req.workload)
    params = warm_start_params(space, req.profile, seed=0, pool=200)
    origins = [o for _, o in params]
    assert origins[0] == "estimator" and origins[1].startswith("reference ")
    keys = [tuple(sorted(p.items())) for p, _ in params]
    assert len(keys) == len(set(keys))
    s = run_study(req)
    rows = read_raw(s.csv_path)
    # with the estimator the estimator's best are its search's (issue 30), as many as trials
    learner = StudyLearner(capacity_gib=req.cluster.gpu.memory_gib)
    full = warm_start_params(
        space, req.profile, 0, req.runner, best=4, search=search_score(req, learner)
    )[:4]
    assert [r["train_parallel"] for r in rows] == [p["layout"] for p, _ in full]
    assert [r["origin"] for r in rows] == [o for _, o in full]
    assert rows[1]["origin"].startswith("reference ")
    study = optuna.load_study(study_name=s.name, storage=req.storage_url)
    assert study.user_attrs["warm_start_enqueued"] == len(full)
    # a resumed study enqueues nothing again
    run_study(_request(workdir, trials=5))
    study = optuna.load_study(study_name=s.name, storage=req.storage_url)
    assert study.user_attrs["warm_start_enqueued"] == len(full)
    assert not any(t.user_attrs.get("origin") for t in study.trials[len(full) :])


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


def test_a_storage_file_that_is_not_a_journal_is_refused_without_appending(
    workdir: Path,
) -> None:
    log = workdir / "notes.log"
    log.write_text("my own log file\nsecond line\n")
    before = log.read_bytes()
    with pytest.raises(UserError, match="not a journal entry"):
        open_storage(str(log))
    with pytest.raises(UserError, match="cannot be opened"):
        run_study(_request(workdir, storage=str(log)))
    assert log.read_bytes() == before
    assert not (workdir / "results").exists()


def test_journal_file_storage(workdir: Path) -> None:
    s = run_study(_request(workdir, trials=5, storage=str(workdir / "journal.log")))
    assert s.trials_total == 5 and (workdir / "journal.log").stat().st_size > 0
    # a second run on the same journal (the file now exists) opens it
    s = run_study(_request(workdir, trials=6, storage=str(workdir / "journal.log")))
    assert s.trials_total == 6


def test_a_csv_made_by_another_storage_is_refused_not_overwritten(workdir: Path) -> None:
    s = run_study(_request(workdir, trials=2, storage=str(workdir / "a.sqlite3")))
    before = s.csv_path.read_bytes()
    with pytest.raises(UserError) as e:
        run_study(_request(workdir, trials=2, storage=str(workdir / "b.sqlite3")))
    msg = str(e.value)
    assert "a.sqlite3" in msg and "b.sqlite3" in msg and "\n" not in msg
    assert s.csv_path.read_bytes() == before


def test_a_damaged_csv_is_set_aside_and_rebuilt(workdir: Path) -> None:
    req = _request(workdir, trials=4)
    s = run_study(req)
    good = s.csv_path.read_text()
    s.csv_path.write_text(good[: len(good) // 2])  # truncated mid-row
    s2 = run_study(req)
    assert s2.notes and "damaged" in s2.notes[0]
    aside = list(s.csv_path.parent.glob(s.csv_path.name + ".damaged-*"))
    assert len(aside) == 1 and aside[0].read_text() == good[: len(good) // 2]
    assert s.csv_path.read_text() == good


class _CountingRunner(EstimateRunner):
    """The estimator under another name, counting launches; raises on launch number fail_on."""

    name = "counting"

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[int] = []
        self.fail_on = fail_on
        self.closed = 0

    def run(self, spec: TrialSpec) -> TrialResult:
        self.calls.append(spec.number)
        if len(self.calls) - 1 == self.fail_on:
            raise RuntimeError("worker exploded")
        return dataclasses.replace(super().run(spec), launch_s=2.0, measured_s=3.0)

    def close(self) -> None:
        self.closed += 1


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
    assert len(_counted(rows)) == 12 and len(runner.calls) >= 2
    first = rows[runner.calls[0]]
    assert first["status"] == "failed" and "worker exploded" in first["reason"]
    assert rows[runner.calls[1]]["status"] == "ok"
    assert runner.closed == 1


def test_the_runner_is_closed_on_error(workdir: Path) -> None:
    runner = _CountingRunner()
    run_study(_request(workdir, runner=runner, trials=1, study_name="s", warm_start=False))
    with pytest.raises(UserError):
        run_study(
            _request(
                workdir, runner=runner, trials=2, study_name="s", workload=PRESETS["grpo-short"]
            )
        )
    assert runner.closed == 2


def test_repeated_candidates_are_not_relaunched(workdir: Path) -> None:
    runner = _CountingRunner()
    req = _request(workdir, runner=runner, trials=3, warm_start=False)
    space = SearchSpace(
        model=req.model,
        cluster=req.cluster,
        workload=req.workload,
        limits=runner.space_limits(req.model),
    )
    params, _ = warm_start_params(space, req.profile, seed=0, runner=runner, pool=50)[0]
    study = optuna.create_study(
        study_name=req.name, storage=open_storage(req.storage_url), direction="maximize"
    )
    study.enqueue_trial(params)
    study.enqueue_trial(params)  # the same candidate twice
    s = run_study(req)
    rows = read_raw(s.csv_path)
    assert [r["status"] for r in rows[:2]] == ["ok", "ok"] and len(_counted(rows)) == 3
    assert rows[1]["reason"] == "same candidate as trial 0; not re-run"
    assert rows[1]["tokens_per_s_per_gpu"] == rows[0]["tokens_per_s_per_gpu"]
    # its row is not a launch: no launch or measured time of its own
    assert rows[0]["measured_s"] == "3" and rows[1]["measured_s"] == rows[1]["launch_s"] == ""
    launched = [int(r["trial"]) for r in rows if r["status"] == "ok" and not r["reason"]]
    assert runner.calls == launched and runner.calls[0] == 0 and 1 not in runner.calls


def test_trial_killed_between_record_and_tell_is_closed_from_its_record(workdir: Path) -> None:
    req = _request(workdir, trials=3, warm_start=False)
    run_study(req)
    study = optuna.load_study(study_name=req.name, storage=req.storage_url)
    # a worker that died after storing trial 3's record but before telling the storage
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    rec0 = TrialRecord.from_dict(study.trials[0].user_attrs[RECORD_ATTR])
    t = study.ask()
    t.set_user_attr("worker", f"{os.uname().nodename}:{dead}")
    d = {**rec0.to_dict(), "trial": t.number, "status": "ok", "tokens_per_s_per_gpu": 1234.0}
    t.set_user_attr(RECORD_ATTR, d)
    t.set_user_attr("status", "ok")
    # and one that died before storing anything
    t2 = study.ask()
    t2.set_user_attr("worker", f"{os.uname().nodename}:{dead}")
    s = run_study(_request(workdir, trials=5, warm_start=False))
    study = optuna.load_study(study_name=req.name, storage=req.storage_url)
    assert study.trials[t.number].state == optuna.trial.TrialState.COMPLETE
    assert study.trials[t.number].value == 1234.0
    assert study.trials[t2.number].state == optuna.trial.TrialState.FAIL
    rows = read_raw(s.csv_path)
    assert [int(r["trial"]) for r in rows] == list(range(len(rows)))
    assert rows[t2.number]["status"] == "interrupted" and "not counted" in rows[t2.number]["reason"]
    assert rows[t.number]["tokens_per_s_per_gpu"] == "1234"
    assert len(_counted(rows)) == 5


class _MeasuringRunner(EstimateRunner):
    """A runner whose 'measurements' differ from the cost model the way a real machine does:
    twice as slow, 2 GiB more device memory; its first launch runs out of memory."""

    name = "fake"

    def __init__(self) -> None:
        self.specs: list[TrialSpec] = []

    def run(self, spec: TrialSpec) -> TrialResult:
        self.specs.append(spec)
        e = spec.prediction
        if len(self.specs) == 1:
            return TrialResult(status=Status.OOM, source="fake", reason="CUDA OOM", launch_s=50.0)
        return TrialResult(
            status=Status.OK,
            source="fake",
            tokens_per_s_per_gpu=e.throughput_tokens_per_s_per_gpu / 2,
            step_s=e.step_s * 2,
            update_actor_s=e.update_actor_s * 2,
            peak_mem_device_gib=e.peak_mem_gib + 2,
            launch_s=30.0 + len(self.specs),
            measured_s=e.step_s * 2 * 3,
            hardware="fake",
        )


def test_the_study_learns_time_and_memory_from_its_own_trials(workdir: Path) -> None:
    runner = _MeasuringRunner()
    req = _request(
        workdir,
        runner=runner,
        trials=8,
        warm_start=False,
        trial_timeout_s=1e9,
        cluster=Cluster(gpu=get_gpu("h200"), num_gpus=8),
    )
    s = run_study(req)
    rows = read_raw(s.csv_path)
    launched = [r for r in rows if r["status"] in ("ok", "oom")]
    # before anything was measured: scale 1 and the generous first-launch cost
    assert float(launched[0]["pred_time_scale"]) == 1.0
    first = runner.specs[0]
    assert first.timeout_s == pytest.approx(
        FIRST_LAUNCH_S + 3 * first.prediction.step_s * 3, rel=1e-6
    )
    # after measured trials: twice as slow, and launches as slow as the slowest seen x 1.5
    last = runner.specs[-1]
    assert float(launched[-1]["pred_time_scale"]) == pytest.approx(2.0)
    slowest = max(50.0, *(30.0 + i for i in range(2, len(runner.specs))))
    assert last.timeout_s == pytest.approx(
        slowest * 1.5 + 3 * last.prediction.step_s * 2 * 3, rel=1e-6
    )
    # an OOM at a predicted device peak lowers what counts as fitting for the rest
    oom_at = float(launched[0]["pred_device_mem_gib"])
    assert launched[0]["status"] == "oom"
    for r in launched[1:]:
        assert float(r["pred_device_mem_gib"]) < oom_at
    assert all(r["pred_device_mem_corrected_gib"] for r in launched)
    assert s.launch_s == pytest.approx(sum(float(r["launch_s"]) for r in launched))
    # the CSV keeps 6 significant digits (results.record.fmt): each row within 5e-6 of its value
    assert s.measured_s == pytest.approx(
        sum(float(r["measured_s"]) for r in launched if r["measured_s"]), rel=5e-6
    )


class _SlowRunner(EstimateRunner):
    """Reports each measured step to should_stop; after two trials, steps run 10x slower. The
    throughput is the same for every candidate (not its prediction), so only the slowdown can
    make a trial far slower than the best."""

    name = "slowing"

    def __init__(self) -> None:
        self.n = 0

    def run(self, spec: TrialSpec) -> TrialResult:
        self.n += 1
        tput = 2000.0 / (10 if self.n > 2 else 1)
        for step in range(3):
            if spec.should_stop is not None and spec.should_stop(step, tput):
                return TrialResult(
                    status=Status.PRUNED_SLOW,
                    source="slowing",
                    reason=f"step {step}: {tput:.0f} tok/s/GPU, far below the best",
                    launch_s=1.0,
                    measured_s=float(step + 1),
                )
        return TrialResult(
            status=Status.OK, source="slowing", tokens_per_s_per_gpu=tput, launch_s=1.0
        )


def test_a_far_slower_trial_is_pruned_slow_not_failed(workdir: Path) -> None:
    req = _request(
        workdir,
        runner=_SlowRunner(),
        trials=4,
        warm_start=False,
        cluster=Cluster(gpu=get_gpu("h200"), num_gpus=8),
    )
    s = run_study(req)
    rows = _counted(read_raw(s.csv_path))
    assert [r["status"] for r in rows][:2] == ["ok", "ok"]
    slow = [r for r in rows[2:] if r["status"] == "pruned-slow"]
    assert slow and all(r["measured_s"] == "1" for r in slow)
    study = optuna.load_study(study_name=s.name, storage=req.storage_url)
    for r in slow:
        t = study.trials[int(r["trial"])]
        assert t.state == optuna.trial.TrialState.PRUNED and t.intermediate_values
    assert s.trials_total == 4


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
    total = len(_counted(list(before.values()))) + 10
    subprocess.run([*cmd, "--trials", str(total)], check=True, stdout=subprocess.DEVNULL)
    after = read_raw(csv_path)
    numbers = [r["trial"] for r in after]
    assert len(numbers) == len(set(numbers))
    assert len(_counted(after)) == total
    for k, r in before.items():
        assert {c: v for c, v in r.items() if c != "recipe"} == {
            c: v for c, v in next(a for a in after if a["trial"] == k).items() if c != "recipe"
        }
    con = sqlite3.connect(workdir / "results" / "studies.sqlite3")
    finished = con.execute(
        "select count(*) from trials where state in ('COMPLETE','PRUNED','FAIL')"
    ).fetchone()[0]
    assert finished == len(after)
    ok_in_storage = con.execute("select count(*) from trials where state='COMPLETE'").fetchone()[0]
    assert ok_in_storage == sum(r["status"] == "ok" for r in after)


class _PinningRunner(EstimateRunner):
    """The estimator with the megatron runner's habit of pinning what it does not measure."""

    name = "pinning"

    def __init__(self, pinned: tuple[tuple[str, object], ...]) -> None:
        self.pinned = pinned

    def space_limits(self, model: object) -> SpaceLimits:
        return SpaceLimits(pinned=self.pinned)


def test_a_study_resumes_after_a_knob_is_added_at_its_default(workdir: Path) -> None:
    """A knob added to the table since a study was made (the megatron runner pins it) does not
    strand the study when it is pinned at verl's default, which the earlier trials ran; pinned
    elsewhere, the study is refused as before."""
    old = (("max_num_seqs", 256),)
    run_study(_request(workdir, runner=_PinningRunner(old), trials=2, warm_start=False))
    s = run_study(
        _request(
            workdir,
            runner=_PinningRunner((*old, ("enforce_eager", False))),
            trials=4,
            warm_start=False,
        )
    )
    assert len(_counted(read_raw(s.csv_path))) == 4
    assert any("made before enforce_eager existed" in n for n in s.notes)
    with pytest.raises(UserError, match="was made for another"):
        run_study(
            _request(
                workdir,
                runner=_PinningRunner((*old, ("enforce_eager", True))),
                trials=6,
                warm_start=False,
            )
        )
    with pytest.raises(UserError, match="was made for another"):
        run_study(
            _request(
                workdir, runner=_PinningRunner((("max_num_seqs", 512),)), trials=6, warm_start=False
            )
        )


def test_a_warm_start_longer_than_a_chunk_runs_in_order(workdir: Path) -> None:
    """The estimator's 40 searched candidates wait in the study's user attrs past the first
    WARM_START_CHUNK (Optuna re-read every waiting trial at each read: 200 made a 200-trial
    study slow, issue 38.7); the trials still run them in the search's order, each once."""
    from tuner.study.warmstart import WARM_START_CHUNK

    n = 2 * WARM_START_CHUNK + 8
    req = _request(workdir, trials=n)
    space = SearchSpace(model=req.model, cluster=req.cluster, workload=req.workload)
    learner = StudyLearner(capacity_gib=req.cluster.gpu.memory_gib)
    want = warm_start_params(
        space, req.profile, 0, req.runner, best=n, search=search_score(req, learner)
    )[:n]
    assert len(want) == n
    s = run_study(req)
    study = optuna.load_study(study_name=s.name, storage=req.storage_url)
    assert study.user_attrs["warm_start_enqueued"] == n
    ran = [(t.params, t.user_attrs.get("origin")) for t in study.trials[:n]]
    assert ran == [(p, o) for p, o in want]
