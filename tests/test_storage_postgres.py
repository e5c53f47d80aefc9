"""PostgreSQL as a storage: the message where its driver is not installed names the package,
and workers opening a new database at once all open it (on the server VT_POSTGRES_URL names;
`.ci/run` starts one). The multi-worker, kill -9 and heartbeat tests run on it too
(test_study_workers, test_study_faults, test_study_durability)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import optuna

from tuner.study.storage import open_storage, study_lock

_WITHOUT_DRIVERS = """
import sys
sys.modules["psycopg"] = sys.modules["psycopg2"] = None  # as where neither is installed
from tuner.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_postgresql_storage_without_its_driver_names_the_package(workdir: Path) -> None:
    got = subprocess.run(
        [
            sys.executable,
            "-c",
            _WITHOUT_DRIVERS,
            *("--model", "qwen2.5-7b", "--gpus", "8", "--runner", "estimate", "--no-progress"),
            *("--storage", "postgresql://tuner:secret@127.0.0.1:1/studies"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 2, got.stderr[-2000:]
    (line,) = [x for x in got.stderr.splitlines() if x.startswith("tune: error:")]
    assert line == (
        "tune: error: storage postgresql://tuner:***@127.0.0.1:1/studies needs the PostgreSQL "
        "driver psycopg 3: pip install 'verl-tuner[postgres]'"
    )
    assert "move the file aside" not in got.stderr and "secret" not in got.stderr
    assert not list(workdir.iterdir())  # nothing written


def test_workers_starting_together_on_a_new_database_all_open_it(
    workdir: Path, postgres_url: str
) -> None:
    """Several workers opening a database that has no tables yet, at the same moment: every
    one opens it (unserialized, all but one could die on a duplicate key in PostgreSQL's
    catalog as they created Optuna's tables)."""
    n = 6
    code = textwrap.dedent(
        f"""
        import pathlib, sys, time
        from tuner.study import open_storage
        pathlib.Path(f"ready-{{sys.argv[1]}}").touch()
        while len(list(pathlib.Path().glob("ready-*"))) < {n}:
            time.sleep(0.001)
        open_storage({postgres_url!r})
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(i)], stderr=subprocess.PIPE, text=True)
        for i in range(n)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-1000:]


def test_a_study_lock_on_postgresql_excludes_other_processes(
    workdir: Path, postgres_url: str
) -> None:
    """The study lock is held on the server: another process waits for it (it was no lock at
    all on a server storage, so workers counted and enqueued best-effort), and gets it once
    the holder is killed (the server ends its session)."""
    optuna.create_study(study_name="s", storage=open_storage(postgres_url))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from tuner.study.storage import study_lock\n"
            f"with study_lock({postgres_url!r}, 's') as held:\n"
            "    print(held, flush=True)\n"
            "    time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        waiter = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from tuner.study.storage import study_lock\n"
                f"with study_lock({postgres_url!r}, 's') as held:\n"
                "    print(held, flush=True)\n",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            waiter.wait(timeout=3)
            raise AssertionError("the lock was taken while another process held it")
        except subprocess.TimeoutExpired:
            pass
        with study_lock(postgres_url, "other study") as held:  # another study's: free
            assert held
        holder.kill()
        out, _ = waiter.communicate(timeout=60)
        assert waiter.returncode == 0 and out.strip() == "True"
    finally:
        holder.kill()
        holder.wait()
