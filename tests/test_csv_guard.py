"""Issue 30, class 3: `--study NAME` where results/NAME.csv holds rows the storage does not
know (a storage moved aside or replaced, an older version's measured rows) is refused with one
line and exit 2, before anything is written: the CSV is never rebuilt without them."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest

from tuner.cli import main

R = ["--model", "qwen2.5-7b", "--gpus", "8", "--no-progress", "--study", "s"]
SCHEMA1 = Path(__file__).parent / "data" / "schema1" / "dense-h200-x2.csv"


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_storage_moved_aside_does_not_cost_the_csvs_rows(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*R, "--trials", "3"]) == 0
    results = workdir / "results"
    aside = workdir / "aside"
    aside.mkdir()
    for p in results.glob("studies.sqlite3*"):
        shutil.move(p, aside / p.name)
    before = _tree(workdir)
    line = _refused([*R, "--trials", "4"], capsys)
    assert "results/s.csv has" in line and "does not hold" in line and "--storage" in line
    assert _tree(workdir) == before  # no new storage, no rebuilt CSV, no lock

    # a storage at the same path that holds other studies (not this one's trials): refused too
    assert main(["--model", "qwen2.5-7b", "--gpus", "8", "--no-progress", "--trials", "2"]) == 0
    before = _tree(workdir)
    line = _refused([*R, "--trials", "4"], capsys)
    assert "holds no trial of study s" in line
    assert _tree(workdir) == before
    storage = optuna.storages.RDBStorage(f"sqlite:///{results / 'studies.sqlite3'}")
    assert "s" not in {st.study_name for st in storage.get_all_studies()}

    # with the storage back, the study resumes and keeps every row
    for p in results.glob("studies.sqlite3*"):
        p.unlink()
    for p in aside.iterdir():
        shutil.move(p, results / p.name)
    assert main([*R, "--trials", "4"]) == 0


def test_an_older_versions_rows_are_not_replaced(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A schema-1 leaderboard (rows with no storage column) of the study's name: its measured
    rows are in no storage, so a new study of that name is refused, not written over them."""
    results = workdir / "results"
    results.mkdir()
    shutil.copy(SCHEMA1, results / "dense-h200-x2.csv")
    before = _tree(workdir)
    argv = ["--model", "qwen2.5-7b", "--gpu", "h200", "--gpus", "2", "--trials", "2"]
    line = _refused([*argv, "--no-progress", "--study", "dense-h200-x2"], capsys)
    assert "dense-h200-x2.csv has" in line and "does not hold" in line
    assert _tree(workdir) == before
