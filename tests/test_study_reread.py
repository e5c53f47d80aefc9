"""`tune reread`: a finished verl row whose measure the parser did not know when it was read is
filled from its own trial's log, with the current parser, through the CLI; never a value the row
holds; a second reread changes nothing; bad input changes no file.

A real SQLite Optuna storage holds the study, each record stored as the study loop stores it
(`store_record`), the CSV is its view (`write_leaderboard`), and each trial's folder holds a
console log with verl 0.9.1's step line: the actor's allocator peaks under the `actor/` prefix
the trainer gives them (verl_log.ACTOR_PREFIX)."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path

import optuna
import pytest

from tuner.cli import main
from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY
from tuner.results import Status, TrialRecord, read_raw
from tuner.runners import verl_log
from tuner.runners.estimate import EstimateRunner
from tuner.study import TuneRequest, run_study
from tuner.study.csv_view import write_leaderboard
from tuner.study.reread import parser_tag
from tuner.study.storage import (
    REREAD_ATTR,
    close_storage,
    open_storage,
    record_of,
    reread_overlay,
    storage_label,
    store_record,
)
from tuner.workload import PRESETS

REPO = Path(__file__).resolve().parents[1]
STUDY = "verl-small"
TPUT = {0: 4089.14592766064, 1: 4198.395630868606, 2: 4295.6927624213895, 3: 3963.0310878274827}
"""Each trial's step-3 throughput, as verl logged it and its row keeps it."""


def step_line(step: int, throughput: float, allocated: float, reserved: float) -> str:
    """verl 0.9.1's console line of a step as a Ray job's log shows it (the TaskRunner's prefix
    and colour codes; metrics in the trainer's order, a few of each group kept; the actor's
    memory renamed `actor/perf/...` by ray_trainer._update_actor)."""
    return (
        f"\x1b[36m(TaskRunnerV1 pid=2508)\x1b[0m step:{step} - global_seqlen/min:139264.0 - "
        "actor/entropy:11.521614074707031 - actor/pg_loss:7.750140503048897e-05 - "
        f"actor/grad_norm:1.8892877697944641 - actor/perf/max_memory_allocated_gb:{allocated} - "
        f"actor/perf/max_memory_reserved_gb:{reserved} - "
        "actor/perf/cpu_memory_used_gb:25.52915573120117 - actor/lr:1e-06 - "
        "perf/mfu/actor:0.28655908066483875 - training/global_step:3 - "
        "response_length/mean:4096.0 - prompt_length/mean:256.0 - num_turns/min:np.int32(2) - "
        "timing_s/gen:24.11880729400002 - timing_s/old_log_prob:1.9896230980000382 - "
        "timing_s/update_actor:6.956221417000052 - timing_s/update_weights:0.8635134600000356 - "
        "timing_s/step:34.05698951900001 - perf/total_num_tokens:139264 - "
        f"perf/time_per_step:34.05698951900001 - perf/throughput:{throughput} - "
        "training/num_turns/mean:np.float64(2.0)\n"
    )


def console_log(throughput: float, allocated: float, reserved: float) -> str:
    """A verl run's log from its second step to its end (steps 2 and 3, then the teardown)."""
    return (
        "\x1b[36m(TaskRunnerV1 pid=2508)\x1b[0m Training Progress:  33%|###3      | 1/3\n"
        + step_line(2, throughput * 1.03, allocated, reserved - 0.3)
        + "\x1b[36m(TaskRunnerV1 pid=2508)\x1b[0m Training Progress:  67%|######6   | 2/3\n"
        + step_line(3, throughput, allocated, reserved)
        + "\x1b[36m(TaskRunnerV1 pid=2508)\x1b[0m Training Progress: 100%|##########| 3/3\n"
    )


def _record(n: int, label: str, **measured: float | None) -> TrialRecord:
    """Trial n's ok verl row as the runner recorded it before it knew the actor/ prefix: every
    measure of step 3 but the allocator peaks (unless `measured` gives them)."""
    return TrialRecord(
        study=STUDY,
        trial=n,
        status=Status.OK,
        source="verl",
        runner="verl",
        gpu="h100",
        num_gpus=1,
        train_parallel="dp1",
        tokens_per_s_per_gpu=TPUT[n],
        step_s=34.05698951900001,
        generation_s=24.11880729400002,
        old_log_prob_s=1.9896230980000382,
        update_actor_s=6.956221417000052,
        reshard_s=0.8635134600000356,
        peak_mem_gib=measured.get("peak_mem_gib"),
        peak_mem_reserved_gib=measured.get("peak_mem_reserved_gib"),
        peak_mem_device_gib=72.614,
        storage=label,
        log_path=f"/tmp/vt-res4/{STUDY}/trials/{n}/verl.log",
        extra={"launcher": "local", "metrics": "console", "step": 3},
    )


