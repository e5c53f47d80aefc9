"""Shared fixtures: every test runs in its own working directory (results/, recipes/ land there)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ANCHORS = Path(__file__).resolve().parents[2] / "shared" / "anchors"
"""The reference leaderboards, beside the checkout (../shared/anchors), as on CI."""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def anchors() -> Path:
    if not ANCHORS.is_dir():
        pytest.skip(f"reference leaderboards not found at {ANCHORS}")
    return ANCHORS


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("OPTUNA_WARN_EXPERIMENTAL", "0")
