from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.results import rank, read_raw, read_rows


def _err_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--model", "gpt-5", "--gpus", "8"], "unknown model 'gpt-5'"),
        (["--model", "qwen2.5-7b", "--gpus", "0"], "argument --gpus: must be a positive"),
        (["--model", "qwen2.5-7b", "--gpus", "-8"], "argument --gpus: must be a positive"),
        (["--model", "qwen2.5-7b", "--gpus", "12"], "not a multiple of --gpus-per-node 8"),
        (["--model", "qwen2.5-7b", "--gpus", "8", "--gpu", "v100"], "unknown GPU kind 'v100'"),
        (["--model", "qwen2.5-7b", "--gpus", "8", "--batch", "100"], "not a multiple of --mini"),
        (
            ["--model", "qwen2.5-7b", "--gpus", "8", "--trials", "0"],
            "argument --trials: must be a positive",
        ),
        (["--model", "qwen2.5-7b", "--gpus", "8", "--workload", "x"], "unknown workload 'x'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    workdir: Path, capsys: pytest.CaptureFixture[str], argv: list[str], fragment: str
) -> None:
    assert main([*argv, "--no-progress"]) == 2
    assert fragment in _err_line(capsys)
    assert not (workdir / "results").exists() or not list((workdir / "results").glob("*.csv"))


def test_malformed_config_json(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "config.json").write_text("{oops")
    assert main(["--model", "config.json", "--gpus", "8", "--no-progress"]) == 2
    assert "not valid JSON" in _err_line(capsys)


