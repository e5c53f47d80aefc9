"""Locks held across a study's workers: `study_lock`, one study's exclusive lock (a file lock
beside a file storage, a PostgreSQL advisory lock on a server), under which workers count the
study's trials and enqueue; and `advisory_lock`, which `open_storage` also takes while Optuna
creates its tables in a new PostgreSQL database.

Optuna has no such lock: its storages make each single write atomic (an RDB transaction, the
journal file's append lock), not a worker's read of the study followed by its enqueue."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tuner.results import locked
from tuner.study.storage.urls import driver_url, file_of, is_postgres


@contextlib.contextmanager
def study_lock(url: str, study: str) -> Iterator[bool]:
    """An exclusive lock of one study, held across processes and hosts; yields True. A file
    storage's is a file lock beside it (hosts sharing the file system); a PostgreSQL storage's
    a session advisory lock on its server (`advisory_lock`), which the server releases when a
    killed worker's connection ends. Other servers (MySQL) yield False without locking: their
    workers count and enqueue best-effort."""
    path, _ = file_of(url)
    if path is not None:
        with locked(path.with_name(f"{path.name}.{study}")):
            yield True
    elif is_postgres(url):
        with advisory_lock(url, f"verl-tuner study {study}"):
            yield True
    else:
        yield False


_LOCK_ENGINES: dict[str, Any] = {}
"""SQLAlchemy engines of this process's `advisory_lock`s, by storage URL (a pool each)."""


@contextlib.contextmanager
def advisory_lock(url: str, name: str) -> Iterator[None]:
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
