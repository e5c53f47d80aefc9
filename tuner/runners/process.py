"""Starting processes with a timeout, output to a log file, and a structured result.

The launcher is injectable: runners take a `launch` callable, the real one by default, and tests
pass one that runs a real small program."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
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

    def tail(self, n_bytes: int = 20_000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n_bytes))
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""


Launch = Callable[..., ProcessResult]


def run_process(
    cmd: Sequence[str],
    *,
    log_path: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ProcessResult:
    """Run `cmd` in its own process group, stdout+stderr to `log_path`; on timeout the whole
    group gets SIGTERM, then SIGKILL 10 s later."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    start = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out, rc = True, None
            _kill_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _kill_group(proc, signal.SIGKILL)
                proc.wait()
        except BaseException:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
            raise
    return ProcessResult(
        returncode=rc, timed_out=timed_out, duration_s=time.monotonic() - start, log_path=log_path
    )


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
