"""Several `tune` workers on one journal storage, and on a PostgreSQL server (where
VT_POSTGRES_URL names one): --trials is the total over all of them and the warm start is
enqueued once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tuner.results import read_raw
from tuner.study import open_storage

STUDY = "qwen2.5-7b-h100x8-estimate"
UNCOUNTED = {"pruned-invalid", "pruned-oom-predicted", "interrupted"}


@pytest.mark.parametrize("kind", ["journal", "postgresql"])
def test_three_workers_share_the_trial_budget_and_one_warm_start(
    workdir: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    storage = str(workdir / "results" / "study.journal")
    if kind == "postgresql":
        storage = str(request.getfixturevalue("postgres_url"))
    cmd = [
        sys.executable,
        "-m",
        "tuner.cli",
        "--model",
        "qwen2.5-7b",
        "--gpus",
        "8",
        "--no-progress",
        "--storage",
        storage,
        "--trials",
        "12",
    ]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    study = optuna.load_study(study_name=STUDY, storage=open_storage(storage))
    finished = [t for t in study.trials if t.state.is_finished()]
    counted = [t for t in finished if t.user_attrs.get("status") not in UNCOUNTED]
    assert len(counted) == 12
    assert {str(t.user_attrs["worker"]) for t in finished} and len(
        {str(t.user_attrs["worker"]) for t in finished}
    ) >= 2
    enqueued = study.user_attrs["warm_start_enqueued"]
    with_origin = [t for t in study.trials if t.user_attrs.get("origin")]
    assert len(with_origin) == enqueued  # enqueued once, not once per worker
    keys = [tuple(sorted(t.params.items())) for t in with_origin if t.params]
    assert len(keys) == len(set(keys))
    rows = read_raw(workdir / "results" / f"{STUDY}.csv")
    assert len([r for r in rows if r["status"] not in UNCOUNTED]) == 12
    assert sorted(int(r["trial"]) for r in rows) == sorted(t.number for t in finished)
