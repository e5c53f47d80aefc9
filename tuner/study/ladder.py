"""The fidelity ladder's decisions (`--runner ladder`, tuner.runners.ladder_runner): which screened
candidates real verl confirms, and the confirmations themselves as trials of the study.

The estimator prunes (as in every study); the fast runner screens every proposed candidate (the
study's ordinary trials, counted by --trials); real verl confirms:

- at once, a screened candidate whose whole step, predicted from its screen by the ratios the
  study learned between the rungs (learn.StudyLearner.rung_ratios), beats the best confirmed
  one (the first screened ok candidate is confirmed at once: it gives the first ratios);
- at the study's end, the `confirm_top` best screened candidates by that prediction.

A confirmation is a trial of its own (origin CONFIRM_ORIGIN<n>, source `verl`, its `extra`
confirms=<n>) that does not count against --trials. Everything here is decided from the study's
stored trials, so a killed study resumes where it was: a finished confirmation is not re-run,
one interrupted mid-launch is run again (storage.reclaim._rerun_due does not enqueue it as a
screen)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import optuna

from tuner.results import Status, TrialRecord, TrialResult
from tuner.runners.ladder_runner import LadderRunner
from tuner.space import current_params, sample
from tuner.study.learn import (
    StudyLearner,
    confirmed_trial,
    eager,
    measured_phases,
    scaled_estimate,
)
from tuner.study.objective import Proposal, build_record, now, propose, trial_spec
from tuner.study.request import TuneRequest
from tuner.study.storage import (
    CONFIRM_ORIGIN,
    RECORD_ATTR,
    WORKER,
)

MAX_INTERRUPTED = 2
"""Interrupted confirmations of one screened trial after which it is not confirmed again."""


def ladder_of(req: TuneRequest) -> LadderRunner | None:
    return req.runner if isinstance(req.runner, LadderRunner) else None


def predicted_verl_tps(rec: TrialRecord, ratios: Mapping[str, float]) -> float | None:
    """The whole-step tokens/s/GPU verl is predicted to measure for a screened row: each phase
    the fast rung timed (learn.measured_phases) times its ratio (`rung_ratios_for`), the others
    (the reference pass, the weight sync; generation where it was predicted) the study's
    prediction (pred_step_s less the timed phases' pred_*_s), over the same tokens. None where
    the row has no throughput."""
    tps = rec.tokens_per_s_per_gpu
    if not tps or rec.status is not Status.OK:
        return None
    timed = {ph: float(getattr(rec, f"{ph}_s")) for ph in measured_phases(rec)}
    summed = sum(timed.values())
    if summed <= 0:
        return None
    tokens = tps * summed  # per GPU: the fast rung's throughput covers the phases it timed
    rest = 0.0
    if rec.pred_step_s is not None:
        rest = rec.pred_step_s - sum(getattr(rec, f"pred_{ph}_s") or 0.0 for ph in timed)
    step = sum(x * ratios.get(ph, 1.0) for ph, x in timed.items()) + max(0.0, rest)
    return tokens / step if step > 0 else None


def confirmation_state(
    trials: Iterable[optuna.trial.FrozenTrial],
) -> tuple[set[int], dict[int, int]]:
    """(screened trials whose confirmation is running or finished: not to be confirmed again,
    each confirmation's trial -> the screened trial it confirms). A confirmation interrupted
    before it stored its record (FAIL, no record) does not count, it is run again, unless
    MAX_INTERRUPTED of them were (a candidate that kills its worker is not retried forever)."""
    taken: set[int] = set()
    links: dict[int, int] = {}
    interrupted_of: dict[int, int] = {}
    for t in trials:
        origin = str(t.user_attrs.get("origin", ""))
        if not origin.startswith(CONFIRM_ORIGIN):
            continue
        try:
            n = int(origin.removeprefix(CONFIRM_ORIGIN))
        except ValueError:
            continue
        links[t.number] = n
        interrupted = t.state is optuna.trial.TrialState.FAIL and RECORD_ATTR not in t.user_attrs
        interrupted_of[n] = interrupted_of.get(n, 0) + interrupted
        if not interrupted or interrupted_of[n] >= MAX_INTERRUPTED:
            taken.add(n)
    return taken, links


def to_confirm(
    records: Mapping[int, TrialRecord],
    trials: Iterable[optuna.trial.FrozenTrial],
    learner: StudyLearner,
    *,
    screen_source: str,
    top: int,
    final: bool,
) -> list[int]:
    """The screened trials verl should confirm now, the most promising first (see the module
    docstring): one at most during the study, the rest of the top `top` at its end. A candidate
    screened twice (a repeat copies its result) is confirmed once."""
    taken, _ = confirmation_state(trials)
    screened: list[tuple[float, int, TrialRecord]] = []
    for n, r in records.items():
        if r.source != screen_source or r.status is not Status.OK or "not re-run" in r.reason:
            continue
        v = predicted_verl_tps(r, learner.rung_ratios_for(eager(r)))
        if v is not None:
            screened.append((v, n, r))
    screened.sort(key=lambda x: (-x[0], x[1]))
    done_keys = {_key(records[n]) for n in taken if n in records}
    best_confirmed = max(
        (
            r.tokens_per_s_per_gpu or 0.0
            for r in records.values()
            if confirmed_trial(r) >= 0 and r.status is Status.OK
        ),
        default=None,
    )
    out: list[int] = []
    for rank, (v, n, r) in enumerate(screened):
        key = _key(r)
        if n in taken or key in done_keys:
            continue
        beats = (
            best_confirmed is None
            and not taken
            or (best_confirmed is not None and v > best_confirmed)
        )
        if beats or (final and rank < top):
            out.append(n)
            done_keys.add(key)
            if not final:
                break
    return out


def _key(rec: TrialRecord) -> tuple[Any, ...]:
    return (rec.train_parallel, rec.infer_parallel, tuple(sorted(rec.knobs.items())))


def confirm_proposal(prop_req: TuneRequest, c: Any, learner: StudyLearner) -> Proposal:
    """The proposal of a confirmation: the cost model as verl runs the candidate (`prop_req`'s
    runner: the ladder's confirm rung), its phases scaled by what the study learned of the fast
    rung times the ratios learned between the rungs (pred_<phase>_scale: the product)."""
    prop = propose(prop_req, c, learner)
    ratios = learner.rung_ratios_for(c.enforce_eager)
    scales = {ph: s * ratios.get(ph, 1.0) for ph, s in prop.phase_scales.items()}
    return replace(prop, scaled=scaled_estimate(prop.estimate, scales), phase_scales=scales)


def open_confirmation(s: Any, req: TuneRequest, screened: int) -> optuna.Trial:
    """A new RUNNING trial of this worker with screened trial `screened`'s params, origin
    CONFIRM_ORIGIN<n>. Call under the study lock (as `ask` is), with the decision that made it."""
    storage = s.storage
    sid = storage.get_study_id_from_name(req.name)
    src = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(sid, screened))
    template = optuna.trial.create_trial(
        state=optuna.trial.TrialState.RUNNING,
        params=src.params,
        distributions=src.distributions,
        user_attrs={"origin": f"{CONFIRM_ORIGIN}{screened}", "worker": WORKER},
    )
    return optuna.Trial(s.study, storage.create_new_trial(sid, template_trial=template))


def confirm(s: Any, req: TuneRequest, beat: Any, trial: optuna.Trial, screened: int) -> TrialRecord:
    """Measure the confirmation `trial` (`open_confirmation`) of screened trial `screened` with
    real verl, store its record and tell it (loop._Study `s`). Returns its record."""
    ladder = ladder_of(req)
    assert ladder is not None
    beat.start(trial)
    started, t0 = now(), time.monotonic()
    c = sample(optuna.trial.FixedTrial(current_params(trial.params)), s.space)
    prop = confirm_proposal(replace(req, runner=ladder.confirm), c, s.learner)
    spec = trial_spec(req, trial.number, prop)
    try:
        res = ladder.run_confirmation(spec, screened)
    except Exception as e:  # a runner bug must not lose the study; the row says what happened
        res = TrialResult(
            status=Status.FAILED,
            source=ladder.confirm.name,
            reason=f"runner error: {type(e).__name__}: {e}"[:300],
            extra={"confirms": screened},
        )
    rec = build_record(
        req,
        s.label,
        trial.number,
        prop,
        res,
        origin=f"{CONFIRM_ORIGIN}{screened}",
        started_at=started,
        duration_s=time.monotonic() - t0,
    )
    rec = s.finish(trial, rec, res)
    beat.stop()
    return rec


def confirm_due(s: Any, req: TuneRequest, beat: Any, *, final: bool) -> int:
    """Run the confirmations the study's rows call for now (`to_confirm`), each decided and
    opened under the study lock; their number."""
    ladder = ladder_of(req)
    if ladder is None:
        return 0
    ran = 0
    while True:
        with s.lock():
            due = to_confirm(
                s.records,
                s.trials(),
                s.learner,
                screen_source=ladder.screen_source,
                top=ladder.confirm_top,
                final=final,
            )
            trial = open_confirmation(s, req, due[0]) if due else None
        if trial is None:
            return ran
        confirm(s, req, beat, trial, due[0])
        ran += 1
