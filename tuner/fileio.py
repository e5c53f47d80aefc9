"""The project's one atomic file writer (temp file + fsync + os.replace, with the user's umask)
and its one reader of what a user passes in (bounded, regular files only).

A kill at any moment leaves either the old file or the new one, never a torn one. The file gets
the mode a plain `open(path, "w")` would give it (0644 under the usual umask 022), not the 0600
that `tempfile.mkstemp` creates.

Stdlib only (and tuner.errors, which is too): the Megatron worker writes its result and its pool
files through it under torchrun on the GPU host, and the cost model saves its profile with it.
tests/test_fileio.py fails on a hand-written atomic writer anywhere else in tuner/."""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from tuner.errors import UserError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(
    path: Path | str, data: str | bytes, *, executable: bool = False, exclusive: bool = False
) -> Path:
    """Write `data` (text is UTF-8, newlines as given) to `path` atomically; returns the path.

    The parent directory is created if missing; a temporary file of its own per call, so
    processes writing the same path at once each replace it whole. `executable`: mode 0777
    less the umask (a script), else 0666 less the umask. `exclusive`: create `path` only if
    it is absent, whole or not at all (a hard link, which never replaces), and raise
    FileExistsError, leaving the file there as it was, if it is present (the first writer
    wins)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fchmod(f.fileno(), (0o777 if executable else 0o666) & ~_umask())
            os.fsync(f.fileno())
        if exclusive:
            os.link(tmp, path)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:  # a write's ENOSPC names no file
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    return path


def remove_leftovers(path: Path | str) -> int:
    """Remove the temporary files of `write_atomic(path)` that writers killed mid-write left
    beside it (SIGKILL runs no cleanup; each such file is as large as the file it was to
    replace: a large study's CSV is hundreds of MiB); returns how many. Only under the lock
    that every writer of `path` holds, or another writer's file in progress would go."""
    path = Path(path)
    removed = 0
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
            removed += 1
    return removed


# --------------------------------------------------------------------------------------------
# Reading what a user passes in: bounded, regular files only
# --------------------------------------------------------------------------------------------

MIB = 1 << 20
JSON_MAX_BYTES = 16 * MIB
"""Largest JSON input (a config.json, a calibration profile): real ones are a few KiB."""
CSV_MAX_BYTES = 512 * MIB
"""Largest leaderboard CSV: a 100,000-trial study's is about 200 MiB."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a pipe (fifo)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_input_file(path: Path | str, what: str, max_bytes: int) -> int:
    """`path` is a regular file of at most `max_bytes` that this user may read; returns its
    size. Decided from its metadata alone, so a pipe or a device (`/dev/zero`), which would
    block or never end, is refused without being opened. UserError otherwise."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise UserError(f"{what}: no file at {path}: check the path") from None
    except PermissionError:  # a folder on the way this user may not enter
        raise UserError(f"{what} {path} cannot be read: check its permissions") from None
    except OSError as e:  # a symbolic link loop, a name too long, a file in the way
        why = "a symbolic link loop" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise UserError(f"{what} {path}: {why}: pass another path") from None
    if not stat.S_ISREG(st.st_mode):
        hint = "pass a file in it" if stat.S_ISDIR(st.st_mode) else "pass a regular file"
        raise UserError(f"{what} {path} is {_kind(st.st_mode)}: {hint}")
    if st.st_size > max_bytes:
        raise UserError(
            f"{what} {path} is {st.st_size / MIB:.1f} MiB, more than the {max_bytes // MIB} MiB "
            "such a file can be: pass the right file"
        )
    if not os.access(path, os.R_OK):
        raise UserError(f"{what} {path} cannot be read: check its permissions")
    return st.st_size


def read_input(path: Path | str, what: str, max_bytes: int) -> bytes:
    """The bytes of the input file `path` (checked by `check_input_file`), reading at most
    `max_bytes` even if the file grows meanwhile."""
    size = check_input_file(path, what, max_bytes)
    try:
        with open(path, "rb") as f:
            # read(n) allocates n bytes before it reads: ask for the file's size (one byte more
            # sees it grow), never the limit (512 MiB failed under a 400 MB `ulimit -v`)
            parts = [f.read(min(size, max_bytes) + 1)]
            got = len(parts[0])
            while got <= max_bytes and got > size:  # it grew since its size was taken
                more = f.read(min(max(size + 1, MIB), max_bytes + 1 - got))
                if not more:
                    break
                parts.append(more)
                got += len(more)
            data = b"".join(parts) if len(parts) > 1 else parts[0]
    except PermissionError:
        raise UserError(f"{what} {path} cannot be read: check its permissions") from None
    except OSError as e:
        raise UserError(f"{what} {path}: {e.strerror or e}: check the path") from None
    if len(data) > max_bytes:
        raise UserError(f"{what} {path} grew past {max_bytes // MIB} MiB while read: pass a file")
    return data


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows: write a finite number")


def _whole(text: str) -> int:
    if len(text.lstrip("-")) > 30:
        raise ValueError(f"a number of {len(text.lstrip('-'))} digits is too large")
    return int(text)


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{text[:40]} is too large: write a finite number")
    return v


def load_json(path: Path | str, what: str, max_bytes: int = JSON_MAX_BYTES) -> Any:
    """A JSON input file as Python values: bounded (`read_input`), UTF-8 with or without a byte
    order mark, and strict: NaN, Infinity and numbers too long for Python to read are refused
    with the file named, as a UserError."""
    data = read_input(path, what, max_bytes)
    try:
        return json.loads(
            data.decode("utf-8-sig"),
            parse_constant=_no_constant,
            parse_float=_finite,
            parse_int=_whole,
        )
    except UnicodeDecodeError:
        raise UserError(f"{what} {path} is not UTF-8 text: pass a JSON file") from None
    except ValueError as e:  # JSONDecodeError, NaN/Infinity, a 5000-digit number
        first = " ".join(str(e).split())
        raise UserError(f"{what} {path} is not valid JSON ({first})") from None
    except RecursionError:
        raise UserError(f"{what} {path} nests too deeply to be a JSON config") from None
