from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.errors import UserError
from tuner.fileio import write_atomic
from tuner.measures import MEASURES
from tuner.results import (
    COLUMNS,
    SCHEMA_VERSION,
    Status,
    TrialRecord,
    format_table,
    rank,
    read_raw,
    read_rows,
    upsert_row,
)

DATA = Path(__file__).parent / "data" / "schema1"


def _row(trial: int, tput: float | None, status: str = "ok") -> dict[str, object]:
    return {
        "study": "s",
        "trial": trial,
        "status": status,
        "tokens_per_s_per_gpu": tput,
        "train_parallel": f"tp{trial}",
        "source": "estimate",
    }


def test_upsert_replaces_by_trial_and_keeps_others(tmp_path: Path) -> None:
    p = tmp_path / "lb.csv"
    upsert_row(p, _row(0, 100.0))
    upsert_row(p, _row(1, 200.0))
    upsert_row(p, _row(0, 150.0))
    rows = read_raw(p)
    assert [r["trial"] for r in rows] == ["0", "1"]
    assert rows[0]["tokens_per_s_per_gpu"] == "150"
    # colocated rows only: the placement column is left out (files.COLOCATED_ONLY_OMITTED)
    assert list(rows[0]) == [c for c in COLUMNS if c != "rollout_gpus"]
    assert all(r["schema_version"] == str(SCHEMA_VERSION) for r in rows)
    assert not list(tmp_path.glob("*.tmp"))


