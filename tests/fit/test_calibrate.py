"""Calibration recovers constants from rows the tool itself produced under a known profile."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.errors import UserError
from tuner.estimate import Profile, load_profile, save_profile
from tuner.fit.calibrate import calibrate, observations_from_rows
from tuner.hardware import GPUS, Cluster
from tuner.models import get_model
from tuner.results import read_raw
from tuner.runners.estimate import EstimateRunner
from tuner.study import TuneRequest, run_study
from tuner.workload import get_workload

TRUE = Profile().with_values(
    gemm_efficiency=0.7,
    hbm_efficiency=0.65,
    comm_efficiency=0.55,
    layer_host_s=4.5e-3,
    decode_seq_overhead_s=40e-6,
)
"""The 'hardware' the synthetic rows come from: a profile the defaults do not know."""


def _study_rows(workdir: Path, trials: int = 40) -> Path:
    """A leaderboard the estimator wrote under TRUE, relabelled as if measured."""
    req = TuneRequest(
        model=get_model("qwen2.5-7b"),
        model_arg="qwen2.5-7b",
        cluster=Cluster(gpu=GPUS["h100"], num_gpus=8),
        workload=get_workload("grpo-math"),
        runner=EstimateRunner(),
        trials=trials,
        profile=TRUE,
        recipes=0,
        warm_start=False,
        results_dir=workdir / "results",
        recipes_dir=workdir / "recipes",
    )
    path = run_study(req).csv_path
    rows = read_raw(path)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({**r, "source": "synthetic" if r["status"] == "ok" else r["source"]})
    return path


@pytest.fixture(scope="module")
def study_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _study_rows(tmp_path_factory.mktemp("cal"))


def test_calibration_recovers_the_constants(study_csv: Path) -> None:
    obs = observations_from_rows(read_raw(study_csv))
    assert len(obs) >= 30
    res = calibrate(obs)
    assert res.rms_log_before > 0.1
    assert res.rms_log_after < 0.01
    for name in ("gemm_efficiency", "hbm_efficiency", "comm_efficiency", "layer_host_s"):
        assert getattr(res.profile, name) == pytest.approx(getattr(TRUE, name), rel=0.05), name
    assert all(v < 0.02 for v in res.error_after.values())
    # a dense model says nothing about MoE constants: they stay at the start
    assert "moe_layer_host_s" not in res.fitted
    assert res.profile.moe_layer_host_s == Profile().moe_layer_host_s


def test_estimates_are_not_measurements(study_csv: Path) -> None:
    rows = [{**r, "source": "estimate"} for r in read_raw(study_csv)]
    with pytest.raises(UserError, match="no measured rows"):
        calibrate(observations_from_rows(rows))


def test_tune_calibrate_writes_the_profile_tune_then_uses(
    study_csv: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate", str(study_csv)]) == 0
    out = capsys.readouterr().out
    assert "before" in out and "after" in out and "gemm_efficiency" in out
    saved = workdir / "results" / "calibration.json"
    data = json.loads(saved.read_text())
    assert data["schema"] == 2 and data["rows"] > 0
    assert load_profile().gemm_efficiency == pytest.approx(TRUE.gemm_efficiency, rel=0.05)
    # `tune estimate` picks the calibrated profile up by default
    argv = ["estimate", "--model", "qwen2.5-7b", "--gpus", "8", "--layout", "tp4", "--json"]
    assert main(argv) == 0
    calibrated = json.loads(capsys.readouterr().out)["update_actor_s"]
    assert main([*argv, "--profile", str(save_profile(Profile(), workdir / "d.json"))]) == 0
    default = json.loads(capsys.readouterr().out)["update_actor_s"]
    assert calibrated > default * 1.1  # TRUE is a slower machine


def test_profile_round_trip_and_bad_files(workdir: Path) -> None:
    p = save_profile(TRUE, workdir / "p.json", note="x")
    assert load_profile(p) == TRUE
    p.write_text(json.dumps({"schema": 1, "constants": {}}))
    with pytest.raises(UserError, match="re-run `tune calibrate`"):
        load_profile(p)
    with pytest.raises(UserError, match="no calibration profile"):
        load_profile(workdir / "missing.json")


def test_an_old_megatron_rows_phases_both_mean_the_whole_step(tmp_path: Path) -> None:
    """A schema-2 megatron row timed old_log_prob over the mini-batches run and scaled only the
    update to the step: calibration (and validation, through case_from_row) reads both phases
    as the whole step's, as the cost model predicts them (issue 19, item 4)."""
    from tuner.fit.validate import predicted_phase
    from tuner.results import read_rows

    repo = Path(__file__).resolve().parents[2]
    raw = read_raw(repo / "results" / "moe8k-h200-x2.csv")
    row = next(r for r in raw if r["status"] == "ok" and r["old_log_prob_s"])
    row["extra"] = row["extra"].replace("mini_batches_per_step=2;", "mini_batches_per_step=8;")
    path = tmp_path / "old.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    obs = {o.phase: o for o in observations_from_rows(read_rows(path))}
    assert set(obs) == {"old_log_prob", "update_actor"}
    logp = obs["old_log_prob"]
    assert logp.measured_s == pytest.approx(4 * float(row["old_log_prob_s"]), rel=1e-5)
    assert obs["update_actor"].measured_s == pytest.approx(float(row["update_actor_s"]))
    # compared with the cost model's whole-step phase
    assert predicted_phase(logp.case.predict(Profile()), "old_log_prob") > 0


def test_calibrate_says_when_it_mixes_runners_and_fits_one_with_source(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """verl's training phases include its controller and dispatch (results/README.md: the fast
    runner's old_log_prob is 0.68-0.91 of verl's on the same candidates): a fit over both says
    so, and --source keeps one runner's rows."""
    from tuner.cli_parser import CALIBRATE_SOURCES
    from tuner.runners.megatron import MegatronRunner
    from tuner.runners.verl import VerlRunner

    assert set(CALIBRATE_SOURCES) == {MegatronRunner.name, VerlRunner.name}
    results = Path(__file__).resolve().parents[2] / "results"
    both = [str(results / "verl4k-h100-x1.csv"), str(results / "gen-check-h100-x1.csv")]
    assert main(["calibrate", *both, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sources megatron, verl" in out and "--source verl fits verl's steps" in out
    assert main(["calibrate", *both, "--source", "verl", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sources verl)" in out and "note:" not in out
    # the megatron rows here are too few to fit the constants they move (issue 30): refused
    assert main(["calibrate", *both, "--source", "megatron", "--dry-run"]) == 2
    assert "2 measured row(s) give 6 phase time(s), fewer than" in capsys.readouterr().err
