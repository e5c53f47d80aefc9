"""The decision made for one proposed candidate (tuner.study.objective)."""

from __future__ import annotations

import random
from pathlib import Path

from tuner.estimate import estimate
from tuner.estimate.device import phase_headroom_gib
from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY
from tuner.runners.estimate import EstimateRunner
from tuner.space import Candidate, RandomSuggester, SearchSpace, sample
from tuner.study import TuneRequest, warm_start_params
from tuner.study.learn import StudyLearner
from tuner.study.objective import propose
from tuner.workload import PRESETS


def _request(tmp: Path, headroom_gib: float | None) -> TuneRequest:
    return TuneRequest(
        model=REGISTRY["qwen2.5-7b"],
        model_arg="qwen2.5-7b",
        cluster=Cluster(gpu=get_gpu("h100"), num_gpus=8),
        workload=PRESETS["dapo-math"],
        runner=EstimateRunner(),
        results_dir=tmp / "results",
        recipes_dir=tmp / "recipes",
        headroom_gib=headroom_gib,
    )


def _near_capacity(req: TuneRequest) -> Candidate:
    """A candidate whose predicted device total lies 0.6..1.9 GiB below the GPU's memory: it
    fits with a 0.5 GiB headroom and not with its peak phase's default (2.0 or 3.8 GiB)."""
    space = SearchSpace(model=req.model, cluster=req.cluster, workload=req.workload)
    cap = req.cluster.gpu.memory_gib
    rng = random.Random(0)
    for _ in range(5000):
        c = sample(RandomSuggester(rng), space)
        e = estimate(c, req.model, req.cluster, req.workload, req.profile)
        if cap - 1.9 < e.device_peak_gib < cap - 0.6 and e.step_s < float("inf"):
            return c
    raise AssertionError("no candidate near the capacity")


def test_the_users_headroom_decides_fitting_below_the_default(tmp_path: Path) -> None:
    small = _request(tmp_path, headroom_gib=0.5)
    c = _near_capacity(small)
    learner = StudyLearner(capacity_gib=small.cluster.gpu.memory_gib, headroom_gib=0.5)
    prop = propose(small, c, learner)
    assert prop.unfit == ""
    assert prop.estimate.fits and prop.headroom_gib == 0.5
    # the estimate runner's row is then ok, not an OOM decided with the default headroom
    assert prop.estimate.headroom_gib == 0.5
    default = _request(tmp_path, headroom_gib=None)
    prop = propose(default, c, StudyLearner(capacity_gib=default.cluster.gpu.memory_gib))
    phase = prop.estimate.device_peak_phase
    assert f"in {phase} + headroom {phase_headroom_gib(phase):.1f} GiB" in prop.unfit


def test_the_warm_start_keeps_the_users_headroom(tmp_path: Path) -> None:
    req = _request(tmp_path, headroom_gib=0.5)
    space = SearchSpace(model=req.model, cluster=req.cluster, workload=req.workload)
    kept = warm_start_params(space, req.profile, seed=0, pool=300, best=300, headroom_gib=0.5)
    default = warm_start_params(space, req.profile, seed=0, pool=300, best=300)
    assert len(kept) > len(default)


def test_a_study_does_not_resume_across_another_workload(tmp_path: Path) -> None:
    """Issue 19: the fingerprint left out the algorithm, the mean lengths and the clip fraction,
    so a dapo study went on as grpo with another mean."""
    import dataclasses

    import optuna
    import pytest

    from tuner.errors import UserError
    from tuner.study import run_study

    base = dataclasses.replace(_request(tmp_path, None), trials=2, warm_start=False)
    w = base.workload
    run_study(base)
    for other in (
        dataclasses.replace(w, algorithm="grpo"),
        dataclasses.replace(w, response_mean=2000),
        dataclasses.replace(w, prompt_mean=500),
        dataclasses.replace(w, response_clip_fraction=0.2),
    ):
        req = dataclasses.replace(base, workload=other, trials=3, study_name=base.name)
        with pytest.raises(UserError, match="another model/cluster/workload"):
            run_study(req)
    # a study made before the fingerprint named the workload resumes when its rows ran this
    # workload, and is refused when they did not
    study = optuna.load_study(study_name=base.name, storage=base.storage_url)
    new = study.user_attrs["space"]
    legacy = new.split("|w=")[0] + "|" + new.rsplit("|", 1)[1]  # choices | runner
    assert "w=" not in legacy
    study.set_user_attr("space", legacy)
    s = run_study(dataclasses.replace(base, trials=3))
    assert s.trials_total == 3
    assert any("made before its fingerprint named" in n for n in s.notes)
    assert (
        optuna.load_study(study_name=base.name, storage=base.storage_url).user_attrs["space"] == new
    )
    study.set_user_attr("space", legacy)
    grpo = dataclasses.replace(w, algorithm="grpo")
    with pytest.raises(UserError, match="another model/cluster/workload"):
        run_study(dataclasses.replace(base, workload=grpo, trials=4, study_name=base.name))
