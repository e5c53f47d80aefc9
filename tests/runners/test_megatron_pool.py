"""The worker pool's protocol with a real small program standing in for torchrun, and progress
lines (CPU only)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tuner.runners.megatron_pool import WorkerPool
from tuner.runners.megatron_worker.protocol import (
    LEAVING,
    Progress,
    ProgressWatch,
    append_progress,
    done_path,
    read_progress,
    write_request,
)

FAKE_POOL = """
import json, os, sys, time
from pathlib import Path
from tuner.runners.megatron_worker.protocol import serve
pool = Path(sys.argv[sys.argv.index("--pool") + 1])

def handle(req):
    spec = json.loads(Path(req["spec"]).read_text())
    if spec["mode"] == "oom":
        raise MemoryError("CUDA out of memory")
    if spec["mode"] == "slow":
        for i in range(100):
            with open(req["progress"], "a") as f:
                f.write(json.dumps({"step": i, "seconds": 1.0, "tokens": 10}) + "\\n")
            if Path(req["abandon"]).exists():
                break
            time.sleep(0.05)
    Path(req["out"]).write_text(json.dumps({"status": "abandoned" if spec["mode"] == "slow"
                                            else "ok", "pid": os.getpid()}))
    return spec["mode"] != "leak"  # as _serve: memory left after teardown, the pool exits

def on_failure(e, req):
    Path(req["out"]).write_text(json.dumps({"status": "oom", "pid": os.getpid()}))
    return 3

serve(pool, handle, on_failure, poll_s=0.01)
time.sleep(0.5)  # shutting down takes a while: a request now would find no one
"""

SERVE = """
import json, os, sys
from pathlib import Path
from tuner.runners.megatron_worker.protocol import serve
pool, lead = Path(sys.argv[1]), sys.argv[2] == "lead"

def handle(req):
    spec = Path(req["spec"]).read_text()
    if spec == "fail":
        raise RuntimeError("boom")
    with open(pool / f"served-{'lead' if lead else 'other'}", "a") as f:
        f.write(spec + "\\n")
    if lead:
        Path(req["out"]).write_text(json.dumps({"status": "ok", "spec": spec}))
    return True

def on_failure(e, req):
    Path(req["out"]).write_text(json.dumps({"status": "failed", "reason": str(e)}))
    return 5

