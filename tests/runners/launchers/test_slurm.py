"""The Slurm launcher with stand-ins: sbatch, squeue, sacct and scancel are small real scripts on
PATH that record their arguments and play a job's life from a state file. The batch script is
checked with `bash -n` and then run with stand-ins for scontrol, srun, ray and python3, so its
Ray bring-up and command line are exercised, not just parsed."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.runners.launchers import Job, SlurmLauncher

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

RECORD = """#!/usr/bin/env bash
printf '%s\\n' "$(basename "$0") $*" >> "$STANDIN_DIR/calls.log"
"""


def standin(bin_dir: Path, name: str, body: str) -> None:
    exe = bin_dir / name
    exe.write_text(RECORD + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sbatch/squeue/sacct/scancel stand-ins. squeue prints the next line of `queue` (one
    state per poll; empty once the job has left); sacct prints the `final` file."""
    d = tmp_path / "slurm"
    (d / "bin").mkdir(parents=True)
    standin(d / "bin", "sbatch", 'cp "${@: -1}" "$STANDIN_DIR/submitted.sh"\necho "4242;cluster"\n')
    standin(
        d / "bin",
        "squeue",
        'state=$(head -n 1 "$STANDIN_DIR/queue" 2>/dev/null)\n'
        'sed -i 1d "$STANDIN_DIR/queue" 2>/dev/null\n'
        '[ -s "$STANDIN_DIR/cancelled" ] && exit 0\n'
        'echo "$state"\n',
    )
    standin(d / "bin", "sacct", 'cat "$STANDIN_DIR/final"\n')
    standin(d / "bin", "scancel", 'echo "$1" > "$STANDIN_DIR/cancelled"\n')
    monkeypatch.setenv("STANDIN_DIR", str(d))
    monkeypatch.setenv("PATH", f"{d / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return d


def job(tmp_path: Path, timeout_s: float = 60.0, nnodes: int = 2) -> Job:
    return Job(
        name="verl-tuner-t7",
        cmd=["python3", "-m", "verl.trainer.main_ppo", "trainer.nnodes=2", "data.x=a b"],
        env={"VERL_FILE_LOGGER_ROOT": str(tmp_path / "trial"), "HYDRA_FULL_ERROR": "1"},
        log_path=tmp_path / "trial" / "verl.log",
        timeout_s=timeout_s,
        nnodes=nnodes,
        gpus_per_node=8,
        prologue="echo probe",
        workdir=tmp_path / "trial",
    )


def launcher(**kw: object) -> SlurmLauncher:
    return SlurmLauncher(
        partition="h100",
        account="rl",
        sbatch_args=("--qos=high",),
        setup="source /shared/venv/bin/activate",
        poll_s=0.05,
        cancel_grace_s=2,
        **kw,  # type: ignore[arg-type]
    )


def calls(d: Path) -> list[str]:
    return (d / "calls.log").read_text().splitlines()


def test_script_is_valid_bash_with_the_request(tmp_path: Path) -> None:
    text = launcher().render(job(tmp_path))
    script = tmp_path / "s.sh"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=h100",
        "#SBATCH --account=rl",
        "#SBATCH --qos=high",
        "#SBATCH --exclusive",
        f"#SBATCH --output={tmp_path / 'trial' / 'verl.log'}",
        "#SBATCH --time=11",  # 60 s trial + 10 min margin, in minutes
        "source /shared/venv/bin/activate",
        "python3 -m verl.trainer.main_ppo trainer.nnodes=2 'data.x=a b'",
    ):
        assert line in text.splitlines(), line


