"""`--allow-off-policy` (issue 29 items 1, 3, 5): placement searched only when asked, a split
study end to end with the estimator (rows, `tune show`, `tune export`), vs_ref within a GPU
count, and the runners and launchers that cannot run a split refused before anything is
written."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from tuner.cli import build_parser, main
from tuner.errors import UserError
from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.results import read_raw, upsert_row
from tuner.space import Candidate, RandomSuggester, SearchSpace, sample, validate
from tuner.workload import get_workload

M = get_model("qwen2.5-7b")
CL4 = Cluster(gpu=get_gpu("h100"), num_gpus=4)
W = get_workload("grpo-short")


def test_help_says_what_the_option_changes() -> None:
    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    (action,) = [a for a in run._actions if "--allow-off-policy" in a.option_strings]
    assert action.default is False
    text = " ".join(str(action.help).split())
    assert "one step stale" in text and "rollout_correction bypass" in text
    assert "one_step_off_policy" in text


def test_without_the_option_every_candidate_is_colocated_as_before() -> None:
    space = SearchSpace(model=M, cluster=CL4, workload=W)
    rng = random.Random(1)
    for _ in range(200):
        s = RandomSuggester(rng)
        c = sample(s, space)
        assert c.rollout_gpus == 0 and c.layout.world == 4
        assert "rollout_gpus" not in s.params and "layout" in s.params
    assert "placements=" not in space.fingerprint()


def test_with_it_each_pool_is_a_valid_world_for_its_knobs() -> None:
    space = SearchSpace(model=M, cluster=CL4, workload=W, allow_off_policy=True)
    assert space.placements == [0, 1, 2, 3]
    rng = random.Random(2)
    seen = set()
    for _ in range(300):
        c = sample(RandomSuggester(rng), space)
        assert c.layout.world == 4 - c.rollout_gpus
        if c.rollout_gpus:
            assert c.rollout_gpus % (c.rollout_tp * c.rollout_dp) == 0  # vLLM on its r GPUs
        assert not validate(c, M, CL4, W)
        seen.add(c.rollout_gpus)
    assert seen == {0, 1, 2, 3}
    # a split whose actor spans the whole cluster is refused, naming the valid sizes
    bad = Candidate(layout=c.layout, rollout_gpus=4)
    assert any("use 0 (colocated) or one of 1, 2, 3" in why for why in validate(bad, M, CL4, W))


def test_a_split_study_end_to_end(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Long responses: generation and training of comparable length, a split wins in the cost
    model; its rows carry the placement, `tune show` prints it, its recipe runs one-step-off."""
    argv = ["--model", "qwen2.5-7b", "--gpus", "4", "--trials", "12", "--no-progress"]
    argv += ["--runner", "estimate", "--workload", "grpo-short", "--response-len", "8192"]
    assert main([*argv, "--allow-off-policy"]) == 0
    (csv_path,) = Path("results").glob("*.csv")
    rows = read_raw(csv_path)
    split = [r for r in rows if r["status"] == "ok" and int(r["rollout_gpus"] or 0)]
    assert split, "no split row"
    r = split[0]
    assert int(r["tp"]) * int(r["pp"]) * int(r["cp"]) * int(r["dp"]) == 4 - int(r["rollout_gpus"])
    assert r["num_gpus"] == "4"  # a split row is of the whole cluster
    capsys.readouterr()
    assert main(["show", str(csv_path)]) == 0
    out = capsys.readouterr().out
    assert "placement" in out.splitlines()[0] and f"split r{r['rollout_gpus']}+t" in out
    assert main(["export", str(csv_path), "--trial", r["trial"], "--recipes-dir", "rx"]) == 0
    (recipe,) = Path("rx").rglob("*.sh")
    text = recipe.read_text()
    assert "-split-r" in recipe.name and "ONE STEP OFF-POLICY" in text
    assert "verl.experimental.one_step_off_policy.main_ppo" in text
    assert "actor_rollout_ref.hybrid_engine=False" in text


