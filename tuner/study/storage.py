"""The Optuna storage: opening it (refusing files that are not storages), naming it, locking it,
and the trial records it keeps (the source of truth; the CSV is a view of them)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna

from tuner.errors import UserError
from tuner.results import Status, TrialRecord, locked

JOURNAL_SUFFIXES = (".log", ".jsonl", ".journal")
"""A --storage path with one of these suffixes is an Optuna journal file (several workers)."""
RECORD_ATTR = "record"
"""The trial user attr holding the TrialRecord (`to_dict()`, JSON)."""
WORKER = f"{socket.gethostname()}:{os.getpid()}"
"""This process, as the `worker` user attr of the trials it runs."""
_SQLITE_MAGIC = b"SQLite format 3\x00"


def _file_of(url: str) -> tuple[Path | None, bool]:
    """(the storage file, is it a journal) for a path or sqlite:/// URL; (None, False) else."""
    if "://" not in url:
        path = Path(url)
        return path, path.suffix in JOURNAL_SUFFIXES
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///")), False
    return None, False


def storage_label(url: str) -> str:
    """The storage's name as leaderboards record it: an absolute file path for file storages,
    the URL without its password otherwise."""
    path, journal = _file_of(url)
    if path is not None:
        return f"{'journal' if journal else 'sqlite'}:{path.resolve()}"
    scheme, _, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if at:
        user = creds.partition(":")[0]
        return f"{scheme}://{user}@{host}"
    return url


