"""The Optuna storage: opening it (refusing files that are not storages), naming it, locking it,
the trial records it keeps (the source of truth; the CSV is a view of them), and the trials of
dead workers (reclaimed on this host at once, on any host by Optuna's heartbeat)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import socket
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import optuna

from tuner.errors import UserError
from tuner.results import Status, TrialRecord, TrialResult, locked
from tuner.space import current_params

JOURNAL_SUFFIXES = (".log", ".jsonl", ".journal")
"""A --storage path with one of these suffixes is an Optuna journal file (several workers)."""
RECORD_ATTR = "record"
"""The trial user attr holding the TrialRecord (`to_dict()`, JSON)."""
RECIPES_ATTR = "recipes"
"""Study user attr: {trial number: recipe path} of the recipes written for the best rows."""
REREAD_ATTR = "reread"
"""Study user attr: the measured values `tune reread` read later from finished trials' own logs
(Optuna keeps a finished trial's user attrs as they were): {trial number: [{"fields": {field:
value}, "from": the log, relative to the results folder, "parser": what read it}, ...]}, one
entry per reread that filled something. `stored_record` lays them over the trial's record."""
REREAD_EXTRA = "reread"
"""`extra` key of a record with values filled by `tune reread`: their fields, comma-separated."""
FINISHED = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
    optuna.trial.TrialState.FAIL,
)
"""The states of a trial that ended (with a record, or interrupted)."""
WORKER = f"{socket.gethostname()}:{os.getpid()}"
"""This process, as the `worker` user attr of the trials it runs."""
_SQLITE_MAGIC = b"SQLite format 3\x00"
HEARTBEAT_S = 10
"""A running trial's worker records Optuna's heartbeat this often (RDB storages: SQLite,
PostgreSQL, MySQL)."""
GRACE_S = 60
"""A RUNNING trial whose heartbeat is older than this is failed by any worker of the study
(Optuna's `fail_stale_trials`) and its candidate re-run once: a worker that died on another
host, or one whose process this host can no longer tell apart (a reused pid)."""
JOURNAL_LOCK_GRACE_S = 5
"""A journal file's append lock (Optuna's `JournalFileOpenLock`, held for one write) that has
not changed for this long was left by a killed worker and is broken."""


def file_of(url: str) -> tuple[Path | None, bool]:
    """(the storage file, is it a journal) for a path or sqlite:/// URL; (None, False) else."""
    if "://" not in url:
        path = Path(url)
        return path, path.suffix in JOURNAL_SUFFIXES
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///")), False
    return None, False


def storage_label(url: str, results_dir: Path | None = None) -> str:
    """The storage's name as leaderboards record it: a file storage inside `results_dir` by its
    path relative to that folder (`sqlite:studies.sqlite3`), so the folder resumes wherever it
    is moved, renamed, copied or mounted; any other file by its absolute path
    (`journal:/shared/x.log`); a server's URL without its password. `label_url` reads it
    back."""
    path, journal = file_of(url)
    if path is not None:
        full = path.resolve()
        if results_dir is not None and full.is_relative_to(folder := results_dir.resolve()):
            full = full.relative_to(folder)
        return f"{'journal' if journal else 'sqlite'}:{full}"
    scheme, _, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if at:
        user = creds.partition(":")[0]
        return f"{scheme}://{user}@{host}"
    return url


def label_file(label: str, results_dir: Path) -> tuple[str, Path | None]:
    """(`sqlite` or `journal`, its file) of a file storage's `storage_label`, a relative one
    taken from `results_dir` (the folder of the leaderboard that records it); ("", None) for
    a server's URL."""
    kind, colon, rest = label.partition(":")
    if kind not in ("sqlite", "journal") or not colon or not rest or rest.startswith("//"):
        return "", None
    path = Path(rest)
    return kind, path if path.is_absolute() else results_dir / path


def label_url(label: str, results_dir: Path) -> str:
    """The URL or path `open_storage` takes for a leaderboard's `storage` cell (`storage_label`;
    relative to `results_dir`, the leaderboard's folder); a server's URL as it is."""
    kind, path = label_file(label, results_dir)
    if path is None:
        return label
    return f"sqlite:///{path}" if kind == "sqlite" else str(path)