def test_upsert_rejects_unknown_columns(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown leaderboard columns"):
        upsert_row(tmp_path / "lb.csv", {"study": "s", "trial": 0, "throughput": 1})


def test_columns_come_from_the_record_with_units_and_one_name_per_quantity() -> None:
    names = [f.name for f in dataclasses.fields(TrialRecord)]
    assert COLUMNS[0] == "schema_version" and SCHEMA_VERSION == 3
    own = [n for n in names if n not in MEASURES and n != "knobs"]  # the record's, in order
    at = own.index("infer_parallel") + 1  # the measures (TrialMeasures, its base) follow it
    assert [c for c in COLUMNS if c in names] == [*own[:at], *MEASURES, *own[at:]]
    for c in ("throughput", "mfu", "mfu_pct", "throughput_tokens_per_s_per_gpu"):
        assert c not in COLUMNS
    for c in (
        "tokens_per_s_per_gpu",
        "mfu_update_pct",
        "verl_mfu_actor_pct",
        "peak_mem_gib",
        "peak_mem_reserved_gib",
        "peak_mem_device_gib",
        "pred_peak_mem_gib",
        "pred_device_mem_gib",
        "launch_s",
        "measured_s",
        "prompt_mean_len",
        "response_mean_len",
        "backend",
        "pred_versions",
        "storage",
    ):
        assert c in COLUMNS, c
    assert len(COLUMNS) == len(set(COLUMNS))


def test_record_round_trips_through_dict_and_row() -> None:
    rec = TrialRecord(
        study="s",
        trial=7,
        status=Status.OK,
        tokens_per_s_per_gpu=1234.5,
        peak_mem_device_gib=70.25,
        pred_tokens_per_s_per_gpu=1500.0,
        pred_fits=True,
        tp=4,
        knobs={"use_dynamic_bsz": True, "rollout_tp": 2, "gpu_memory_utilization": 0.6},
        extra={"seed": "0", "phase": "step"},
        prompt_mean_len=204.8,
    )
    assert TrialRecord.from_dict(rec.to_dict()) == rec
    back = TrialRecord.from_row(rec.to_row())
    assert back == rec
    row = rec.to_row()
    assert row["tokens_per_s_per_gpu"] == "1234.5" and row["pred_tokens_per_s_per_gpu"] == "1500"
    assert row["extra"] == "seed=0;phase=step" and row["schema_version"] == str(SCHEMA_VERSION)


@pytest.mark.parametrize("name", ["dense-h200-x2.csv", "moe-h200-x2.csv"])
def test_schema_1_leaderboards_still_read(name: str) -> None:
    assert {r["schema_version"] for r in read_raw(DATA / name)} == {"1"}
    rows = read_rows(DATA / name)  # in schema 3's meaning
    assert rows and all(r["schema_version"] == str(SCHEMA_VERSION) for r in rows)
    recs = [TrialRecord.from_row(r) for r in rows]
    assert [r.trial for r in recs] == list(range(len(rows)))
    for raw, rec in zip(rows, recs, strict=True):
        assert rec.status is Status(raw["status"])
        assert rec.train_parallel == raw["train_parallel"]
        if raw["tokens_per_s_per_gpu"]:
            assert rec.tokens_per_s_per_gpu == pytest.approx(float(raw["tokens_per_s_per_gpu"]))
        # schema 1 kept launch time and origin in `extra`; schema 2 has columns
        assert rec.launch_s is not None and "launch_s" not in rec.extra
        assert "origin" not in rec.extra
        assert rec.pred_peak_mem_gib == pytest.approx(float(raw["pred_peak_mem_gib"]))
        again = TrialRecord.from_row(rec.to_row())
        assert again == rec


@pytest.mark.parametrize(
    "path",
    [DATA / "dense-h200-x2.csv", DATA.parent / "memory" / "small16k-h100-x1.csv"],
    ids=["schema1", "schema2-before-enforce-eager"],
)
def test_rows_written_before_the_enforce_eager_column_load_with_verls_default(path: Path) -> None:
    """Leaderboards older than the knob have no `enforce_eager` column: their candidates read
    back with verl 0.9.1's default (CUDA graphs), which is what the verl runner ran, and a
    rewrite adds the column."""
    from tuner.space import VERL_DEFAULT_ENFORCE_EAGER, Candidate

    rows = read_rows(path)
    assert rows and "enforce_eager" not in rows[0] and "enforce_eager" in COLUMNS
    for raw in rows:
        rec = TrialRecord.from_row(raw)
        assert "enforce_eager" not in rec.knobs
        out = rec.to_row()
        assert out["enforce_eager"] == ""
        if raw.get("tp"):
            c = Candidate.from_record(raw, int(raw["num_gpus"]))
            assert c.enforce_eager is VERL_DEFAULT_ENFORCE_EAGER
            assert c.layout.tp == int(raw["tp"]) and c.rollout_tp == int(raw["rollout_tp"])
    back = TrialRecord.from_row({**rows[0], "enforce_eager": "True"})
    assert back.knobs["enforce_eager"] is True


def test_a_newer_schema_is_refused() -> None:
    with pytest.raises(UserError, match="upgrade verl-tuner"):
        TrialRecord.from_row({"schema_version": "9", "study": "s", "trial": "0", "status": "ok"})


def test_write_atomic_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        p = write_atomic(tmp_path / "sub" / "f.txt", "hello\n")
    finally:
        os.umask(old)
    assert p.read_text() == "hello\n"
    assert p.stat().st_mode & 0o777 == 0o640
    write_atomic(p, b"bytes")
    assert p.read_bytes() == b"bytes" and not list(p.parent.glob("*.tmp"))


def test_rank_sorts_numerically_with_missing_last(tmp_path: Path) -> None:
    rows = [
        {"trial": "1", "status": "ok", "tokens_per_s_per_gpu": "900"},
        {"trial": "2", "status": "oom", "tokens_per_s_per_gpu": ""},
        {"trial": "3", "status": "ok", "tokens_per_s_per_gpu": "1000"},
        {"trial": "4", "status": "ok", "tokens_per_s_per_gpu": "80"},
    ]
    assert [r["trial"] for r in rank(rows)] == ["3", "1", "4", "2"]
    assert [r["trial"] for r in rank(rows, status="ok", top=2)] == ["3", "1"]
    assert [r["trial"] for r in rank(rows, sort_by="tokens_per_s_per_gpu", descending=False)][
        :3
    ] == ["4", "1", "3"]
    with pytest.raises(UserError, match="no column"):
        rank(rows, sort_by="nope")


def test_a_partial_measure_never_heads_the_ranking() -> None:
    """A pruned-slow row's number is the step it was stopped at (results/gen8k-h200-x1 trial
    8 holds its training rate, 13066, from before de79b11): ok rows come first."""
    rows = [
        {"trial": "8", "status": "pruned-slow", "tokens_per_s_per_gpu": "13066"},
        {"trial": "6", "status": "ok", "tokens_per_s_per_gpu": "4262"},
        {"trial": "9", "status": "ok", "tokens_per_s_per_gpu": ""},
        {"trial": "1", "status": "ok", "tokens_per_s_per_gpu": "4252"},
    ]
    assert [r["trial"] for r in rank(rows)] == ["6", "1", "9", "8"]


def test_show_ranks_the_committed_whole_step_study_ok_rows_first() -> None:
    from tuner.leaderboard import load_leaderboard
    from tuner.leaderboard.ranking import rank as rank_df

    csv = Path(__file__).resolve().parents[1] / "results" / "gen8k-h200-x1.csv"
    ranked = rank_df(load_leaderboard(csv))
    statuses = ranked["status"].tolist()
    last_ok = max(i for i, st in enumerate(statuses) if st == "ok")
    assert statuses[0] == "ok" and statuses.index("pruned-slow") > last_ok
    assert "_partial" not in ranked.columns


def test_the_reference_leaderboards_are_in_the_repository(anchors: Path) -> None:
    """A clean clone runs the tests that read them: none is skipped for want of a folder
    outside the checkout (it looked for ../shared/anchors)."""
    repo = Path(__file__).resolve().parents[1]
    assert anchors.resolve().is_relative_to(repo)
    assert len(list(anchors.glob("*.csv"))) >= 3


def test_reads_every_reference_leaderboard(anchors: Path) -> None:
    for path in sorted(anchors.glob("*.csv")):
        rows = read_rows(path)
        assert rows and all(r["source"] == "reference" for r in rows)
        with open(path, newline="") as f:
            assert len(rows) == len(list(csv.DictReader(f)))
    grpo = {r["trial"]: r for r in read_rows(anchors / "grpo_qwen2.5_7b.csv")}
    assert grpo["4"]["status"] == "oom" and grpo["4"]["train_parallel"] == "tp2pp1cp2"
    assert grpo["2"]["tokens_per_s_per_gpu"] == "2583.4"
    assert grpo["2"]["max_response_len"] == "8192"
    dapo = {r["trial"]: r for r in read_rows(anchors / "dapo7b.csv")}
    assert dapo["4"]["update_actor_s"] == "205"
    assert float(dapo["4"]["verl_mfu_actor_pct"]) == 35.0  # verl's perf/mfu/actor, a fraction
    assert "mfu_pct" not in dapo["4"] and "mfu_update_pct" not in dapo["4"]
    assert dapo["4"]["actor_budget"] == str(20 * 1024)


def test_format_table_aligns_columns() -> None:
    rows = [
        {"trial": "1", "status": "ok", "tokens_per_s_per_gpu": "1234.5678"},
        {"trial": "22", "status": "oom", "tokens_per_s_per_gpu": ""},
    ]
    text = format_table(rows, ("trial", "status", "tokens_per_s_per_gpu"))
    lines = text.splitlines()
    assert lines[0].split() == ["trial", "status", "tok/s/gpu"]
    assert lines[1].split() == ["1", "ok", "1235"]
    assert lines[2].index("oom") == lines[1].index("ok")


def test_a_non_leaderboard_csv_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="neither"):
        read_rows(p)