def _check_file(path: Path, journal: bool) -> None:
    """Refuse an existing non-empty file that is not the kind of storage its name says, before
    Optuna appends to it or writes tables into it."""
    if not path.exists() or path.stat().st_size == 0:
        return
    if path.is_dir():
        raise UserError(f"--storage {path} is a directory: pass a file path")
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    if journal:
        first = head.split(b"\n", 1)[0]
        try:
            ok = "op_code" in json.loads(first)
        except (ValueError, TypeError):
            ok = False
        if not ok:
            raise UserError(
                f"storage {path} cannot be opened as an Optuna journal file (its first line is "
                "not a journal entry): move the file aside or pass --storage with another path"
            )
    elif not head.startswith(_SQLITE_MAGIC):
        raise UserError(
            f"storage {path} cannot be opened as an Optuna storage (not an SQLite database): "
            "move the file aside or pass --storage with another path"
        )


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage from a URL (sqlite://, postgresql://, mysql://) or a file path
    (`*.log`/`*.jsonl`/`*.journal`: a journal file for several workers; anything else: SQLite).
    An existing file of the wrong kind is refused, unchanged."""
    path, journal = _file_of(url)
    if path is not None:
        _check_file(path, journal)
        path.parent.mkdir(parents=True, exist_ok=True)
    if journal and path is not None:
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    if "://" not in url:
        url = f"sqlite:///{path}"
    if url.startswith("sqlite:///"):
        _sqlite_wal()
    try:
        return optuna.storages.RDBStorage(url, skip_compatibility_check=False)
    except Exception as e:  # sqlalchemy raises many types for a bad file or URL
        first = str(e).splitlines()[0][:160]
        raise UserError(
            f"storage {url} cannot be opened as an Optuna storage ({first}): "
            "move the file aside or pass --storage with another path"
        ) from None


def _sqlite_on_connect(dbapi_conn: object, _record: object) -> None:
    import sqlite3

    if isinstance(dbapi_conn, sqlite3.Connection):
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()


def _sqlite_wal() -> None:
    """SQLite in WAL mode with synchronous=NORMAL: a commit survives the process being killed
    (only an OS crash can lose the last one), without an fsync per write, which made the
    storage most of the tuner's own time; readers in other processes are not blocked."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "connect", _sqlite_on_connect):
        event.listen(Engine, "connect", _sqlite_on_connect)


@contextlib.contextmanager
def study_lock(url: str, study: str) -> Iterator[bool]:
    """An exclusive lock of one study on a file storage (held across processes of this host
    and of hosts sharing the file system); yields True. For server storages (PostgreSQL,
    MySQL) yields False without locking: their workers count and enqueue best-effort."""
    path, _ = _file_of(url)
    if path is None:
        yield False
        return
    with locked(path.with_name(f"{path.name}.{study}")):
        yield True


# --------------------------------------------------------------------------------------------
# Records in the storage
# --------------------------------------------------------------------------------------------


def record_of(t: optuna.trial.FrozenTrial) -> TrialRecord | None:
    d = t.user_attrs.get(RECORD_ATTR)
    if not isinstance(d, dict):
        return None
    try:
        return TrialRecord.from_dict(d)
    except ValueError:
        return None


def store_record(study: optuna.Study, trial_id: int, rec: TrialRecord) -> None:
    """Keep the whole record in the trial's user attrs, with the few attrs users filter on."""
    from tuner.study.view import LINE_KEY, line_entry

    s = study._storage
    d = rec.to_dict()
    s.set_trial_user_attr(trial_id, RECORD_ATTR, {**d, LINE_KEY: line_entry(d)})
    for k in ("status", "reason", "train_parallel", "source"):
        s.set_trial_user_attr(trial_id, k, str(getattr(rec, k)))


def state_for(status: Status) -> optuna.trial.TrialState:
    """Optuna's state of a trial that ended with `status`."""
    if status is Status.OK:
        return optuna.trial.TrialState.COMPLETE
    if status in (Status.PRUNED_INVALID, Status.PRUNED_OOM, Status.PRUNED_SLOW):
        return optuna.trial.TrialState.PRUNED
    return optuna.trial.TrialState.FAIL


NOT_COUNTED = frozenset({Status.PRUNED_INVALID, Status.PRUNED_OOM, Status.INTERRUPTED})
"""Statuses that do not count against --trials: nothing was launched, or it was cut off."""


def alive(worker: str) -> bool:
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname():
        return True  # another host's worker: not ours to reclaim
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def running_elsewhere(study: optuna.Study, locked_: bool) -> list[optuna.trial.FrozenTrial]:
    """RUNNING trials whose worker is alive (this host) or on another host."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = str(t.user_attrs.get("worker", ""))
        if worker and alive(worker):
            out.append(t)
        elif not worker and not locked_:
            out.append(t)  # asked by a worker not yet marked: count it to be safe
    return out


RERUN_ORIGIN = "re-run of interrupted trial "
"""Origin (user attr and CSV column) of a trial enqueued to re-run an interrupted one; the
interrupted trial's number follows."""


def enqueue_rerun(study: optuna.Study, t: optuna.trial.FrozenTrial) -> bool:
    """Enqueue the params of the interrupted trial `t` once more, so its candidate is measured
    after all. Not `skip_if_exists`: Optuna would skip it, as params of an existing (failed)
    trial. Once: not if a re-run of `t` is already in the study, not for a trial that was
    itself a re-run (a candidate that kills its worker is not retried forever), not for a
    trial killed before it sampled anything. Call under the study lock. True if enqueued."""
    if not t.params or str(t.user_attrs.get("origin", "")).startswith(RERUN_ORIGIN):
        return False
    origin = f"{RERUN_ORIGIN}{t.number}"
    if any(o.user_attrs.get("origin") == origin for o in study.get_trials(deepcopy=False)):
        return False
    study.enqueue_trial(dict(t.params), user_attrs={"origin": origin})
    return True


def reclaim_interrupted(
    study: optuna.Study, make_interrupted: Any, locked_: bool
) -> list[TrialRecord]:
    """Close the trials left RUNNING by a killed worker of this host: with the record it
    stored, if it stored one (killed between record and tell), else as an INTERRUPTED record
    (Optuna FAIL; it does not count against --trials) and its params enqueued once more
    (`enqueue_rerun`). Under the study lock a RUNNING trial with no worker yet was asked by a
    killed process too (ask and mark happen under the lock).
    `make_interrupted(trial) -> TrialRecord` builds the record of the latter."""
    out: list[TrialRecord] = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = str(t.user_attrs.get("worker", ""))
        if (worker and alive(worker)) or (not worker and not locked_):
            continue
        rec = record_of(t)
        rerun = rec is None
        if rec is None:
            rec = make_interrupted(t)
            store_record(study, t._trial_id, rec)
        state = state_for(rec.status)
        value = rec.tokens_per_s_per_gpu if state is optuna.trial.TrialState.COMPLETE else None
        if state is optuna.trial.TrialState.COMPLETE and value is None:
            state = optuna.trial.TrialState.FAIL
        study.tell(t.number, value, state=state)
        if rerun:
            enqueue_rerun(study, t)
        out.append(rec)
    return out