serve(pool, handle, on_failure, world=2, lead=lead, poll_s=0.01)
"""


def _files(tmp: Path, n: int, mode: str) -> dict[str, Path]:
    d = tmp / f"t{n}"
    d.mkdir()
    (d / "spec.json").write_text(json.dumps({"mode": mode}))
    return {k: d / v for k, v in
            (("spec", "spec.json"), ("out", "result.json"), ("progress", "p.jsonl"),
             ("abandon", "abandon"))}  # fmt: skip


def test_pool_serves_trials_restarts_after_a_failure_and_closes(tmp_path: Path):
    prog = tmp_path / "fake_pool.py"
    prog.write_text(FAKE_POOL)
    repo = str(Path(__file__).resolve().parents[2])
    pool = WorkerPool(tmp_path / "pool", [sys.executable, str(prog)], env={"PYTHONPATH": repo})
    pids = []
    for n, mode in enumerate(["ok", "ok", "oom", "ok"]):
        f = _files(tmp_path, n, mode)
        o = pool.run(**f, timeout_s=30)
        assert o.finished and not o.timed_out
        pids.append(json.loads(f["out"].read_text())["pid"])
        assert o.started_pool == (n in (0, 3))
    assert pids[0] == pids[1] == pids[2] != pids[3]  # reused, then a fresh pool after the OOM
    assert pool.starts == 2
    # early stop: the runner's poll says stop, the pool abandons the trial and stays up
    f = _files(tmp_path, 9, "slow")
    watch = ProgressWatch(f["progress"], 1, lambda step, tps: step >= 2)
    o = pool.run(**f, timeout_s=30, poll=watch.poll)
    assert o.finished and o.stopped and watch.stopped_at == 2 and pool.alive()
    proc = pool.proc
    pool.close()
    assert proc is not None and proc.returncode == 0 and not pool.alive()


def _pool(tmp: Path, base: str = "pool") -> WorkerPool:
    prog = tmp / "fake_pool.py"
    prog.write_text(FAKE_POOL)
    repo = str(Path(__file__).resolve().parents[2])
    return WorkerPool(tmp / base, [sys.executable, str(prog)], env={"PYTHONPATH": repo})


def test_a_pool_that_leaves_is_not_handed_the_next_trial(tmp_path: Path):
    pool = _pool(tmp_path)
    f = _files(tmp_path, 0, "leak")
    o = pool.run(**f, timeout_s=30)
    assert o.finished and not o.died and o.started_pool
    first = pool.folder
    assert (first / LEAVING).exists() and not pool.alive()
    f = _files(tmp_path, 1, "ok")
    o = pool.run(**f, timeout_s=30)
    assert o.finished and not o.died and o.started_pool and pool.starts == 2
    assert json.loads(f["out"].read_text())["status"] == "ok"
    assert pool.folder != first and not (pool.folder / LEAVING).exists()
    pool.close()


def test_a_new_pool_never_starts_in_a_used_folder(tmp_path: Path):
    # another pool on the same base (a study resumed, a world size change) left its marker
    # and files in pool.0: a new WorkerPool starts in a fresh folder and keeps serving
    (tmp_path / "pool.0").mkdir()
    (tmp_path / "pool.0" / LEAVING).touch()
    pool = _pool(tmp_path)
    pids = []
    for n in range(2):
        f = _files(tmp_path, n, "ok")
        o = pool.run(**f, timeout_s=30)
        assert o.finished and not o.died
        pids.append(json.loads(f["out"].read_text())["pid"])
    assert pool.folder == tmp_path / "pool.1" and not (pool.folder / LEAVING).exists()
    assert pids[0] == pids[1] and pool.starts == 1 and pool.alive()
    pool.close()


def test_pool_timeout_ends_the_pool(tmp_path: Path):
    prog = tmp_path / "hang.py"
    prog.write_text("import time\ntime.sleep(60)\n")
    pool = WorkerPool(tmp_path / "pool", [sys.executable, str(prog)])
    o = pool.run(**_files(tmp_path, 0, "ok"), timeout_s=1)
    assert o.timed_out and not o.finished and not pool.alive()


def test_progress_lines_skip_a_partial_line(tmp_path: Path):
    p = tmp_path / "progress.jsonl"
    append_progress(p, Progress(step=0, seconds=2.0, tokens=1600, update_actor_s=1.5))
    with open(p, "a") as f:
        f.write('{"step": 1, "sec')
    got = read_progress(p)
    assert got == [Progress(step=0, seconds=2.0, tokens=1600, update_actor_s=1.5)]
    assert got[0].tokens_per_s_per_gpu(4) == 200.0


Served = Callable[[list[str]], tuple[Path, list[subprocess.Popen[bytes]]]]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    """Starts two processes (rank 0 and another) serving `specs` as trial requests from one
    pool; whatever the test's outcome, the ones still running are killed at its end, so a
    failing test leaves no serve.py behind."""
    started: list[subprocess.Popen[bytes]] = []

    def start(specs: list[str]) -> tuple[Path, list[subprocess.Popen[bytes]]]:
        (tmp_path / "serve.py").write_text(SERVE)
        pool = tmp_path / "pool"
        pool.mkdir()
        repo = str(Path(__file__).resolve().parents[2])
        for who in ("lead", "other"):
            started.append(
                subprocess.Popen(
                    [sys.executable, str(tmp_path / "serve.py"), str(pool), who],
                    env={"PYTHONPATH": repo},
                )
            )
        for seq, text in enumerate(specs, 1):
            (tmp_path / f"spec{seq}").write_text(text)
            write_request(
                pool, seq, "trial", spec=tmp_path / f"spec{seq}", out=tmp_path / f"out{seq}"
            )
        return pool, list(started)

    try:
        yield start
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
            p.wait()


def _wait_for(done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Until `done()` holds (an AssertionError after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_serve_runs_requests_in_order_on_every_rank_until_exit(tmp_path: Path, served: Served):
    pool, procs = served(["a", "b", "c"])
    write_request(pool, 4, "exit")
    assert [p.wait(timeout=30) for p in procs] == [0, 0]
    assert (pool / "served-lead").read_text() == (pool / "served-other").read_text() == "a\nb\nc\n"
    assert [json.loads((tmp_path / f"out{i}").read_text())["spec"] for i in (1, 2, 3)] == [
        "a", "b", "c"
    ]  # fmt: skip
    assert json.loads((pool / "ready.json").read_text())["world"] == 2
    assert all(done_path(pool, seq).exists() for seq in (1, 2, 3, 4))  # the exit is done too
    assert int(done_path(pool, 1).read_text()) == procs[0].pid  # only rank 0 marks
    assert not (pool / LEAVING).exists()


def test_a_failing_request_writes_its_result_and_ends_the_process(tmp_path: Path, served: Served):
    pool, procs = served(["a", "fail", "c"])
    assert [p.wait(timeout=30) for p in procs] == [5, 5]  # the exit status on_failure gave
    assert json.loads((tmp_path / "out2").read_text()) == {"status": "failed", "reason": "boom"}
    assert (pool / "served-lead").read_text() == "a\n"  # nothing served after the failure
    assert done_path(pool, 1).exists() and not done_path(pool, 2).exists()
    assert not (tmp_path / "out3").exists()


def test_serve_waits_for_the_next_request(tmp_path: Path, served: Served):
    pool, procs = served(["a"])
    # both ranks have served request 1 (rank 0 marks it done once all have): they now wait
    served_other = pool / "served-other"
    _wait_for(
        lambda: (
            done_path(pool, 1).exists()
            and served_other.exists()
            and served_other.read_text() == "a\n"
        )
    )
    assert all(p.poll() is None for p in procs)
    (tmp_path / "spec2").write_text("b")
    write_request(pool, 2, "trial", spec=tmp_path / "spec2", out=tmp_path / "out2")
    write_request(pool, 3, "exit")
    assert [p.wait(timeout=30) for p in procs] == [0, 0]
    assert (pool / "served-other").read_text() == "a\nb\n"
