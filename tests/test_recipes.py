"""Recipes say what their row did not measure, and one candidate gives one recipe (issue 19,
item 13)."""

from __future__ import annotations

import csv
import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from tuner import recipes
from tuner.cli import main
from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY
from tuner.results import COLUMNS, Status, read_raw
from tuner.runners import pinned_knobs
from tuner.runners.estimate import EstimateRunner
from tuner.runners.megatron import MEGATRON_PINNED
from tuner.study import TuneRequest, run_study
from tuner.study import loop as study_loop
from tuner.study.storage import record_of
from tuner.workload import PRESETS

REPO = Path(__file__).resolve().parents[1]
MEGATRON_CSV = REPO / "results" / "moe8k-h200-x2.csv"
"""A committed leaderboard of the megatron runner."""


def _code(text: str) -> str:
    """A script without its comments: what it runs."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


def _pinned_block(text: str) -> dict[str, str]:
    return dict(re.findall(r"^#   (\w+)=(\S+)  \(pinned, not measured\)$", text, re.MULTILINE))


def test_a_megatron_rows_recipe_names_every_pin_and_that_generation_was_not_measured(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(MEGATRON_CSV), "--rank", "1", "--recipes-dir", "r"]) == 0
    text = Path(capsys.readouterr().out.strip()).read_text()
    pins = _pinned_block(text)
    assert list(pins) == [name for name, _ in MEGATRON_PINNED]
    assert pins["rollout_tp"] == "1" and pins["gpu_memory_utilization"] == "0.6"
    assert pins["apply_rope_fusion"] == "False" and pins["bias_activation_fusion"] == "False"
    assert "# NOT MEASURED: --runner megatron ran no generation (vLLM)" in text
    assert "# generation was not measured" in text
    # the pins are what the script sets
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=1" in text
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.6" in text


def test_rows_of_other_runners_pin_nothing(workdir: Path) -> None:
    assert pinned_knobs("estimate") == () and pinned_knobs("verl") == ()
    assert pinned_knobs("megatron") == MEGATRON_PINNED


def _copy_of_best(rows: list[dict[str, str]], trial: int) -> dict[str, str]:
    """The best ok row again under another trial number, as a study copies a repeat's result."""
    best = max(
        (r for r in rows if r["status"] == "ok"), key=lambda r: float(r["tokens_per_s_per_gpu"])
    )
    return {**best, "trial": str(trial), "reason": f"same candidate as trial {best['trial']}"}


def test_export_counts_one_candidate_once(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = read_raw(MEGATRON_CSV)
    rows.append(_copy_of_best(rows, 99))
    path = workdir / "dup.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    ok = [r for r in rows if r["status"] == "ok"]
    distinct = recipes.distinct(ok)
    assert len(distinct) == len(ok) - 1
    texts = []
    for rank in range(1, len(distinct) + 1):
        assert main(["export", str(path), "--rank", str(rank), "--recipes-dir", "r"]) == 0
        texts.append(_code(Path(capsys.readouterr().out.strip()).read_text()))
    assert len(set(texts)) == len(texts)  # no two differ only in a comment
    assert main(["export", str(path), "--rank", str(len(distinct) + 1)]) == 2
    assert f"--rank 1..{len(distinct)}" in capsys.readouterr().err
    # --trial still exports that very row
    assert main(["export", str(path), "--trial", "99", "--recipes-dir", "r"]) == 0


def test_best_recipes_are_one_per_candidate(workdir: Path) -> None:
    req = TuneRequest(
        model=REGISTRY["qwen2.5-7b"],
        model_arg="qwen2.5-7b",
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=8),
        workload=PRESETS["dapo-math"],
        runner=EstimateRunner(),
        trials=8,
        results_dir=workdir / "results",
        recipes_dir=workdir / "recipes",
        recipes=3,
    )
    run_study(req)
    study = optuna.load_study(study_name=req.name, storage=req.storage_url)
    records = {t.number: rec for t in study.trials if (rec := record_of(t)) is not None}
    ok = sorted(
        (r for r in records.values() if r.status is Status.OK),
        key=lambda r: -(r.tokens_per_s_per_gpu or 0.0),
    )
    assert len(ok) >= 3
    # the best candidate again (a repeat's copied result), and as a megatron row
    copy = dataclasses.replace(ok[0], trial=1000, reason=f"same candidate as trial {ok[0].trial}")
    records[copy.trial] = copy
    s = SimpleNamespace(
        study=SimpleNamespace(user_attrs={}, set_user_attr=lambda k, v: None), records=records
    )
    paths = study_loop.write_best_recipes(req, s)  # type: ignore[arg-type]
    assert len(paths) == 3
    assert len({_code(p.read_text()) for p in paths}) == 3
    assert not any(_pinned_block(p.read_text()) for p in paths)  # estimator rows: no pins
    megatron = {n: dataclasses.replace(r, source="megatron") for n, r in records.items()}
    s.records = megatron
    paths = study_loop.write_best_recipes(req, s)  # type: ignore[arg-type]
    assert all(list(_pinned_block(p.read_text())) == [n for n, _ in MEGATRON_PINNED] for p in paths)


def _write_many(directory: str, text: str, n: int) -> None:
    from pathlib import Path

    from tuner.recipes import Recipe, write

    for _ in range(n):
        write(Recipe(name="same.sh", text=text), Path(directory))


def test_workers_writing_the_same_recipe_at_once_all_succeed(tmp_path: Path) -> None:
    """Found by CI: three workers of one study wrote the same best recipe at once through one
    fixed temporary name, and a worker failed ('.<name>.sh.tmp: No such file or directory')."""
    import multiprocessing
    import os

    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_write_many, args=(str(tmp_path), "#!/bin/sh\necho hi\n", 300))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    made = tmp_path / "same.sh"
    assert made.read_text() == "#!/bin/sh\necho hi\n"
    mask = os.umask(0o022)
    os.umask(mask)
    assert made.stat().st_mode & 0o777 == 0o777 & ~mask  # a script: executable
    assert [p.name for p in tmp_path.iterdir()] == ["same.sh"]


def test_a_drawn_rows_recipe_says_what_ran_its_responses(tmp_path: Path) -> None:
    """A row whose responses were drawn (response_mode=drawn in its extra) is exported with a
    comment naming the agent loop and the overrides the trial added on its synthetic data."""
    import csv

    from tuner.cli import main

    src = Path(__file__).parent.parent / "results" / "tail4k-h100-x2.csv"
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    assert all("response_mode=drawn" in r["extra"] for r in rows)
    out = tmp_path / "recipes"
    assert main(["export", str(src), "--rank", "1", "--recipes-dir", str(out)]) == 0
    (recipe,) = out.rglob("*.sh")
    text = recipe.read_text()
    assert "tuner/verl_agent_loop.py" in text and "data.shuffle=False" in text
    assert "agent_loop_config_path=<its folder>/agent_loops.yaml" in text
