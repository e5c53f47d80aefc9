"""Shared fixtures: every test runs in its own working directory (results/, recipes/ land there)."""

from __future__ import annotations

import os
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
