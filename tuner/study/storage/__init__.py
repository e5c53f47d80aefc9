"""The Optuna storage, one module per concern, its public names re-exported here once:

- urls: a storage's file, the label a leaderboard records for it and the URL read back from it;
- opening: opening a storage by URL or path (SQLite, journal file, PostgreSQL/MySQL), refusing
  files that are not storages; closing one;
- journal: journal files, their append lock that sets aside a line cut short, their check;
- locks: one study's lock across workers (a file lock, a PostgreSQL advisory lock);
- heartbeat: Optuna's heartbeat settings and the thread that beats for a worker's trial;
- workers: this worker's name in its trials, whether a worker is alive, trials running
  elsewhere;
- records: the trial records the storage keeps (the source of truth; the CSV is a view of
  them) and what Optuna is told of a result;
- reclaim: the trials of dead workers, closed, and their candidates re-run once.

A module reads another's setting or function through that module (`heartbeat.HEARTBEAT_S` at
each open), so a test changes it there, not here: the names here are bound once, at import."""

from tuner.study.storage.heartbeat import GRACE_S, HEARTBEAT_S, Heartbeat
from tuner.study.storage.journal import (
    JOURNAL_LOCK_GRACE_S,
    TORN_SUFFIX,
    journal_damage,
    set_aside_torn_tail,
)
from tuner.study.storage.locks import study_lock
from tuner.study.storage.opening import (
    OPTUNA_TABLES,
    POSTGRES_EXTRA,
    StaleCallback,
    close_storage,
    open_storage,
    sqlite_tables,
)
from tuner.study.storage.reclaim import (
    CONFIRM_ORIGIN,
    RERUN_ORIGIN,
    Recover,
    candidate_params,
    enqueue_rerun,
    reclaim_interrupted,
)
from tuner.study.storage.records import (
    FINISHED,
    NOT_COUNTED,
    RECIPES_ATTR,
    RECORD_ATTR,
    REREAD_ATTR,
    REREAD_EXTRA,
    record_of,
    reread_overlay,
    state_for,
    store_record,
    stored_record,
    told,
)
from tuner.study.storage.urls import (
    JOURNAL_SUFFIXES,
    driver_url,
    file_of,
    label_file,
    label_url,
    same_storage,
    storage_label,
)
from tuner.study.storage.workers import WORKER, alive, running_elsewhere, still_running_note

__all__ = [
    "CONFIRM_ORIGIN",
    "FINISHED",
    "GRACE_S",
    "HEARTBEAT_S",
    "JOURNAL_LOCK_GRACE_S",
    "JOURNAL_SUFFIXES",
    "NOT_COUNTED",
    "OPTUNA_TABLES",
    "POSTGRES_EXTRA",
    "RECIPES_ATTR",
    "RECORD_ATTR",
    "REREAD_ATTR",
    "REREAD_EXTRA",
    "RERUN_ORIGIN",
    "TORN_SUFFIX",
    "WORKER",
    "Heartbeat",
    "Recover",
    "StaleCallback",
    "alive",
    "candidate_params",
    "close_storage",
    "driver_url",
    "enqueue_rerun",
    "file_of",
    "journal_damage",
    "label_file",
    "label_url",
    "open_storage",
    "reclaim_interrupted",
    "record_of",
    "reread_overlay",
    "running_elsewhere",
    "still_running_note",
    "same_storage",
    "set_aside_torn_tail",
    "sqlite_tables",
    "state_for",
    "store_record",
    "stored_record",
    "storage_label",
    "study_lock",
    "told",
]
