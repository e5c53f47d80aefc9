"""Bad and awkward input, as a new user types it (issue 11): every case is exit code 2, one line
on stderr that names the argument, and no file created, changed or removed.

Each case runs `main(argv)` in-process in its own folder holding a real leaderboard (made once by
a real estimator study), a few damaged copies and whatever the case sets up; the folder's tree,
sizes, modes and mtimes are compared before and after.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import tuner.cli_args
from tuner.cli import build_parser, main

R = ["--model", "qwen2.5-7b", "--gpus", "8", "--trials", "2", "--no-progress"]
"""A search that would run (and write results/) if the case's bad argument were accepted."""
E = ["estimate", "--model", "qwen2.5-7b", "--gpus", "8"]
"""An estimate that would print if the bad argument were accepted."""
GOOD = "lb.csv"
X4 = "x4.csv"
NUL = "nul.csv"
JUNK = "junk.csv"

Setup = Callable[[Path, pytest.MonkeyPatch], None]


def _file(name: str, text: str = "not a folder\n") -> Setup:
    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)

    return setup


def _dir(name: str) -> Setup:
    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        (d / name).mkdir(parents=True)

    return setup


def _read_only(name: str) -> Setup:
    """A folder this user cannot write in. Root writes anywhere, so for root the check's view
    (os.access) is made to say what it says to everyone else."""

    def setup(d: Path, mp: pytest.MonkeyPatch) -> None:
        folder = d / name
        folder.mkdir()
        (folder / "keep.txt").write_text("x")
        folder.chmod(0o555)
        if os.geteuid() == 0:
            real = os.access

            def access(path: object, mode: int, **kw: object) -> bool:
                p = Path(str(path)).absolute()
                if mode & os.W_OK and (p == folder or folder in p.parents):
                    return False
                return real(path, mode, **kw)  # type: ignore[arg-type]

            mp.setattr(tuner.cli_args.os, "access", access)

    return setup


def _config_json(text: str) -> Setup:
    return _file("config.json", text)


def _none(_d: Path, _mp: pytest.MonkeyPatch) -> None:
    return None


