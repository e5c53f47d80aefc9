"""One trial: decide (invalid, predicted not to fit, a repeat, launch), run, and build its one
TrialRecord."""

from __future__ import annotations

import contextlib
import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import optuna

from tuner.estimate import Estimate
from tuner.fields import same_named
from tuner.results import Status, TrialRecord, TrialResult
from tuner.runners.base import Predicted, TrialSpec
from tuner.space import Candidate, SearchSpace, current_params, sample, validate
from tuner.study.learn import StudyLearner, scaled_estimate
from tuner.study.request import TuneRequest
from tuner.study.storage import WORKER, candidate_params

BACKENDS = {
    "estimate": "estimate (cost model)",
    "verl": "megatron+vllm",
    "megatron": "megatron-core",
}
"""What ran, by runner, where the runner's result does not say."""
LAUNCHED_AS_WRITTEN = "hand: "
"""Origins of configurations a user writes by hand (verl's own example): launched even where the
cost model predicts they do not fit, since the comparison is with what the user would run."""
PROFILE_EXTRA = "profile"
"""`extra` key naming the calibration profile file the row's predictions used (absent: the
built-in constants)."""
NOT_COPIED = frozenset({Status.INTERRUPTED, Status.PRUNED_INVALID, Status.PRUNED_OOM})
"""A repeated candidate is not relaunched; its earlier result is copied, unless it was one of
these (nothing was measured)."""


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def assumed_versions() -> str:
    """The software versions the cost model assumes (tuner.versions)."""
    from tuner.versions import summary

    return summary()


@dataclass(frozen=True, kw_only=True, slots=True)
class Proposal:
    """What the study knew when it proposed a candidate: the raw model and its corrections."""

    candidate: Candidate
    estimate: Estimate
    """The raw cost model (the runner's TrialSpec.prediction)."""
    scaled: Estimate
    """The study's prediction: `estimate` with the phase times scaled by what the study learned
    (`phase_scales`); the row's pred_*_s."""
    phase_scales: dict[str, float]
    """Measured/predicted time per phase the study had learned for this candidate's launch mode
    (learn.SCALED_PHASES; generation of an eager candidate from eager rows: scales_for)."""
    predicted: Predicted
    """The runner's view of the raw model."""
    device_gib: float
    """Predicted device total (raw; the PyTorch peak where the model has no device total)."""
    corrected_device_gib: float
    """After the study's memory guard."""
    headroom_gib: float
    """Kept free below the capacity at its peak phase: the study's, else that phase's default
    (the memory guard's `headroom_for`)."""
    time_scale: float
    unfit: str
    """Why it cannot run ('' if it can): the runner's model or the memory guard."""
    timeout_s: float


def propose(req: TuneRequest, c: Candidate, learner: StudyLearner) -> Proposal:
    from tuner.estimate import estimate

    # the study's headroom decides fitting in the model as in the guard (None: the default)
    e = estimate(
        c, req.model, req.cluster, req.workload, req.profile, headroom_gib=req.headroom_gib
    )
    p = req.runner.predicted(e, req.cluster)
    scales = learner.scales_for(c.enforce_eager)
    dev = p.device_gib or p.peak_gib
    corrected, guard_unfit = learner.fit(dev, p.phase)
    unfit = p.unfit or guard_unfit
    if unfit:
        unfit = f"predicted {unfit} of a {req.cluster.gpu.name}"
    steps = int(getattr(req.runner, "steps", 3) or 3)
    window = getattr(req.runner, "measured_window_s", lambda step_s: steps * step_s)
    per_step = (
        e.tokens_per_step / (p.tokens_per_s_per_gpu * req.cluster.num_gpus)
        if p.tokens_per_s_per_gpu > 0 and e.tokens_per_step > 0
        else math.inf
    )
    return Proposal(
        candidate=c,
        estimate=e,
        scaled=scaled_estimate(e, scales),
        phase_scales=scales,
        predicted=p,
        device_gib=dev,
        corrected_device_gib=corrected,
        headroom_gib=learner.headroom_for(p.phase),
        time_scale=learner.time_scale,
        unfit=unfit,
        # the window's step count follows the steps as they will run (scaled), the limit is
        # given in predicted seconds (the learner scales it)
        timeout_s=learner.timeout_s(
            window(per_step * learner.time_scale) / learner.time_scale, req.trial_timeout_s
        ),
    )


def search_score(req: TuneRequest, learner: StudyLearner) -> Callable[[Candidate], float]:
    """The study's view of a candidate as a number for the estimator's search (tuner.study.exact
    holds each candidate it finds to it; warmstart.cost_model_search climbs by it): its
    predicted tokens/s/GPU where `propose` lets it run, else below 0 by its predicted device
    total (the smaller, the nearer to fitting)."""

    def score(c: Candidate) -> float:
        prop = propose(req, c, learner)
        if prop.unfit:
            return -1.0 - prop.device_gib
        return prop.predicted.tokens_per_s_per_gpu

    return score


