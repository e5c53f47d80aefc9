"""Issue 30, class 5: refused input writes nothing, and one study does not write over another's
recipes. A refused `tune` adds no study to the storage, appends no line to a journal, writes no
Optuna tables into an empty file and leaves no `.lock` file; a resumed journal study gets no
second CREATE_STUDY line; a second and third study of the same model and GPUs keep the first
one's recipe files as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.cli import main

R = ["--model", "qwen2.5-7b", "--gpus", "8", "--no-progress"]
JUNK = "name,value\nalpha,1\n"
"""A CSV that is not a leaderboard, where the study's leaderboard would go."""


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], fragment: str) -> None:
    capsys.readouterr()
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], lines


def _study_names(db: Path) -> set[str]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT study_name FROM studies")}


def test_a_foreign_csv_adds_no_study_to_the_storage(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*R, "--trials", "2"]) == 0
    db = workdir / "results" / "studies.sqlite3"
    names = _study_names(db)
    (workdir / "results" / "s.csv").write_text(JUNK)
    before = _tree(workdir)
    _refused([*R, "--trials", "2", "--study", "s"], capsys, "not a verl-tuner leaderboard")
    assert _study_names(db) == names
    assert _tree(workdir) == before


@pytest.mark.parametrize("storage", ["absent", "empty"])
def test_a_new_or_empty_storage_file_stays_as_it_was(
    storage: str, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before the storage is opened: no tables in an empty file, no new file, no
    lock beside it."""
    results = workdir / "results"
    results.mkdir()
    (results / "s.csv").write_text(JUNK)
    if storage == "empty":
        (workdir / "db.sqlite3").write_bytes(b"")
    before = _tree(workdir)
    argv = [*R, "--trials", "2", "--study", "s", "--storage", "db.sqlite3"]
    _refused(argv, capsys, "not a verl-tuner leaderboard")
    assert _tree(workdir) == before


def _journal_ops(path: Path) -> list[int]:
    return [json.loads(line)["op_code"] for line in path.read_text().splitlines()]


def test_a_journal_gets_no_line_from_a_refusal_or_a_resume(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = workdir / "j.log"
    argv = [*R, "--study", "s", "--storage", str(journal)]
    assert main([*argv, "--trials", "2"]) == 0
    assert _journal_ops(journal).count(0) == 1  # CREATE_STUDY
    before = _tree(workdir)
    _refused([*argv, "--trials", "3", "--workload", "grpo-short"], capsys, "--study NEW_NAME")
    assert _tree(workdir) == before
    assert main([*argv, "--trials", "3"]) == 0
    assert _journal_ops(journal).count(0) == 1


def test_studies_of_the_same_model_and_gpus_keep_each_others_recipes(workdir: Path) -> None:
    recipes = workdir / "recipes"
    seen: dict[str, bytes] = {}
    for name in ("a", "b", "c"):
        assert main([*R, "--trials", "4", "--study", name]) == 0
        now = _tree(recipes)
        assert {k: now[k] for k in seen} == seen, f"study {name} changed an earlier recipe"
        assert len(now) > len(seen), f"study {name} wrote no recipe of its own"
        seen = now
    for text in seen.values():  # each recipe names the row it comes from
        assert text.count(b"\n# origin: ") == 1
