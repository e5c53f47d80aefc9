"""Optuna's heartbeat of a running trial, for RDB storages (SQLite, PostgreSQL, MySQL): its
settings (`HEARTBEAT_S`, `GRACE_S`, which `open_storage` hands to Optuna's `RDBStorage`) and the
thread that records it (`Heartbeat`). Failing the stale trials is Optuna's own
(`optuna.storages.fail_stale_trials`, called by `reclaim.reclaim_interrupted`).

The thread is ours, not Optuna's: Optuna's heartbeat thread (`HeartbeatThread`,
`get_heartbeat_thread`) lives in the private module `optuna.storages._heartbeat`, which
`optuna.storages` does not export (the tuner uses Optuna's public API only:
tests/test_optuna_public_api.py), and only `Study.optimize` starts it, one thread per trial; the
study loop asks and tells itself. Its beat is also not guarded: one failed write (a dropped
server connection) ends the thread, and the trial, still running, goes stale and is failed by
another worker; `Heartbeat` beats again at the next interval. What the thread calls is Optuna's
public API: the storage's `get_heartbeat_interval` and `record_heartbeat`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import optuna

HEARTBEAT_S = 10
"""A running trial's worker records Optuna's heartbeat this often (RDB storages: SQLite,
PostgreSQL, MySQL)."""
GRACE_S = 60
"""A RUNNING trial whose heartbeat is older than this is failed by any worker of the study
(Optuna's `fail_stale_trials`) and its candidate re-run once: a worker that died on another
host, or one whose process this host can no longer tell apart (a reused pid)."""


class Heartbeat:
    """Optuna's heartbeat of this worker's running trial, recorded every `HEARTBEAT_S` by one
    thread for the worker's life (`study.optimize` runs one per trial; the loop asks and tells
    itself). Nothing where the storage has no heartbeat (journal files, readers)."""

    def __init__(self, storage: optuna.storages.BaseStorage, study_name: str) -> None:
        interval = getattr(storage, "get_heartbeat_interval", lambda: None)()
        self._record: Callable[[int], None] | None = (
            getattr(storage, "record_heartbeat", None) if interval else None
        )
        self._storage = storage
        self._study_id = storage.get_study_id_from_name(study_name) if self._record else -1
        self._interval = float(interval or HEARTBEAT_S)
        self._trial: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        if self._record is not None:
            self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def start(self, trial: optuna.Trial) -> None:
        """Beat for `trial` from now on (the first beat at once: a trial killed before the
        thread's next beat is stale all the same)."""
        if self._record is None:
            return
        tid = self._storage.get_trial_id_from_study_id_trial_number(self._study_id, trial.number)
        self._record(tid)
        self._trial = tid

    def stop(self) -> None:
        self._trial = None

    def _beat(self) -> None:
        assert self._record is not None
        while not self._stop.wait(self._interval):
            tid = self._trial
            if tid is not None:
                with contextlib.suppress(Exception):  # a failed beat: the next one may pass
                    self._record(tid)
