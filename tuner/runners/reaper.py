"""Ends a launched process group when the tune process that launched it dies.

`tune` starts every launch (a verl run, a megatron or vLLM worker pool) in a process group of
its own, and stops the group itself on a timeout, on Ctrl-C, SIGTERM or SIGHUP. Killed with
SIGKILL (or by the OOM killer, or a host agent) it can do nothing, and the group would live on,
holding the GPUs while the resumed study launches beside it. So the group's leader is this small
program, not the launch itself:

    python reaper.py PARENT_PID COMMAND [ARG ...]

It runs COMMAND in its own process group (the one the launcher made for it) and waits for it,
ignoring SIGTERM and SIGINT (the launcher's stop reaches COMMAND, in the group, and the reaper
ends with it). Every POLL_S it checks that PARENT_PID is still its parent; once it is not, it
sends the group SIGTERM, then SIGKILL GRACE_S later. It exits as COMMAND did (the same signal
where COMMAND was killed by one), so the launcher sees COMMAND's status.

Plain Python with no imports from tuner: it runs as a script from whatever folder the launch
runs in (tuner.runners.process.reaped)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL_S = 1.0
GRACE_S = 10.0


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("reaper: usage: reaper.py PARENT_PID COMMAND [ARG ...]", file=sys.stderr)
        return 2
    parent = int(argv[0])
    child = subprocess.Popen(argv[1:])
    # ignored only after the start: an ignored signal stays ignored across exec
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            rc = child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:
                _end_group(child)  # ends this process too
    if rc < 0:
        if -rc in (signal.SIGTERM, signal.SIGINT):  # ignored above; SIGKILL has no handler
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
        time.sleep(1.0)  # the signal's default action ends this process
    return rc if rc >= 0 else 128 - rc


def _end_group(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the group (ignored by this process), then, once COMMAND has ended or GRACE_S
    later, SIGKILL to the whole group: COMMAND if it is still there, what it started in the
    group and did not wait for, and this process, so it does not return."""
    group = os.getpgrp()
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(group, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
