"""What a study learns between trials (tuner.study.learn): per-phase time scales from its
measured rows, applied to the next proposals' predictions."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.estimate import estimate
from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY
from tuner.results import Status, TrialRecord, read_raw
from tuner.runners.estimate import EstimateRunner
from tuner.space import Candidate, RandomSuggester, SearchSpace, sample
from tuner.study import TuneRequest, run_study
from tuner.study.learn import (
    EAGER_PRIOR,
    StudyLearner,
    eager,
    measured_phases,
    raw_prediction,
    scaled_estimate,
)
from tuner.study.objective import propose
from tuner.study.storage import RECORD_ATTR
from tuner.workload import PRESETS

GEN, LOGP, UPD, TPUT = 0.5, 1.5, 2.0, 0.8
"""A 'machine' of the tests: generation twice as fast as the cost model says, old_log_prob 1.5
and the update 2 times as slow, its measured throughput 0.8 of the predicted."""


def _request(workdir: Path, **kw: Any) -> TuneRequest:
    base: dict[str, Any] = dict(
        model=REGISTRY["qwen2.5-7b"],
        model_arg="qwen2.5-7b",
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=8),
        workload=PRESETS["dapo-math"],
        runner=EstimateRunner(),
        trials=1,
        warm_start=False,
        results_dir=workdir / "results",
        recipes_dir=workdir / "recipes",
    )
    base.update(kw)
    return TuneRequest(**base)


def _measured(rec: TrialRecord, **kw: Any) -> TrialRecord:
    """`rec` (an estimate row) as a row measured on the tests' machine."""
    assert rec.pred_generation_s and rec.pred_old_log_prob_s and rec.pred_update_actor_s
    assert rec.pred_tokens_per_s_per_gpu
    got: dict[str, Any] = dict(
        source="verl",
        status=Status.OK,
        reason="",
        generation_s=rec.pred_generation_s * GEN,
        old_log_prob_s=rec.pred_old_log_prob_s * LOGP,
        update_actor_s=rec.pred_update_actor_s * UPD,
        tokens_per_s_per_gpu=rec.pred_tokens_per_s_per_gpu * TPUT,
        extra={},
    )
    return dataclasses.replace(rec, **{**got, **kw})


def _raw(req: TuneRequest, row: dict[str, str]) -> Any:
    c = Candidate.from_record(row, req.cluster.num_gpus)
    return estimate(c, req.model, req.cluster, req.workload, req.profile)


@pytest.mark.parametrize(
    ("kw", "gen_scale"),
    [
        ({}, GEN),
        # the megatron runner times the training phases only: its generation (had the row one)
        # is not a measure
        ({"source": "megatron", "extra": {"measured": "old_log_prob + actor update"}}, 1.0),
        ({"source": "megatron", "generation_s": None}, 1.0),
        # ... unless it says it measured generation too (with vLLM)
        (
            {
                "source": "megatron",
                "extra": {
                    "measured": "old_log_prob + actor update",
                    "generation": "measured(vllm)",
                },
            },
            GEN,
        ),
    ],
    ids=["verl", "megatron-labelled", "megatron-no-generation", "megatron-with-generation"],
)
def test_a_measured_row_scales_the_next_proposals_predictions(
    workdir: Path, kw: dict[str, Any], gen_scale: float
) -> None:
    req = _request(workdir)
    run_study(req)  # one ok row of the cost model (and the pruned ones before it)
    study = optuna.load_study(study_name=req.name, storage=req.storage_url)
    (rec0,) = (
        r
        for r in (TrialRecord.from_dict(t.user_attrs[RECORD_ATTR]) for t in study.trials)
        if r.status is Status.OK
    )
    assert rec0.source == "estimate" and rec0.pred_generation_scale == 1.0
    # the next trial: a measured row, as a measuring worker of the study would have stored it
    t = study.ask()
    rec1 = _measured(dataclasses.replace(rec0, trial=t.number), **kw)
    t.set_user_attr(RECORD_ATTR, rec1.to_dict())
    t.set_user_attr("status", "ok")
    study.tell(t, rec1.tokens_per_s_per_gpu)

    s = run_study(dataclasses.replace(req, trials=5))
    rows = read_raw(s.csv_path)
    later = [r for r in rows if int(r["trial"]) > t.number]
    assert later and rows[t.number]["source"] == rec1.source
    for r in later:
        e = _raw(req, r)
        # generation is learned per launch mode: a row of the other mode has the prior (1)
        same_mode = eager(TrialRecord.from_row(r)) == eager(rec1)
        gen = gen_scale if same_mode else EAGER_PRIOR
        want = {"generation": gen, "old_log_prob": LOGP, "update_actor": UPD}
        for ph, scale in want.items():
            assert float(r[f"pred_{ph}_scale"]) == pytest.approx(scale)
            assert float(r[f"pred_{ph}_s"]) == pytest.approx(
                getattr(e, f"{ph}_s") * scale, rel=1e-5
            )
        # the step is its phases, as predicted; the reference pass and weight sync unscaled
        assert float(r["pred_ref_s"]) == pytest.approx(e.ref_s, rel=1e-5, abs=1e-9)
        step = e.step_s + sum((want[ph] - 1) * getattr(e, f"{ph}_s") for ph in want)
        assert float(r["pred_step_s"]) == pytest.approx(step, rel=1e-5)
        # the time limit's scale is the throughput's, against the raw model's throughput
        assert float(r["pred_time_scale"]) == pytest.approx(1 / TPUT)
        assert float(r["pred_tokens_per_s_per_gpu"]) == pytest.approx(
            e.throughput_tokens_per_s_per_gpu, rel=1e-5
        )
        # the estimate runner's own row is the raw model (its rows teach nothing)
        if r["status"] == "ok":
            assert float(r["generation_s"]) == pytest.approx(e.generation_s, rel=1e-5)


