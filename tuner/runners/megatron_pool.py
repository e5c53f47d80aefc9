"""The runner's side of the worker pool: one torchrun of the worker kept up across trials.

Start-up (Python imports, CUDA context, NCCL, kernel checks) is paid once per pool instead of
once per trial; each trial is handed over as a request file (protocol in
`tuner.runners.megatron_worker.protocol`). A pool whose trial failed, timed out or was stopped
is ended (its ranks may wait in a collective for the failed one) and the next trial starts a
fresh one. `close()` asks the pool to exit and ends it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.runners.megatron_worker.protocol import LEAVING, READY, done_path, write_request
from tuner.runners.process import reaped, stop_group


@dataclass(frozen=True, kw_only=True, slots=True)
class PoolOutcome:
    """How one trial handed to the pool ended."""

    finished: bool
    """The result file appeared."""
    timed_out: bool = False
    stopped: bool = False
    """`poll` asked to stop and the workers abandoned the trial (or were ended)."""
    died: bool = False
    """The pool process ended without writing a result."""
    returncode: int | None = None
    duration_s: float = 0.0
    started_pool: bool = False
    """This trial paid for a pool start."""


class WorkerPool:
    """One torchrun of the worker in `folder` (see the module docstring)."""

    def __init__(
        self,
        folder: Path,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        poll_s: float = 0.5,
    ) -> None:
        self.base = folder
        """Each start serves from a new folder `<base>.<n>` (see `_start`)."""
        self.folder = folder
        self.command = list(command)
        self.env = dict(env or {})
        self.poll_s = poll_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.seq = 0
        self.starts = 0
        self.log_path = folder / "pool.log"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _start(self) -> None:
        """Start a pool in a folder no pool has used: a reused one could hold another pool's
        `leaving` marker, `done-*` files or requests (a second WorkerPool on the same base
        after a world size change, or a resumed study), read as this pool's."""
        self.stop()
        n = self.starts
        while True:
            folder = self.base.parent / f"{self.base.name}.{n}"
            try:
                folder.mkdir(parents=True)  # atomic: two pools never share a folder
                break
            except FileExistsError:
                n += 1
        self.folder = folder
        self.log_path = self.folder / "pool.log"
        self.seq = 0
        self.starts += 1
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                reaped([*self.command, "--pool", str(self.folder)]),
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                cwd=self.folder,
                start_new_session=True,
            )

    def run(
        self,
        *,
        spec: Path,
        out: Path,
        progress: Path,
        abandon: Path,
        timeout_s: float,
        poll: Callable[[], bool] | None = None,
    ) -> PoolOutcome:
        """Hand one trial to the pool (starting one if none is up) and wait for its result."""
        start = time.monotonic()
        started = False
        if not self.alive():
            self._start()
            started = True
        assert self.proc is not None
        self.seq += 1
        seq = self.seq
        write_request(
            self.folder, seq, "trial", spec=spec, out=out, progress=progress, abandon=abandon
        )
        stop_asked: float | None = None
        while True:
            elapsed = time.monotonic() - start
            if out.exists():
                ok = self._wait_done(seq, out)
                return PoolOutcome(
                    finished=True,
                    stopped=stop_asked is not None,
                    duration_s=elapsed,
                    started_pool=started,
                    died=not ok,
                )
            rc = self.proc.poll()
            if rc is not None:
                self.proc = None
                return PoolOutcome(
                    finished=out.exists(),
                    died=True,
                    returncode=rc,
                    duration_s=elapsed,
                    started_pool=started,
                )
            if elapsed > timeout_s or (
                stop_asked is not None and time.monotonic() - stop_asked > 60
            ):
                timed_out = stop_asked is None
                self.stop()
                return PoolOutcome(
                    finished=out.exists(),
                    timed_out=timed_out,
                    stopped=not timed_out,
                    duration_s=elapsed,
                    started_pool=started,
                )
            if stop_asked is None and poll is not None and poll():
                abandon.touch()
                stop_asked = time.monotonic()
            time.sleep(self.poll_s)

    def _wait_done(self, seq: int, out: Path, grace_s: float = 120.0) -> bool:
        """After a result: an ok (or abandoned) trial is torn down and marked done by the ranks;
        a failed trial's workers exit or hang in a collective, so the pool is ended now. True if
        the pool is ready for the next trial."""
        assert self.proc is not None
        try:
            status = json.loads(out.read_text()).get("status")
        except (OSError, ValueError):
            status = None
        if status not in ("ok", "abandoned"):
            self.stop()
            return False
        t = time.monotonic()
        while time.monotonic() - t < grace_s:
            if done_path(self.folder, seq).exists():
                if (self.folder / LEAVING).exists():
                    # the pool exits on its own after this trial (memory left behind): let it
                    # go, and the next trial starts a fresh one
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.proc.wait(timeout=60)
                    self.stop()
                    return True
                return True
            if self.proc.poll() is not None:
                self.proc = None
                return False
            time.sleep(0.05)
        self.stop()
        return False

    def ready(self) -> bool:
        return (self.folder / READY).exists()

    def stop(self) -> None:
        """End the pool's process group now."""
        if self.proc is not None:
            if self.proc.poll() is None:
                stop_group(self.proc)
            self.proc = None

    def close(self, wait_s: float = 30.0) -> None:
        """Ask the pool to exit, then end it if it has not within `wait_s`."""
        if self.alive():
            assert self.proc is not None
            self.seq += 1
            write_request(self.folder, self.seq, "exit")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait_s)
        self.stop()
