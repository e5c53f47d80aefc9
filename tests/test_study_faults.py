"""Fault injection: a real `tune` process killed with SIGKILL at seeded random moments; the
rerun's CSV must be exactly the view of the storage, every finished trial once."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import optuna

from tuner.results import TrialRecord, read_raw
from tuner.study.storage import RECORD_ATTR

CMD = [
    sys.executable,
    "-m",
    "tuner.cli",
    "--model",
    "qwen2.5-7b",
    "--gpus",
    "8",
    "--no-progress",
]
STUDY = "qwen2.5-7b-h100x8-estimate"
UNCOUNTED = {"pruned-invalid", "pruned-oom-predicted", "interrupted"}


def _check_csv_is_the_storage_view(workdir: Path) -> list[dict[str, str]]:
    rows = read_raw(workdir / "results" / f"{STUDY}.csv")
    numbers = [int(r["trial"]) for r in rows]
    assert numbers == sorted(set(numbers)), "a trial twice or out of order"
    study = optuna.load_study(
        study_name=STUDY, storage=f"sqlite:///{workdir / 'results' / 'studies.sqlite3'}"
    )
    states = optuna.trial.TrialState
    assert not study.get_trials(states=(states.RUNNING,)), "a trial left running"
    finished = [t for t in study.trials if t.state.is_finished()]
    assert [t.number for t in finished] == numbers
    by_number = {int(r["trial"]): r for r in rows}
    for t in finished:
        row = TrialRecord.from_dict(t.user_attrs[RECORD_ATTR]).to_row()
        got = by_number[t.number]
        assert {k: v for k, v in row.items() if k != "recipe"} == {
            k: v for k, v in got.items() if k != "recipe"
        }
        # Optuna's state agrees with the row: nothing interrupted is counted as done
        if got["status"] == "ok":
            assert t.state is states.COMPLETE
        elif got["status"] == "interrupted":
            assert t.state is states.FAIL
    return rows


def test_sigkill_at_random_moments_then_rerun(workdir: Path) -> None:
    rng = random.Random(1234)
    csv_path = workdir / "results" / f"{STUDY}.csv"
    killed_with_rows = []
    for _ in range(3):
        start = len(read_raw(csv_path)) if csv_path.exists() else 0
        more = rng.randint(1, 6)  # kill after a few more trials, at a random moment
        proc = subprocess.Popen(
            [*CMD, "--trials", "5000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if csv_path.exists() and len(read_raw(csv_path)) >= start + more:
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))
        proc.kill()
        proc.wait()
        killed_with_rows.append(len(read_raw(csv_path)))
    assert killed_with_rows[-1] > killed_with_rows[0] > 0
    have = (
        len([r for r in read_raw(csv_path) if r["status"] not in UNCOUNTED])
        if (csv_path.exists())
        else 0
    )
    total = have + 3
    done = subprocess.run(
        [*CMD, "--trials", str(total)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = _check_csv_is_the_storage_view(workdir)
    assert len([r for r in rows if r["status"] not in UNCOUNTED]) == total