def test_corrupt_storage_exits_2_and_keeps_the_file(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = workdir / "my.db"
    bad.write_bytes(b"\x00garbage" * 64)
    argv = ["--model", "qwen2.5-7b", "--gpus", "8", "--storage", str(bad), "--no-progress"]
    assert main(argv) == 2
    assert "cannot be opened" in _err_line(capsys)
    assert bad.read_bytes() == b"\x00garbage" * 64


def test_run_show_export(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "qwen2.5-7b", "--gpus", "8", "--trials", "15", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("tune: no GPU here: using the estimator")
    csv_path = workdir / "results" / "qwen2.5-7b-h100x8-estimate.csv"
    launched = [r for r in read_raw(csv_path) if not r["status"].startswith("pruned-")]
    assert csv_path.exists() and len(launched) == 15  # candidates pruned before launch: not counted

    assert main(["show", str(csv_path), "--status", "ok", "--top", "3"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["trial", "status", "source"] and len(table) == 4
    col = table[0].split().index("tok/s/gpu")
    tputs = [float(line.split()[col]) for line in table[1:]]
    assert tputs == sorted(tputs, reverse=True)

    assert main(["export", str(csv_path), "--rank", "1"]) == 0
    script = Path(capsys.readouterr().out.strip())
    assert script.parent == Path("recipes") / "qwen2.5-7b"
    assert script.name.endswith("_h100x8.sh") and script.name.startswith("qwen2.5-7b_")
    text = script.read_text()
    assert "--config-name=ppo_megatron_trainer" in text
    assert 'trainer.total_training_steps="${TOTAL_STEPS}"' in text
    assert "MODEL_PATH=${MODEL_PATH:?" in text and "NNODES=${NNODES:-1}" in text
    subprocess.run(["bash", "-n", str(script)], check=True)

    assert main(["export", str(csv_path), "--rank", "999"]) == 2
    assert "pass --rank 1.." in _err_line(capsys)


def test_show_reads_reference_csvs(anchors: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(anchors / "grpo_qwen2.5_7b.csv"), "--status", "oom"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 and all(" oom " in line for line in lines[1:])
    assert (
        main(
            ["show", str(anchors / "dapo7b.csv"), "--sort", "update_actor_s", "--asc", "--top", "1"]
        )
        == 0
    )
    assert "tp4" in capsys.readouterr().out.splitlines()[1]
    # every reference file, with the default sort (dapo_moe30b.csv has no throughput column:
    # its fastest step comes first)
    for path in sorted(anchors.glob("*.csv")):
        assert main(["show", str(path), "--top", "3"]) == 0, path
        assert len(capsys.readouterr().out.splitlines()) == 4
    rows = rank(read_rows(anchors / "dapo_moe30b.csv"), status="ok")
    steps = [float(r["step_s"]) for r in rows if r.get("step_s")]
    assert steps == sorted(steps)


def test_models_lists_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in ("qwen2.5-7b", "qwen3-30b-moe", "qwen3-235b-moe", "llama3.1-70b"):
        assert name in out


def test_estimate_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "estimate",
        "--model",
        "qwen2.5-7b",
        "--gpu",
        "h100",
        "--gpus",
        "8",
        "--layout",
        "tp4pp2",
        "--rollout-tp",
        "4",
        "--json",
    ]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    for k in (
        "step_s",
        "generation_s",
        "old_log_prob_s",
        "ref_s",
        "update_actor_s",
        "reshard_s",
        "throughput_tokens_per_s_per_gpu",
        "mfu",
        "peak_mem_gib",
        "fits",
        "bottleneck",
    ):
        assert k in d
    assert isinstance(d["fits"], bool)


def test_help_explains(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["run", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--trials" in out and "resume" in out and "--storage" in out


def test_run_help_lists_every_gpu_kind_the_registry_holds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--gpu`'s help is the hardware registry's kinds, not a list typed by hand (issue 38.6:
    it named four kinds while six were accepted)."""
    from tuner.hardware import GPUS

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"GPU kind: {', '.join(GPUS)} (default h100)" in out
    assert len(GPUS) > 4


def test_plot_writes_a_png(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert main(["--model", "qwen2.5-7b", "--gpus", "8", "--trials", "8", "--no-progress"]) == 0
    capsys.readouterr()
    csv_path = workdir / "results" / "qwen2.5-7b-h100x8-estimate.csv"
    assert main(["plot", str(csv_path)]) == 0
    png = Path(capsys.readouterr().out.strip())
    assert png == csv_path.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_python_dash_m_tuner_is_the_cli() -> None:
    # Ray installs a `tune` command of its own; `python -m tuner` (and `verl-tune`) always work
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "tuner", "models"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "qwen3-30b-moe" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "tuner", "--model", "nope", "--gpus", "8"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_plot_of_a_measured_leaderboard_compares_the_update() -> None:
    from tuner.plots import prediction_pairs

    repo = Path(__file__).resolve().parents[1]
    rows = [r for r in read_raw(repo / "results" / "moe-h200-x2.csv") if r["status"] == "ok"]
    phase, pts = prediction_pairs(rows)
    assert phase == "update_actor" and len(pts) == len(rows) == 3
    assert all(p > 0 and m > 0 for p, m in pts)


def test_written_files_follow_the_umask(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Leaderboard, storage and recipes get the mode `open()` would give under the user's
    umask (scripts executable), not 0600 from a temporary file nor a fixed 0755."""
    import os

    old = os.umask(0o027)
    try:
        assert main(["--model", "qwen2.5-7b", "--gpus", "8", "--trials", "3", "--no-progress"]) == 0
        csv_path = workdir / "results" / "qwen2.5-7b-h100x8-estimate.csv"
        assert main(["export", str(csv_path), "--rank", "1", "--recipes-dir", "mine"]) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    assert csv_path.stat().st_mode & 0o777 == 0o640
    scripts = [*Path("recipes").rglob("*.sh"), *Path("mine").rglob("*.sh")]
    assert scripts and all(p.stat().st_mode & 0o777 == 0o750 for p in scripts)
    written = [p for p in Path(".").rglob("*") if p.is_file()]
    assert written and all(p.stat().st_mode & 0o007 == 0 for p in written), written


def test_default_outputs_are_git_ignored() -> None:
    """A study run from the checkout leaves nothing for `git status` to show: results/ (with the
    default storage results/studies.sqlite3) and recipes/ are ignored; the project's measured
    leaderboards are not."""
    import shutil

    repo = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (repo / ".gitignore").is_file():
        pytest.fail("git and the checkout's .gitignore are needed")
    outputs = [
        "results/studies.sqlite3",
        "results/studies.sqlite3-wal",
        "results/my-study.csv",
        "results/my-study/trials/0/verl.log",
        "results/calibration.json",
        "recipes/qwen2.5-7b/qwen2.5-7b_tp4-rtp1_h100x8.sh",
    ]
    out = subprocess.run(
        ["git", "-C", str(repo), "check-ignore", "--no-index", *outputs],
        capture_output=True,
        text=True,
    )
    assert sorted(out.stdout.split()) == sorted(outputs)
    kept = subprocess.run(
        ["git", "-C", str(repo), "check-ignore", "--no-index", "results/dense-h200-x2.csv"],
        capture_output=True,
        text=True,
    )
    assert kept.returncode == 1


def test_run_summary_prints_the_time_split() -> None:
    """What a finished study prints; the facts newer summaries carry are shown when present."""
    from types import SimpleNamespace

    from tuner.cli import summary_text

    base = dict(
        name="s",
        csv_path=Path("results/s.csv"),
        trials_run=3,
        trials_total=5,
        resumed_from=2,
        best_rows=[],
        recipe_paths=[Path("recipes/m/a.sh")],
    )
    text = summary_text(SimpleNamespace(**base))
    assert text.splitlines() == [
        "resumed study s: 2 trials were done before",
        "study s: 3 trials run, 5 in all; leaderboard results/s.csv",
        "no trial finished ok: see the reason column of the leaderboard",
        "recipe: recipes/m/a.sh",
    ]
    more = SimpleNamespace(
        **base, measured_s=300.0, launch_s=80.0, other_s=20.0, pruned_before_launch=4
    )
    lines = summary_text(more).splitlines()
    assert lines[1] == (
        "study s: 3 trials run, 5 in all, 4 pruned before launch; leaderboard results/s.csv"
    )
    assert (
        lines[2] == "wall time: 300 s in measured steps, 80 s launching, 20 s other (75% measuring)"
    )
    rows = [{"trial": "1", "status": "ok", "source": "megatron", "extra": "measured=x"}]
    with_rows = summary_text(SimpleNamespace(**{**base, "best_rows": rows}))
    assert "tok/s/gpu covers: old_log_prob + update only, measured; generation not measured" in (
        with_rows.splitlines()
    )
    verl_like = SimpleNamespace(
        **base, measured_s=66.0, launch_s=720.0, warmup_s=238.0, unmeasured_s=476.0, other_s=33.0
    )
    assert summary_text(verl_like).splitlines()[2] == (
        "wall time: 66 s in measured steps, 720 s launching, 238 s in warm-up steps, 476 s in "
        "trials that gave no number, 33 s other (4% measuring)"
    )


def test_run_notes_go_to_stderr(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A note of the study (a damaged leaderboard set aside and rebuilt) is a stderr line."""
    import tuner.study

    real = tuner.study.run_study

    def noted(*a: object, **k: object) -> object:
        import dataclasses

        s = real(*a, **k)  # type: ignore[arg-type]
        return dataclasses.replace(s, notes=("results/x.csv was damaged: set aside, rebuilt",))

    monkeypatch.setattr(tuner.study, "run_study", noted)
    assert main(["--model", "qwen2.5-7b", "--gpus", "8", "--trials", "2", "--no-progress"]) == 0
    cap = capsys.readouterr()
    assert cap.err.splitlines() == ["tune: results/x.csv was damaged: set aside, rebuilt"]
    assert "study qwen2.5-7b-h100x8-estimate: 2 trials run" in cap.out


def test_headroom_reaches_the_request(workdir: Path) -> None:
    """--headroom-gib is passed to the study as TuneRequest.headroom_gib."""
    import dataclasses

    from tuner.cli import build_parser
    from tuner.cli_request import build_request, build_setup
    from tuner.runners import make_runner
    from tuner.study import TuneRequest

    if "headroom_gib" not in {f.name for f in dataclasses.fields(TuneRequest)}:
        pytest.fail("TuneRequest has no headroom_gib field yet")
    args = build_parser().parse_args(
        ["run", "--model", "qwen2.5-7b", "--gpus", "8", "--headroom-gib", "6.5"]
    )
    req = build_request(args, build_setup(args), make_runner("estimate"))
    assert req.headroom_gib == 6.5


def test_the_tune_command_is_this_one() -> None:
    """The README's test command installs Ray, whose `tune` command would shadow ours, then
    reinstalls this package last: `tune --model ...` must still be this tool afterwards."""
    import sys

    script = Path(sys.executable).parent / "tune"
    if not script.is_file():
        pytest.skip("no tune script beside this Python (not installed with pip)")
    assert "tuner.cli" in script.read_text(), (
        "Ray's tune command shadows ours: pip install --no-deps --force-reinstall -e ."
    )
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--model" in out.stdout


def test_a_calibrated_profile_is_announced_and_recorded_in_every_row(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tune calibrate` writes results/calibration.json, which every later run in the folder
    uses: the run says so and each row's extra names the file (issue 38.6); a run without one
    says nothing of a profile."""
    from tuner.estimate import Profile, save_profile

    argv = ["--model", "qwen2.5-7b", "--gpus", "8", "--trials", "2", "--no-progress"]
    assert main([*argv, "--study", "plain"]) == 0
    assert "profile" not in capsys.readouterr().out
    plain = read_raw(workdir / "results" / "plain.csv")
    assert plain and all("profile=" not in r["extra"] for r in plain)

    save_profile(Profile(), workdir / "results" / "calibration.json")
    assert main([*argv, "--study", "calibrated"]) == 0
    out = capsys.readouterr().out
    assert "calibrated by the profile results/calibration.json" in out
    rows = read_raw(workdir / "results" / "calibrated.csv")
    assert len(rows) >= 2
    assert all("profile=results/calibration.json" in r["extra"] for r in rows)
