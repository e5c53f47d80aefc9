"""The launch timeline read from a verl log and its clock: each milestone at the first sampled
time the log held its line, Ray's start whether the driver started an instance of its own or
joined the study's head (`--shared-ray`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.runners.verl_timeline import timeline

LINES = [
    "ray init kwargs: {...}",
    "{ray_line}",
    "(TaskRunnerV1 pid=1) INFO: actor and ref model engine initialized",
    "(vLLMHttpServer pid=2) ['serve',",
    "(vLLMHttpServer pid=2) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 0%",
    "(vLLMHttpServer pid=3) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 0%",
    "Training Progress: 0%",
    "step:1 - timing_s/step:100.0",
    "step:2 - timing_s/step:30.0",
]


def _launch(tmp: Path, ray_line: str) -> tuple[Path, Path]:
    """A log whose i-th line arrived at 10 * (i + 1) s, and the clock that saw it."""
    log, clock = tmp / "verl.log", tmp / "log-clock.csv"
    text, points = b"", ["# base 0"]
    for i, line in enumerate(LINES):
        text += (line.replace("{ray_line}", ray_line) + "\n").encode()
        points.append(f"{10.0 * (i + 1):.2f},{len(text)}")
    log.write_bytes(text)
    clock.write_text("\n".join(points) + "\n")
    return log, clock


@pytest.mark.parametrize(
    "ray_line",
    ["INFO worker.py:2038 -- Started a local Ray instance.", "INFO -- Connected to Ray cluster."],
)
def test_milestones_with_ray_of_its_own_or_joined(tmp_path: Path, ray_line: str) -> None:
    log, clock = _launch(tmp_path, ray_line)
    got = timeline(log, clock, {1: 100.0, 2: 30.0}, duration_s=100.0)
    assert got["t_driver_s"] == 10.0 and got["t_ray_up_s"] == 20.0
    assert got["t_actor_built_s"] == 30.0 and got["t_rollout_server_s"] == 40.0
    assert got["t_rollout_graphs_s"] == 60.0  # the last server's
    assert got["t_training_loop_s"] == 70.0
    assert got["teardown_s"] == 10.0  # step 2's line at 90 s of a 100-s launch


def test_a_log_without_ray_s_line_has_no_ray_milestone(tmp_path: Path) -> None:
    log, clock = _launch(tmp_path, "nothing of Ray here")
    got = timeline(log, clock, {1: 100.0}, duration_s=100.0)
    assert "t_ray_up_s" not in got and got["t_actor_built_s"] == 30.0