# --------------------------------------------------------------------------------------------
# Schema 3: one meaning per column; rows of 1 and 2 read in it (issue 19, items 4 and 10)
# --------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
MOE8K = REPO / "results" / "moe8k-h200-x2.csv"
"""A committed schema-2 megatron leaderboard (both phases measured, mfu_pct both phases')."""


def _schema2_megatron_row(per_step: int = 8) -> dict[str, str]:
    """A committed schema-2 megatron ok row, as if 2 of `per_step` mini-batches had run."""
    row = next(r for r in read_raw(MOE8K) if r["status"] == "ok" and r["mfu_pct"])
    assert row["schema_version"] == "2" and "mini_batches_run=2;" in row["extra"]
    row["extra"] = row["extra"].replace(
        "mini_batches_per_step=2;", f"mini_batches_per_step={per_step};"
    )
    return row


def _extra(row: dict[str, str]) -> dict[str, str]:
    return dict(p.split("=", 1) for p in row["extra"].split(";") if "=" in p)


def test_an_old_megatron_rows_old_log_prob_means_the_whole_step(tmp_path: Path) -> None:
    """Schema 2 kept old_log_prob of the mini-batches run beside an update scaled to the step:
    read, both mean the step (the measured value in `extra`), by every reader."""
    old = _schema2_megatron_row(per_step=8)
    logp, upd_run = float(old["old_log_prob_s"]), float(_extra(old)["update_s_run"])
    path = tmp_path / "old.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(old))
        w.writeheader()
        w.writerow(old)
    (row,) = read_rows(path)
    assert float(row["old_log_prob_s"]) == pytest.approx(logp * 4, rel=1e-5)
    assert float(_extra(row)["old_log_prob_s_run"]) == pytest.approx(logp)
    rec = TrialRecord.from_row(old)
    assert rec.old_log_prob_s == pytest.approx(logp * 4, rel=1e-5)
    assert rec.update_actor_s == pytest.approx(float(old["update_actor_s"]))  # already the step's
    assert TrialRecord.from_row(rec.to_row()) == rec  # schema 3 is read as written
    # a storage's record of schema 2 (no schema_version; `mfu_pct` a key) likewise
    d = rec.to_dict()
    for k in ("mfu_update_pct", "verl_mfu_actor_pct"):
        d.pop(k)
    d["extra"] = {k: v for k, v in d["extra"].items() if not k.startswith(("old_log", "mfu"))}
    d.update(old_log_prob_s=logp, mfu_pct=float(old["mfu_pct"]), tokens_per_s_per_gpu=1.0)
    stored = TrialRecord.from_dict(d)
    for k in ("old_log_prob_s", "mfu_update_pct"):
        assert getattr(stored, k) == pytest.approx(getattr(rec, k), rel=1e-5)
    assert stored.extra["old_log_prob_s_run"] == logp and stored.verl_mfu_actor_pct is None
    # mfu_pct of a worker that measured both phases: both phases' FLOPs (4/3 of the update's)
    # over both phases' time of the mini-batches run; the update's own is read from it
    mfu = float(old["mfu_pct"])
    assert rec.mfu_update_pct == pytest.approx(0.75 * mfu * (logp + upd_run) / upd_run, rel=1e-5)
    assert rec.verl_mfu_actor_pct is None
    assert float(rec.extra["mfu_both_phases_pct"]) == pytest.approx(mfu)
    # upserting into an old file writes every row in schema 3's meaning
    upsert_row(path, {"study": "x", "trial": 99, "status": "failed", "source": "megatron"})
    again = {r["trial"]: r for r in read_raw(path)}
    assert {r["schema_version"] for r in again.values()} == {str(SCHEMA_VERSION)}
    assert float(again[old["trial"]]["old_log_prob_s"]) == pytest.approx(logp * 4, rel=1e-5)
    assert TrialRecord.from_row(again[old["trial"]]) == rec


