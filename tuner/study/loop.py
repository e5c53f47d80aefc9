"""The study loop: open the storage, reclaim what a dead worker left, enqueue the warm start
once, then ask → propose → evaluate → store the record → tell → rebuild the CSV view, until
the study holds --trials counted trials (all workers together), beating Optuna's heartbeat for
the running trial."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

import optuna

from tuner.errors import UserError
from tuner.results import Status, TrialRecord, TrialResult
from tuner.results.lines import LINE_KEY
from tuner.results.scope import WHOLE_STEP, scope_of
from tuner.space import SearchSpace, current_fingerprint, current_params, sample
from tuner.study.csv_view import check_leaderboard, write_leaderboard
from tuner.study.grid import (
    candidates_from_params,
    hand_grid_params,
    hand_retry_params,
    verl_example_params,
)
from tuner.study.ladder import confirm_due
from tuner.study.learn import SlowerThanBestPruner, StudyLearner, should_stop_for
from tuner.study.objective import (
    NOT_COPIED,
    build_record,
    evaluate,
    interrupted_record,
    now,
    propose,
    ran_workload,
    recovered_record,
    search_score,
)
from tuner.study.outcome import summary_of, write_best_recipes
from tuner.study.request import Progress, StudySummary, TuneRequest
from tuner.study.storage import (
    CONFIRM_ORIGIN,
    FINISHED,
    GRACE_S,
    HEARTBEAT_S,
    NOT_COUNTED,
    RECIPES_ATTR,
    RECORD_ATTR,
    WORKER,
    Heartbeat,
    enqueue_rerun,
    file_of,
    open_storage,
    reclaim_interrupted,
    record_of,
    reread_overlay,
    running_elsewhere,
    still_running_note,
    storage_label,
    store_record,
    stored_record,
    study_lock,
    told,
)
from tuner.study.warmstart import (
    WARM_START_ATTR,
    enqueue_pending,
    enqueue_warm_start,
    warm_start_params,
)

MAX_CONSECUTIVE_UNFIT = 200
"""Candidates in a row predicted not to fit after which the study gives up (its space does not
fit the GPUs); they do not count against --trials."""
VIEW_EVERY_PRUNED = 25
"""The CSV is rebuilt after every launched trial, and after this many pruned ones (their
records are in the storage at once; the CSV catches up, at the latest when the study ends)."""
_COUNTED_OFF = frozenset(s.value for s in NOT_COUNTED)


def _counts(t: optuna.trial.FrozenTrial) -> bool:
    """Whether a finished trial counts against --trials: a FAIL trial with no record was
    interrupted (its worker died; `reclaim_interrupted`) and does not."""
    if str(t.user_attrs.get("origin", "")).startswith(CONFIRM_ORIGIN):
        return False  # a ladder's confirmation measures a counted screen again
    status = t.user_attrs.get("status")
    if status is None and t.state is optuna.trial.TrialState.FAIL:
        return RECORD_ATTR in t.user_attrs
    return t.state in FINISHED and str(status or "") not in _COUNTED_OFF


ESTIMATE_QUEUE_MAX = 256
"""At most this many of the cost-model search's best are enqueued (the estimator's warm start):
enough to hold its best and the runners-up, few enough to enqueue in seconds; a study of more
trials samples the rest. Enqueuing one per trial made `--trials 5000` write thousands of
waiting trials before the first row (tests/test_study_faults.py, test_storage_journal_tail.py
found it)."""


def progress_best(records: Iterable[TrialRecord]) -> tuple[float, str] | None:
    """The progress bar's best throughput and its layout: of the whole-step rows once there is
    one (a ladder study's verl confirmations), else of every ok row, so a screened partial step
    never shows as the best above a confirmed whole one."""
    ok = [r for r in records if r.status is Status.OK and r.tokens_per_s_per_gpu]
    whole = [r for r in ok if scope_of(r.source, r.extra) == WHOLE_STEP]
    ok = whole or ok
    if not ok:
        return None
    b = max(ok, key=lambda r: r.tokens_per_s_per_gpu or 0.0)
    return float(b.tokens_per_s_per_gpu or 0.0), b.train_parallel


class _Study:
    """One worker's view of the study: the Optuna study, its records, the CSV view."""

    def __init__(self, req: TuneRequest, space: SearchSpace) -> None:
        self.req, self.space = req, space
        self.url = req.storage_url
        self.label = storage_label(self.url, req.results_dir)
        # Every check that can refuse comes before anything is written (issue 30): the CSV and
        # --candidates-from are read first; a storage file not there yet (or empty) is not
        # made, and a study is not added to a storage, before they pass.
        self.from_params = (
            candidates_from_params(req.candidates_from, space) if req.candidates_from else []
        )
        """The --candidates-from candidates (`start` enqueues them into a new study)."""
        path, _ = file_of(self.url)

        def fresh() -> bool:
            return path is not None and (not path.exists() or path.stat().st_size == 0)

        checked = None
        if fresh():
            try:
                checked = check_leaderboard(req.csv_path, req.name, self.label, lambda: ())
            except UserError:
                if fresh():
                    raise
                # another worker made the storage (and the CSV's rows) meanwhile: checked below
        self.storage = storage = open_storage(self.url, on_stale=enqueue_rerun)
        sampler = optuna.samplers.TPESampler(
            seed=req.seed, multivariate=True, group=True, n_startup_trials=10, constant_liar=True
        )
        pruner = SlowerThanBestPruner()
        try:
            # loaded where it exists: create_study writes a CREATE_STUDY line into a journal
            # file on every call, the study's own or not
            names = {s.study_name for s in storage.get_all_studies()}
            existing = (
                optuna.load_study(
                    study_name=req.name, storage=storage, sampler=sampler, pruner=pruner
                )
                if req.name in names
                else None
            )
        except Exception as e:
            raise self._cannot_open(e) from None
        runner = f"|{req.runner.name}"
        fingerprint = f"{space.fingerprint()}{runner}"
        old = existing.user_attrs.get("space") if existing is not None else None
        if old is not None and not isinstance(old, str):  # not written by verl-tuner
            raise UserError(
                f"study {req.name} in storage {self.label} has a `space` attribute of "
                f"{type(old).__name__} {str(old)[:40]!r}, not the text verl-tuner writes: the "
                "storage is damaged or another tool's: pass --study NEW_NAME"
            )
        if isinstance(old, str):  # pins spelled as before each knob had one name
            old = current_fingerprint(old)
        added: list[str] = []
        predates = False
        overlay = reread_overlay(existing) if existing is not None else {}
        if existing is not None and old is not None and old != fingerprint and old.endswith(runner):
            added = space.added_since(old.removesuffix(runner))
            records = (stored_record(t, overlay) for t in existing.get_trials(deepcopy=False))
            predates = space.predates_workload(old.removesuffix(runner)) and ran_workload(
                [d for d in records if d is not None], req.workload
            )
            if added and not predates:
                fingerprint = old
        if old is not None and not predates and old != fingerprint:
            raise UserError(
                f"study {req.name} was made for another model/cluster/workload/runner "
                f"({old}); pass --study NEW_NAME to start a new one"
            )
        if checked is None:

            def known() -> list[int]:
                try:  # looked up again: another worker may have made the study meanwhile
                    sid = storage.get_study_id_from_name(req.name)
                except KeyError:
                    return []
                return [t.number for t in storage.get_all_trials(sid, deepcopy=False)]

            checked = check_leaderboard(req.csv_path, req.name, self.label, known)
        self.legacy, self.notes = checked
        try:
            self.study = (
                existing
                if existing is not None
                else optuna.create_study(
                    study_name=req.name,
                    storage=storage,
                    sampler=sampler,
                    pruner=pruner,
                    direction="maximize",
                    load_if_exists=True,
                )
            )
        except Exception as e:
            raise self._cannot_open(e) from None
        self.overlay = reread_overlay(self.study)
        """Values `tune reread` filled into finished records (`stored_record`)."""
        if old is None or predates:
            self.study.set_user_attr("space", fingerprint)
        if predates:
            self.notes.append(
                f"study {req.name} was made before its fingerprint named the algorithm and mean "
                "lengths; its rows ran this workload's, so it resumes (the clip fraction was "
                "not recorded)"
            )
        if added:
            self.notes.append(
                f"study {req.name} was made before {', '.join(added)} existed; they stay pinned "
                "at verl's default, as its earlier trials ran"
            )
        self.lines: dict[tuple[int, str, str], str] = {}
        """Formatted CSV lines by (trial, recipe), so each rebuild formats only new rows."""
        self.records: dict[int, TrialRecord] = {}
        """Parsed records by trial number (parsed once; for learning and repeats)."""
        self.learner = StudyLearner(
            capacity_gib=req.cluster.gpu.memory_gib,
            headroom_gib=req.headroom_gib,
            screen_source=str(getattr(req.runner, "screen_source", "")),
        )

    def lock(self) -> contextlib.AbstractContextManager[bool]:
        return study_lock(self.url, self.req.name)

    def start(self) -> None:
        """Reclaim trials of killed workers (after learning from the finished ones, as their
        trials had when proposed); enqueue the warm start once per study."""
        req = self.req
        with self.lock() as locked_:
            self.trials()
            reclaim_interrupted(self.study, locked_, self.recover, self.storage)
            if (
                (req.warm_start or req.hand_grid or req.verl_example or req.candidates_from)
                and not self.study.user_attrs.get(WARM_START_ATTR)
                and not self.study.get_trials(deepcopy=False)
            ):
                params = verl_example_params(self.space) if req.verl_example else []
                params += self.from_params
                if req.hand_grid:  # its utilization: the largest predicted to fit
                    params += hand_grid_params(
                        self.space, lambda c: propose(req, c, self.learner).unfit
                    )
                if req.warm_start and req.runner.name == "estimate":
                    # the cost model is the objective: the trials are its search's best
                    queued = min(req.trials, ESTIMATE_QUEUE_MAX)
                    params += warm_start_params(
                        self.space,
                        req.profile,
                        req.seed,
                        req.runner,
                        best=queued,
                        headroom_gib=req.headroom_gib,
                        search=search_score(req, self.learner),
                    )[: max(1, queued - len(params))]
                elif req.warm_start:
                    params += warm_start_params(
                        self.space, req.profile, req.seed, req.runner, headroom_gib=req.headroom_gib
                    )
                enqueue_warm_start(self.study, params)

    def _cannot_open(self, e: Exception) -> UserError:
        from tuner.cli_args.messages import storage_failure_line

        known = storage_failure_line(e, self.url)  # a damaged or locked file: said as such
        if known is not None:
            return UserError(known)
        first = str(e).splitlines()[0][:160]
        return UserError(
            f"cannot open study {self.req.name} in {self.url} ({first}): "
            "pass --storage with another path"
        )

    def abandon(self) -> None:
        """On the way out of an interrupted or failed loop: close this worker's running trial
        as a dead worker's (its `interrupted` row, its candidate re-run by the next worker;
        its record's state where it stored one; `reclaim_interrupted`) and rebuild the CSV, so
        that `tune show` and `tune report` see the trial and every finished one at once, not
        after a resume. Best effort: what a failing storage or a second interrupt leaves, the
        next worker reclaims as before."""
        with contextlib.suppress(Exception):  # the exception on its way out is the one to see
            with self.lock() as locked_:
                reclaim_interrupted(
                    self.study, locked_, self.recover, self.storage, stopping=WORKER
                )
            self.write_view()

    def stored(self, number: int) -> optuna.trial.FrozenTrial:
        """Trial `number` as the storage holds it now."""
        sid = self.storage.get_study_id_from_name(self.req.name)
        tid = self.storage.get_trial_id_from_study_id_trial_number(sid, number)
        return self.storage.get_trial(tid)

    def running(self, number: int) -> bool:
        """Whether trial `number` is RUNNING in the storage now (not closed by another)."""
        return self.stored(number).state is optuna.trial.TrialState.RUNNING

    def finish(self, trial: optuna.Trial, rec: TrialRecord, res: TrialResult) -> TrialRecord:
        """Store the trial's record and tell Optuna its result; a trial another worker closed
        meanwhile (its heartbeat lapsed) stays as that worker closed it (`keep_closed`).
        Returns the record that stands."""
        value, state = told(res)
        try:
            store_record(trial, rec)
            self.study.tell(trial, value, state=state)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            if self.running(trial.number):
                raise  # not closed by another worker: a real error
            rec = self.keep_closed(trial, rec, state, value)
        return rec

    def keep_closed(
        self,
        trial: optuna.Trial,
        rec: TrialRecord,
        state: optuna.trial.TrialState,
        value: float | None,
    ) -> TrialRecord:
        """The record of `trial`, which another worker closed while this one ran it: Optuna's
        heartbeat of it stopped for `GRACE_S` (this process suspended, or stalled), so it was
        failed as stale and its candidate enqueued again. The measurement is kept: in a trial
        of its own with the same params (the re-run then copies it, `repeat_of`, rather than
        launch it again), unless the record was stored before the trial was closed (its row
        is there; a finished trial cannot change). Returns the record as stored."""
        closed = self.stored(trial.number)
        if RECORD_ATTR in closed.user_attrs:
            return rec
        template = optuna.trial.create_trial(
            state=optuna.trial.TrialState.RUNNING,
            params=closed.params,
            distributions=closed.distributions,
            user_attrs={k: v for k, v in closed.user_attrs.items() if k in ("origin", "worker")},
        )
        sid = self.storage.get_study_id_from_name(self.req.name)
        with self.lock():  # RUNNING with its worker at once: no reclaim takes it for a dead one
            tid = self.storage.create_new_trial(sid, template_trial=template)
        number = self.storage.get_trial_number_from_id(tid)
        note = (
            f"measured as trial {trial.number}, which another worker closed while it ran "
            "(its heartbeat had stopped: this worker was suspended or stalled)"
        )
        kept = replace(rec, trial=number, reason=f"{rec.reason}; {note}" if rec.reason else note)
        store_record(optuna.Trial(self.study, tid), kept)
        self.study.tell(number, value, state=state)
        return kept

    def recover(self, t: optuna.trial.FrozenTrial) -> TrialRecord | None:
        """The record of a dead worker's trial whose measurement is in its folder
        (`recovered_record`); a runner that fails to read it back leaves a note, and the trial
        is re-run."""
        try:
            return recovered_record(self.req, self.label, self.space, self.learner, t)
        except Exception as e:  # a runner bug must not stop the study from resuming
            self.notes.append(
                f"trial {t.number}: its files could not be read back "
                f"({type(e).__name__}: {e}); it is re-run"[:300]
            )
            return None

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        """The study's trials; new finished records are parsed and learned from. A FAIL
        trial with no record (nor a legacy row) was interrupted: its record is made here. A
        `tune reread` since the last call (another process) re-parses the records it filled
        (learned from as first read) and reformats their CSV lines."""
        ts = self.study.get_trials(deepcopy=False)
        overlay = reread_overlay(self.study)
        if overlay != self.overlay:
            changed = {
                n
                for n in overlay.keys() | self.overlay.keys()
                if overlay.get(n) != self.overlay.get(n)
            }
            self.overlay = overlay
            self.lines = {k: v for k, v in self.lines.items() if str(k[0]) not in changed}
            for t in ts:
                if str(t.number) in changed and t.number in self.records:
                    rec = record_of(t, overlay)
                    if rec is not None:
                        self.records[t.number] = rec
        for t in ts:
            if t.state in FINISHED and t.number not in self.records:
                rec = record_of(t, self.overlay) or self.legacy.get(t.number)
                if rec is None and t.state is optuna.trial.TrialState.FAIL:
                    rec = interrupted_record(self.req, self.label, self.space, t)
                if rec is not None:
                    self.records[t.number] = rec
                    self.learner.observe(rec)
        return ts

    def counted(self, ts: list[optuna.trial.FrozenTrial]) -> int:
        return sum(1 for t in ts if _counts(t))

    def write_view(self, ts: list[optuna.trial.FrozenTrial] | None = None) -> None:
        """Rebuild the CSV from the storage (all workers' records), atomically."""
        ts = self.trials() if ts is None else ts
        recs: list[dict[str, Any]] = []
        for t in ts:
            if t.state not in FINISHED:
                continue
            d = stored_record(t, self.overlay)
            if d is not None and d.get("storage") != self.label:
                # kept before its results folder moved, or by an older version (absolute)
                d = {k: v for k, v in d.items() if k != LINE_KEY} | {"storage": self.label}
            if d is not None:
                recs.append(d)
            elif t.number in self.legacy:
                recs.append({**self.legacy[t.number].to_dict(), "storage": self.label})
            elif t.number in self.records:  # interrupted
                recs.append(self.records[t.number].to_dict())
        got = self.study.user_attrs.get(RECIPES_ATTR)
        write_leaderboard(
            self.req.csv_path, recs, got if isinstance(got, dict) else None, self.lines
        )

    def best(self) -> tuple[float, str] | None:
        return progress_best(self.records.values())

    def repeat_of(self, params: dict[str, Any], number: int) -> TrialRecord | None:
        """The earliest finished trial with the same sampler params, if it measured anything."""
        key = tuple(sorted(current_params(params).items()))
        for t in self.study.get_trials(deepcopy=False, states=FINISHED):
            if t.number == number or tuple(sorted(current_params(t.params).items())) != key:
                continue
            rec = self.records.get(t.number)
            if rec is not None and rec.status not in NOT_COPIED:
                return rec
        return None


def run_study(
    req: TuneRequest,
    on_progress: Callable[[Progress], None] | None = None,
) -> StudySummary:
    """Run (or resume, or join as one more worker) the study of `req`. The runner is closed at
    the end, also on error; SIGTERM and SIGHUP stop it as Ctrl-C does
    (`_stop_signals_interrupt`)."""
    with _stop_signals_interrupt():
        return _run_study(req, on_progress)


def _run_study(req: TuneRequest, on_progress: Callable[[Progress], None] | None) -> StudySummary:
    try:
        space = SearchSpace(
            model=req.model,
            cluster=req.cluster,
            workload=req.workload,
            limits=req.runner.space_limits(req.model),
            allow_off_policy=req.allow_off_policy,
        )
        space.check_nonempty()
        space.check_splits()
        req.runner.check_available(req.cluster)
        optuna.logging.set_verbosity(logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        # the loop asks and tells itself and beats the heartbeat (storage.Heartbeat)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        return _run(req, space, on_progress)
    finally:
        close = getattr(req.runner, "close", None)
        if callable(close):
            close()


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP while a study runs, raised as an interrupt (as Ctrl-C is)."""


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (a scheduler's stop, a closed terminal) raise `Terminated` while the
    study runs, so that what a Ctrl-C cleans up is cleaned up for them too: the launched
    trial's process group is killed (`runners.process.run_process`), the runner closed, this
    worker's trial closed (`_Study.abandon`). By default either signal ended the process on
    the spot and left the trial's launch running, holding its GPUs, beside the resume's
    re-run. A second one ends the process at once; a handler of the caller's own, or one
    ignored (nohup), is left as it is; nothing off the main thread, where Python allows no
    handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def on_stop(signum: int, _frame: object) -> None:
        signal.signal(signum, previous[signum])
        raise Terminated(f"stopped by {signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, on_stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run(
    req: TuneRequest, space: SearchSpace, on_progress: Callable[[Progress], None] | None
) -> StudySummary:
    s = _Study(req, space)
    s.start()
    try:
        with Heartbeat(s.storage, req.name) as beat:
            return _loop(req, s, beat, on_progress)
    except BaseException:
        s.abandon()
        raise


def _loop(
    req: TuneRequest,
    s: _Study,
    beat: Heartbeat,
    on_progress: Callable[[Progress], None] | None,
) -> StudySummary:
    ts = s.trials()
    s.write_view(ts)
    resumed_from = done = s.counted(ts)
    notes = s.notes  # with what later reclaims add
    deadline = time.monotonic() + req.timeout_s if req.timeout_s else None
    ran = pruned = unfit_in_a_row = 0
    reclaim_at = time.monotonic() + HEARTBEAT_S
    while deadline is None or time.monotonic() < deadline:
        if confirm_due(s, req, beat, final=False):  # the fidelity ladder's, at once
            continue
        with s.lock() as locked_:
            if time.monotonic() >= reclaim_at:  # workers that died while this one ran
                reclaim_interrupted(s.study, locked_, s.recover, s.storage)
                reclaim_at = time.monotonic() + HEARTBEAT_S
            ts = s.trials()
            done = s.counted(ts)
            elsewhere = running_elsewhere(ts, locked_)
            if done + len(elsewhere) >= req.trials:
                if done < req.trials:  # ended short: say which trial it waits on and why
                    beats = getattr(s.storage, "get_heartbeat_interval", lambda: None)()
                    grace = GRACE_S if beats else None
                    notes += [still_running_note(t, done, req.trials, grace) for t in elsewhere]
                break
            enqueue_pending(s.study, ts)  # the warm start's next chunk, once the queue is empty
            trial = s.study.ask()
            trial.set_user_attr("worker", WORKER)
            beat.start(trial)
        started, t0 = now(), time.monotonic()
        c = sample(trial, s.space)
        prop = propose(req, c, s.learner)
        # the estimator scores a repeat again (evaluate): no need to look for one
        same = s.repeat_of(trial.params, trial.number) if req.runner.name != "estimate" else None
        res = evaluate(req, trial, prop, same, should_stop_for(trial))
        rec = build_record(
            req,
            s.label,
            trial.number,
            prop,
            res,
            origin=str(trial.user_attrs.get("origin", "")),
            started_at=started,
            duration_s=time.monotonic() - t0,
        )
        rec = s.finish(trial, rec, res)
        beat.stop()
        retry = hand_retry_params(dict(trial.params), rec)
        if retry is not None:  # the hand rule: a lower utilization after an OOM in generation
            with s.lock():
                s.study.enqueue_trial(
                    retry[0], user_attrs={"origin": retry[1]}, skip_if_exists=True
                )
        ts = s.trials()
        if res.status in NOT_COUNTED:
            pruned += 1
            if pruned % VIEW_EVERY_PRUNED == 0:
                s.write_view(ts)
            unfit_in_a_row = unfit_in_a_row + 1 if res.status is Status.PRUNED_OOM else 0
            if unfit_in_a_row >= MAX_CONSECUTIVE_UNFIT:
                notes.append(
                    f"{unfit_in_a_row} candidates in a row were predicted not to fit a "
                    f"{req.cluster.gpu.name} (last: {rec.reason}); stopped: use more GPUs, "
                    "shorter sequences, a smaller batch, or a smaller --headroom-gib"
                )
                break
            continue
        s.write_view(ts)
        unfit_in_a_row = 0
        ran += 1
        done = s.counted(ts)
        if on_progress:
            best = s.best()
            on_progress(
                Progress(
                    done=done,
                    total=req.trials,
                    status=res.status.value,
                    best_tokens_per_s_per_gpu=best[0] if best else None,
                    best_layout=best[1] if best else "",
                )
            )
    if deadline is None or time.monotonic() < deadline:
        confirm_due(s, req, beat, final=True)  # the fidelity ladder's top candidates
    paths = write_best_recipes(req, s)
    ts = s.trials()
    s.write_view(ts)
    return summary_of(
        req,
        s,
        trials_run=ran,
        trials_total=s.counted(ts),
        resumed_from=resumed_from,
        recipe_paths=paths,
        pruned_before_launch=pruned,
        notes=notes,
    )