def test_a_colocated_study_writes_no_placement(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", "qwen2.5-7b", "--gpus", "4", "--trials", "3", "--no-progress"]
    assert main([*argv, "--runner", "estimate"]) == 0
    (csv_path,) = Path("results").glob("*.csv")
    assert "rollout_gpus" not in csv_path.read_text().splitlines()[0]
    capsys.readouterr()
    assert main(["show", str(csv_path)]) == 0
    assert "placement" not in capsys.readouterr().out


def test_vs_ref_sets_a_split_row_against_the_same_gpu_count(tmp_path: Path) -> None:
    from tuner.leaderboard import load_leaderboard, with_reference_ratio

    p = tmp_path / "lb.csv"
    common = dict(study="s", status="ok", model="qwen2.5-7b", gpu="h100", source="estimate")
    upsert_row(
        p,
        {
            **common,
            "trial": 0,
            "num_gpus": 4,
            "origin": "reference tp2",
            "tokens_per_s_per_gpu": 100.0,
        },
    )
    upsert_row(
        p,
        {
            **common,
            "trial": 1,
            "num_gpus": 2,
            "origin": "reference tp1",
            "tokens_per_s_per_gpu": 300.0,
        },
    )
    upsert_row(
        p, {**common, "trial": 2, "num_gpus": 4, "rollout_gpus": 2, "tokens_per_s_per_gpu": 150.0}
    )
    df = with_reference_ratio(load_leaderboard(p))
    row = df[df["trial"] == 2].iloc[0]
    assert row["placement"] == "split r2+t2"
    assert row["vs_ref"] == pytest.approx(1.5)  # the 4-GPU reference, not the 2-GPU one
    assert set(df[df["trial"] < 2]["placement"]) == {"colocated"}


def test_a_runner_or_launcher_that_cannot_run_a_split_is_refused(tmp_path: Path) -> None:
    from tuner.runners.launchers.base import Job, Launcher, LaunchResult
    from tuner.runners.verl import VerlRunner
    from tuner.study import TuneRequest

    class SingleCommand(Launcher):
        """A launcher that runs the command without a Ray cluster of its own."""

        name = "single"

        def launch(self, job: Job) -> LaunchResult:
            raise AssertionError("nothing is launched")

        def split_refusal(self) -> str | None:
            return "--launcher single runs no Ray cluster; use --launcher local, ray or slurm"

    fake = Path(__file__).with_name("fake_verl.py")
    runner = VerlRunner(
        model_path="/m", launcher=SingleCommand(), entrypoint=[sys.executable, str(fake)]
    )
    kw = dict(model=M, model_arg="qwen2.5-7b", cluster=CL4, workload=W, results_dir=tmp_path)
    with pytest.raises(UserError, match="--allow-off-policy: --launcher single runs no Ray"):
        TuneRequest(runner=runner, allow_off_policy=True, **kw)  # type: ignore[arg-type]
    TuneRequest(runner=runner, **kw)  # type: ignore[arg-type]  # colocated: fine
    local = VerlRunner(model_path="/m", entrypoint=[sys.executable, str(fake)])
    TuneRequest(runner=local, allow_off_policy=True, **kw)  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())


def test_a_split_row_is_not_read_as_a_colocated_candidate() -> None:
    """--candidates-from a leaderboard with a split row, in a study without the option: the
    row's layout (of N - r GPUs) must not become a colocated candidate of N."""
    from tuner.space import ParallelLayout
    from tuner.study.grid import outside_space

    c = Candidate(layout=ParallelLayout(world=2, tp=2), sequence_parallel=True, rollout_gpus=2)
    space = SearchSpace(model=M, cluster=CL4, workload=W)
    column, why = outside_space(c, space) or ("", "")
    assert column == "rollout_gpus" and "pass --allow-off-policy" in why
    on = SearchSpace(model=M, cluster=CL4, workload=W, allow_off_policy=True)
    assert outside_space(c, on) is None or outside_space(c, on)[0] != "rollout_gpus"  # type: ignore[index]
