"""Run the job as a subprocess on this node: verl starts a Ray instance of its own, or joins the
study's (`shared_ray`: launchers.ray_head)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tuner.errors import UserError
from tuner.runners.launchers.base import Job, Launcher, LaunchResult
from tuner.runners.launchers.ray_head import RayHead
from tuner.runners.process import Launch, run_process

LOCAL_RAY_ENV = {"RAY_ADDRESS": "local"}
"""verl's `ray.init()` would join a Ray instance already running on this node (found through
/tmp/ray/ray_current_cluster), where the job's environment does not reach the workers; `local`
makes it start its own, whose workers inherit this environment."""


def count_local_gpus() -> int:
    """NVIDIA GPUs on this node, as `nvidia-smi -L` lists them (0 without nvidia-smi)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if out.returncode != 0:
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


class LocalLauncher(Launcher):
    name = "local"

    def __init__(
        self,
        launch: Launch = run_process,
        *,
        shared_ray: bool = False,
        python: str | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self._launch = launch
        self._head = RayHead(python or sys.executable, log_dir=log_dir) if shared_ray else None
        """One Ray head for all the jobs, which each job's driver joins (`shared_ray`)."""

    @property
    def shared_ray(self) -> bool:
        return self._head is not None

    def ray_env(self, job: Job) -> dict[str, str]:
        """How the job's driver finds Ray: the study's head where it is shared (started with the
        job's environment; its address and token), else `local` (LOCAL_RAY_ENV)."""
        if self._head is None:
            return dict(LOCAL_RAY_ENV)
        return self._head.driver_env(job.env)

    def launch(self, job: Job) -> LaunchResult:
        if job.nnodes > 1:
            raise ValueError(f"the local launcher runs one node, the job needs {job.nnodes}")
        cmd = list(job.cmd)
        if job.prologue:
            cmd = ["bash", "-c", f"{job.prologue}; exec {shlex.join(cmd)}"]
        res = self._launch(
            cmd,
            log_path=job.log_path,
            timeout_s=job.timeout_s,
            env={**self.ray_env(job), **job.env},
            cwd=job.workdir,
        )
        return LaunchResult(
            returncode=res.returncode,
            timed_out=res.timed_out,
            duration_s=res.duration_s,
            log_path=res.log_path,
            state="timeout" if res.timed_out else f"exit {res.returncode}",
        )

    def gpus_visible(self) -> int | None:
        return count_local_gpus()

    def close(self) -> None:
        if self._head is not None:
            self._head.stop()

    def check(self, gpus: int, nnodes: int) -> None:
        if nnodes > 1:
            raise UserError(
                f"--launcher local runs on this node only, and --gpus {gpus} needs {nnodes} "
                "nodes: use --launcher ray (--ray-address) or --launcher slurm"
            )
        super().check(gpus, nnodes)

    def more_gpus_hint(self) -> str:
        return "lower --gpus, or use --launcher ray or slurm to reach more GPUs"