def same_storage(recorded: str, label: str, results_dir: Path) -> bool:
    """Whether a leaderboard row's `storage` cell (`recorded`) names the storage `label` of a
    study writing that leaderboard in `results_dir`: the same name, or the same file; or, as
    versions before relative names recorded it, an absolute path that is no longer there
    ending in `label`'s path inside the results folder (the folder was moved or renamed with
    its storage in it)."""
    if recorded == label:
        return True
    kind, was = label_file(recorded, results_dir)
    kind_now, now = label_file(label, results_dir)
    if was is None or now is None or kind != kind_now:
        return False
    if was.resolve() == now.resolve():
        return True
    inside = Path(label.partition(":")[2])
    if inside.is_absolute() or not Path(recorded.partition(":")[2]).is_absolute():
        return False
    return not was.exists() and was.parts[-len(inside.parts) :] == inside.parts


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
        why = journal_damage(path)
        if why:
            raise UserError(
                f"storage {path} cannot be opened as an Optuna journal file ({why}): move the "
                "file aside or pass --storage with another path"
            )
    elif not head.startswith(_SQLITE_MAGIC):
        raise UserError(
            f"storage {path} cannot be opened as an Optuna storage (not an SQLite database): "
            "move the file aside or pass --storage with another path"
        )
    else:
        tables = sqlite_tables(path)
        if tables and not tables >= OPTUNA_TABLES:
            shown = ", ".join(sorted(tables)[:4]) + (", ..." if len(tables) > 4 else "")
            raise UserError(
                f"storage {path} is another application's SQLite database (tables {shown}), "
                "not an Optuna storage; Optuna would add its tables to it: pass --storage with "
                "a new file"
            )


def journal_damage(path: Path) -> str:
    """Why the journal file `path` is not one Optuna can replay, or "": each whole line must be
    a JSON object with an integer `op_code` and a `worker_id`, and Optuna's own replay of them
    must pass (an unknown `op_code`, an entry missing a field Optuna reads). A last line
    without its newline is a write cut short: Optuna skips it, and the next writer sets it
    aside (`_TornTailLock`). Optuna itself stops with a KeyError or a TypeError on the first
    such line, at any later read."""
    lines = _CheckedLines(path)
    try:
        optuna.storages.JournalStorage(lines)  # replays every line it is handed
    except Exception as e:  # Optuna's replay: KeyError, TypeError, AssertionError, ...
        return f"{_which(lines.number)} is an entry Optuna cannot replay: {type(e).__name__} {e}"
    return lines.why


def _which(number: int) -> str:
    return "its first line" if number == 1 else f"line {number}"


class _CheckedLines(optuna.storages.journal.BaseJournalBackend):
    """The whole lines of a journal file, each checked before Optuna's replay is handed it; a
    read-only backend for `journal_damage`. `number`: the line handed out last; `why`: what
    stopped the reading early, or ""."""

    def __init__(self, path: Path) -> None:
        self.path, self.number, self.why = path, 0, ""

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        with open(self.path, "rb") as f:
            for number, line in enumerate(f, start=1):
                if number <= log_number_from:
                    continue
                if not line.endswith(b"\n"):
                    return  # a write cut short: Optuna skips it
                self.number = number
                try:
                    entry = json.loads(line.decode())
                except (ValueError, UnicodeDecodeError):
                    entry = None
                op = entry.get("op_code") if isinstance(entry, dict) else None
                if not isinstance(entry, dict) or type(op) is not int:
                    self.why = f"{_which(number)} is not a journal entry"
                    return
                if not isinstance(entry.get("worker_id"), str):
                    self.why = f"{_which(number)} has no worker_id"
                    return
                yield entry

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        raise RuntimeError("journal_damage only reads")


OPTUNA_TABLES = frozenset({"studies", "trials", "version_info"})
"""Tables every Optuna RDB storage has: an SQLite file with tables but not these is another
application's."""


def sqlite_tables(path: Path) -> set[str]:
    """The table names of the SQLite file `path`, read without writing to it or beside it
    (`immutable`: no lock, no -wal/-shm file); empty if it cannot be read so (a file Optuna
    then reports on, or whose tables sit in a write-ahead log not yet checkpointed)."""
    import sqlite3
    from urllib.parse import quote

    uri = f"file:{quote(str(path.absolute()))}?mode=ro&immutable=1"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except sqlite3.Error:
        return set()
    return {str(r[0]) for r in rows}


StaleCallback = Callable[[optuna.Study, optuna.trial.FrozenTrial], None]


