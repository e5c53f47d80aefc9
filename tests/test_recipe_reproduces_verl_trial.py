"""`tune export` writes the command the verl runner ran: a study runs one real trial (the local
launcher starting tests/fake_verl.py in place of main_ppo), the best row is exported as a recipe,
and the recipe, run by bash with MODEL_PATH/TRAIN_FILE/NNODES set as the runner set them and a
python3 stand-in that prints its arguments, passes verl exactly the trial's overrides."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner import recipes, verl_command
from tuner.cli import main
from tuner.hardware import Cluster, get_gpu
from tuner.models import get_model
from tuner.results import read_raw
from tuner.runners.verl import VerlRunner
from tuner.space import Candidate, ParallelLayout, SearchSpace, params_for
from tuner.study import TuneRequest, open_storage, run_study
from tuner.workload import get_workload

pytestmark = [
    pytest.mark.verl,
    pytest.mark.skipif(importlib.util.find_spec("verl") is None, reason="needs verl"),
]

FAKE_VERL = Path(__file__).resolve().with_name("fake_verl.py")


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def eight_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """nvidia-smi lists 8 GPUs; python3 prints its argv as JSON (for running recipes)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gpus = "".join(f'echo "GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})"\n' for i in range(8))
    _exe(bin_dir / "nvidia-smi", "#!/usr/bin/env bash\n" + gpus)
    _exe(
        bin_dir / "python3",
        f"#!/usr/bin/env bash\nexec {shlex.quote(sys.executable)} -c "
        "'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def _trial_overrides(command_sh: Path) -> list[str]:
    """The overrides of a trial's command.sh (after the entrypoint's own arguments)."""
    words = shlex.split(command_sh.read_text().replace("\\\n", " "), comments=True)
    words = [w for w in words if not w.startswith(("export", "VERL_", "HYDRA_", "PYTHON"))]
    return words[words.index(str(FAKE_VERL)) + 1 :]


def test_exported_recipe_runs_the_trials_overrides(
    workdir: Path, eight_gpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, cluster = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=8)
    workload = get_workload("grpo-short")
    runner = VerlRunner(
        model_path="fake/ok",
        python=sys.executable,
        entrypoint=[sys.executable, str(FAKE_VERL)],
    )
    req = TuneRequest(
        model=model,
        model_arg="qwen2.5-7b",
        cluster=cluster,
        workload=workload,
        runner=runner,
        trials=1,
        warm_start=False,
        study_name="s",
        results_dir=workdir / "results",
        recipes_dir=workdir / "recipes",
    )
    # The first trial is a known candidate that fits (enqueued as a warm start would be).
    space = SearchSpace(model=model, cluster=cluster, workload=workload)
    seq = workload.max_seq_len
    cand = Candidate(
        layout=ParallelLayout(world=8, tp=4),
        sequence_parallel=True,
        recompute_granularity="full",
        ppo_max_token_len_per_gpu=2 * seq,
        log_prob_max_token_len_per_gpu=4 * seq,
        rollout_tp=2,
        gpu_memory_utilization=0.5,  # 0.6 leaves verl 0.9.1's generation under 2 GiB spare
        max_num_batched_tokens=seq,
    )
    study = optuna.create_study(
        study_name="s", storage=open_storage(req.storage_url), direction="maximize"
    )
    study.enqueue_trial(params_for(cand, space))
    summary = run_study(req)
    (row,) = read_raw(summary.csv_path)
    assert row["status"] == "ok", row["reason"]
    assert row["runner"] == "verl" and float(row["tokens_per_s_per_gpu"]) == 1030.0
    # the study's wall time split counts the row's warm-up steps apart
    warm = float(dict(p.split("=", 1) for p in row["extra"].split(";") if "=" in p)["warmup_s"])
    assert warm > 0 and summary.warmup_s == pytest.approx(warm) and summary.unmeasured_s == 0
    trial_dir = workdir / "results" / "s" / "trials" / row["trial"]
    ran = _trial_overrides(trial_dir / "command.sh")

    assert main(["export", str(summary.csv_path), "--rank", "1"]) == 0
    recipe = Path(capsys.readouterr().out.strip().splitlines()[-1])
    (data,) = (workdir / "results" / "s" / "data").iterdir()
    env = {
        **os.environ,
        "MODEL_PATH": "fake/ok",
        "TRAIN_FILE": str(data / "train.parquet"),
        "NNODES": str(cluster.num_nodes),
    }
    out = subprocess.run(["bash", str(recipe)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    argv: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    assert argv[:3] == list(verl_command.ENTRYPOINT[1:])
    # the synthetic data's own overrides (drawn response lengths: tuner.runners.verl
    # data_overrides) are the trial's, not the recipe's: a recipe runs the user's data
    data_keys = ("actor_rollout_ref.rollout.agent.", "actor_rollout_ref.rollout.ignore_eos=")
    data_keys += ("data.shuffle=",)
    assert [a for a in argv[3:] if not a.startswith(data_keys)] == [
        a for a in ran if not a.startswith(data_keys)
    ]
    assert "actor_rollout_ref.rollout.ignore_eos=True" in ran
    assert any(a.startswith("reward.custom_reward_function.path=") for a in ran)


def test_recipe_without_a_reward_file_uses_verls_scorer(workdir: Path, eight_gpus: Path) -> None:
    m, cl, w = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=8), None
    w = get_workload("dapo-math")
    c = Candidate(
        layout=ParallelLayout(world=8, tp=4),
        sequence_parallel=True,
        ppo_max_token_len_per_gpu=20480,
        log_prob_max_token_len_per_gpu=30720,
    )
    path = recipes.write(recipes.render(c, m, cl, w), workdir)
    (workdir / "mine").mkdir()
    env: dict[str, Any] = {**os.environ, "MODEL_PATH": "/m", "TRAIN_FILE": "/x/mine.parquet"}
    out = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    argv = json.loads(out.stdout.strip().splitlines()[-1])
    assert "reward.custom_reward_function.path=null" in argv
    assert "trainer.nnodes=1" in argv and "trainer.total_training_steps=3" in argv
