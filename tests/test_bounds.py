"""Issue 30, classes 6 and 7: nonsense is refused at every entry point with one line and exit 2,
nothing written; the bounds come from one declaration (the option's or the knob's)."""

from __future__ import annotations

import csv
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.cli_args.values import GPUS, PROMPTS, TRIAL_SECONDS
from tuner.space.knobs import KNOB_BY_NAME

REPO = Path(__file__).resolve().parents[1]
E = ["estimate", "--model", "qwen2.5-7b", "--gpus", "8", "--layout", "tp2"]
R = ["--model", "qwen2.5-7b", "--gpus", "8", "--no-progress"]


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real leaderboard of a 4-trial estimator study."""
    d = tmp_path_factory.mktemp("board")
    cwd = os.getcwd()
    os.chdir(d)
    try:
        assert main([*R, "--trials", "4", "--recipes", "0"]) == 0
    finally:
        os.chdir(cwd)
    return d / "results" / "qwen2.5-7b-h100x8-estimate.csv"


def _with_cell(src: Path, dst: Path, column: str, value: str) -> Path:
    """`src` with `column` set to `value` in every ok row."""
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        if r["status"] == "ok":
            r[column] = value
    with open(dst, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return dst


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _tree(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


@pytest.mark.parametrize(
    ("argv", "flag", "bounds"),
    [
        ([*E, "--batch", "1000000000000"], "--batch", PROMPTS),
        ([*R, "--gpus", "100000000000000000000000"], "--gpus", GPUS),
        ([*R, "--trial-timeout", "1e-300"], "--trial-timeout", TRIAL_SECONDS),
        ([*R, "--trial-timeout", "1e9"], "--trial-timeout", TRIAL_SECONDS),
    ],
)
def test_an_option_outside_its_declared_bounds_is_refused_with_its_range(
    argv: list[str],
    flag: str,
    bounds: object,
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--batch 1e12 gave ok rows of 5.5e11-s steps; --trial-timeout 1e-300 was taken."""
    assert main(argv) == 2
    line = _one_line(capsys)
    assert f"argument {flag}: must be {bounds.text}" in line  # type: ignore[attr-defined]
    assert not list(workdir.iterdir())


def test_an_estimate_option_asks_the_knobs_bounds(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    util = KNOB_BY_NAME["gpu_memory_utilization"].bounds
    assert util is not None and util.allows(0.9) and not util.allows(7.5) and not util.allows(0)
    assert main([*E, "--gpu-memory-utilization", "7.5"]) == 2
    assert f"must be {util.text}" in _one_line(capsys)


def test_a_layout_with_a_zero_degree_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """`tune estimate --layout pp2vpp0` was a ZeroDivisionError traceback."""
    for layout in ("pp2vpp0", "tp0", "pp0"):
        argv = ["estimate", "--model", "qwen2.5-7b", "--gpus", "8", "--layout", layout]
        assert main(argv) == 2
        assert "a degree is at least 1" in _one_line(capsys)


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("rollout_tp", "3", "rollout_tp: 3 is not one this study offers (1, 2, 4)"),
        ("recompute_granularity", "bogus", "must be one of none, selective, full, got 'bogus'"),
        ("gpu_memory_utilization", "7.5", "got 7.5"),
        ("gpu_memory_utilization", "0.55", "0.55 is not one this study offers"),
    ],
)
def test_candidates_outside_the_knobs_choices_are_refused_naming_the_cell(
    column: str,
    value: str,
    says: str,
    board: Path,
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A --candidates-from row whose rollout_tp or recompute_granularity the space does not
    offer was Optuna's ValueError and an `interrupted` row; gpu_memory_utilization 7.5 ran as
    0.8 under the CSV's label. Now one line naming the file, line and column, nothing written."""
    src = _with_cell(board, workdir / "cand.csv", column, value)
    assert main([*R, "--trials", "3", "--candidates-from", str(src)]) == 2
    line = _one_line(capsys)
    assert f"--candidates-from {src} line 2 (trial " in line, line
    assert f"column {says}" in line or (f"column {column}:" in line and says in line), line
    assert _tree(workdir) == {"cand.csv"}  # no storage, no leaderboard, no interrupted row


def test_candidates_of_the_studys_own_choices_still_run(
    board: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(board, workdir / "cand.csv")
    assert main([*R, "--trials", "5", "--recipes", "0", "--candidates-from", "cand.csv"]) == 0
    out = (workdir / "results" / "qwen2.5-7b-h100x8-estimate.csv").read_text()
    assert "from cand.csv trial" in out and "interrupted" not in out


def test_export_refuses_a_knob_outside_its_bounds(
    board: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tune export` wrote gpu_memory_utilization=9 into a recipe."""
    src = _with_cell(board, workdir / "e.csv", "gpu_memory_utilization", "9")
    assert main(["export", "e.csv", "--recipes-dir", "recipes"]) == 2
    line = _one_line(capsys)
    assert "e.csv line " in line and "column gpu_memory_utilization: must be" in line, line
    assert "got 9" in line
    assert not (workdir / "recipes").exists()
    assert src.exists()


def test_report_out_must_be_html(
    board: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tune report -o r.png` wrote an HTML page named r.png."""
    shutil.copy(board, workdir / "lb.csv")
    assert main(["report", "lb.csv", "-o", "r.png"]) == 2
    assert "end the name in .html" in _one_line(capsys)
    assert not (workdir / "r.png").exists()


def _limited(mib: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (mib << 20, mib << 20))


def test_show_runs_under_a_400_mb_memory_limit(board: Path, tmp_path: Path) -> None:
    """`tune show` under `ulimit -v 400000` was a MemoryError traceback: it asked read() for the
    512 MiB a leaderboard may have, not the file's size."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "show", str(board)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        preexec_fn=lambda: _limited(400),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "estimate" in proc.stdout


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("gpu_memory_utilization", 0.97),  # vLLM takes it; space/rules.py said 0.1..0.95
        ("gpu_memory_utilization", 0.05),
        ("gpu_memory_utilization", 1.5),
        ("gpu_memory_utilization", 0.0),
        ("max_num_seqs", 0),
        ("max_num_seqs", 2**17),
    ],
)
def test_the_rules_and_the_vllm_worker_ask_the_knobs_bounds(name: str, value: float) -> None:
    """Issue 31: a knob's bounds are said once, on its table entry; validate() (a CSV cell's
    candidate) and the vLLM worker's engine refuse exactly what `Knob.bounds` refuses, in its
    words (before, the rules said 0.1..0.95 and the engine (0, 1])."""
    from tuner.hardware import Cluster, get_gpu
    from tuner.models import get_model
    from tuner.runners.vllm_gen.spec import EngineCfg
    from tuner.space import Candidate, ParallelLayout, validate
    from tuner.space.knobs import knob_refusal
    from tuner.workload import get_workload

    why = knob_refusal(name, value)
    c = Candidate(layout=ParallelLayout(world=8, tp=4), **{name: value})
    model, cluster = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=8)
    broken = [b for b in validate(c, model, cluster, get_workload("grpo-short")) if name in b]
    engine = dict(model="m", config_sha="0", tensor_parallel_size=1, gpu_memory_utilization=0.6,
                  max_num_seqs=256, max_num_batched_tokens=8192, enforce_eager=False,
                  max_model_len=8192)  # fmt: skip
    if why is None:
        assert broken == [] and EngineCfg(**{**engine, name: value})
    else:
        assert broken == [f"{name}({value}) {why}"]
        with pytest.raises(ValueError, match=re.escape(why)):
            EngineCfg(**{**engine, name: value})
