"""A results folder can move: its leaderboard names a storage inside it by the path relative to
it, so a renamed checkout, a copy elsewhere or a mount at another path resumes (it named the
storage by absolute path, and following the message created an empty storage at the old one).
A leaderboard an older version wrote (absolute paths) still resumes."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.results import read_raw
from tuner.study.storage import label_url, same_storage, storage_label

STUDY = "qwen2.5-7b-h100x8-estimate"
TUNE = ["--model", "qwen2.5-7b", "--gpus", "8", "--runner", "estimate", "--no-progress"]


def _tune(*more: str) -> int:
    return main([*TUNE, *more])


def _counted(csv: Path) -> int:
    return len([r for r in read_raw(csv) if r["status"] == "ok"])


@pytest.mark.parametrize("storage", ["", "results/s.journal"], ids=["sqlite", "journal"])
def test_a_renamed_checkout_resumes_its_study(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, storage: str
) -> None:
    old = workdir / "checkout"
    old.mkdir()
    monkeypatch.chdir(old)
    flags = ["--storage", storage] if storage else []
    assert _tune(*flags, "--trials", "2") == 0
    csv = Path("results") / f"{STUDY}.csv"
    kind = "journal:s.journal" if storage else "sqlite:studies.sqlite3"
    assert {r["storage"] for r in read_raw(csv)} == {kind}
    before = read_raw(csv)
    monkeypatch.chdir(workdir)
    old.rename(workdir / "moved")
    monkeypatch.chdir(workdir / "moved")
    assert _tune(*flags, "--trials", "4") == 0
    rows = read_raw(csv)
    assert _counted(csv) == 4 and rows[: len(before)] == before
    assert not old.exists()  # nothing created at the old place


def test_a_results_folder_renamed_and_copied_resumes(workdir: Path) -> None:
    assert _tune("--trials", "2") == 0
    shutil.copytree("results", "copy")
    os.rename("results", "renamed")
    for folder in ("renamed", "copy"):
        assert _tune("--results-dir", folder, "--trials", "3") == 0
        assert _counted(Path(folder) / f"{STUDY}.csv") == 3
    assert not Path("results").exists()


def _as_an_older_version_wrote_it(results: Path, old: str) -> None:
    """The leaderboard and the storage's records naming the storage by the absolute path `old`,
    as versions before relative names wrote them."""
    csv = results / f"{STUDY}.csv"
    csv.write_text(csv.read_text().replace("sqlite:studies.sqlite3", f"sqlite:{old}"))
    with contextlib.closing(sqlite3.connect(results / "studies.sqlite3")) as db, db:
        db.execute(
            "UPDATE trial_user_attributes SET value_json = replace(value_json, ?, ?)",
            ("sqlite:studies.sqlite3", f"sqlite:{old}"),
        )


def test_a_leaderboard_of_an_older_version_resumes_here_and_moved(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _tune("--trials", "2") == 0
    results = (workdir / "results").resolve()
    _as_an_older_version_wrote_it(results, str(results / "studies.sqlite3"))
    assert _tune("--trials", "3") == 0  # an absolute path of this very file
    csv = results / f"{STUDY}.csv"
    assert _counted(csv) == 3 and {r["storage"] for r in read_raw(csv)} == {
        "sqlite:studies.sqlite3"
    }
    # written at a place that is gone: the folder moved with its storage in it
    _as_an_older_version_wrote_it(results, "/gone/checkout/results/studies.sqlite3")
    os.rename("results", "elsewhere")
    assert _tune("--results-dir", "elsewhere", "--trials", "4") == 0
    rows = read_raw(Path("elsewhere") / f"{STUDY}.csv")
    assert len([r for r in rows if r["status"] == "ok"]) == 4
    assert {r["storage"] for r in rows} == {"sqlite:studies.sqlite3"}  # relative from now on
    assert not Path("/gone").exists()


def test_a_storage_outside_the_results_folder_is_named_by_its_absolute_path(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _tune("--storage", "shared/x.journal", "--trials", "2") == 0
    csv = Path("results") / f"{STUDY}.csv"
    (cell,) = {r["storage"] for r in read_raw(csv)}
    assert cell == f"journal:{(workdir / 'shared' / 'x.journal').resolve()}"
    # the storage moved away from where the leaderboard says: refused, nothing created there
    os.rename("shared", "moved")
    before = csv.read_bytes()
    capsys.readouterr()
    assert _tune("--storage", "other.journal", "--trials", "3") == 2
    err = capsys.readouterr().err
    assert "x.journal is not there: move that storage back there" in err, err
    assert not Path("shared").exists()
    assert csv.read_bytes() == before
    os.rename("moved", "shared")
    assert _tune("--storage", "shared/x.journal", "--trials", "3") == 0


def test_labels_read_back_relative_to_the_leaderboard(tmp_path: Path) -> None:
    results = tmp_path / "r"
    label = storage_label(str(results / "sub" / "s.log"), results)
    assert label == "journal:sub/s.log"
    assert label_url(label, tmp_path / "moved") == str(tmp_path / "moved" / "sub" / "s.log")
    assert label_url("sqlite:a.db", results) == f"sqlite:///{results / 'a.db'}"
    assert label_url("sqlite:/abs/a.db", results) == "sqlite:////abs/a.db"
    url = "postgresql://u:pw@h/db"
    assert storage_label(url, results) == "postgresql://u@h/db"
    assert label_url("postgresql://u@h/db", results) == "postgresql://u@h/db"
    # an older absolute path that is still there names that file, not one in the moved folder
    (results / "sub").mkdir(parents=True)
    (results / "sub" / "s.log").touch()
    assert not same_storage(f"journal:{results / 'sub' / 's.log'}", label, tmp_path / "other")
    assert same_storage(f"journal:{results / 'sub' / 's.log'}", label, results)
    assert not same_storage("sqlite:sub/s.log", label, results)  # another kind
