"""The files between the runner and the worker (pure Python, both sides use it).

Progress: after each measured step rank 0 appends one JSON line
`{"step": i, "seconds": s, "tokens": n, "old_log_prob_s": a, "update_actor_s": b}` to the
trial's progress file; the runner reads new lines while the trial runs (early stop).

Abandon: the runner creates the trial's abandon file; after each measured step the ranks agree
(one all-reduce) whether any of them sees it, and end the trial as `abandoned`.

Pool: one torchrun of the worker serves many trials. The runner writes requests
`<pool>/req-<seq>.json` (seq 1, 2, ...; atomically), each
`{"seq": n, "cmd": "trial", "spec": path, "out": path, "progress": path, "abandon": path}` or
`{"seq": n, "cmd": "exit"}`; every rank polls for its next request itself (no collective while
idle), runs the trial and rank 0 writes the result to `out`. Rank 0 writes `<pool>/ready.json`
once the process group is up, and `<pool>/done-<seq>` after each request, when the ranks are
ready for the next one. `serve` is that loop, for the megatron worker and the generation worker
(tuner.runners.vllm_gen) alike."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.runners.megatron_worker.result import write_json_atomic

READY = "ready.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """One measured step as the worker reported it."""

    step: int
    """Measured step index, from 0."""
    seconds: float
    """old_log_prob + update of that step."""
    tokens: int
    old_log_prob_s: float = 0.0
    update_actor_s: float = 0.0

    def tokens_per_s_per_gpu(self, world: int, extra_s: float = 0.0) -> float:
        """Over the step's seconds plus `extra_s` (a phase measured outside the worker, e.g.
        the generation before it, in the same mini-batch scale)."""
        t = self.seconds + extra_s
        return self.tokens / t / world if t > 0 else 0.0


LEAVING = "leaving"
"""Marker a pool writes before it exits on its own, so the runner starts a new one instead of
handing the next trial to a pool on its way out."""


def append_progress(path: str | Path, p: Progress) -> None:
    line = json.dumps(
        {
            "step": p.step,
            "seconds": p.seconds,
            "tokens": p.tokens,
            "old_log_prob_s": p.old_log_prob_s,
            "update_actor_s": p.update_actor_s,
        }
    )
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()


def read_progress(path: str | Path) -> list[Progress]:
    """The complete lines written so far (a line being written is skipped)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.split("\n")[:-1]:  # the last piece has no newline yet
        try:
            d = json.loads(line)
            out.append(
                Progress(
                    step=int(d["step"]),
                    seconds=float(d["seconds"]),
                    tokens=int(d["tokens"]),
                    old_log_prob_s=float(d.get("old_log_prob_s", 0.0)),
                    update_actor_s=float(d.get("update_actor_s", 0.0)),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return out


class ProgressWatch:
    """The runner's side of early stop: feeds each new progress line to `should_stop`."""

    def __init__(
        self,
        path: Path,
        world: int,
        should_stop: Callable[[int, float], bool] | None,
        extra_s: float = 0.0,
    ) -> None:
        self.path, self.world, self.should_stop = path, world, should_stop
        self.extra_s = extra_s
        """Seconds added to each step's (Progress.tokens_per_s_per_gpu), so what `should_stop`
        is told means what the row's objective means."""
        self.seen: list[Progress] = []
        self.stopped_at: int | None = None

    def poll(self) -> bool:
        """Read new lines; True once `should_stop` said so for one of them."""
        if self.stopped_at is not None:
            return True
        lines = read_progress(self.path)
        for p in lines[len(self.seen) :]:
            self.seen.append(p)
            if self.should_stop is not None and self.should_stop(
                p.step, p.tokens_per_s_per_gpu(self.world, self.extra_s)
            ):
                self.stopped_at = p.step
                return True
        return False


# ---- the pool --------------------------------------------------------------------------------


def request_path(pool: Path, seq: int) -> Path:
    return pool / f"req-{seq:06d}.json"


def done_path(pool: Path, seq: int) -> Path:
    return pool / f"done-{seq:06d}"


def write_request(pool: Path, seq: int, cmd: str, **paths: str | Path) -> Path:
    if cmd not in ("trial", "exit"):
        raise ValueError(f"pool command {cmd!r} is not trial or exit")
    path = request_path(pool, seq)
    write_json_atomic(path, {"seq": seq, "cmd": cmd, **{k: str(v) for k, v in paths.items()}})
    return path


def wait_request(
    pool: Path, seq: int, *, poll_s: float = 0.05, timeout_s: float | None = None
) -> dict[str, Any] | None:
    """The request numbered `seq` once it exists (None after `timeout_s`)."""
    path = request_path(pool, seq)
    start = time.monotonic()
    while True:
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            d = None
        if isinstance(d, dict):
            if d.get("seq") != seq or d.get("cmd") not in ("trial", "exit"):
                raise ValueError(f"bad pool request {path}: {d}")
            return d
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            return None
        time.sleep(poll_s)


def mark_done(pool: Path, seq: int) -> None:
    done_path(pool, seq).write_text(f"{os.getpid()}\n")


def mark_ready(pool: Path, world: int) -> None:
    write_json_atomic(pool / READY, {"pid": os.getpid(), "world": world, "time": time.time()})


Request = dict[str, Any]


def serve(
    pool: Path,
    handle: Callable[[Request], bool],
    on_failure: Callable[[BaseException, Request], int],
    *,
    world: int = 1,
    lead: bool = True,
    poll_s: float = 0.05,
) -> None:
    """A worker's side of the pool: mark it ready, then serve requests in order until an exit
    request. `handle` runs a trial request (and writes its result); it returns False when this
    process must not serve another (the pool marks itself LEAVING and returns). A failing
    `handle` ends the process at once: `on_failure` writes the failed result and returns the
    exit status (ranks of a failed trial may wait in a collective; the runner ends them and
    starts a fresh pool). Only the `lead` process (rank 0) writes ready, done and LEAVING;
    every process reads the requests itself."""
    if lead:
        mark_ready(pool, world)
    seq = 1
    while True:
        req = wait_request(pool, seq, poll_s=poll_s)
        assert req is not None
        if req["cmd"] == "exit":
            break
        try:
            go_on = handle(req)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 (every failure must become a result)
            status = on_failure(e, req)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        if not go_on:
            if lead:
                (pool / LEAVING).touch()
                mark_done(pool, seq)
            return
        if lead:
            mark_done(pool, seq)
        seq += 1
    if lead:
        mark_done(pool, seq)
