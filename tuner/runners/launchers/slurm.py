"""Run the job under Slurm: render a batch script that starts Ray on the allocation's nodes and
runs the command on the first one, submit it with `sbatch`, poll `squeue`/`sacct`, and `scancel`
it past the timeout. The log is the batch script's `--output` file, so the trial folder must be
on a filesystem the nodes share (as Slurm sites have)."""

from __future__ import annotations

import contextlib
import math
import shlex
import subprocess
import time
from collections.abc import Sequence

from tuner.errors import UserError
from tuner.runners.launchers.base import Job, Launcher, LaunchResult

RAY_PORT = 6379
RAY_WAIT_S = 600
"""How long the script waits for every node's GPUs to join the Ray cluster."""
TIME_MARGIN_S = 600
"""Added to the trial timeout for `#SBATCH --time`, so Slurm ends a job the tuner lost."""
DONE_OK = ("COMPLETED",)
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")

_WAIT_FOR_GPUS = """\
python3 - "$RAY_ADDRESS" "{gpus}" "{wait_s}" <<'PY'
import sys, time
import ray
address, want, wait_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
start = time.time()
while True:
    try:
        ray.init(address=address, logging_level="ERROR")
        break
    except Exception as e:
        if time.time() - start > wait_s:
            sys.exit(f"verl-tuner: no Ray head at {{address}} after {{wait_s:.0f}} s: {{e}}")
        time.sleep(5)
while (have := ray.cluster_resources().get("GPU", 0)) < want:
    if time.time() - start > wait_s:
        sys.exit(f"verl-tuner: Ray sees {{have:.0f}} of {{want:.0f}} GPUs after {{wait_s:.0f}} s")
    time.sleep(5)
print(f"verl-tuner: Ray cluster up with {{have:.0f}} GPUs", flush=True)
ray.shutdown()
PY"""


