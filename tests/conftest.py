"""Shared fixtures: every test runs in its own working directory (results/, recipes/ land there)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ANCHORS = Path(__file__).resolve().parent / "data" / "anchors"
"""The reference leaderboards (copies of the published ones, in the repository, so a clean clone
runs every test that reads them)."""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def anchors() -> Path:
    return ANCHORS


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("OPTUNA_WARN_EXPERIMENTAL", "0")


POSTGRES_ENV = "VT_POSTGRES_URL"
"""A PostgreSQL server's URL (`.ci/run` starts one and sets it); the tests that run on a
storage server each get a fresh database on it (`postgres_url`), skipped where it is not set."""


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """The URL of a new, empty database on the server `POSTGRES_ENV` names, dropped after the
    test (with the connections left to it); skipped where no server is named."""
    server = os.environ.get(POSTGRES_ENV, "")
    if not server:
        pytest.skip(f"{POSTGRES_ENV} is not set: no PostgreSQL server (.ci/run starts one)")
    import psycopg  # the postgres extra's driver: with a server named, it must be there
    from sqlalchemy.engine import make_url

    name = f"vt_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
