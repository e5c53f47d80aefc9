"""Issue 30, class 2: a recipe passes verl every value as written. Shell code in a row's
`verl_overrides` or `verl_env` (`$(...)`, backticks), Hydra's own `${oc.env:HOME}`, and a model
name or Hugging Face id with a line break or a command substitution in it are not run by the
shell; only the recipe's documented variables (MODEL_PATH, TRAIN_FILE, REWARD_FN, NNODES,
TOTAL_STEPS) are expanded. Each recipe is run by bash with a stand-in `python3` that prints its
argv, and the argv is compared with the command the verl runner would run."""

from __future__ import annotations

import csv
import json
import os
import shlex
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tuner import recipes, verl_command
from tuner.cli import main
from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.space import Candidate, ParallelLayout
from tuner.verl_settings import VerlSettings
from tuner.workload import get_workload

HOSTILE = [
    ("+actor_rollout_ref.model.override_config.note", "$(touch PWNED-subst)"),
    ("+actor_rollout_ref.model.override_config.tick", "`touch PWNED-tick`"),
    ("+actor_rollout_ref.model.override_config.home", "${oc.env:HOME}"),
    ("+actor_rollout_ref.model.override_config.mix", "'a b' \"${oc.env:USER}\" $HOME !x \\n"),
]
"""Overrides (key, Hydra text) that bash would run or expand if it saw them unquoted or in
double quotes; the trial passed each to verl as an argv word, as written."""

ENV = [("TUNER_NOTE", "$(touch PWNED-env) `touch PWNED-env2` ${HOME}")]


@pytest.fixture
def printing_python(tmp_path: Path) -> Path:
    """A folder whose `python3` prints its argv as JSON (put first on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "python3"
    exe.write_text(
        f"#!/usr/bin/env bash\nexec {shlex.quote(sys.executable)} -c "
        "'import json, os, sys; print(json.dumps([sys.argv[1:], os.environ.get(\"TUNER_NOTE\")]))'"
        ' "$@"\n'
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _run(script: Path, bin_dir: Path, cwd: Path) -> tuple[list[str], str | None]:
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "MODEL_PATH": "/models/my model",
        "TRAIN_FILE": "/data/train.parquet",
        "REWARD_FN": "/data/reward.py",
        "NNODES": "1",
        "TOTAL_STEPS": "7",
    }
    env.pop("TUNER_NOTE", None)
    out = subprocess.run(["bash", str(script)], env=env, cwd=cwd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    argv, note = json.loads(out.stdout.strip().splitlines()[-1])
    return argv, note


def _setup() -> tuple[Candidate, Cluster]:
    cl = Cluster(gpu=get_gpu("h100"), num_gpus=8)
    c = Candidate(
        layout=ParallelLayout(world=8, tp=4),
        sequence_parallel=True,
        ppo_max_token_len_per_gpu=20480,
        log_prob_max_token_len_per_gpu=30720,
    )
    return c, cl


def test_recipe_passes_every_value_as_written(workdir: Path, printing_python: Path) -> None:
    c, cl = _setup()
    w = get_workload("dapo-math")
    m = replace(
        get_model("qwen2.5-7b"),
        name="evil\ntouch PWNED-name",
        hf_id="$(touch PWNED-hf)}`touch PWNED-hf2`",
    )
    settings = VerlSettings(overrides=tuple(HOSTILE), env=tuple(ENV))
    recipe = recipes.render(
        c, m, cl, w, origin="x.csv trial 1\ntouch PWNED-origin", settings=settings
    )
    path = recipes.write(recipe, workdir / "recipes")
    argv, note = _run(path, printing_python, workdir)

    assert sorted(p.name for p in workdir.iterdir() if p.name.startswith("PWNED")) == []
    ran = verl_command.command(
        verl_command.overrides(
            c,
            m,
            cl,
            w,
            steps=7,
            model_path="/models/my model",
            train_file="/data/train.parquet",
            reward_fn="/data/reward.py",
            nnodes=1,
            experiment=recipes.experiment_name(c, m, cl),
            settings=settings,
        )
    )
    # the recipe variables are expanded as the shell gives them (no Hydra quoting of the path)
    ran = [a.replace("'/models/my model'", "/models/my model") for a in ran]
    assert argv == ran[1:]
    for key, value in HOSTILE:
        assert f"{key}={value}" in argv
    assert note == ENV[0][1]
    # the model name and the origin stay inside their comment lines
    lines = path.read_text().splitlines()
    assert [line[:1] for line in lines if "PWNED-name" in line or "PWNED-origin" in line] == [
        "#",
        "#",
    ]


def test_the_model_path_message_is_not_run(workdir: Path, printing_python: Path) -> None:
    """Without MODEL_PATH the recipe stops with its message, which is printed, not run."""
    c, cl = _setup()
    m = replace(get_model("qwen2.5-7b"), hf_id="$(touch PWNED-hf)} `touch PWNED-tick`")
    path = recipes.write(recipes.render(c, m, cl, get_workload("dapo-math")), workdir)
    env = {k: v for k, v in os.environ.items() if k != "MODEL_PATH"}
    env["PATH"] = f"{printing_python}{os.pathsep}{env['PATH']}"
    out = subprocess.run(["bash", str(path)], env=env, cwd=workdir, capture_output=True, text=True)
    assert out.returncode != 0
    assert "set MODEL_PATH to a local copy of $(touch PWNED-hf)} `touch PWNED-tick`" in out.stderr
    assert not list(workdir.glob("PWNED*"))


def test_export_of_a_row_with_shell_code_runs_none_of_it(
    workdir: Path, printing_python: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tune export` of a leaderboard row whose verl_overrides cell holds `$(...)`, backticks
    and `${oc.env:HOME}` (issue 30's example): the recipe passes them to verl as written."""
    argv = ["--model", "qwen2.5-7b", "--gpus", "8", "--trials", "2", "--no-progress"]
    assert main(argv) == 0
    csv_path = workdir / "results" / "qwen2.5-7b-h100x8-estimate.csv"
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    (row,) = [r for r in rows if r["status"] == "ok"][:1]
    row["verl_bridge"] = "megatron-bridge"
    row["verl_overrides"] = shlex.join(f"{k}={v}" for k, v in HOSTILE)
    row["verl_env"] = shlex.join(f"{k}={v}" for k, v in ENV)
    row["source"] = "estimator\ntouch PWNED-source"
    with open(csv_path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows)
    capsys.readouterr()
    assert main(["export", str(csv_path), "--trial", row["trial"]]) == 0
    script = Path(capsys.readouterr().out.strip().splitlines()[-1])
    got, note = _run(script, printing_python, workdir)
    assert not list(workdir.glob("PWNED*"))
    for key, value in HOSTILE:
        assert f"{key}={value}" in got
    assert note == ENV[0][1]
    assert "data.train_files=/data/train.parquet" in got
    assert "trainer.total_training_steps=7" in got