def make_study(results: Path, log_name: str = "verl.log") -> Path:
    """The study: trials 0-3 ok verl rows, trial 4 a failed one.

    0: no allocator peaks, its log has them (66.14 / 66.37 GiB);
    1: its allocated peak recorded (37.40), the reserved one not; its log says otherwise for the
       allocated one (99.5) and 38.67 for the reserved;
    2: no peaks, the log in its folder is another run's (another throughput);
    3: no peaks and no log."""
    url = str(results / f"{STUDY}.sqlite3")
    label = storage_label(url)
    storage = open_storage(url)
    study = optuna.create_study(study_name=STUDY, storage=storage, direction="maximize")
    records = [
        _record(0, label),
        _record(1, label, peak_mem_gib=37.4042181968689),
        _record(2, label),
        _record(3, label),
    ]
    for rec in records:
        trial = study.ask()
        store_record(trial, rec)
        study.tell(trial, rec.tokens_per_s_per_gpu)
    trial = study.ask()
    store_record(
        trial, TrialRecord(study=STUDY, trial=4, status=Status.OOM, source="verl", runner="verl")
    )
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    write_leaderboard(
        results / f"{STUDY}.csv", [t.user_attrs["record"] for t in study.get_trials()]
    )
    close_storage(storage)
    logs = {
        0: console_log(TPUT[0], 66.14179563522339, 66.37109375),
        1: console_log(TPUT[1], 99.5, 38.669921875),
        2: console_log(1609.0382274918022, 44.70484685897827, 44.982421875),
        4: "torch.OutOfMemoryError: CUDA out of memory.\n",
    }
    for n, text in logs.items():
        folder = results / STUDY / "trials" / str(n)
        folder.mkdir(parents=True)
        name = log_name if n == 0 else "verl.log"
        data = text.encode()
        (folder / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return results / f"{STUDY}.csv"


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `root` (bytes, mtime), less the empty `.lock` files a storage's opener
    takes (they hold no data)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not (p.name.endswith(".lock") and p.stat().st_size == 0):
            out[str(p.relative_to(root))] = (p.read_bytes(), p.stat().st_mtime_ns)
    return out


def rows_by_trial(csv_path: Path) -> dict[int, dict[str, str]]:
    return {int(r["trial"]): r for r in read_raw(csv_path)}


@pytest.mark.parametrize("log_name", ["verl.log", "verl.log.gz", "verl.log.tail"])
def test_reread_fills_what_the_parser_missed_from_the_trials_own_logs(
    log_name: str, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = workdir / "results"
    csv_path = make_study(results, log_name)
    before = rows_by_trial(csv_path)
    assert before[0]["peak_mem_gib"] == "" and before[1]["peak_mem_gib"] == "37.4042"

    assert main(["reread", "--study", STUDY, "--results-dir", "results"]) == 0

    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        "trial 0: filled peak_mem_gib=66.1418, peak_mem_reserved_gib=66.3711 from "
        f"{STUDY}/trials/0/{log_name}"
    )
    assert out[1] == f"trial 1: filled peak_mem_reserved_gib=38.6699 from {STUDY}/trials/1/verl.log"
    assert out[2].startswith(f"trial 2: nothing filled: {STUDY}/trials/2/verl.log is another run")
    assert "throughput 1609.04, the row's 4295.69" in out[2]
    assert out[3].startswith("trial 3: nothing filled: ref_s, peak_mem_gib, ")
    assert "no verl log in results/verl-small/trials/3" in out[3]
    assert not any(line.startswith("trial 4") for line in out)  # failed: not an ok row
    assert out[4].startswith(f"study {STUDY}: 3 values filled in 2 trials")
    assert len(out) == 5

    rows = rows_by_trial(csv_path)
    assert float(rows[0]["peak_mem_gib"]) == pytest.approx(66.14179563522339, rel=1e-5)
    assert float(rows[0]["peak_mem_reserved_gib"]) == pytest.approx(66.37109375, rel=1e-5)
    assert rows[0]["extra"].endswith(";reread=peak_mem_gib,peak_mem_reserved_gib")
    assert rows[1]["peak_mem_gib"] == "37.4042"  # held: never replaced by the log's 99.5
    assert float(rows[1]["peak_mem_reserved_gib"]) == pytest.approx(38.669921875, rel=1e-5)
    assert rows[1]["extra"].endswith(";reread=peak_mem_reserved_gib")
    for n in (2, 3, 4):  # nothing read: the rows as they were
        assert rows[n] == before[n]
    for n in (0, 1):  # every other cell as it was
        assert {k: v for k, v in rows[n].items() if k not in ("peak_mem_gib", "extra")} == {
            k: v for k, v in before[n].items() if k not in ("peak_mem_gib", "extra")
        } | {"peak_mem_reserved_gib": rows[n]["peak_mem_reserved_gib"]}

    assert not (results / f"{STUDY}.sqlite3-wal").exists()  # its connections closed
    # the storage: the trials as Optuna keeps them, the fills in the study's user attrs
    storage = open_storage(str(results / f"{STUDY}.sqlite3"))
    study = optuna.load_study(study_name=STUDY, storage=storage)
    t0 = study.trials[0]
    assert t0.user_attrs["record"]["peak_mem_gib"] is None
    fills = study.user_attrs[REREAD_ATTR]
    assert set(fills) == {"0", "1"}
    assert fills["0"] == [
        {
            "fields": {"peak_mem_gib": 66.14179563522339, "peak_mem_reserved_gib": 66.37109375},
            "from": f"{STUDY}/trials/0/{log_name}",
            "parser": parser_tag(),
        }
    ]
    rec = record_of(t0, reread_overlay(study))
    assert rec is not None and rec.peak_mem_gib == 66.14179563522339
    assert rec.extra["reread"] == "peak_mem_gib,peak_mem_reserved_gib"
    rec1 = record_of(study.trials[1], reread_overlay(study))
    assert rec1 is not None and rec1.peak_mem_gib == 37.4042181968689
    close_storage(storage)

    # again: nothing left to fill, no file changed
    files = snapshot(workdir)
    assert main(["reread", "--study", STUDY, "--results-dir", "results"]) == 0
    again = capsys.readouterr().out.splitlines()
    assert again[0].startswith("trial 0: nothing filled: ref_s empty, not in ")
    assert again[-1] == f"study {STUDY}: nothing filled; leaderboard results/{STUDY}.csv unchanged"
    assert snapshot(workdir) == files


def test_the_parser_tag_names_verl_logs_git_blob() -> None:
    """`git hash-object tuner/runners/verl_log.py` is what the tag names."""
    import hashlib

    src = Path(verl_log.__file__).read_bytes()
    blob = hashlib.sha1(b"blob %d\0" % len(src) + src).hexdigest()
    assert parser_tag().endswith(f"tuner/runners/verl_log.py blob {blob[:12]}")


def _estimate_only(results: Path) -> None:
    """studies.sqlite3 holding study `est`, whose one row is the estimator's."""
    storage = open_storage(str(results / "studies.sqlite3"))
    study = optuna.create_study(study_name="est", storage=storage, direction="maximize")
    trial = study.ask()
    rec = TrialRecord(study="est", trial=0, status=Status.OK, source="estimate", runner="estimate")
    store_record(trial, rec)
    study.tell(trial, 1000.0)
    close_storage(storage)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (
            ["--study", "nope", "--storage", f"results/{STUDY}.sqlite3"],
            f"no study 'nope' in results/{STUDY}.sqlite3: pass --study with one of {STUDY}, ",
        ),
        (
            ["--study", "nope"],
            f"no storage of study 'nope' in results (neither nope.sqlite3 nor studies.sqlite3; it "
            f"holds {STUDY}.sqlite3): pass --study with the study's name",
        ),
        (["--study", STUDY, "--results-dir", "gone"], "--results-dir gone does not exist: pass"),
        (["--study", "est"], "study est in results/studies.sqlite3 has no ok row of the verl "),
        (["--study", STUDY, "--storage", "x.sqlite3"], "--storage x.sqlite3: no such file"),
    ],
    ids=["unknown-study", "no-storage", "missing-results-dir", "no-verl-rows", "missing-storage"],
)
def test_bad_input_is_one_line_exit_2_and_no_file_changed(
    argv: list[str], fragment: str, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = workdir / "results"
    make_study(results)
    if "est" in argv:
        _estimate_only(results)
    files = snapshot(workdir)
    code = main(["reread", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("tune: error: ") and fragment in err[0], err
    assert snapshot(workdir) == files
    assert not list(workdir.rglob("*-wal")) and not list(workdir.rglob("*-shm"))


def test_the_study_loop_shows_the_fills_in_its_view(workdir: Path) -> None:
    """A study resumed after a reread rebuilds its CSV through the same overlay: the filled value
    shows, with its marker; a value the record holds stays (the fill below is made by hand to
    see the loop's reading: `tune reread` writes the same attr from a log)."""
    req = _estimate_request(workdir)
    run_study(req)
    study = optuna.load_study(study_name=req.name, storage=req.storage_url)
    ok = [t for t in study.trials if t.user_attrs.get("status") == "ok"]
    n, other = ok[0].number, ok[1].number
    held = ok[0].user_attrs["record"]["peak_mem_gib"]
    assert held is not None and ok[0].user_attrs["record"]["measured_s"] is None
    fill = {"fields": {"measured_s": 12.5, "peak_mem_gib": 1.0}, "from": "x", "parser": "y"}
    study.set_user_attr(REREAD_ATTR, {str(n): [fill]})

    run_study(dataclasses.replace(req, trials=3))

    rows = rows_by_trial(req.csv_path)
    assert rows[n]["measured_s"] == "12.5"
    assert float(rows[n]["peak_mem_gib"]) == pytest.approx(held, rel=1e-5)
    assert rows[n]["extra"].endswith(";reread=measured_s")
    assert "reread" not in rows[other]["extra"]
    assert sum(r["status"] == "ok" for r in rows.values()) == 3


def test_a_reread_during_a_study_reaches_its_workers_next_view(workdir: Path) -> None:
    """A worker formats each row once and keeps the line (a finished record never changes);
    a reread by another process changes what a record shows, so the worker's next view
    formats those rows again."""
    from tuner.space import SearchSpace
    from tuner.study.loop import _Study

    req = _estimate_request(workdir)
    run_study(req)
    space = SearchSpace(
        model=req.model,
        cluster=req.cluster,
        workload=req.workload,
        limits=req.runner.space_limits(req.model),
    )
    s = _Study(req, space)
    s.write_view(s.trials())
    n = min(s.records)
    assert rows_by_trial(req.csv_path)[n]["measured_s"] == ""
    fill = {"fields": {"measured_s": 12.5}, "from": "x", "parser": "y"}
    optuna.load_study(study_name=req.name, storage=req.storage_url).set_user_attr(
        REREAD_ATTR, {str(n): [fill]}
    )

    s.write_view(s.trials())

    assert rows_by_trial(req.csv_path)[n]["measured_s"] == "12.5"
    assert s.records[n].measured_s == 12.5


def _estimate_request(workdir: Path) -> TuneRequest:
    return TuneRequest(
        model=REGISTRY["qwen2.5-7b"],
        model_arg="qwen2.5-7b",
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=8),
        workload=PRESETS["dapo-math"],
        runner=EstimateRunner(),
        trials=2,
        results_dir=workdir / "results",
        recipes_dir=workdir / "recipes",
        warm_start=False,
    )


COMMITTED = REPO / "results" / "verl4k-h100-x1"


@pytest.mark.skipif(not (COMMITTED / "trials").is_dir(), reason="the committed logs")
@pytest.mark.parametrize("trial", [1, 2])
def test_the_committed_fills_are_what_the_committed_logs_say(trial: int) -> None:
    """results/verl4k-h100-x1.csv rows 1 and 2: the allocator peaks `tune reread` filled are
    verl's step-3 numbers in the trials' committed log tails, as verl_log reads them."""
    log = COMMITTED / "trials" / str(trial) / "verl.log.tail"
    got = verl_log.measures(verl_log.read_console(log.read_text(errors="replace")))
    assert got is not None
    row = rows_by_trial(REPO / "results" / "verl4k-h100-x1.csv")[trial]
    assert float(row["tokens_per_s_per_gpu"]) == pytest.approx(
        got.fields["tokens_per_s_per_gpu"], rel=1e-5
    )
    for field in ("peak_mem_gib", "peak_mem_reserved_gib"):
        assert float(row[field]) == pytest.approx(got.fields[field], rel=1e-5)
    assert row["extra"].endswith(";reread=peak_mem_gib,peak_mem_reserved_gib")
