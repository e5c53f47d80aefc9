"""The trials of dead workers: closing them (`reclaim_interrupted`: this host's at once, by
their process; any host's by Optuna's heartbeat, `optuna.storages.fail_stale_trials`), and
measuring each one's candidate after all, once, in a trial of origin `RERUN_ORIGIN<n>`
(`enqueue_rerun`, also the storage's heartbeat-stale callback).

The re-run is ours, not Optuna's `RetryHeartbeatStaleTrialCallback` (`RetryFailedTrialCallback`
is its deprecated name), which adds a WAITING trial holding the stale trial's params with their
distributions, its user attrs and its system attrs (with `failed_trial`, `retry_history`):

- it copies the user attrs, so the re-run keeps the dead trial's origin (`reference`, a warm
  start's) and its dead `worker`; a re-run's origin is `re-run of interrupted trial <n>` (the
  CSV's origin column; committed storages hold that form, and `_rerun_due` tells a re-run by it:
  one not re-run again, one not enqueued twice; so it cannot move to a system attr);
- it gives the re-run the params the trial holds as its own, with their distributions of then: a
  trial killed while it sampled holds part of its candidate (the rest would be drawn anew:
  another candidate), params under an older version's sampler names (`current_params` reads
  them as today's knobs) would stay beside today's knobs drawn anew, and a knob whose choices
  differ now fails Optuna's distribution check at its first suggest. An enqueued re-run
  (`enqueue_trial`, Optuna's `fixed_params`) is the whole candidate, by today's names and
  distributions (`candidate_params`);
- Optuna calls it only from `fail_stale_trials`, for a trial that call failed: this host's dead
  workers' trials (closed at once, and on journal files, which have no heartbeat) need the same
  re-run, and a worker killed between the fail and the callback left the candidate unmeasured
  for good, found later by its origin only (`_enqueue_missing_reruns`);
- it re-runs every stale trial: here not one that stored its record (it finished; it is
  closed by its record), a ladder's confirmation (the ladder runs it again itself), or one
  killed before it had a candidate."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import optuna

from tuner.results import Status, TrialRecord
from tuner.space import current_params
from tuner.study.storage.records import RECORD_ATTR, record_of, state_for, store_record
from tuner.study.storage.workers import alive

RERUN_ORIGIN = "re-run of interrupted trial "
"""Origin (user attr and CSV column) of a trial enqueued to re-run an interrupted one; the
interrupted trial's number follows."""
CONFIRM_ORIGIN = "confirms trial "
"""Origin of a fidelity ladder's confirmation (tuner.study.ladder): real verl on the candidate of
the screened trial whose number follows. Not a trial of --trials' count, and not re-enqueued when
interrupted (the ladder runs it again itself)."""


