from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tuner.errors import UserError
from tuner.results import COLUMNS, format_table, rank, read_raw, read_rows, upsert_row


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
    assert list(rows[0]) == list(COLUMNS)
    assert all(r["schema_version"] == "1" for r in rows)
    assert not list(tmp_path.glob("*.tmp"))


def test_upsert_rejects_unknown_columns(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown leaderboard columns"):
        upsert_row(tmp_path / "lb.csv", {"study": "s", "trial": 0, "throughput": 1})


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
    assert dapo["4"]["update_actor_s"] == "205" and float(dapo["4"]["mfu_pct"]) == 35.0
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
