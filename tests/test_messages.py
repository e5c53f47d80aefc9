"""Issue 30, class 8 (and class 7's calibrate): messages that say what is true and what to
change."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.hardware import GPUS, Cluster

R = ["--model", "qwen2.5-7b", "--gpus", "8", "--no-progress"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 30-trial estimator leaderboard relabelled as measured by the megatron runner."""
    d = tmp_path_factory.mktemp("measured")
    cwd = os.getcwd()
    os.chdir(d)
    try:
        assert main([*R, "--trials", "30", "--recipes", "0", "--no-warm-start"]) == 0
    finally:
        os.chdir(cwd)
    path = d / "results" / "qwen2.5-7b-h100x8-estimate.csv"
    return _rewrite(path, d / "measured.csv", lambda r: {**r, "source": "megatron"})


def _rewrite(src: Path, dst: Path, change) -> Path:  # type: ignore[no-untyped-def]
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(dst, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(change(r) for r in rows)
    return dst


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_calibrate_out_elsewhere_says_how_tune_uses_it(
    measured: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tune calibrate --out X` claimed tune uses X by default; it reads results/calibration.json
    only."""
    assert main(["calibrate", str(measured), "--out", "mine.json"]) == 0
    out = capsys.readouterr().out
    assert "pass --profile mine.json" in out
    assert "uses it by default" not in out
    assert main(["calibrate", str(measured)]) == 0
    assert "use it by default" in capsys.readouterr().out


def test_calibrate_refuses_one_row(
    measured: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One measured row fitted 13 constants and wrote the profile."""
    seen = {"n": 0}

    def one(r: dict[str, str]) -> dict[str, str]:
        if r["status"] == "ok":
            seen["n"] += 1
            if seen["n"] > 1:
                return {**r, "status": "failed"}
        return r

    src = _rewrite(measured, workdir / "one.csv", one)
    assert main(["calibrate", str(src), "--out", "p.json"]) == 2
    assert "1 measured row(s) give" in _err(capsys)
    assert not (workdir / "p.json").exists()


def test_calibrate_drops_absurd_times_and_says_why_rows_were_left_out(
    measured: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows of 1e300-s phases were fitted; and with --source, rows dropped for any reason were
    blamed on --source."""
    src = _rewrite(measured, workdir / "huge.csv", lambda r: {**r, "update_actor_s": "1e300"})
    assert main(["calibrate", str(src), "--source", "megatron", "--dry-run"]) == 2
    line = _err(capsys)
    assert "with a phase time over 604800 s" in line, line
    assert "of another runner than --source" not in line  # none was
    assert "no measured row to calibrate from" in line


def test_a_gpu_count_between_nodes_gets_both_neighbours() -> None:
    with pytest.raises(ValueError, match=r"e\.g\. --gpus 8 or 16"):
        Cluster(gpu=GPUS["h100"], num_gpus=12)
