"""The project's one atomic file writer: temp file + fsync + os.replace, with the user's umask.

A kill at any moment leaves either the old file or the new one, never a torn one. The file gets
the mode a plain `open(path, "w")` would give it (0644 under the usual umask 022), not the 0600
that `tempfile.mkstemp` creates."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path | str, data: str | bytes) -> Path:
    """Write `data` (text is UTF-8, newlines as given) to `path` atomically; returns the path.

    The parent directory is created if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path