class SlurmLauncher(Launcher):
    name = "slurm"

    def __init__(
        self,
        *,
        partition: str | None = None,
        account: str | None = None,
        cpus_per_node: int | None = None,
        exclusive: bool = True,
        sbatch_args: Sequence[str] = (),
        setup: str = "",
        poll_s: float = 10.0,
        cancel_grace_s: float = 120.0,
        max_pending_s: float | None = None,
    ) -> None:
        self.partition = partition
        self.account = account
        self.cpus_per_node = cpus_per_node
        self.exclusive = exclusive
        self.sbatch_args = tuple(sbatch_args)
        """Extra `#SBATCH` options, e.g. `--qos=high`, `--constraint=h100`."""
        self.setup = setup
        """Shell lines run first on the batch node (and inherited by `srun`): module loads, a
        virtualenv's activate, exports."""
        self.poll_s = poll_s
        self.cancel_grace_s = cancel_grace_s
        self.max_pending_s = max_pending_s
        """Cancel a job that waits longer than this in the queue (default: wait)."""

    # ----------------------------------------------------------------------------------------
    # The script
    # ----------------------------------------------------------------------------------------

    def render(self, job: Job) -> str:
        """The batch script for `job` (bash; checked with `bash -n` by the tests)."""
        minutes = math.ceil((job.timeout_s + TIME_MARGIN_S) / 60)
        gpn = job.gpus_per_node
        opts = [
            f"--job-name={job.name}",
            f"--nodes={job.nnodes}",
            "--ntasks-per-node=1",
            f"--time={minutes}",
            f"--output={job.log_path}",
            f"--error={job.log_path}",
        ]
        if gpn:
            opts.append(f"--gpus-per-node={gpn}")
        if self.cpus_per_node:
            opts.append(f"--cpus-per-task={self.cpus_per_node}")
        if self.exclusive:
            opts.append("--exclusive")
        if self.partition:
            opts.append(f"--partition={self.partition}")
        if self.account:
            opts.append(f"--account={self.account}")
        opts += list(self.sbatch_args)
        gpus_flag = f" --num-gpus={gpn}" if gpn else ""
        cpus_flag = f" --num-cpus={self.cpus_per_node}" if self.cpus_per_node else ""
        lines = [
            "#!/usr/bin/env bash",
            *[f"#SBATCH {o}" for o in opts],
            "# Written by verl-tuner: starts Ray on every node of the allocation, then runs one",
            "# trial's command on the first node.",
            "set -euo pipefail",
        ]
        if self.setup:
            lines += ["", "# --- setup (--slurm-setup) ---", self.setup.rstrip(), ""]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in job.env.items()]
        lines += [
            'mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
            'head_node="${nodes[0]}"',
            'head_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address '
            "| awk '{print $1}')",
            f'export RAY_ADDRESS="$head_ip:{RAY_PORT}"',
            'echo "verl-tuner: job $SLURM_JOB_ID on ${nodes[*]}, Ray head $RAY_ADDRESS"',
            'srun --nodes=1 --ntasks=1 -w "$head_node" ray start --head '
            f'--node-ip-address="$head_ip" --port={RAY_PORT}{gpus_flag}{cpus_flag} --block &',
            "sleep 10",
            'for node in "${nodes[@]:1}"; do',
            '    srun --nodes=1 --ntasks=1 -w "$node" ray start --address="$RAY_ADDRESS"'
            f"{gpus_flag}{cpus_flag} --block &",
            "done",
            _WAIT_FOR_GPUS.format(gpus=gpn * job.nnodes, wait_s=RAY_WAIT_S),
        ]
        if job.prologue:
            lines.append(job.prologue)
        if job.workdir is not None:
            lines.append(f"cd {shlex.quote(str(job.workdir))}")
        lines += [
            "set +e",
            shlex.join(job.cmd),
            "rc=$?",
            'echo "verl-tuner: command exited with $rc"',
            "exit $rc",
            "",
        ]
        return "\n".join(lines)

    # ----------------------------------------------------------------------------------------
    # Submit, poll, cancel
    # ----------------------------------------------------------------------------------------

    def launch(self, job: Job) -> LaunchResult:
        folder = job.workdir or job.log_path.parent
        folder.mkdir(parents=True, exist_ok=True)
        job.log_path.parent.mkdir(parents=True, exist_ok=True)
        script = folder / "slurm_job.sh"
        script.write_text(self.render(job))
        try:
            out = _run(["sbatch", "--parsable", str(script)])
        except (OSError, subprocess.SubprocessError) as e:
            return self._not_run(job, f"sbatch failed: {e}")
        if out.returncode != 0:
            return self._not_run(job, f"sbatch failed: {out.stderr.strip() or out.stdout.strip()}")
        job_id = out.stdout.strip().split(";")[0]
        submitted = time.monotonic()
        started: float | None = None
        timed_out = False
        while True:
            state = self._queue_state(job_id)
            now = time.monotonic()
            if state is None:
                break
            if state == "RUNNING" and started is None:
                started = now
            running_too_long = started is not None and now - started > job.timeout_s
            queued_too_long = (
                started is None
                and self.max_pending_s is not None
                and now - submitted > self.max_pending_s
            )
            if running_too_long or queued_too_long:
                timed_out = True
                self._cancel(job_id)
                break
            time.sleep(self.poll_s)
        end = time.monotonic()
        final, code = self._final_state(job_id)
        t0 = started if started is not None else end
        returncode = None if timed_out else code
        return LaunchResult(
            returncode=returncode,
            timed_out=timed_out,
            duration_s=end - t0,
            log_path=job.log_path,
            job_id=job_id,
            state=final,
            queued_s=t0 - submitted,
        )

    def check(self, gpus: int, nnodes: int) -> None:
        """A Slurm allocation is granted when the job starts: trust the request."""
        return None

    @staticmethod
    def _not_run(job: Job, why: str) -> LaunchResult:
        job.log_path.write_text(f"verl-tuner: {why}\n")
        return LaunchResult(
            returncode=None, timed_out=False, duration_s=0.0, log_path=job.log_path, state=why
        )

    @staticmethod
    def _queue_state(job_id: str) -> str | None:
        """The job's state while squeue lists it; None once it has left the queue."""
        try:
            out = _run(["squeue", "-h", "-j", job_id, "-o", "%T"])
        except (OSError, subprocess.SubprocessError):
            return "UNKNOWN"
        state = out.stdout.strip().split("\n")[0].strip() if out.returncode == 0 else ""
        if not state:
            return None
        return state if state in ACTIVE else None

    def _final_state(self, job_id: str) -> tuple[str, int | None]:
        """sacct's State and the exit code (accounting can lag the queue: retried briefly)."""
        for _ in range(6):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                out = _run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode"])
                line = out.stdout.strip().split("\n")[0].strip()
                if out.returncode == 0 and "|" in line:
                    state, _, exit_code = line.partition("|")
                    state = state.split()[0]
                    code, _, signal = exit_code.partition(":")
                    if state in DONE_OK:
                        return state, 0
                    if state in ACTIVE:
                        time.sleep(self.poll_s)
                        continue
                    rc = int(code) if code.isdigit() and int(code) else None
                    if rc is None and signal.isdigit() and int(signal):
                        rc = 128 + int(signal)
                    return state, rc if rc is not None else 1
            time.sleep(min(self.poll_s, 5.0))
        return "UNKNOWN", None

    def _cancel(self, job_id: str) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            _run(["scancel", job_id])
        deadline = time.monotonic() + self.cancel_grace_s
        while time.monotonic() < deadline and self._queue_state(job_id) is not None:
            time.sleep(self.poll_s)


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def require_slurm() -> None:
    """Raise a UserError when sbatch is not on PATH."""
    import shutil

    if shutil.which("sbatch") is None:
        raise UserError(
            "--launcher slurm needs sbatch on PATH: run the tuner on a Slurm login node"
        )
