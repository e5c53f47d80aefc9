"""Journal file storages (several workers sharing a file system, no server): Optuna's own
`JournalFileBackend` and its append lock `JournalFileOpenLock`, the lock subclassed only to set
aside a last line a dead writer cut short (`set_aside_torn_tail`), and with a grace period of its
own (`JOURNAL_LOCK_GRACE_S`); and `journal_damage`, whether a file is a journal Optuna can
replay, told by Optuna's own replay (`JournalStorage` over a read-only backend)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna

JOURNAL_LOCK_GRACE_S = 5
"""A journal file's append lock (Optuna's `JournalFileOpenLock`, held for one write) that has
not changed for this long was left by a killed worker and is broken."""


def journal_damage(path: Path) -> str:
    """Why the journal file `path` is not one Optuna can replay, or "": each whole line must be
    a JSON object with an integer `op_code` and a `worker_id`, and Optuna's own replay of them
    must pass (an unknown `op_code`, an entry missing a field Optuna reads). A last line
    without its newline is a write cut short: Optuna skips it, and the next writer sets it
    aside (`_TornTailLock`). Optuna itself stops with a KeyError or a TypeError on the first
    such line, at any later read."""
    lines = _CheckedLines(path)
    try:
        optuna.storages.JournalStorage(lines)  # replays every line it is handed
    except Exception as e:  # Optuna's replay: KeyError, TypeError, AssertionError, ...
        return f"{_which(lines.number)} is an entry Optuna cannot replay: {type(e).__name__} {e}"
    return lines.why


def _which(number: int) -> str:
    return "its first line" if number == 1 else f"line {number}"


class _CheckedLines(optuna.storages.journal.BaseJournalBackend):
    """The whole lines of a journal file, each checked before Optuna's replay is handed it; a
    read-only backend for `journal_damage`. `number`: the line handed out last; `why`: what
    stopped the reading early, or ""."""

    def __init__(self, path: Path) -> None:
        self.path, self.number, self.why = path, 0, ""

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        with open(self.path, "rb") as f:
            for number, line in enumerate(f, start=1):
                if number <= log_number_from:
                    continue
                if not line.endswith(b"\n"):
                    return  # a write cut short: Optuna skips it
                self.number = number
                try:
                    entry = json.loads(line.decode())
                except (ValueError, UnicodeDecodeError):
                    entry = None
                op = entry.get("op_code") if isinstance(entry, dict) else None
                if not isinstance(entry, dict) or type(op) is not int:
                    self.why = f"{_which(number)} is not a journal entry"
                    return
                if not isinstance(entry.get("worker_id"), str):
                    self.why = f"{_which(number)} has no worker_id"
                    return
                yield entry

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        raise RuntimeError("journal_damage only reads")


def open_journal(path: Path) -> optuna.storages.BaseStorage:
    """A journal file storage whose append lock a killed worker cannot leave for long, and
    whose last line cut short does not spoil the next append (`_TornTailLock`).

    Optuna's default lock is a symbolic link to the journal's path as given: for a relative
    path (`--storage results/x.log`) the link dangles, and a link left by a kill -9 was never
    broken (the waiter spun for good); with an absolute path it was broken after 30 s. The
    lock here is a file named by the absolute path, broken after `JOURNAL_LOCK_GRACE_S`; a
    dangling link left by the old lock is removed (no live worker can hold one)."""
    from optuna.storages.journal import JournalFileBackend

    full = str(path.resolve())
    lock = Path(full + ".lock")
    if lock.is_symlink() and not lock.exists():
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
    backend = JournalFileBackend(full, _TornTailLock(Path(full), JOURNAL_LOCK_GRACE_S))
    return optuna.storages.JournalStorage(backend)


class _TornTailLock(optuna.storages.journal.JournalFileOpenLock):
    """Optuna's append lock of a journal file (`JournalFileOpenLock`, held for one append),
    which, once held, sets aside a last line cut short (`set_aside_torn_tail`) before the
    append writes after it.

    A write cut short (the disk full, a file-size limit, a kill between Optuna's write and its
    flush) leaves a last line without its newline; Optuna's reader skips it, but its next
    append went on after it, making one line of the two that no reader can parse: that run
    stopped with a JSONDecodeError and every later one refused the file. Under the lock no
    other worker is mid-append, so such a line is a dead writer's."""

    def __init__(self, journal: Path, grace_period: int) -> None:
        super().__init__(str(journal), grace_period)
        self.journal = journal

    def acquire(self) -> bool:
        got = super().acquire()
        try:
            set_aside_torn_tail(self.journal)
        except BaseException:
            self.release()
            raise
        return got


TORN_SUFFIX = ".torn-"
"""A journal's last line cut short is kept in `<journal>.torn-<offset>`, its byte offset in the
journal (`set_aside_torn_tail`)."""


def set_aside_torn_tail(journal: Path) -> Path | None:
    """Move the journal's last line, if a write cut it short (no newline), to a file beside it
    (`TORN_SUFFIX`): the file is kept whole first, then the journal truncated to its complete
    lines, each of which a resume keeps; says where on stderr, in one line. Returns that file,
    or None when the journal ends with a whole line. Call under the journal's append lock."""
    from tuner.fileio import write_atomic

    with open(journal, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        start = pos = size
        while pos > 0:  # back to the last newline
            step = min(pos, 1 << 16)
            pos -= step
            f.seek(pos)
            i = f.read(step).rfind(b"\n")
            if i >= 0:
                start = pos + i + 1
                break
        else:
            start = 0
        f.seek(start)
        tail = f.read()
        aside = journal.with_name(f"{journal.name}{TORN_SUFFIX}{start}")
        for n in itertools.count(2):  # an earlier tail cut at the same offset stays too
            try:
                write_atomic(aside, tail, exclusive=True)
                break
            except FileExistsError:
                aside = journal.with_name(f"{journal.name}{TORN_SUFFIX}{start}-{n}")
        f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
    print(
        f"tune: storage {journal}: its last line was cut short (a write that did not finish: a "
        f"full disk or a killed worker); its {len(tail)} bytes are set aside in {aside} and the "
        "study goes on from every complete entry before it",
        file=sys.stderr,
    )
    return aside
