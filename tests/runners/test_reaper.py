"""tuner.runners.reaper: a launch's process group ends when the tune process that launched it
dies, even by SIGKILL (which no handler of tune's can see), and the launcher still sees the
launch's own exit status. Real processes throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tuner.runners.process import run_process


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(cond, seconds: float) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_a_launch_and_what_it_started_end_when_tune_is_killed(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # the launch writes its pid and its background child's, then waits on the child
    launch = f"echo $$ > {pids}.tmp; sleep 300 & echo $! >> {pids}.tmp; mv {pids}.tmp {pids}; wait"
    tune = textwrap.dedent(
        f"""
        from pathlib import Path
        from tuner.runners.process import run_process
        run_process(["sh", "-c", {launch!r}], log_path=Path({str(tmp_path / "log")!r}),
                    timeout_s=300)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", tune], cwd=Path(__file__).parents[2])
    try:
        assert wait_for(pids.exists, 30), "the launch never started"
        launched = [int(x) for x in pids.read_text().split()]
        assert all(alive(p) for p in launched)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_for(lambda: not any(alive(p) for p in launched), 15), (
            "the launch outlived the tune process that started it"
        )
    finally:
        parent.kill()
        parent.wait()
        if pids.exists():
            for p in (int(x) for x in pids.read_text().split()):
                if alive(p):
                    os.kill(p, signal.SIGKILL)


def test_the_launcher_sees_the_launch_s_exit_status(tmp_path: Path) -> None:
    log = tmp_path / "log"
    assert run_process(["sh", "-c", "exit 3"], log_path=log, timeout_s=30).returncode == 3
    killed = run_process(["sh", "-c", "kill -TERM $$"], log_path=log, timeout_s=30)
    assert killed.returncode == -signal.SIGTERM
    # SIGINT only where it is not ignored here already (a background job's is, and sh's with it)
    sigs = [signal.SIGKILL]
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        sigs.append(signal.SIGINT)
    for sig in sigs:
        res = run_process(["sh", "-c", f"kill -{sig.name[3:]} $$"], log_path=log, timeout_s=30)
        assert res.returncode == -sig
    timed = run_process(["sleep", "30"], log_path=log, timeout_s=1)
    assert timed.timed_out and timed.duration_s < 15
