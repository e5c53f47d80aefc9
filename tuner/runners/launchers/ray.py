"""Submit the job to an existing Ray cluster through the Ray Jobs API (the dashboard address,
`http://<head>:8265`), poll it, fetch its logs, and stop it past the timeout.

The job's driver runs on the head node; verl's `ray.init()` there joins the cluster, and the
environment passed as the job's `runtime_env.env_vars` reaches every worker. Paths in the command
(model, data, the trial folder) must mean the same on the cluster's nodes (a shared filesystem)."""

from __future__ import annotations

import contextlib
import shlex
import time
import uuid
from collections.abc import Callable
from typing import Any

from tuner.errors import UserError
from tuner.fileio import write_atomic
from tuner.runners.launchers.base import Job, Launcher, LaunchResult

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def dashboard_url(address: str) -> str:
    """`head:8265` or `http://head:8265` -> the Jobs API URL."""
    address = address.strip().rstrip("/")
    if address.startswith("ray://"):
        raise UserError(
            f"--ray-address {address} is a Ray Client address: pass the dashboard address "
            "(http://<head>:8265), which the Ray Jobs API uses"
        )
    return address if "://" in address else f"http://{address}"


def entrypoint(job: Job) -> str:
    """The job's shell command line (Ray runs entrypoints through a shell)."""
    cmd = shlex.join(job.cmd)
    return f"{job.prologue}; {cmd}" if job.prologue else cmd


class RayLauncher(Launcher):
    name = "ray"

    def __init__(
        self,
        address: str,
        *,
        poll_s: float = 2.0,
        log_every_s: float = 30.0,
        stop_grace_s: float = 60.0,
        max_pending_s: float | None = None,
        client_factory: Callable[[str], Any] | None = None,
    ) -> None:
        self.address = dashboard_url(address)
        self.poll_s = poll_s
        self.log_every_s = log_every_s
        self.stop_grace_s = stop_grace_s
        self.max_pending_s = max_pending_s
        """How long a job may wait for the cluster before it is stopped (default: its timeout)."""
        self._client_factory = client_factory
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            try:
                if self._client_factory is not None:
                    self._client = self._client_factory(self.address)
                else:
                    from ray.job_submission import JobSubmissionClient

                    self._client = JobSubmissionClient(self.address)
            except ImportError:
                raise UserError(
                    "--launcher ray needs ray: pip install 'verl-tuner[verl]'"
                ) from None
            except Exception as e:  # ConnectionError, RuntimeError from the SDK
                first = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
                raise UserError(
                    f"cannot reach the Ray Jobs API at {self.address} ({first}): start the "
                    "cluster's head with its dashboard, or fix --ray-address"
                ) from None
        return self._client

    def gpus_visible(self) -> int | None:
        """GPUs of the cluster's live nodes (the resources `ray.cluster_resources()` counts), read
        through the dashboard's state API, so only the Jobs address is needed."""
        self.client()
        from ray.util.state import list_nodes

        try:
            nodes = list_nodes(address=self.address, detail=True, raise_on_missing_output=False)
        except Exception as e:
            raise UserError(
                f"cannot list the nodes of the Ray cluster at {self.address}: {e}"
            ) from None
        return int(
            sum(
                (n.resources_total or {}).get("GPU", 0)
                for n in nodes
                if str(getattr(n, "state", "")) == "ALIVE"
            )
        )

    def more_gpus_hint(self) -> str:
        return f"add GPU nodes to the Ray cluster at {self.address} or lower --gpus"

    def launch(self, job: Job) -> LaunchResult:
        client = self.client()
        sid = f"{job.name}-{uuid.uuid4().hex[:8]}"
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            client.submit_job(
                entrypoint=entrypoint(job),
                submission_id=sid,
                runtime_env={"env_vars": dict(job.env)},
                metadata={"submitted_by": "verl-tuner", "job": job.name},
            )
        except Exception as e:
            job.log_path.write_text(f"verl-tuner: submitting to {self.address} failed: {e}\n")
            return LaunchResult(
                returncode=None,
                timed_out=False,
                duration_s=0.0,
                log_path=job.log_path,
                job_id=sid,
                state="SUBMIT_FAILED",
            )
        max_pending = self.max_pending_s if self.max_pending_s is not None else job.timeout_s
        submitted = time.monotonic()
        started: float | None = None
        last_log = submitted
        timed_out = False
        status = "PENDING"
        while True:
            status = str(self._status(client, sid))
            now = time.monotonic()
            if status in TERMINAL:
                break
            if status == "RUNNING" and started is None:
                started = now
            over = (
                now - started > job.timeout_s
                if started is not None
                else now - submitted > max_pending
            )
            if over:
                timed_out = True
                status = self._stop(client, sid)
                break
            if now - last_log > self.log_every_s:
                self._save_logs(client, sid, job)
                last_log = now
            time.sleep(self.poll_s)
        end = time.monotonic()
        self._save_logs(client, sid, job)
        returncode: int | None = None
        if not timed_out:
            info = self._info(client, sid)
            code = getattr(info, "driver_exit_code", None)
            returncode = 0 if status == "SUCCEEDED" else (int(code) if code is not None else 1)
            if status == "STOPPED":
                returncode = None
        t0 = started if started is not None else end
        return LaunchResult(
            returncode=returncode,
            timed_out=timed_out,
            duration_s=end - t0,
            log_path=job.log_path,
            job_id=sid,
            state=status,
            queued_s=t0 - submitted,
        )

    @staticmethod
    def _status(client: Any, sid: str) -> str:
        st = client.get_job_status(sid)
        return str(getattr(st, "value", st))

    @staticmethod
    def _info(client: Any, sid: str) -> Any:
        with contextlib.suppress(Exception):
            return client.get_job_info(sid)
        return None

    def _stop(self, client: Any, sid: str) -> str:
        with contextlib.suppress(Exception):
            client.stop_job(sid)
        deadline = time.monotonic() + self.stop_grace_s
        status = "STOPPING"
        while time.monotonic() < deadline:
            status = self._status(client, sid)
            if status in TERMINAL:
                break
            time.sleep(self.poll_s)
        return status

    @staticmethod
    def _save_logs(client: Any, sid: str, job: Job) -> None:
        with contextlib.suppress(Exception):
            text = client.get_job_logs(sid)
            write_atomic(job.log_path, text)