def open_storage(url: str, on_stale: StaleCallback | None = None) -> optuna.storages.BaseStorage:
    """An Optuna storage from a URL (sqlite://, postgresql://, mysql://) or a file path
    (`*.log`/`*.jsonl`/`*.journal`: a journal file for several workers; anything else: SQLite).
    An existing file of the wrong kind is refused, unchanged.

    With `on_stale`, an RDB storage has Optuna's heartbeat on (`HEARTBEAT_S`, `GRACE_S`) and
    calls `on_stale(study, trial)` for each trial `fail_stale_trials` fails (a study's
    workers; readers pass none). Optuna's journal storage has no heartbeat."""
    path, journal = file_of(url)
    if path is not None:
        _check_file(path, journal)
        path.parent.mkdir(parents=True, exist_ok=True)
    if journal and path is not None:
        return _journal(path)
    if "://" not in url:
        url = f"sqlite:///{path}"
    if url.startswith("sqlite:///"):
        _sqlite_wal()
    try:
        # workers starting together on a new SQLite file or PostgreSQL database: one creates
        # the tables, the others wait for it (unserialized, the others died with "table
        # studies already exists", or a duplicate key in PostgreSQL's catalog)
        serial: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        if path is not None:
            serial = locked(path)
        elif _postgres(url):
            serial = _advisory_lock(url, "verl-tuner: Optuna's tables")
        with serial, warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                driver_url(url),
                skip_compatibility_check=False,
                heartbeat_interval=HEARTBEAT_S if on_stale else None,
                grace_period=GRACE_S if on_stale else None,
                heartbeat_stale_trial_callback=on_stale,
            )
    except Exception as e:  # sqlalchemy raises many types for a bad file or URL
        text = " ".join(str(e).split())
        if "compatible with the table schema" in text:  # Optuna's whole sentence says what to do
            raise UserError(f"storage {url}: {text}") from None
        missing = _missing_driver(e)
        if missing:
            raise UserError(f"storage {url} needs {missing}") from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]  # not the SQL below it
        fix = (
            "move the file aside or pass --storage with another path"
            if path is not None
            else "check that the server is up and the URL's user, host, port and database, "
            "or pass --storage with another"
        )
        raise UserError(
            f"storage {url} cannot be opened as an Optuna storage ({first}): {fix}"
        ) from None


POSTGRES_EXTRA = "verl-tuner[postgres]"
"""The extra that installs the PostgreSQL driver (psycopg 3) a postgresql:// storage needs."""
_DRIVERS = {
    "psycopg": f"the PostgreSQL driver psycopg 3: pip install '{POSTGRES_EXTRA}'",
    "psycopg2": "the PostgreSQL driver psycopg2: pip install psycopg2-binary (or pip install "
    f"'{POSTGRES_EXTRA}' and write postgresql://)",
    "MySQLdb": "the MySQL driver mysqlclient: pip install mysqlclient (or pip install pymysql "
    "and write mysql+pymysql://)",
    "pymysql": "the MySQL driver PyMySQL: pip install pymysql",
}
"""What a server storage needs, by the module SQLAlchemy failed to import for it."""


def driver_url(url: str) -> str:
    """The URL SQLAlchemy opens for `url`: `postgresql://` with psycopg 3 where psycopg2 (its
    default) is not installed (the `postgres` extra installs psycopg 3); any other as it is."""
    import importlib.util

    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg2") is None:
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return url


def _missing_driver(e: BaseException) -> str:
    """What to install for the server storage whose driver `e` (an ImportError in its chain,
    Optuna's over SQLAlchemy's) says is missing; "" for any other error."""
    seen: BaseException | None = e
    for _ in range(8):
        if seen is None:
            return ""
        if isinstance(seen, ImportError) and seen.name:
            module = seen.name.partition(".")[0]
            return _DRIVERS.get(module, f"the Python package {module}: pip install {module}")
        seen = seen.__cause__ or seen.__context__
    return ""


def close_storage(storage: optuna.storages.BaseStorage) -> None:
    """Close a storage's connections now, not when the process exits: an SQLite file in WAL
    mode then folds its -wal file back and removes it (with the -shm file). For a command that
    opened the storage for one job (`tune reread`)."""
    remove = getattr(storage, "remove_session", None)  # RDBStorage's
    if callable(remove):
        remove()
    engine = getattr(storage, "engine", None)  # RDBStorage's SQLAlchemy engine
    if engine is not None:
        engine.dispose()