def test_a_scaled_prediction_teaches_the_whole_ratio() -> None:
    """A row records the scaled prediction and its scale: the learner divides the scale out, so
    a study whose scale is already right keeps it (it does not learn what is left, 1)."""
    rec = TrialRecord(
        study="s",
        trial=3,
        status=Status.OK,
        source="verl",
        generation_s=24.1,
        pred_generation_s=24.0,
        pred_generation_scale=0.71,
        old_log_prob_s=2.0,
        pred_old_log_prob_s=1.6,
    )
    learner = StudyLearner(capacity_gib=80.0)
    learner.observe(rec)
    scales = learner.scales_for(enforce_eager=False)
    assert scales["generation"] == pytest.approx(24.1 / (24.0 / 0.71))
    # no scale recorded (rows from before it was applied): the prediction is the cost model's
    assert scales["old_log_prob"] == pytest.approx(2.0 / 1.6)
    assert scales["update_actor"] == 1.0


def test_what_a_row_measured() -> None:
    base = TrialRecord(
        study="s",
        trial=0,
        status=Status.OK,
        source="megatron",
        generation_s=9.0,
        old_log_prob_s=1.0,
        update_actor_s=2.0,
    )
    assert measured_phases(base) == ("generation", "old_log_prob", "update_actor")
    labelled = dataclasses.replace(base, extra={"measured": "old_log_prob + actor update"})
    assert measured_phases(labelled) == ("old_log_prob", "update_actor")
    old = dataclasses.replace(base, extra={"measured": "actor update"})
    assert measured_phases(old) == ("update_actor",)
    # a phase's own label decides
    for label, want in (("measured(vllm)", True), ("predicted", False)):
        got = dataclasses.replace(
            base, extra={"measured": "old_log_prob + actor update", "generation": label}
        )
        assert ("generation" in measured_phases(got)) is want
        assert measured_phases(dataclasses.replace(got, extra={"generation": label})) == (
            ("generation",) if want else ()
        ) + ("old_log_prob", "update_actor")
    for nothing in (
        dataclasses.replace(base, source="estimate"),
        dataclasses.replace(base, reason="same candidate as trial 1; not re-run"),
    ):
        assert measured_phases(nothing) == ()
    learner = StudyLearner(capacity_gib=80.0)
    learner.observe(
        dataclasses.replace(
            labelled,
            pred_generation_s=18.0,
            pred_old_log_prob_s=0.5,
            pred_update_actor_s=1.0,
        )
    )
    graph = learner.scales_for(enforce_eager=False)
    assert graph == {"generation": 1.0, "old_log_prob": 2.0, "update_actor": 2.0}


def test_the_scaled_estimate_is_one_step(tmp_path: Path) -> None:
    req = _request(tmp_path)
    space = SearchSpace(model=req.model, cluster=req.cluster, workload=req.workload)
    rng = random.Random(1)
    for _ in range(200):
        c = sample(RandomSuggester(rng), space)
        e = estimate(c, req.model, req.cluster, req.workload, req.profile)
        if e.fits and e.bottleneck == "generation":
            break
    else:
        raise AssertionError("no candidate that fits, bound by generation")
    prop = propose(req, c, StudyLearner(capacity_gib=req.cluster.gpu.memory_gib))
    assert prop.scaled == prop.estimate  # nothing learned: the cost model's
    e = prop.estimate
    s = scaled_estimate(e, {"generation": 0.01, "update_actor": 2.0})
    assert s.step_s == pytest.approx(
        s.generation_s + s.old_log_prob_s + s.ref_s + s.update_actor_s + s.reshard_s + s.critic_s
    )
    assert s.generation_s == pytest.approx(0.01 * e.generation_s)
    assert s.old_log_prob_s == e.old_log_prob_s and s.reshard_s == e.reshard_s
    assert s.throughput_tokens_per_s_per_gpu * s.step_s == pytest.approx(
        e.throughput_tokens_per_s_per_gpu * e.step_s
    )
    assert s.mfu == pytest.approx(e.mfu / 2)
    assert s.bottleneck != "generation"
    assert s.memory is e.memory and s.device_peak_gib == e.device_peak_gib


