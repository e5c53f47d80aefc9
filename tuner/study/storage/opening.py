"""Opening a storage by its URL or path: an SQLite file (in WAL mode), a journal file
(journal.py), a PostgreSQL or MySQL server; a file of another kind is refused unchanged, a missing
driver named with what to install. Workers opening a new storage at once serialize Optuna's
creation of its tables. A study's workers open it with Optuna's heartbeat on (heartbeat.py)."""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import warnings
from collections.abc import Callable
from pathlib import Path

import optuna

from tuner.errors import UserError
from tuner.results import locked
from tuner.study.storage import heartbeat
from tuner.study.storage.journal import journal_damage, open_journal
from tuner.study.storage.locks import advisory_lock
from tuner.study.storage.urls import driver_url, file_of, is_postgres, normal_url

_SQLITE_MAGIC = b"SQLite format 3\x00"


def check_storage_file(path: Path, journal: bool) -> None:
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
        if tables:
            why = schema_mismatch(path)
            if why:
                raise UserError(f"storage sqlite:///{path}: {why}")


@functools.cache
def _optuna_schema() -> tuple[str, list[str], int]:
    """The schema revision this Optuna writes, every revision it knows (newest first) and its
    `version_info` schema number: those of a new in-memory storage, through Optuna's public
    API (RDBStorage.get_head_version, get_all_versions)."""
    import sqlalchemy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = optuna.storages.RDBStorage("sqlite:///:memory:")
    try:
        with fresh.engine.connect() as conn:
            number = conn.execute(sqlalchemy.text("SELECT schema_version FROM version_info"))
            schema = int(number.scalar_one())
        return fresh.get_head_version(), fresh.get_all_versions(), schema
    finally:
        fresh.engine.dispose()


def schema_mismatch(path: Path) -> str:
    """Why this Optuna cannot open the Optuna SQLite storage `path` (its schema revision is
    older or newer than this Optuna's), in Optuna's own words; "" when it can or the file
    cannot be read so. Read without writing: Optuna refuses such a storage only after it has
    stamped it (its version row, its alembic revision) and switched it to WAL."""
    import sqlite3
    from urllib.parse import quote

    uri = f"file:{quote(str(path.absolute()))}?mode=ro&immutable=1"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            info = conn.execute(
                "SELECT schema_version, library_version FROM version_info"
            ).fetchone()
            try:
                rev_row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
            except sqlite3.OperationalError:  # made before Optuna used alembic
                rev_row = None
    except sqlite3.Error:
        return ""
    head, known, schema = _optuna_schema()
    rev = str(rev_row[0]) if rev_row else None
    if rev is None:
        if info is None or info[0] == schema:
            return ""  # Optuna stamps it as its own and opens it
        rev = known[-1] if known else ""  # Optuna stamps the first revision: too old
    if rev == head:
        return ""
    made_by = info[1] if info else "an unknown version"
    text = (
        f"The runtime optuna version {importlib.metadata.version('optuna')} is no longer "
        "compatible with the "
        f"table schema (set up by optuna {made_by}). "
    )
    if rev in known:
        return text + (
            "Please execute `$ optuna storage upgrade --storage $STORAGE_URL` for upgrading the "
            "storage."
        )
    return text + "Please try updating optuna to the latest version by `$ pip install -U optuna`."


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

    With `on_stale`, an RDB storage has Optuna's heartbeat on (`heartbeat.HEARTBEAT_S` and
    `heartbeat.GRACE_S`, read at each open) and calls `on_stale(study, trial)` for each trial
    `fail_stale_trials` fails (a study's workers; readers pass none). Optuna's journal storage
    has no heartbeat."""
    url = normal_url(url)
    path, journal = file_of(url)
    if path is not None:
        check_storage_file(path, journal)
        path.parent.mkdir(parents=True, exist_ok=True)
    if journal and path is not None:
        return open_journal(path)
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
        elif is_postgres(url):
            serial = advisory_lock(url, "verl-tuner: Optuna's tables")
        with serial, warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.storages.RDBStorage(
                driver_url(url),
                skip_compatibility_check=False,
                heartbeat_interval=heartbeat.HEARTBEAT_S if on_stale else None,
                grace_period=heartbeat.GRACE_S if on_stale else None,
                heartbeat_stale_trial_callback=on_stale,
            )
    except Exception as e:  # sqlalchemy raises many types for a bad file or URL
        from tuner.cli_args.messages import storage_failure_line

        known = storage_failure_line(e, url)  # a damaged or locked file: said as such
        if known is not None:
            raise UserError(known) from None
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