def result_of_record(rec: TrialRecord, same_as: int) -> TrialResult:
    """A repeat's result: the earlier trial's measures, saying it was not re-run."""
    kw = same_named(rec, TrialResult)
    kw["reason"] = f"same candidate as trial {same_as}; not re-run"
    # nothing was launched for it: the study's wall-time split counts the earlier trial's
    kw["launch_s"] = kw["measured_s"] = None
    return TrialResult(**kw)


def trial_spec(req: TuneRequest, number: int, prop: Proposal, should_stop: Any = None) -> TrialSpec:
    """What the runner is given for trial `number` (its folder: results/<study>/trials/<n>)."""
    return TrialSpec(
        number=number,
        candidate=prop.candidate,
        model=req.model,
        cluster=req.cluster,
        workload=req.workload,
        trial_dir=req.results_dir / req.name / "trials" / str(number),
        timeout_s=prop.timeout_s,
        prediction=prop.estimate,
        seed=req.seed,
        should_stop=should_stop,
    )


def evaluate(
    req: TuneRequest,
    trial: optuna.Trial,
    prop: Proposal,
    same_as: TrialRecord | None,
    should_stop: Any,
) -> TrialResult:
    """The trial's result: pruned before launch, copied from a repeat, or run. A runner that
    raises gives a FAILED result (the study goes on)."""
    c = prop.candidate
    reasons = validate(c, req.model, req.cluster, req.workload)
    if reasons:
        return TrialResult(status=Status.PRUNED_INVALID, source="tuner", reason="; ".join(reasons))
    hand = str(trial.user_attrs.get("origin", "")).startswith(LAUNCHED_AS_WRITTEN)
    if prop.unfit and not hand:
        return TrialResult(status=Status.PRUNED_OOM, source="estimate", reason=prop.unfit)
    if same_as is not None and req.runner.name != "estimate":
        return result_of_record(same_as, same_as.trial)
    spec = trial_spec(req, trial.number, prop, should_stop)
    try:
        return req.runner.run(spec)
    except Exception as e:  # a runner bug must not lose the study; the row says what happened
        return TrialResult(
            status=Status.FAILED,
            source=req.runner.name,
            reason=f"runner error: {type(e).__name__}: {e}"[:300],
        )


