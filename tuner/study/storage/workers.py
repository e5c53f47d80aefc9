"""A study's workers: this process's name in the trials it runs (`WORKER`, the `worker` user
attr, `host:pid`), whether a worker may still run (`alive`: this host's by its process, at once;
another host's is told by Optuna's heartbeat, heartbeat.py), and the trials running elsewhere,
which count against --trials. Optuna names no worker of an RDB storage (a journal storage's
worker id is its own, per storage object, and not in the trial), so the name is a user attr."""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Iterable
from pathlib import Path

import optuna

WORKER = f"{socket.gethostname()}:{os.getpid()}"
"""This process, as the `worker` user attr of the trials it runs."""


def alive(worker: str) -> bool:
    """Whether the worker `host:pid` may still run: False only for a process of this host that
    has exited (or is a zombie its parent has not reaped yet)."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname():
        return True  # another host's worker: its heartbeat tells
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def running_elsewhere(
    trials: Iterable[optuna.trial.FrozenTrial], locked_: bool
) -> list[optuna.trial.FrozenTrial]:
    """Of `trials`, the RUNNING ones whose worker is alive (this host) or on another host.
    Pass the same read of the study as the finished trials are counted from: a trial another
    worker told between two reads is then either counted or running, not neither (the study
    went past --trials when a second read here missed a trial the first saw running)."""
    out = []
    for t in trials:
        if t.state is not optuna.trial.TrialState.RUNNING:
            continue
        worker = str(t.user_attrs.get("worker", ""))
        if worker and alive(worker):
            out.append(t)
        elif not worker and not locked_:
            out.append(t)  # asked by a worker not yet marked: count it to be safe
    return out


def still_running_note(
    t: optuna.trial.FrozenTrial, done: int, trials: int, grace_s: float | None
) -> str:
    """Why a worker ended short of --trials: trial `t` still runs elsewhere (`running_elsewhere`)
    and counts once it ends. Where its worker is another host's, when a run can reclaim it if
    that worker died: once its heartbeat is `grace_s` old (at the latest `grace_s` from now,
    its last beat being no later than now), or never from this host where the storage keeps no
    heartbeat (`grace_s` None: a journal file). A resume that ended "11 in all" for --trials 12
    said nothing of the trial it could not take (issue 38.6)."""
    worker = str(t.user_attrs.get("worker", "")) or "a worker not yet named"
    text = (
        f"{done} of --trials {trials} finished: trial {t.number} still runs on {worker} and "
        "counts once it ends"
    )
    host = worker.rpartition(":")[0]
    if not host or host == socket.gethostname():
        return text
    if grace_s is None:
        return (
            f"{text}; this storage keeps no heartbeat, so if that worker died only a run on "
            f"{host} reclaims it (`tune` with the same arguments there)"
        )
    at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=grace_s)
    return (
        f"{text}; if that worker died, run the same command again after "
        f"{at.strftime('%H:%M:%S')} UTC (its heartbeat {grace_s:.0f} s old): that run reclaims "
        f"trial {t.number} and measures its candidate again"
    )