# (id, argv, fragment of the one stderr line, setup)
CASES: list[tuple[str, list[str], str, Setup]] = [
    # --- tune run: cluster and model
    ("gpus-zero", [*R[:2], "--gpus", "0", *R[4:]], "argument --gpus: must be a positive", _none),
    ("gpus-negative", [*R[:2], "--gpus", "-8", *R[4:]], "argument --gpus: must be a pos", _none),
    ("gpus-word", [*R[:2], "--gpus", "eight", *R[4:]], "argument --gpus: 'eight' is not", _none),
    ("gpus-fullwidth", [*R[:2], "--gpus", "８", *R[4:]], "argument --gpus: '８' is not a", _none),
    ("gpus-fraction", [*R[:2], "--gpus", "8.5", *R[4:]], "argument --gpus: '8.5' is not", _none),
    ("gpus-underscore", [*R[:2], "--gpus", "1_6", *R[4:]], "argument --gpus:", _none),
    ("gpus-per-node-zero", [*R, "--gpus-per-node", "0"], "argument --gpus-per-node:", _none),
    ("gpus-not-nodes", [*R[:2], "--gpus", "12", *R[4:]], "--gpus-per-node 8", _none),
    ("gpu-kind", [*R, "--gpu", "v100"], "unknown GPU kind 'v100'", _none),
    ("model-unknown", ["--model", "gpt-5", *R[2:]], "unknown model 'gpt-5'", _none),
    ("model-empty", ["--model", "", *R[2:]], "argument --model: '' is not a model", _none),
    ("model-300", ["--model", "q" * 300, *R[2:]], "argument --model: unknown model", _none),
    ("model-nul", ["--model", "qwen\x00", *R[2:]], "argument --model:", _none),
    ("model-bad-json", ["--model", "config.json", *R[2:]], "not valid JSON", _config_json("{x")),
    ("missing-gpus", ["--model", "qwen2.5-7b", "--no-progress"], "required: --gpus", _none),
    ("unknown-flag", [*R, "--gpuz", "8"], "unrecognized arguments: --gpuz", _none),
    ("unknown-command", ["shwo", GOOD], "unknown command 'shwo'", _none),
    # --- tune run: workload
    ("workload-unknown", [*R, "--workload", "x"], "unknown workload 'x'", _none),
    ("algorithm", [*R, "--algorithm", "sft"], "argument --algorithm: invalid choice", _none),
    ("prompt-len-zero", [*R, "--prompt-len", "0"], "argument --prompt-len:", _none),
    ("response-len-neg", [*R, "--response-len", "-1"], "argument --response-len:", _none),
    ("response-mean-zero", [*R, "--response-mean", "0"], "argument --response-mean:", _none),
    ("prompt-mean-word", [*R, "--prompt-mean", "half"], "argument --prompt-mean:", _none),
    ("batch-zero", [*R, "--batch", "0"], "argument --batch:", _none),
    ("batch-not-mini", [*R, "--batch", "100"], "not a multiple of --mini", _none),
    ("n-zero", [*R, "--n", "0"], "argument --n:", _none),
    ("mini-batch-zero", [*R, "--mini-batch", "0"], "argument --mini-batch:", _none),
    # --- tune run: search
    ("trials-zero", [*R, "--trials", "0"], "argument --trials: must be a positive", _none),
    ("trials-negative", [*R, "--trials", "-3"], "argument --trials:", _none),
    ("timeout-zero", [*R, "--timeout", "0"], "argument --timeout: must be more than 0", _none),
    ("timeout-nan", [*R, "--timeout", "nan"], "argument --timeout: 'nan' is not", _none),
    ("timeout-inf", [*R, "--timeout", "1e999"], "argument --timeout: '1e999' is too", _none),
    ("trial-timeout-zero", [*R, "--trial-timeout", "0"], "argument --trial-timeout:", _none),
    ("trial-timeout-neg", [*R, "--trial-timeout", "-5"], "argument --trial-timeout:", _none),
    ("runner", [*R, "--runner", "gpu"], "argument --runner: invalid choice", _none),
    ("launcher", [*R, "--launcher", "k8s"], "argument --launcher: invalid choice", _none),
    ("study-escapes", [*R, "--study", "../../escaped"], "argument --study:", _none),
    ("study-slash", [*R, "--study", "a/b"], "argument --study: 'a/b' is not a plain", _none),
    ("study-300", [*R, "--study", "s" * 300], "argument --study: 'sss", _none),
    ("study-fullwidth", [*R, "--study", "ｓｔｕｄｙ"], "argument --study:", _none),
    ("study-hidden", [*R, "--study", ".hidden"], "argument --study:", _none),
    ("study-space", [*R, "--study", "my study"], "argument --study:", _none),
    ("study-dotdot", [*R, "--study", "a..b"], "argument --study:", _none),
    ("seed-negative", [*R, "--seed", "-1"], "argument --seed: must be between 0", _none),
    ("seed-huge", [*R, "--seed", str(2**32)], "argument --seed: must be between 0", _none),
    ("recipes-negative", [*R, "--recipes", "-1"], "argument --recipes: must be 0 or more", _none),
    ("headroom-negative", [*R, "--headroom-gib", "-1"], "argument --headroom-gib:", _none),
    ("headroom-word", [*R, "--headroom-gib", "lots"], "argument --headroom-gib:", _none),
    # --- tune run: where it writes
    ("results-is-file", R, "--results-dir results is a file", _file("results")),
    ("recipes-is-file", R, "--recipes-dir recipes is a file", _file("recipes")),
    ("results-under-file", [*R, "--results-dir", "f/results"], "f is a file", _file("f")),
    ("results-read-only", R, "--results-dir results: cannot write", _read_only("results")),
    ("results-dir-empty", [*R, "--results-dir", ""], "argument --results-dir:", _none),
    ("results-dir-long", [*R, "--results-dir", "r" * 300], "argument --results-dir:", _none),
    ("storage-is-dir", [*R, "--storage", "db"], "--storage db is a folder", _dir("db")),
    ("study-csv-is-dir", [*R, "--study", "s"], "leaderboard of study s", _dir("results/s.csv")),
    ("study-dir-is-file", [*R, "--study", "s"], "trial folder of study s", _file("results/s")),
    ("profile-missing", [*R, "--profile", "p.json"], "--profile: no file at p.json", _none),
    ("profile-is-dir", [*R, "--profile", "p"], "--profile p is a folder", _dir("p")),
    # --- tune estimate
    ("layout-twice", [*E, "--layout", "tp2tp4"], "gives tp more than once", _none),
    ("layout-empty", [*E, "--layout", ""], "argument --layout: cannot read layout ''", _none),
    ("layout-fullwidth", [*E, "--layout", "ｔｐ２"], "argument --layout: cannot read", _none),
    ("layout-fullwidth-digit", [*E, "--layout", "tp２"], "argument --layout: cannot read", _none),
    ("layout-unknown-degree", [*E, "--layout", "tp4xx2"], "argument --layout: cannot read", _none),
    ("layout-no-degree", [*E, "--layout", "tp"], "argument --layout: cannot read", _none),
    ("layout-does-not-fit", [*E, "--layout", "tp3"], "layout 'tp3' does not fit 8 GPUs", _none),
    ("layout-heads", [*E, "--layout", "tp8"], "tp(8) does not divide the 28 attention", _none),
    ("layout-ep-dense", [*E, "--layout", "ep2"], "layout ep2: ep(2)", _none),
    ("layout-missing", E, "required: --layout", _none),
    ("micro-batch-zero", [*E, "--layout", "tp2", "--micro-batch", "0"], "--micro-batch:", _none),
    ("rollout-tp-zero", [*E, "--layout", "tp2", "--rollout-tp", "0"], "--rollout-tp:", _none),
    ("gmu-above-1", [*E, "--layout", "tp2", "--gpu-memory-utilization", "1.5"], "at most 1", _none),
    ("gmu-zero", [*E, "--layout", "tp2", "--gpu-memory-utilization", "0"], "--gpu-memory", _none),
    ("max-token-len-zero", [*E, "--layout", "tp2", "--max-token-len", "0"], "--max-token", _none),
    ("batched-neg", [*E, "--layout", "tp2", "--max-num-batched-tokens", "-1"], "--max-num", _none),
    ("recompute", [*E, "--layout", "tp2", "--recompute", "some"], "--recompute: invalid", _none),
    # --- tune export
    ("export-steps-zero", ["export", GOOD, "--steps", "0"], "argument --steps:", _none),
    ("export-rank-zero", ["export", GOOD, "--rank", "0"], "argument --rank:", _none),
    ("export-rank-past", ["export", GOOD, "--rank", "999"], "pass --rank 1..", _none),
    ("export-trial-negative", ["export", GOOD, "--trial", "-1"], "argument --trial:", _none),
    ("export-trial-absent", ["export", GOOD, "--trial", "12345"], "no trial 12345", _none),
    ("export-missing-csv", ["export", "nope.csv"], "csv: no file at nope.csv", _none),
    ("export-csv-is-dir", ["export", "results"], "csv results is a folder", _dir("results")),
    ("export-trial-x4", ["export", X4], "trial 'x4' is not a whole number", _none),
    ("export-nul", ["export", NUL], "holds a NUL byte", _none),
    ("export-junk", ["export", JUNK], "neither a verl-tuner leaderboard", _none),
    ("export-recipes-file", ["export", GOOD], "--recipes-dir recipes is a file", _file("recipes")),
    # --- tune show
    ("show-dir", ["show", "results"], "csv results is a folder", _dir("results")),
    ("show-missing", ["show", "nope.csv"], "csv: no file at nope.csv", _none),
    ("show-top-negative", ["show", GOOD, "--top", "-1"], "argument --top:", _none),
    ("show-top-zero", ["show", GOOD, "--top", "0"], "argument --top:", _none),
    ("show-columns-unknown", ["show", GOOD, "--columns", "trial,nosuch"], "'nosuch'", _none),
    ("show-columns-empty", ["show", GOOD, "--columns", "trial,,status"], "--columns", _none),
    ("show-sort-unknown", ["show", GOOD, "--sort", "speed"], "--sort: unknown column", _none),
    ("show-x4", ["show", X4], "trial 'x4' is not a whole number", _none),
    ("show-nul", ["show", NUL], "holds a NUL byte", _none),
    ("show-second-missing", ["show", GOOD, "gone.csv"], "no file at gone.csv", _none),
    # --- tune plot
    ("plot-dir", ["plot", "results"], "csv results is a folder", _dir("results")),
    ("plot-out-suffix", ["plot", GOOD, "--out", "p.txt"], "--out p.txt: end the name in", _none),
    ("plot-out-dir", ["plot", GOOD, "--out", "p.png"], "--out p.png is a folder", _dir("p.png")),
    ("plot-x4", ["plot", X4], "trial 'x4' is not a whole number", _none),
    # --- tune report
    ("report-dir", ["report", "results"], "csv results is a folder", _dir("results")),
    (
        "report-out-dir",
        ["report", GOOD, "--out", "r.html"],
        "--out r.html is a folder",
        _dir("r.html"),
    ),
    ("report-ref-missing", ["report", GOOD, "--reference", "r.csv"], "--reference: no file", _none),
    ("report-x4", ["report", X4], "trial 'x4' is not a whole number", _none),
    # --- tune calibrate, tune models
    ("calibrate-missing", ["calibrate", "nope.csv"], "csv: no file at nope.csv", _none),
    ("calibrate-out-dir", ["calibrate", GOOD, "--out", "o"], "--out o is a folder", _dir("o")),
    ("calibrate-start-missing", ["calibrate", GOOD, "--start", "s.json"], "--start", _none),
    ("calibrate-gpu", ["calibrate", GOOD, "--gpu", "v100"], "unknown GPU kind 'v100'", _none),
    ("models-extra", ["models", "--all"], "unrecognized arguments: --all", _none),
]


