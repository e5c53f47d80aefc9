"""Starting processes with a timeout, output to a log file, and a structured result.

The launcher is injectable: runners take a `launch` callable, the real one by default, and tests
pass one that runs a real small program."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True, slots=True)
class ProcessResult:
    returncode: int | None
    """Exit code; None when it was killed for the timeout."""
    timed_out: bool
    duration_s: float
    log_path: Path
    stopped: bool = False
    """Ended early because `poll` asked for it (not a timeout)."""
    started_pool: bool = False
    """A worker pool was started for this run (its start-up is in `duration_s`)."""

    def tail(self, n_bytes: int = 20_000) -> str:
        return log_tail(self.log_path, n_bytes)


def log_tail(path: str | Path, n_bytes: int) -> str:
    """The last `n_bytes` of a log as text ('' where it cannot be read): the one tail reader of
    the runners' logs."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


Launch = Callable[..., ProcessResult]

REAPER = Path(__file__).with_name("reaper.py")


def reaped(cmd: Sequence[str]) -> list[str]:
    """`cmd` led by tuner.runners.reaper: started in a process group of its own (the caller's
    start_new_session), the group ends when this process dies, even by SIGKILL, instead of
    holding the GPUs beside a resumed study's launches."""
    return [sys.executable, str(REAPER), str(os.getpid()), *cmd]


def run_process(
    cmd: Sequence[str],
    *,
    log_path: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    poll: Callable[[], bool] | None = None,
    poll_s: float = 1.0,
) -> ProcessResult:
    """Run `cmd` in its own process group, stdout+stderr to `log_path`; on timeout the whole
    group gets SIGTERM, then SIGKILL 10 s later. `poll`, called every `poll_s` while it runs,
    returning True stops it the same way (`stopped`). The group ends with this process
    (`reaped`)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            reaped(cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
        stopped = timed_out = False
        rc: int | None = None
        try:
            while True:
                left = timeout_s - (time.monotonic() - start)
                if left <= 0:
                    timed_out = True
                    break
                try:
                    rc = proc.wait(timeout=min(left, poll_s) if poll else left)
                    break
                except subprocess.TimeoutExpired:
                    if poll is not None and poll():
                        stopped = True
                        break
            if rc is None:
                stop_group(proc)
        except BaseException:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
            raise
    return ProcessResult(
        returncode=rc,
        timed_out=timed_out,
        duration_s=time.monotonic() - start,
        log_path=log_path,
        stopped=stopped,
    )


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group, SIGKILL 10 s later if it is still there."""
    _kill_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _kill_group(proc, signal.SIGKILL)
        proc.wait()


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
