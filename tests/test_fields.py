"""A measure travels by name (tuner.fields.same_named): phase times into the cost model's
Estimate, an Estimate into the estimate runner's TrialResult, a TrialResult and the study's
prediction into the TrialRecord; every measure a runner reports has its record column."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from tuner.estimate import Estimate, estimate
from tuner.estimate.context import get_context
from tuner.estimate.time import PhaseTimes, phase_times_of
from tuner.fields import same_named
from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY
from tuner.results import MEASURE_COLUMNS, Status, TrialRecord, TrialResult
from tuner.runners.base import TrialSpec
from tuner.runners.estimate import EstimateRunner
from tuner.space import Candidate, ParallelLayout
from tuner.study import TuneRequest
from tuner.study.learn import StudyLearner
from tuner.study.objective import build_record, propose
from tuner.workload import PRESETS


@dataclass(frozen=True, slots=True)
class _A:
    x_s: float
    y_s: float
    tag: str


@dataclass(frozen=True, slots=True)
class _B:
    x_s: float = 0.0
    tag: str = ""
    pred_y_s: float = 0.0


def test_same_named_copies_the_fields_both_declare() -> None:
    a = _A(x_s=1.0, y_s=2.0, tag="t")
    assert same_named(a, _B) == {"x_s": 1.0, "tag": "t"}
    assert same_named(a, _B, skip=("tag",)) == {"x_s": 1.0}
    assert same_named(a, _B, prefix="pred_") == {"pred_y_s": 2.0}
    with pytest.raises(ValueError, match="_A has no field z_s"):
        same_named(a, _B, skip=("z_s",))


MEASURES = tuple(f.name for f in dataclasses.fields(TrialResult) if f.type == "float | None")
"""What a runner measures: TrialResult's numbers."""


def test_every_measure_a_runner_reports_has_its_record_column() -> None:
    columns = {f.name: f.type for f in dataclasses.fields(TrialRecord)}
    assert len(MEASURES) >= 14
    assert all(columns.get(m) == "float | None" for m in MEASURES), MEASURES
    assert set(MEASURES) == set(MEASURE_COLUMNS)  # the record's measure columns are these


def test_one_record_of_measures_is_shared_by_the_result_and_the_row() -> None:
    """The measures are declared once (TrialMeasures): the runners' TrialResult, the megatron
    worker's result.json and the row's TrialRecord are it plus their own fields, with its
    docstrings; the leaderboard's measure columns are its fields, in its order."""
    from tuner.measures import MEASURES, TrialMeasures
    from tuner.runners.megatron_worker import WorkerResult

    for cls in (TrialResult, TrialRecord, WorkerResult):
        assert issubclass(cls, TrialMeasures), cls
        own = {f.name for f in dataclasses.fields(cls)} - set(MEASURES)
        assert not own & set(TrialMeasures.__dataclass_fields__), cls
        assert not set(MEASURES) & set(vars(cls).get("__annotations__", {})), cls
    assert MEASURE_COLUMNS == MEASURES


def _request(tmp: Path) -> TuneRequest:
    return TuneRequest(
        model=REGISTRY["qwen2.5-7b"],
        model_arg="qwen2.5-7b",
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=8),
        workload=PRESETS["dapo-math"],
        runner=EstimateRunner(),
        results_dir=tmp / "results",
        recipes_dir=tmp / "recipes",
    )


CAND = Candidate(layout=ParallelLayout(world=8, tp=4), ppo_max_token_len_per_gpu=16384)


def test_the_estimate_carries_the_phase_times_of_the_cost_model(tmp_path: Path) -> None:
    req = _request(tmp_path)
    e = estimate(CAND, req.model, req.cluster, req.workload, req.profile)
    t = phase_times_of(get_context(req.model, req.cluster, req.workload, req.profile), CAND)
    shared = [f.name for f in dataclasses.fields(PhaseTimes) if f.name in Estimate.__slots__]
    assert {"generation_s", "old_log_prob_s", "update_actor_s", "critic_s"} <= set(shared)
    for name in shared:
        assert getattr(e, name) == getattr(t, name), name
    assert e.step_s == t.step_s and math.isfinite(e.step_s)


def test_a_record_keeps_every_measure_and_the_prediction_of_its_trial(tmp_path: Path) -> None:
    """Each measure of the result, with a value of its own, is in the record; the pred_ times
    are the study's scaled estimate's; the estimate runner's row has the estimate's times."""
    req = _request(tmp_path)
    learner = StudyLearner(capacity_gib=req.cluster.gpu.memory_gib)
    learner.scales = {"generation": 1.5, "update_actor": 0.8}  # as learned from rows
    prop = propose(req, CAND, learner)
    e = prop.scaled
    assert e.generation_s == pytest.approx(1.5 * prop.estimate.generation_s)
    row = EstimateRunner().run(
        TrialSpec(
            number=7,
            candidate=CAND,
            model=req.model,
            cluster=req.cluster,
            workload=req.workload,
            trial_dir=tmp_path,
            timeout_s=60.0,
            prediction=prop.estimate,
        )
    )
    for name in ("step_s", "generation_s", "old_log_prob_s", "ref_s", "update_actor_s"):
        assert getattr(row, name) == getattr(prop.estimate, name), name
    res = dataclasses.replace(
        row, **{m: 1000.0 + i for i, m in enumerate(MEASURES)}, status=Status.OK
    )
    rec = build_record(req, "sqlite:/x", 7, prop, res, origin="", started_at="t0", duration_s=3.0)
    for m in MEASURES:
        assert getattr(rec, m) == getattr(res, m), m
    for name in ("step_s", "generation_s", "old_log_prob_s", "ref_s", "update_actor_s"):
        assert getattr(rec, f"pred_{name}") == pytest.approx(getattr(e, name)), name
    assert rec.pred_bottleneck == e.bottleneck
    assert (rec.status, rec.source, rec.hardware) == (Status.OK, "estimate", "cost model")


def test_the_megatron_runner_keeps_the_workers_memory_and_wall_times() -> None:
    """What the worker measured and the runner does not rescale reaches the row as it is, each
    from its own field (the worker's result is TrialMeasures too: the allocated peak is its
    peak_mem_gib)."""
    from tuner.runners.megatron import RUNNER_TIMES, worker_measures
    from tuner.runners.megatron_worker import WorkerResult

    numbers = [
        f.name
        for f in dataclasses.fields(WorkerResult)
        if f.type in ("float | None", "float") and f.name not in RUNNER_TIMES
    ]
    r = WorkerResult(
        status="ok", phase="update_actor", **{n: 10.0 + i for i, n in enumerate(numbers)}
    )
    got = worker_measures(r)
    assert {k: v for k, v in got.items() if k not in ("generation_s", "ref_s", "reshard_s",
            "verl_mfu_actor_pct")} == {
        "peak_mem_gib": r.peak_mem_gib,
        "peak_mem_reserved_gib": r.peak_mem_reserved_gib,
        "peak_mem_device_gib": r.peak_mem_device_gib,
        "launch_s": r.launch_s,
        "measured_s": r.measured_s,
    }  # fmt: skip
    assert got == {m: getattr(r, m) for m in MEASURE_COLUMNS if m not in RUNNER_TIMES}
    assert len(set(got.values())) == len(got)
    assert set(got) <= set(MEASURES)