def _snapshot(root: Path) -> dict[str, tuple[bool, int, int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (p.is_dir(), st.st_size, st.st_mode, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def leaderboards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real leaderboard of a 4-trial estimator study, and damaged copies of it."""
    d = tmp_path_factory.mktemp("lb")
    cwd = os.getcwd()
    os.chdir(d)
    try:
        argv = ["--model", "qwen2.5-7b", "--gpus", "8", "--trials", "4", "--no-progress"]
        assert main(argv) == 0
    finally:
        os.chdir(cwd)
    out = tmp_path_factory.mktemp("lbs")
    good = d / "results" / "qwen2.5-7b-h100x8-estimate.csv"
    shutil.copy(good, out / GOOD)
    with open(good, newline="") as f:
        rows = list(csv.DictReader(f))
    for name, trial in ((X4, "x4"), (NUL, "\x001")):
        rows[1]["trial"] = trial
        with open(out / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    (out / JUNK).write_text("name,value\nalpha,1\n")
    return out


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 60
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    ("argv", "fragment", "setup"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input(
    argv: list[str],
    fragment: str,
    setup: Setup,
    leaderboards: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in (GOOD, X4, NUL, JUNK):
        shutil.copy(leaderboards / name, workdir / name)
    setup(workdir, monkeypatch)
    before = _snapshot(workdir)
    try:
        code = main(argv)
    finally:
        for p in workdir.rglob("*"):  # let tmp_path clean up a read-only folder
            if p.is_dir():
                p.chmod(0o755)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("tune: error: ") and fragment in lines[0], lines[0]
    after = _snapshot(workdir)
    for p in after:  # the chmod above is the test's own change
        if after[p][0] and p in before:
            after[p] = (True, before[p][1], before[p][2], after[p][3])
    assert after == before


def test_every_option_is_checked() -> None:
    """Each option has a type, choices or is a flag; free text only where anything goes."""
    free_text = {
        "--gpu",  # checked against the GPU table (get_gpu) before anything is written
        "--workload",  # a preset name, checked by get_workload
        "--storage",  # a URL or a path; a path is checked by the validate step
        "--model-path",  # a path on the cluster, which this machine may not see
        "--ray-address",
        "--slurm-partition",
        "--slurm-account",
        "--slurm-arg",
        "--slurm-setup",
        "--status",  # show: filters (no match: an empty table)
        "--model",  # show's filter; run's and estimate's --model have a type
        "--source",
        "--sort",  # show: checked against the leaderboard's columns by the validate step
        "--columns",  # show: likewise
    }
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    unchecked = []
    for cmd, p in sub.choices.items():  # type: ignore[attr-defined]
        for a in p._actions:
            if not a.option_strings or a.nargs == 0 or a.dest == "help":
                continue
            if a.type is None and a.choices is None and a.option_strings[0] not in free_text:
                unchecked.append(f"{cmd} {a.option_strings[0]}")
    assert not unchecked


def test_os_error_inside_a_command_is_one_line(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file-system error the checks could not foresee (the disk fills, a folder turns
    read-only mid-study) ends as one line and exit 2, not a traceback."""
    import errno

    import tuner.study

    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "results/x.csv")

    monkeypatch.setattr(tuner.study, "run_study", full)
    assert main(R) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "results/x.csv: No space left on device: the disk is full" in line


def test_broken_pipe_is_quiet(workdir: Path, leaderboards: Path) -> None:
    """`tune show big.csv | head -1`: the first line, nothing on stderr, exit 1 (Python's
    documented handling of a closed stdout), not a BrokenPipeError traceback."""
    with open(leaderboards / GOOD, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(workdir / "big.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for i in range(4000):
            w.writerow({**rows[i % len(rows)], "trial": str(i)})
    out = subprocess.run(
        [
            "bash",
            "-c",
            f'"{sys.executable}" -m tuner show big.csv | head -n 1; exit "${{PIPESTATUS[0]}}"',
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=workdir,
    )
    assert out.stdout.startswith("trial") and len(out.stdout.splitlines()) == 1
    assert out.stderr == ""
    assert out.returncode == 1


@pytest.mark.parametrize("text", ["tp2tp4", "tp2pp2tp2", "", "  ", "ｔｐ２", "tp２", "tp2ｐｐ2"])
def test_layout_parse_refuses_what_the_cli_refuses(text: str) -> None:
    """ParallelLayout.parse (also used on leaderboard rows and reference layouts) refuses a
    degree given twice, an empty layout and non-ASCII digits, as `--layout` does."""
    from tuner.errors import UserError
    from tuner.space import ParallelLayout

    with pytest.raises(UserError, match="layout"):
        ParallelLayout.parse(text, 8)
