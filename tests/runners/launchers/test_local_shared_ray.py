"""`--shared-ray`: the local launcher starts one real Ray head for the study and every job's
driver joins it (a small real program stands in for verl's main_ppo: `ray.init()` with no
address, as verl 0.9.1 calls it, and a remote task that reports its worker's environment); a
job with another environment gets a new head; `close()` leaves no Ray process behind."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from tuner.runners.launchers import Job, LocalLauncher

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray"),
]

DRIVER = """
import json, os, sys, ray
ray.init(log_to_driver=False, configure_logging=False)

@ray.remote(num_cpus=0)
def where():
    return os.environ.get("VT_MARK"), os.getpid()

mark, pid = ray.get(where.remote())
print(json.dumps({"gcs": ray.get_runtime_context().gcs_address, "mark": mark,
                  "address_env": os.environ.get("RAY_ADDRESS")}))
"""


def _run(launcher: LocalLauncher, tmp: Path, name: str, mark: str) -> dict[str, str]:
    log = tmp / f"{name}.log"
    res = launcher.launch(
        Job(
            name=name,
            cmd=[sys.executable, "-c", DRIVER],
            env={"VT_MARK": mark},
            log_path=log,
            timeout_s=180,
        )
    )
    text = log.read_text()
    assert res.returncode == 0, text[-3000:]
    return json.loads(text.strip().splitlines()[-1])


def _ray_processes(temp: str) -> list[str]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if temp in cmd:
                out.append(cmd[:120])
    return out


def test_jobs_join_the_study_s_ray_head_and_close_ends_it(tmp_path: Path) -> None:
    launcher = LocalLauncher(shared_ray=True, log_dir=tmp_path / "ray")
    try:
        first = _run(launcher, tmp_path, "a", "one")
        second = _run(launcher, tmp_path, "b", "one")
        head = launcher._head
        assert head is not None and head.starts == 1
        assert first["gcs"] == second["gcs"] == first["address_env"]
        assert first["mark"] == "one"  # the job's environment reaches the cluster's workers
        temp = str(head._temp)
        assert _ray_processes(temp)  # the head runs between jobs
        third = _run(launcher, tmp_path, "c", "two")  # another environment: another head
        assert head.starts == 2 and third["gcs"] != first["gcs"] and third["mark"] == "two"
        assert not _ray_processes(temp)  # the first head is gone
        temp = str(head._temp)
    finally:
        launcher.close()
    assert not _ray_processes(temp)
    assert not Path(temp).exists()


def test_without_it_each_job_starts_ray_of_its_own(tmp_path: Path) -> None:
    """RAY_ADDRESS=local: verl's driver starts its own instance (no Ray needed to see it)."""
    launcher = LocalLauncher()
    log = tmp_path / "a.log"
    show = "import os; print(os.environ['RAY_ADDRESS'], os.environ.get('RAY_AUTH_TOKEN'))"
    job = Job(name="a", cmd=[sys.executable, "-c", show], log_path=log, timeout_s=60)
    assert launcher.launch(job).returncode == 0
    assert log.read_text().split() == ["local", "None"]
    launcher.close()  # nothing to end


def test_a_head_that_cannot_start_is_one_line(tmp_path: Path) -> None:
    from tuner.errors import UserError
    from tuner.runners.launchers.ray_head import RayHead

    head = RayHead(str(tmp_path / "no-python"))
    with pytest.raises(UserError, match="leave --shared-ray out"):
        head.driver_env({})
    assert not head.running
    assert os.path.isdir(tmp_path)


def test_the_option_reaches_the_verl_runner_s_launcher() -> None:
    from tuner.cli import build_parser
    from tuner.cli_request import verl_runner_options
    from tuner.runners.verl import VerlRunner

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    run = sub.choices["run"]  # type: ignore[attr-defined]
    argv = ["--model", "qwen2.5-7b", "--gpus", "2", "--runner", "verl", "--model-path", "/m"]
    for extra, shared in (([], False), (["--shared-ray"], True)):
        kw = verl_runner_options(run.parse_args([*argv, *extra]))
        launcher = VerlRunner(**kw).launcher
        assert isinstance(launcher, LocalLauncher) and launcher.shared_ray is shared
