"""One-line messages for what fails inside a command (an OSError, a storage that fails, any
error), passwords redacted, and JSON that `tune` prints without NaN or Infinity."""

from __future__ import annotations

import errno
import math
from typing import Any

from tuner.errors import redact

_HINTS = {
    # EACCES/EPERM come from reads and writes alike: the hint names neither
    errno.EACCES: "check its permissions or pass another path",
    errno.EPERM: "check its permissions or pass another path",
    errno.EROFS: "the file system is read-only: pass a path on another one",
    errno.EISDIR: "it is a folder: pass a file",
    errno.ENOTDIR: "a file is in the way of a folder: move it aside or pass another path",
    errno.EEXIST: "a file is in the way of a folder: move it aside or pass another path",
    errno.ENAMETOOLONG: "shorten the name (at most 255 bytes per name)",
    errno.ENOSPC: "the disk is full: free space or pass a folder on another disk",
    errno.EDQUOT: "the disk quota is used up: free space or pass a folder on another disk",
    errno.EFBIG: "the file would pass the file-size limit: raise it (ulimit -f) or write less",
    errno.EMFILE: "too many files open: raise the limit (ulimit -n)",
    errno.EIO: "an I/O error: check the disk, or pass a path on another",
    errno.ELOOP: "a symbolic link loop: pass another path",
    errno.ENOENT: "check the path",
}


def _file_size_limit() -> str:
    """The process's file-size limit (ulimit -f) as text, "" where there is none."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return ""
    return "" if soft == resource.RLIM_INFINITY else f"{soft} bytes"


def error_line(e: BaseException) -> str:
    """A UserError's message as the one line `tune` prints: on one line, no password."""
    return redact(one_line(e))


def os_error_line(e: OSError) -> str:
    """An OSError from inside a command as one line that says what to change."""
    where = e.filename if e.filename is not None else ""
    what = e.strerror or str(e) or type(e).__name__
    hint = _HINTS.get(e.errno or 0, "check the path and its permissions")
    if e.errno == errno.EFBIG and _file_size_limit():
        hint = f"{hint} (the limit is {_file_size_limit()})"
    text = f"{where}: {what}: {hint}" if where else f"{what}: {hint}"
    return redact(" ".join(str(text).splitlines()))


_STORAGE_FAILURES = {
    # a damaged or locked file: Optuna says only "invalid data in the commit" (issue 38)
    "malformed": "the file is damaged (SQLite: database disk image is malformed): restore it "
    "from a copy, or pass --storage with another path",
    "file is not a database": "the file is damaged (SQLite: file is not a database): restore "
    "it from a copy, or pass --storage with another path",
    "database is locked": "another process kept it locked past SQLite's wait (SQLite: "
    "database is locked): stop the program holding it (a `sqlite3` shell, a backup) or wait "
    "for it, then run again",
    "disk is full": "the disk is full: free space or pass --storage on another disk",
    "disk I/O error": "a disk I/O error: check the disk, or pass --storage on another",
    "readonly database": "it became read-only: make it writable or pass --storage elsewhere",
    "unable to open database file": "it cannot be opened: check the path and its permissions",
}


def _from_optuna_storage(e: BaseException) -> bool:
    """Whether `e` was raised inside Optuna's storage code (reading what a storage keeps)."""
    tb = e.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if "/optuna/storages/" in name:
            return True
        tb = tb.tb_next
    return False


def storage_failure_line(e: BaseException, url: str) -> str | None:
    """A storage that fails inside a study (SQLite's `database or disk is full`, raised by
    sqlalchemy or sqlite3), or that keeps a value Optuna cannot read back (a user attr that is
    not JSON: Optuna's reader raised json's error), as one line naming the storage; None for
    any other error."""
    import json

    seen: BaseException | None = e
    for _ in range(8):  # Optuna wraps sqlalchemy's error, which wraps sqlite3's
        if seen is None:
            return None
        if isinstance(seen, json.JSONDecodeError) and _from_optuna_storage(seen):
            where = redact(url.removeprefix("sqlite:///"))
            return (
                f"storage {where} keeps a value that is not JSON ({seen.msg}): it is damaged: "
                "restore it from a copy, or pass --storage with another"
            )
        if type(seen).__name__ in ("OperationalError", "DatabaseError"):
            text = str(seen)
            for key, hint in _STORAGE_FAILURES.items():
                if key in text:
                    where = url.removeprefix("sqlite:///")
                    limit = _file_size_limit()
                    if key == "disk I/O error" and limit:  # SQLite's word for EFBIG
                        hint = (
                            f"a disk I/O error under a file-size limit of {limit} (ulimit -f): "
                            "raise the limit, or check the disk"
                        )
                    return f"storage {redact(where)}: {hint}"
        seen = seen.__cause__ or seen.__context__
    return None


def finite_json(value: Any) -> Any:
    """`value` with every float that is not finite as None, so that `json.dumps` writes JSON
    (`null`), not Python's `Infinity`/`NaN`, which strict readers refuse."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


def one_line(e: BaseException) -> str:
    """The message of an error as a single line."""
    return " ".join(str(e).split()).strip() or type(e).__name__