def test_script_brings_up_ray_and_runs_the_command(tmp_path: Path) -> None:
    """Run the rendered script with stand-ins for the cluster's tools (two nodes)."""
    d = tmp_path / "cluster"
    (d / "bin").mkdir(parents=True)
    standin(d / "bin", "scontrol", 'printf "gpu-a\\ngpu-b\\n"\n')
    standin(d / "bin", "hostname", 'echo "10.0.0.1 fe80::1"\n')
    standin(d / "bin", "srun", 'shift 4; "$@"\n')  # drop --nodes --ntasks -w node; run the rest
    standin(d / "bin", "ray", "exit 0\n")
    argv_dump = f"{sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\""
    standin(d / "bin", "python3", f'[ "$1" = - ] && exit 0\n{argv_dump}\nexit 3\n')
    j = job(tmp_path)
    j.log_path.parent.mkdir()
    text = launcher().render(j).replace("sleep 10", "true")
    script = tmp_path / "s.sh"
    script.write_text(text.replace("source /shared/venv/bin/activate", ":"))
    env = {**os.environ, "STANDIN_DIR": str(d), "PATH": f"{d / 'bin'}{os.pathsep}/usr/bin:/bin"}
    env["SLURM_JOB_NODELIST"], env["SLURM_JOB_ID"] = "gpu-[a-b]", "4242"
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert out.returncode == 3, out.stderr  # the command's exit code is the job's
    assert json.loads(out.stdout.splitlines()[-2]) == list(j.cmd[1:])
    assert "verl-tuner: job 4242 on gpu-a gpu-b, Ray head 10.0.0.1:6379" in out.stdout
    log = calls(d)
    assert "srun --nodes=1 --ntasks=1 -w gpu-a hostname --ip-address" in log
    heads = [c for c in log if c.startswith("ray start --head")]
    assert heads == ["ray start --head --node-ip-address=10.0.0.1 --port=6379 --num-gpus=8 --block"]
    assert "ray start --address=10.0.0.1:6379 --num-gpus=8 --block" in log
    assert any(c.startswith("python3 - 10.0.0.1:6379 16 ") for c in log)  # waits for 16 GPUs


def test_completed_job(slurm: Path, tmp_path: Path) -> None:
    (slurm / "queue").write_text("PENDING\nRUNNING\nRUNNING\n")
    (slurm / "final").write_text("COMPLETED|0:0\n")
    res = launcher().launch(job(tmp_path))
    assert (res.returncode, res.timed_out, res.state, res.job_id) == (0, False, "COMPLETED", "4242")
    log = calls(slurm)
    assert log[0] == f"sbatch --parsable {tmp_path / 'trial' / 'slurm_job.sh'}"
    assert "squeue -h -j 4242 -o %T" in log
    assert "sacct -j 4242 -X -n -P -o State,ExitCode" in log
    assert not any(c.startswith("scancel") for c in log)
    assert (slurm / "submitted.sh").read_text().startswith("#!/usr/bin/env bash")


def test_failed_job_keeps_its_exit_code(slurm: Path, tmp_path: Path) -> None:
    (slurm / "queue").write_text("RUNNING\n")
    (slurm / "final").write_text("FAILED|2:0\n")
    res = launcher().launch(job(tmp_path))
    assert (res.returncode, res.state, res.timed_out) == (2, "FAILED", False)


def test_out_of_memory_state_without_exit_code(slurm: Path, tmp_path: Path) -> None:
    (slurm / "queue").write_text("RUNNING\n")
    (slurm / "final").write_text("OUT_OF_MEMORY|0:125\n")
    res = launcher().launch(job(tmp_path))
    assert res.state == "OUT_OF_MEMORY" and res.returncode == 128 + 125


def test_timeout_cancels_the_job(slurm: Path, tmp_path: Path) -> None:
    (slurm / "queue").write_text("PENDING\n" * 3 + "RUNNING\n" * 400)
    (slurm / "final").write_text("CANCELLED by 0|0:15\n")
    res = launcher().launch(job(tmp_path, timeout_s=0.3))
    assert res.timed_out and res.returncode is None
    assert "scancel 4242" in calls(slurm)
    assert res.queued_s > 0


def test_sbatch_refusal_is_a_result(slurm: Path, tmp_path: Path) -> None:
    standin(slurm / "bin", "sbatch", 'echo "sbatch: error: invalid partition" >&2\nexit 1\n')
    res = launcher().launch(job(tmp_path))
    assert res.returncode is None and not res.timed_out
    assert "invalid partition" in res.state
    assert "invalid partition" in (tmp_path / "trial" / "verl.log").read_text()