VERL4K = Path(__file__).resolve().parents[1] / "results" / "verl4k-h100-x1.csv"


def test_eager_generation_is_learned_apart_on_the_real_study(tmp_path: Path) -> None:
    """verl4k-h100-x1: five CUDA-graph rows, then eager trial 6 (host-bound: 2.9 x the model
    where the graph rows run 0.65-0.71 x). The eager row gets the prior until an eager row is
    measured, and it moves neither the graph rows' scale nor the other phases' rule."""
    rows = sorted((TrialRecord.from_row(r) for r in read_raw(VERL4K)), key=lambda r: r.trial)
    six = next(r for r in rows if r.trial == 6)
    assert eager(six) and measured_phases(six)
    learner = StudyLearner(capacity_gib=80.0)
    for r in rows:
        if r.trial == 6:
            break
        learner.observe(r)
    graph = learner.scales_for(enforce_eager=False)
    assert graph["generation"] == pytest.approx(0.681, abs=0.001)
    assert learner.scales_for(enforce_eager=True) == {**graph, "generation": EAGER_PRIOR}
    # the prior the data chose: the cost model misses the eager row by less than the graph scale
    raw, meas = raw_prediction(six, "generation"), six.generation_s
    assert raw and meas
    assert abs(raw * EAGER_PRIOR - meas) < abs(raw * graph["generation"] - meas)
    learner.observe(six)
    assert learner.scales_for(enforce_eager=True)["generation"] == pytest.approx(meas / raw)
    assert learner.scales_for(enforce_eager=True)["generation"] == pytest.approx(2.907, abs=0.001)
    after = learner.scales_for(enforce_eager=False)
    assert after["generation"] == graph["generation"]  # graph rows only
    assert after["old_log_prob"] != graph["old_log_prob"]  # every row, as before
    # the whole study: the graph scale of its graph rows alone (with the eager row among them
    # the median was 0.711)
    for r in rows:
        if r.trial > 6:
            learner.observe(r)
    graph_only = StudyLearner(capacity_gib=80.0)
    for r in rows:
        if not eager(r):
            graph_only.observe(r)
    assert (
        learner.scales_for(enforce_eager=False)["generation"]
        == graph_only.scales_for(enforce_eager=False)["generation"]
    )

    # propose() applies the candidate's mode's scales, and the record keeps the one applied
    req = _request(tmp_path)
    space = SearchSpace(model=req.model, cluster=req.cluster, workload=req.workload)
    c = sample(RandomSuggester(random.Random(0)), space)
    for mode in (False, True):
        prop = propose(req, dataclasses.replace(c, enforce_eager=mode), learner)
        assert prop.phase_scales == learner.scales_for(enforce_eager=mode)
        if prop.estimate.generation_s > 0 and prop.scaled.generation_s < float("inf"):
            assert prop.scaled.generation_s == pytest.approx(
                prop.estimate.generation_s * prop.phase_scales["generation"]
            )


def test_a_pruned_slow_rows_generation_teaches_its_mode_and_nothing_else() -> None:
    """results/gen8k-h200-x1 trial 8 (enforce_eager) was stopped in its first training step
    after a whole generation, measured: the eager scale learns that generation; the graph
    scale and the training phases' scales do not move (its training was cut short)."""
    path = VERL4K.parent / "gen8k-h200-x1.csv"
    rows = sorted((TrialRecord.from_row(r) for r in read_raw(path)), key=lambda r: r.trial)
    eight = next(r for r in rows if r.trial == 8)
    assert eight.status is Status.PRUNED_SLOW and eager(eight) and eight.generation_s
    learner = StudyLearner(capacity_gib=140.0)
    for r in rows:
        if r.trial < 8:
            learner.observe(r)
    before = learner.scales_for(enforce_eager=True)
    assert before["generation"] == EAGER_PRIOR
    learner.observe(eight)
    after = learner.scales_for(enforce_eager=True)
    raw = raw_prediction(eight, "generation")
    assert raw and after["generation"] == pytest.approx(eight.generation_s / raw)
    assert {k: v for k, v in after.items() if k != "generation"} == {
        k: v for k, v in before.items() if k != "generation"
    }
    graph_before = StudyLearner(capacity_gib=140.0)
    for r in rows:
        if r.trial < 8:
            graph_before.observe(r)
    assert learner.scales_for(enforce_eager=False) == graph_before.scales_for(enforce_eager=False)
    # a pruned-slow row stopped before any step measured no generation: nothing learned
    bare = dataclasses.replace(eight, generation_s=None)
    quiet = StudyLearner(capacity_gib=140.0)
    quiet.observe(bare)
    assert quiet.scales == {}
