"""Where a verl launch's wall time goes: a clock on the trial's log (its size sampled every
CLOCK_PERIOD_S while the launch runs, `log-clock.csv`) turns the byte offset of a log line into
the second it was written, so the start-up can be split at the lines verl, Ray and vLLM print
(MILESTONES) with no change to what runs.

Read by the verl runner into the row's `extra`: `t_<milestone>_s` (seconds from launch to the
first such line; the last one for the rollout's CUDA graphs, which every replica captures),
`startup_s` (launch to the start of step 1: the first step's logged time minus its duration) and
`teardown_s` (the last step's line to the launch's end).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from pathlib import Path

CLOCK_NAME = "log-clock.csv"
CLOCK_PERIOD_S = 0.5

MILESTONES: dict[str, tuple[tuple[str, ...], bool]] = {
    "driver": (("ray init kwargs",), False),
    "ray_up": (("Started a local Ray instance", "Connected to Ray cluster"), False),
    "actor_built": (("actor and ref model engine initialized",), False),
    "rollout_server": (("['serve',",), False),
    "rollout_graphs": (("Capturing CUDA graphs",), True),
    "training_loop": (("Training Progress",), False),
    "agent_loop": (("(AgentLoopWorker",), False),
}
"""Milestone -> (texts of its log line, any one of them; whether the last occurrence counts), in
launch order, as verl 0.9.1 logged them on a 2 x H100 host (results/tail4k-h100-x2):
trainer/main_ppo.py prints `ray init kwargs` once Hydra has composed the config, before
ray.init; Ray's `Started a local Ray instance`, or `Connected to Ray cluster` where the driver
joins the study's head (`--shared-ray`; ray/_private/worker.py, init); the TaskRunner's
`actor and ref model engine initialized` once the Megatron workers are built; the vLLM server's
argument list (`['serve',`) as each rollout server starts; vLLM's `Capturing CUDA graphs`
progress, the last one when every server is ready; verl's tqdm bar `Training Progress` before
step 1; the first line of an agent-loop worker (`(AgentLoopWorker...` as Ray prefixes it), which
verl 0.9.1 starts only when step 1 first generates, so its start-up falls in the first step.
(vLLM's INFO lines, `Model loading took` and the like, are not in verl's log: its
servers log at WARNING.)"""
_STEP_LINE = re.compile(rb"step:(\d+) - ")


class LogClock:
    """Samples a growing log's size with the time since start; `with LogClock(log, out):`."""

    def __init__(self, log_path: Path, out: Path, *, enabled: bool = True) -> None:
        self.log_path, self.out, self.enabled = log_path, out, enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LogClock:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)

    def _size(self) -> int:
        try:
            return os.stat(self.log_path).st_size
        except OSError:
            return 0

    def _run(self) -> None:
        start, base, last = time.monotonic(), self._size(), -1
        with contextlib.suppress(OSError), open(self.out, "w") as f:
            f.write(f"# base {base}\n")
            while True:
                size = self._size() - base
                if size != last:
                    f.write(f"{time.monotonic() - start:.2f},{size}\n")
                    f.flush()
                    last = size
                if self._stop.wait(CLOCK_PERIOD_S):
                    break
            f.write(f"{time.monotonic() - start:.2f},{self._size() - base}\n")


def read_clock(path: Path) -> tuple[int, list[tuple[float, int]]]:
    """(the log's size when the launch began, [(seconds, bytes written since)...])."""
    base, points = 0, []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return 0, []
    for line in lines:
        if line.startswith("# base "):
            with contextlib.suppress(ValueError):
                base = int(line.split()[2])
            continue
        t, _, b = line.partition(",")
        with contextlib.suppress(ValueError):
            points.append((float(t), int(b)))
    return base, points


def time_of(points: list[tuple[float, int]], offset: int) -> float | None:
    """The first sampled time by which the log held `offset` bytes (within CLOCK_PERIOD_S)."""
    for t, b in points:
        if b > offset:
            return t
    return None


def timeline(
    log_path: Path, clock_path: Path, step_times: dict[int, float], duration_s: float
) -> dict[str, float]:
    """The launch's milestones and split, in seconds (module docstring); {} without a clock."""
    base, points = read_clock(clock_path)
    if not points:
        return {}
    try:
        with open(log_path, "rb") as f:
            f.seek(base)
            text = f.read()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for name, (needles, last) in MILESTONES.items():
        found = [text.rfind(n.encode()) if last else text.find(n.encode()) for n in needles]
        found = [p for p in found if p >= 0]
        pos = (max(found) if last else min(found)) if found else -1
        t = time_of(points, pos) if pos >= 0 else None
        if t is not None:
            out[f"t_{name}_s"] = t
    logged: dict[int, float] = {}
    for m in _STEP_LINE.finditer(text):
        step = int(m.group(1))
        t = time_of(points, m.start())
        if t is not None and step not in logged:
            logged[step] = t
    if logged:
        first, last_step = min(logged), max(logged)
        if first in step_times:
            out["startup_s"] = round(max(0.0, logged[first] - step_times[first]), 1)
        if duration_s > 0:
            out["teardown_s"] = round(max(0.0, duration_s - logged[last_step]), 1)
    return out
