"""One Ray cluster on this node for a whole study (`tune run --launcher local --shared-ray`).

Without it each trial's verl driver starts a Ray instance of its own (`RAY_ADDRESS=local`,
launchers.local.LOCAL_RAY_ENV) and stops it at its end: every launch pays Ray's start (about 5 s
on the H100 hosts: results/tail4k-h100-x2/trials/*/log-clock.csv, "Started a local Ray
instance" 5-6 s after the driver's first line of Ray). With it the study starts one head,
`ray start --head --block` in a process group of its own led by the reaper (it ends when `tune`
dies, even by SIGKILL), and each trial's driver joins it through `RAY_ADDRESS`: verl 0.9.1's
main_ppo calls `ray.init()` with no address (trainer/main_ppo.py, run_ppo), which joins the
cluster RAY_ADDRESS names.

The environment: a worker of a joined cluster inherits the head's environment, not the driver's
(verl forwards only its own PPO_RAY_RUNTIME_ENV keys, and drops those the driver's environment
already sets: trainer/constants_ppo.py, get_ppo_ray_runtime_env). So the head starts with the
job's environment, and a job whose environment differs gets a new head; the verl runner keeps
the jobs' environment the study's (`--verl-env`, the preflight's, the compile cache's) and
passes each trial's whole environment as verl's job runtime env as well (runners.verl,
PER_TRIAL_ENV), which reaches every worker of the job. The trials of a study
run one at a time; a trial killed on its timeout leaves no actor behind (verl's actors are not
detached: single_controller/ray/base.py, RayResourcePool(detached=False)), Ray ends them when
their driver goes."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from tuner.errors import UserError
from tuner.runners.process import reaped

START_TIMEOUT_S = 120.0
"""How long the head may take to say it started (`Ray runtime started.`)."""
STARTED = "Ray runtime started."
"""What `ray start` prints once the head node runs (ray/scripts/scripts.py, start)."""
STOP_GRACE_S = 15.0
ADDRESS_FILE = "ray_current_cluster"
"""Where `ray start` writes the GCS address in its temp folder."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RayHead:
    """The study's Ray head on this node; `driver_env(env)` starts it (or starts it again for
    another environment) and says how to join it; `stop()` ends it."""

    def __init__(self, python: str, *, log_dir: Path | None = None):
        self.python = python
        self.log_dir = log_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._env: dict[str, str] | None = None
        self._address = ""
        self._temp: str | None = None
        self._auth: dict[str, str] = {}
        self.starts = 0
        """Heads started so far (a changed environment starts another)."""

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def driver_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """What a driver needs to join the head started with `env` over this process's
        environment (started, or started again for another environment, here): RAY_ADDRESS, the
        head's GCS as `ip:port`, and its authentication."""
        wanted = dict(env)
        if not (self.running and self._env == wanted):
            self.stop()
            self._start(wanted)
        return {"RAY_ADDRESS": self._address, **self._auth}

    def _start(self, env: dict[str, str]) -> None:
        port = free_port()
        # a short folder: Ray's unix sockets live under it (107 bytes at most on Linux)
        self._temp = tempfile.mkdtemp(prefix="vt-ray-", dir="/tmp")
        cmd = [
            self.python,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--head",
            "--block",
            f"--port={port}",
            f"--temp-dir={self._temp}",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ]
        log_dir = Path(self.log_dir or self._temp)
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / "ray-head.log"
        # Ray 2.60's `ray start` turns token authentication on (RAY_AUTH_MODE unset) with a
        # token its drivers must hold (ray/_private/authentication/authentication_token_setup.py):
        # a token of the head's own, passed to the drivers it serves (never to a row or recipe)
        self._auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        full_env = {**os.environ, **env, **self._auth}
        full_env.pop("RAY_ADDRESS", None)
        full_env.pop("RAY_AUTH_TOKEN_PATH", None)
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                reaped(cmd),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while STARTED not in log_path.read_text(errors="replace"):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
                self.stop(keep_files=True)  # the log the message names
                raise UserError(
                    "--shared-ray: the study's Ray head did not start "
                    f"({tail[0][:160] if tail else 'no output'}; log {log_path}): "
                    "leave --shared-ray out to let each trial start its own"
                )
            time.sleep(0.2)
        # the GCS address as the head wrote it (ray/_common/utils.py, get_ray_address_file): Ray
        # names the node by its own IP, which a driver must use (it canonicalizes 127.0.0.1)
        written = Path(self._temp, ADDRESS_FILE)
        self._env = env
        self._address = written.read_text().strip() if written.is_file() else f"127.0.0.1:{port}"
        self.starts += 1

    def stop(self, keep_files: bool = False) -> None:
        """End the head and everything it started, then its files: SIGTERM to its process
        group, and after STOP_GRACE_S SIGKILL to every process left that names the head's temp
        folder on its command line (the group's, and those Ray starts outside it, such as its
        autoscaler monitor)."""
        proc, temp = self._proc, self._temp
        self._proc = self._env = self._temp = None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_GRACE_S)
        if temp is not None:
            _kill_named(temp)
            if not keep_files:
                shutil.rmtree(temp, ignore_errors=True)
        if proc is not None:
            proc.wait()  # reaped (it named the temp folder: killed above if it was left)


def _named(text: str) -> list[int]:
    """This host's processes whose command line holds `text` (from /proc; [] without it)."""
    found = []
    with contextlib.suppress(OSError):
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if text.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
    return found


def _kill_named(text: str, wait_s: float = STOP_GRACE_S) -> None:
    """SIGKILL every process whose command line holds `text`, and wait until none is left."""
    deadline = time.monotonic() + wait_s
    while (pids := _named(text)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