def _journal(path: Path) -> optuna.storages.BaseStorage:
    """A journal file storage whose append lock a killed worker cannot leave for long, and
    whose last line cut short does not spoil the next append (`_TornTailLock`).

    Optuna's default lock is a symbolic link to the journal's path as given: for a relative
    path (`--storage results/x.log`) the link dangles, and a link left by a kill -9 was never
    broken (the waiter spun for good); with an absolute path it was broken after 30 s. The
    lock here is a file named by the absolute path, broken after `JOURNAL_LOCK_GRACE_S`; a
    dangling link left by the old lock is removed (no live worker can hold one)."""
    from optuna.storages.journal import JournalFileBackend

    full = str(path.resolve())
    lock = Path(full + ".lock")
    if lock.is_symlink() and not lock.exists():
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
    backend = JournalFileBackend(full, _TornTailLock(Path(full), JOURNAL_LOCK_GRACE_S))
    return optuna.storages.JournalStorage(backend)


class _TornTailLock(optuna.storages.journal.JournalFileOpenLock):
    """Optuna's append lock of a journal file (`JournalFileOpenLock`, held for one append),
    which, once held, sets aside a last line cut short (`set_aside_torn_tail`) before the
    append writes after it.

    A write cut short (the disk full, a file-size limit, a kill between Optuna's write and its
    flush) leaves a last line without its newline; Optuna's reader skips it, but its next
    append went on after it, making one line of the two that no reader can parse: that run
    stopped with a JSONDecodeError and every later one refused the file. Under the lock no
    other worker is mid-append, so such a line is a dead writer's."""

    def __init__(self, journal: Path, grace_period: int) -> None:
        super().__init__(str(journal), grace_period)
        self.journal = journal

    def acquire(self) -> bool:
        got = super().acquire()
        try:
            set_aside_torn_tail(self.journal)
        except BaseException:
            self.release()
            raise
        return got


TORN_SUFFIX = ".torn-"
"""A journal's last line cut short is kept in `<journal>.torn-<offset>`, its byte offset in the
journal (`set_aside_torn_tail`)."""


def set_aside_torn_tail(journal: Path) -> Path | None:
    """Move the journal's last line, if a write cut it short (no newline), to a file beside it
    (`TORN_SUFFIX`): the file is kept whole first, then the journal truncated to its complete
    lines, each of which a resume keeps; says where on stderr, in one line. Returns that file,
    or None when the journal ends with a whole line. Call under the journal's append lock."""
    from tuner.fileio import write_atomic

    with open(journal, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        start = pos = size
        while pos > 0:  # back to the last newline
            step = min(pos, 1 << 16)
            pos -= step
            f.seek(pos)
            i = f.read(step).rfind(b"\n")
            if i >= 0:
                start = pos + i + 1
                break
        else:
            start = 0
        f.seek(start)
        tail = f.read()
        aside = journal.with_name(f"{journal.name}{TORN_SUFFIX}{start}")
        for n in itertools.count(2):  # an earlier tail cut at the same offset stays too
            try:
                write_atomic(aside, tail, exclusive=True)
                break
            except FileExistsError:
                aside = journal.with_name(f"{journal.name}{TORN_SUFFIX}{start}-{n}")
        f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
    print(
        f"tune: storage {journal}: its last line was cut short (a write that did not finish: a "
        f"full disk or a killed worker); its {len(tail)} bytes are set aside in {aside} and the "
        "study goes on from every complete entry before it",
        file=sys.stderr,
    )
    return aside


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
    """An exclusive lock of one study, held across processes and hosts; yields True. A file
    storage's is a file lock beside it (hosts sharing the file system); a PostgreSQL storage's
    a session advisory lock on its server (`_advisory_lock`), which the server releases when a
    killed worker's connection ends. Other servers (MySQL) yield False without locking: their
    workers count and enqueue best-effort."""
    path, _ = file_of(url)
    if path is not None:
        with locked(path.with_name(f"{path.name}.{study}")):
            yield True
    elif _postgres(url):
        with _advisory_lock(url, f"verl-tuner study {study}"):
            yield True
    else:
        yield False


_LOCK_ENGINES: dict[str, Any] = {}
"""SQLAlchemy engines of this process's `_advisory_lock`s, by storage URL (a pool each)."""


def _postgres(url: str) -> bool:
    return url.partition("://")[0].partition("+")[0] == "postgresql"


@contextlib.contextmanager
def _advisory_lock(url: str, name: str) -> Iterator[None]:
    """PostgreSQL's session advisory lock named `name` (its key: the name's 8-byte BLAKE2b),
    on a connection of its own, held for the block; the server releases it if the process
    dies."""
    import hashlib

    import sqlalchemy

    engine = _LOCK_ENGINES.get(url)
    if engine is None:
        engine = _LOCK_ENGINES[url] = sqlalchemy.create_engine(
            driver_url(url), pool_size=1, pool_pre_ping=True
        )
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    key = int.from_bytes(digest, "big", signed=True)
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": key})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": key})
            conn.commit()


