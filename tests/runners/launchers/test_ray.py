"""The Ray launcher against a real Ray cluster: one local head on 127.0.0.1 with its dashboard
(the Jobs API), two CPUs and two declared GPUs, shut down when the module ends. Jobs are the
verl runner's real commands with tests/fake_verl.py standing in for main_ppo: success, crash and
timeout (the job is stopped)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tuner.errors import UserError
from tuner.hardware import Cluster, get_gpu
from tuner.results import Status
from tuner.runners.launchers import Job, RayLauncher
from tuner.runners.launchers.ray import dashboard_url
from tuner.runners.verl import VerlRunner

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray"),
]


def _helpers() -> Any:
    """tests/verl_helpers.py, loaded by path (tests/ is not a package)."""
    path = Path(__file__).resolve().parents[2] / "verl_helpers.py"
    spec = importlib.util.spec_from_file_location("verl_helpers", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


H = _helpers()
FAKE_VERL = H.FAKE_VERL


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A throwaway Ray head on loopback; yields the dashboard (Jobs API) address."""
    import ray

    ctx = ray.init(
        address="local",
        num_cpus=2,
        num_gpus=2,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=0,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield f"http://{ctx.dashboard_url}"
    finally:
        ray.shutdown()


def fast(address: str) -> RayLauncher:
    return RayLauncher(address, poll_s=0.5, log_every_s=2.0, stop_grace_s=30.0)


def test_dashboard_url() -> None:
    assert dashboard_url("head:8265") == "http://head:8265"
    assert dashboard_url("https://head:8265/") == "https://head:8265"
    with pytest.raises(UserError, match="Ray Client address"):
        dashboard_url("ray://head:10001")


def test_a_raw_job_runs_with_its_environment(ray_cluster: str, tmp_path: Path) -> None:
    job = Job(
        name="env-check",
        cmd=[sys.executable, "-c", "import os; print('value', os.environ['TUNER_TEST'])"],
        env={"TUNER_TEST": "reached"},
        log_path=tmp_path / "job.log",
        timeout_s=60,
        prologue="echo prologue ran",
    )
    res = fast(ray_cluster).launch(job)
    assert (res.returncode, res.state, res.timed_out) == (0, "SUCCEEDED", False)
    log = job.log_path.read_text()
    assert "value reached" in log and "prologue ran" in log
    assert res.job_id.startswith("env-check-")


def test_verl_runner_on_ray(ray_cluster: str, tmp_path: Path) -> None:
    """Success, crash and timeout, each a real job on the cluster, read back into rows."""

    def run(mode: str, timeout_s: float = 120) -> object:
        runner = VerlRunner(
            model_path=f"fake/{mode}",
            launcher=fast(ray_cluster),
            python=sys.executable,
            entrypoint=[sys.executable, str(FAKE_VERL)],
        )
        return runner.run(H.spec_for(tmp_path / mode, timeout_s=timeout_s))

    ok = run("ok")
    assert ok.status is Status.OK, ok.reason  # type: ignore[attr-defined]
    assert ok.tokens_per_s_per_gpu == 1030.0  # type: ignore[attr-defined]
    assert ok.extra["launcher"] == "ray" and ok.extra["job_id"]  # type: ignore[attr-defined]
    assert "verl=" in ok.versions  # type: ignore[attr-defined]

    crash = run("oom")
    assert crash.status is Status.OOM  # type: ignore[attr-defined]
    assert crash.extra["phase"] == "update_actor"  # type: ignore[attr-defined]

    # the job's timeout runs from Ray's RUNNING, which comes before its Python has started and
    # imported verl: the hang's limit is 5 s past the start the ok job took, so that a loaded
    # machine's slow start is not read as the hang (issue 38.6: 5 s in all was flaky)
    start_s = float(ok.extra.get("startup_s") or ok.launch_s or 30)  # type: ignore[attr-defined]
    hang = run("hang", timeout_s=5 + 2 * start_s)
    assert hang.status is Status.TIMEOUT  # type: ignore[attr-defined]
    assert hang.extra["last_step"] == 1  # type: ignore[attr-defined]


def test_gpu_check_reads_the_cluster(ray_cluster: str) -> None:
    launcher = fast(ray_cluster)
    assert launcher.gpus_visible() == 2
    runner = VerlRunner(model_path="/m", launcher=launcher)
    runner.check_available(Cluster(gpu=get_gpu("h100"), num_gpus=2))
    with pytest.raises(UserError, match="sees 2 GPU.*asks for 8"):
        runner.check_available(Cluster(gpu=get_gpu("h100"), num_gpus=8))


def test_unreachable_cluster_is_a_user_error() -> None:
    with pytest.raises(UserError, match="cannot reach the Ray Jobs API"):
        RayLauncher("http://127.0.0.1:9").gpus_visible()