@pytest.mark.parametrize(
    ("source", "column"),
    [("estimate", "mfu_update_pct"), ("verl", "verl_mfu_actor_pct")],
)
def test_an_old_mfu_goes_to_the_column_of_what_it_counted(source: str, column: str) -> None:
    """The estimator's mfu_pct was the update's by the tuner's formula; verl's was its counter
    perf/mfu/actor: each lands in its own column, the other stays empty."""
    row = {c: "" for c in COLUMNS} | {
        "schema_version": "2",
        "study": "s",
        "trial": "3",
        "status": "ok",
        "source": source,
        "mfu_pct": "12.5",
        "old_log_prob_s": "7",
    }
    rec = TrialRecord.from_row(row)
    other = {"mfu_update_pct", "verl_mfu_actor_pct"} - {column}
    assert getattr(rec, column) == 12.5 and getattr(rec, other.pop()) is None
    assert rec.old_log_prob_s == 7.0  # only megatron rows timed part of the step


def test_schema_1_megatron_rows_measured_the_update_alone() -> None:
    """The first worker measured the update alone: its mfu_pct was already the update's."""
    for raw in read_raw(DATA / "dense-h200-x2.csv"):
        if raw["mfu_pct"]:
            assert "measured=actor update" in raw["extra"]
            rec = TrialRecord.from_row(raw)
            assert rec.mfu_update_pct == pytest.approx(float(raw["mfu_pct"]))


def test_an_old_mfu_that_is_no_number_is_kept_for_the_checks_to_refuse(tmp_path: Path) -> None:
    """A damaged mfu_pct of an old file is not dropped on the way: it lands in its new column,
    where the commands' checks name it (tests/test_bad_input.py)."""
    path = tmp_path / "old.csv"
    row = {c: "" for c in COLUMNS} | {"schema_version": "2", "study": "s", "trial": "0"}
    row |= {"status": "ok", "source": "estimate", "mfu_pct": "fast"}
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["mfu_pct", *row.keys() - {"mfu_pct"}])
        w.writeheader()
        w.writerow(row)
    (got,) = read_rows(path)
    assert got["mfu_update_pct"] == "fast" and "mfu_pct" not in got
    assert main(["show", str(path)]) == 2