def _float(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def base_record(req: TuneRequest, storage: str, number: int, **kw: Any) -> dict[str, Any]:
    """The fields every record of this study shares: setup and workload."""
    w, cl = req.workload, req.cluster
    return dict(
        study=req.name,
        trial=number,
        runner=req.runner.name,
        model=req.model_arg,
        gpu=cl.gpu.name,
        num_gpus=cl.num_gpus,
        gpus_per_node=cl.gpus_per_node,
        workload=w.name,
        algorithm=w.algorithm,
        max_prompt_len=w.prompt_len,
        max_response_len=w.response_len,
        prompt_mean_len=w.mean_prompt_len,
        response_mean_len=w.mean_response_len,
        bs=w.batch_size,
        mini_bs=w.mini_batch_size,
        n=w.n,
        storage=storage,
        worker=WORKER,
        **req.runner.record_fields(),
        **kw,
    )


def ran_workload(records: list[dict[str, Any]], w: Any) -> bool:
    """Whether stored records (`base_record`'s fields) all ran workload `w`'s algorithm and
    mean lengths: what a study whose fingerprint predates them is checked on."""
    for r in records:
        if r.get("algorithm") not in (None, "", w.algorithm):
            return False
        for key, want in (
            ("prompt_mean_len", w.mean_prompt_len),
            ("response_mean_len", w.mean_response_len),
        ):
            got = _float(r.get(key))
            if got is not None and not math.isclose(got, want, rel_tol=1e-6):
                return False
    return True


def candidate_fields(c: Candidate) -> dict[str, Any]:
    """The record's layout fields and knobs of a candidate."""
    rec = c.to_record()
    lay = {k: rec.pop(k) for k in tuple(rec) if k in _RECORD_FIELDS}  # tp, ..., dp
    return {**lay, "infer_parallel": f"tp{c.rollout_tp}", "knobs": rec}


_RECORD_FIELDS = frozenset(f.name for f in fields(TrialRecord))
_NOT_THE_ESTIMATES = ("peak_mem_gib", "peak_phase", "fits", "headroom_gib")
"""pred_ columns made from another source than the study's estimate: the runner's view of the
memory (`Predicted`) and the study's fit decision (`Proposal`)."""


def _predicted(e: Estimate) -> dict[str, Any]:
    """The pred_ columns the study's (scaled) estimate gives: each of its fields the record has
    as pred_<name> (pred_step_s, the phase times, pred_bottleneck), numbers finite or None."""
    d = same_named(e, TrialRecord, prefix="pred_", skip=_NOT_THE_ESTIMATES)
    return {k: _float(v) if isinstance(v, float) else v for k, v in d.items()}


def build_record(
    req: TuneRequest,
    storage: str,
    number: int,
    prop: Proposal,
    res: TrialResult,
    *,
    origin: str,
    started_at: str,
    duration_s: float,
) -> TrialRecord:
    """The one record of a finished trial: setup, candidate, the prediction made when it was
    proposed (raw and corrected), and the result."""
    e, p = prop.scaled, prop.predicted
    extra = dict(res.extra)
    if req.profile_source:  # the predictions' constants are a calibration's, not built in
        extra[PROFILE_EXTRA] = req.profile_source
    launch_s = res.launch_s if res.launch_s is not None else _float(extra.get("launch_s"))
    return TrialRecord(
        **base_record(req, storage, number),
        **candidate_fields(prop.candidate),
        # the result's status, measures, hardware and versions: its fields of the record's names
        **same_named(res, TrialRecord, skip=("backend", "launch_s", "extra")),
        backend=res.backend or BACKENDS.get(req.runner.name, req.runner.name),
        launch_s=launch_s,
        **_predicted(e),
        pred_tokens_per_s_per_gpu=p.tokens_per_s_per_gpu,
        pred_peak_mem_gib=p.peak_gib,
        pred_device_mem_gib=prop.device_gib,
        pred_device_mem_corrected_gib=prop.corrected_device_gib,
        pred_headroom_gib=prop.headroom_gib,
        pred_time_scale=prop.time_scale,
        pred_generation_scale=prop.phase_scales["generation"],
        pred_old_log_prob_scale=prop.phase_scales["old_log_prob"],
        pred_update_actor_scale=prop.phase_scales["update_actor"],
        pred_peak_phase=p.phase,
        pred_fits=not prop.unfit,
        pred_versions=assumed_versions(),
        extra=extra,
        origin=origin,
        started_at=started_at,
        finished_at=now(),
        duration_s=duration_s,
    )


def interrupted_record(
    req: TuneRequest, storage: str, space: SearchSpace, t: optuna.trial.FrozenTrial
) -> TrialRecord:
    """The record of a trial whose worker died or was interrupted before it stored one (a
    FAIL trial with no record); made the same each time from the trial, its candidate from
    what it sampled and was enqueued with (`candidate_params`: a trial killed while it
    sampled a warm-start candidate)."""
    cand: dict[str, Any] = {}
    with contextlib.suppress(Exception):  # params of an older space may not sample any more
        cand = candidate_fields(sample(optuna.trial.FixedTrial(candidate_params(t)), space))
    worker = str(t.user_attrs.get("worker", ""))
    base = base_record(req, storage, t.number)
    base["worker"] = worker
    return TrialRecord(
        **base,
        **cand,
        status=Status.INTERRUPTED,
        reason=f"its worker {worker or '(unknown)'} stopped mid-trial; not counted",
        source="tuner",
        backend=BACKENDS.get(req.runner.name, req.runner.name),
        origin=str(t.user_attrs.get("origin", "")),
        started_at=t.datetime_start.astimezone(dt.UTC).isoformat(timespec="seconds")
        if t.datetime_start
        else "",
        finished_at=t.datetime_complete.astimezone(dt.UTC).isoformat(timespec="seconds")
        if t.datetime_complete
        else "",
    )


def recovered_record(
    req: TuneRequest,
    storage: str,
    space: SearchSpace,
    learner: StudyLearner,
    t: optuna.trial.FrozenTrial,
) -> TrialRecord | None:
    """The record of trial `t`, whose worker died before it stored one, if its runner finds a
    finished measurement in the trial's folder (`Runner.recover`); None otherwise (it is then
    interrupted and re-run). The record is the one a finished trial gets (`build_record`, the
    prediction proposed again from the study's learning so far), its worker the dead one, its
    end and duration unknown (file times do not tell: a copied folder has new ones); the reason
    says it was recovered."""
    try:
        c = sample(optuna.trial.FixedTrial(current_params(t.params)), space)
    except Exception:  # params of an older space may not sample any more: nothing to read back
        return None
    prop = propose(req, c, learner)
    spec = trial_spec(req, t.number, prop)
    res = req.runner.recover(spec)
    if res is None or res.value is None:
        return None
    worker = str(t.user_attrs.get("worker", ""))
    why = (
        f"recovered from trials/{t.number}'s files after its worker {worker or '(unknown)'} stopped"
    )
    res = replace(
        res,
        reason=f"{why}; {res.reason}" if res.reason else why,
        extra={**res.extra, "recovered": True},
    )
    rec = build_record(
        req,
        storage,
        t.number,
        prop,
        res,
        origin=str(t.user_attrs.get("origin", "")),
        started_at=t.datetime_start.astimezone(dt.UTC).isoformat(timespec="seconds")
        if t.datetime_start
        else "",
        duration_s=0.0,
    )
    return replace(rec, worker=worker, finished_at="", duration_s=None)