# --------------------------------------------------------------------------------------------
# Records in the storage
# --------------------------------------------------------------------------------------------


def reread_overlay(study: optuna.Study) -> dict[str, Any]:
    """The study's values filled by `tune reread` (`REREAD_ATTR`), by trial number (text)."""
    got = study.user_attrs.get(REREAD_ATTR)
    return got if isinstance(got, dict) else {}


def stored_record(
    t: optuna.trial.FrozenTrial, overlay: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The record dict the trial keeps (`RECORD_ATTR`, `TrialRecord.to_dict()`), with the values
    `tune reread` read later from its own log (`overlay`: the study's `reread_overlay`) where
    the record has none; a value the record holds is never replaced. Such a record names the
    filled fields in its `extra` (`REREAD_EXTRA`) and loses its formatted CSV line, which
    predates them. None when the trial keeps no record. Every reader of a stored record reads
    it through here."""
    d = t.user_attrs.get(RECORD_ATTR)
    if not isinstance(d, dict):
        return None
    fills = (overlay or {}).get(str(t.number))
    if not isinstance(fills, list):
        return d
    from tuner.study.view import LINE_KEY

    out = {k: v for k, v in d.items() if k != LINE_KEY}
    filled: list[str] = []
    for fill in fills:
        values = fill.get("fields") if isinstance(fill, dict) else None
        for k, v in (values or {}).items():
            if out.get(k) is None and v is not None:
                out[k] = v
                filled.append(k)
    if not filled:
        return d
    extra = out.get("extra")
    out["extra"] = {**(extra if isinstance(extra, dict) else {}), REREAD_EXTRA: ",".join(filled)}
    return out


def record_of(
    t: optuna.trial.FrozenTrial, overlay: Mapping[str, Any] | None = None
) -> TrialRecord | None:
    """The trial's record (`stored_record`: with the values `tune reread` filled), or None."""
    d = stored_record(t, overlay)
    if d is None:
        return None
    try:
        return TrialRecord.from_dict(d)
    except ValueError:
        return None


def store_record(trial: optuna.Trial, rec: TrialRecord) -> None:
    """Keep the whole record in the trial's user attrs, with the few attrs users filter on."""
    from tuner.study.view import LINE_KEY, line_entry

    d = rec.to_dict()
    trial.set_user_attr(RECORD_ATTR, {**d, LINE_KEY: line_entry(d)})
    for k in ("status", "reason", "train_parallel", "source"):
        trial.set_user_attr(k, str(getattr(rec, k)))


def state_for(status: Status) -> optuna.trial.TrialState:
    """Optuna's state of a trial that ended with `status`."""
    if status is Status.OK:
        return optuna.trial.TrialState.COMPLETE
    if status in (Status.PRUNED_INVALID, Status.PRUNED_OOM, Status.PRUNED_SLOW):
        return optuna.trial.TrialState.PRUNED
    return optuna.trial.TrialState.FAIL


def told(res: TrialResult) -> tuple[float | None, optuna.trial.TrialState]:
    """What Optuna is told of a trial that gave `res`: its value and state (an ok result
    without a value is a failure)."""
    state = state_for(res.status)
    value = res.value if state is optuna.trial.TrialState.COMPLETE else None
    if state is optuna.trial.TrialState.COMPLETE and value is None:
        state = optuna.trial.TrialState.FAIL
    return value, state


NOT_COUNTED = frozenset({Status.PRUNED_INVALID, Status.PRUNED_OOM, Status.INTERRUPTED})
"""Statuses that do not count against --trials: nothing was launched, or it was cut off."""


def alive(worker: str) -> bool:
    """Whether the worker `host:pid` may still run: False only for a process of this host that
    has exited (or is a zombie its parent has not reaped yet)."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname():
        return True  # another host's worker: its heartbeat tells
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def running_elsewhere(
    trials: Iterable[optuna.trial.FrozenTrial], locked_: bool
) -> list[optuna.trial.FrozenTrial]:
    """Of `trials`, the RUNNING ones whose worker is alive (this host) or on another host.
    Pass the same read of the study as the finished trials are counted from: a trial another
    worker told between two reads is then either counted or running, not neither (the study
    went past --trials when a second read here missed a trial the first saw running)."""
    out = []
    for t in trials:
        if t.state is not optuna.trial.TrialState.RUNNING:
            continue
        worker = str(t.user_attrs.get("worker", ""))
        if worker and alive(worker):
            out.append(t)
        elif not worker and not locked_:
            out.append(t)  # asked by a worker not yet marked: count it to be safe
    return out


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