def candidate_params(t: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """The params of the candidate the trial was to run: those it sampled, over those it was
    enqueued with (a warm start's, a re-run's: Optuna's `fixed_params`), which a trial
    killed while it sampled holds only part of."""
    fixed = t.system_attrs.get("fixed_params")
    return current_params({**(fixed if isinstance(fixed, dict) else {}), **t.params})


def _rerun_due(t: optuna.trial.FrozenTrial, origins: set[str]) -> bool:
    """Whether the ended trial `t` is an interrupted one whose re-run is not in the study yet
    (`origins`: the study's trials' origins): not a trial that was itself a re-run (a candidate
    that kills its worker is not retried forever), not one killed before it had a candidate
    (nothing enqueued, nothing sampled), not one that stored its record or (an older
    version's) status: it finished."""
    origin = str(t.user_attrs.get("origin", ""))
    if not candidate_params(t) or origin.startswith((RERUN_ORIGIN, CONFIRM_ORIGIN)):
        return False
    if RECORD_ATTR in t.user_attrs or "status" in t.user_attrs:
        return False
    return f"{RERUN_ORIGIN}{t.number}" not in origins


def _origins(trials: list[optuna.trial.FrozenTrial]) -> set[str]:
    return {str(o.user_attrs.get("origin", "")) for o in trials}


def enqueue_rerun(study: optuna.Study, t: optuna.trial.FrozenTrial) -> None:
    """Enqueue the candidate of the interrupted trial `t` once more (`candidate_params`), so
    it is measured after all (once: `_rerun_due`). Not `skip_if_exists`: Optuna would skip
    it, as params of an existing (failed) trial. Call under the study lock; also the
    storage's heartbeat-stale callback (`open_storage(on_stale=...)`)."""
    if _rerun_due(t, _origins(study.get_trials(deepcopy=False))):
        _enqueue(study, t)


def _enqueue(study: optuna.Study, t: optuna.trial.FrozenTrial) -> None:
    study.enqueue_trial(candidate_params(t), user_attrs={"origin": f"{RERUN_ORIGIN}{t.number}"})


Recover = Callable[[optuna.trial.FrozenTrial], TrialRecord | None]
"""The record a dead worker's trial already holds in its files (the runner's finished
measurement, `Runner.recover`), or None."""


def reclaim_interrupted(
    study: optuna.Study,
    locked_: bool,
    recover: Recover | None = None,
    storage: optuna.storages.BaseStorage | None = None,
    stopping: str = "",
) -> None:
    """Close the trials left RUNNING by dead workers (and by `stopping`, this process's
    worker when it stops on an interrupt, as if it were dead).

    This host's workers whose process is gone are closed at once: a trial that stored its
    record (killed between record and tell) with the record's state; one that did not, but
    whose measurement `recover` finds in its files (killed after the launch measured it),
    with that `ok` record, COMPLETE; any other as FAIL with no record, its params enqueued
    once more (`enqueue_rerun`). Under the study lock a RUNNING trial with no worker yet was
    asked by a killed process too (ask and mark happen under the lock). Then any host's:
    Optuna fails each trial whose heartbeat is older than `GRACE_S` and the storage's callback
    enqueues its re-run. Last, under the study lock, an interrupted trial whose re-run a
    killed worker did not get to enqueue gets it (`_enqueue_missing_reruns`). A FAIL trial
    with no record is what an interrupted trial is; the study's view gives it its
    `interrupted` row. `storage` (the study's) is where a recovered record is stored; without
    it nothing is recovered."""
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = str(t.user_attrs.get("worker", ""))
        mine = bool(stopping) and worker == stopping
        if not mine and ((worker and alive(worker)) or (not worker and not locked_)):
            continue
        rec = record_of(t)
        if rec is None and recover is not None and storage is not None:
            rec = recover(t)
            if rec is not None and rec.status is Status.OK and rec.tokens_per_s_per_gpu:
                sid = storage.get_study_id_from_name(study.study_name)
                tid = storage.get_trial_id_from_study_id_trial_number(sid, t.number)
                store_record(optuna.Trial(study, tid), rec)
            else:
                rec = None
        state = optuna.trial.TrialState.FAIL if rec is None else state_for(rec.status)
        value = rec.tokens_per_s_per_gpu if rec is not None else None
        if state is not optuna.trial.TrialState.COMPLETE:
            value = None
        elif value is None:
            state = optuna.trial.TrialState.FAIL
        study.tell(t.number, value, state=state)
        if rec is None:
            enqueue_rerun(study, t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    if locked_:
        _enqueue_missing_reruns(study)


def _enqueue_missing_reruns(study: optuna.Study) -> None:
    """Enqueue the re-run of each interrupted trial that has none: a worker killed after it
    closed a dead worker's trial as FAIL and before it enqueued the re-run (here, or in
    Optuna's `fail_stale_trials`, which fails every stale trial before it calls back) left
    the candidate unmeasured for good, as nothing above looks at a trial once it has ended.
    Under the study lock only: two workers of a server storage would enqueue it twice."""
    trials = study.get_trials(deepcopy=False)
    origins = _origins(trials)
    for t in trials:
        if t.state is optuna.trial.TrialState.FAIL and _rerun_due(t, origins):
            _enqueue(study, t)
            origins.add(f"{RERUN_ORIGIN}{t.number}")
