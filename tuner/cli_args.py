"""Argument types and checks of the `tune` command line.

Two kinds, both run before a command creates or launches anything:

- `type=` functions for argparse (`positive_int`, `study_name`, `layout_text`, ...): the syntax
  of one value. They raise `argparse.ArgumentTypeError`; `OneLineParser` turns every argparse
  complaint into a `UserError` that names the argument (`argument --top: ...`).
- `validate(args)`: what needs the filesystem or several arguments (a results folder that is a
  file or read-only, a CSV that is a folder or damaged, `--columns` the leaderboard lacks).

Every message is one line that says what to change; `tuner.cli.main` prints it and exits 2.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

from tuner.errors import UserError

MAX_NAME_CHARS = 100
"""Longest study name: it becomes file names (`<study>.csv`, `<study>/trials/`) and Optuna's
study name, and the file system allows 255 bytes per name."""

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=@,-]*")
_INT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
SEED_MAX = 2**32 - 1
"""numpy's (and so Optuna's samplers') largest seed."""


def _shown(text: str, limit: int = 40) -> str:
    """The user's value, quoted and cut short, for a one-line message."""
    s = text if len(text) <= limit else text[:limit] + "..."
    return repr(s)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are a `UserError` (one line, exit 2 in `main`) instead of
    the usage block plus a message that argparse prints and exits with."""

    def error(self, message: str) -> NoReturn:
        hint = f" (see `{self.prog} --help`)"
        raise UserError(" ".join(message.splitlines()) + hint)


# --------------------------------------------------------------------------------------------
# Numbers. int()/float() alone accept full-width digits, `1_000`, `nan` and `inf`: refused.
# --------------------------------------------------------------------------------------------


def _whole(text: str) -> int:
    s = text.strip()
    if not _INT_RE.fullmatch(s):
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not a whole number: write e.g. 8")
    return int(s)


def _real(text: str) -> float:
    s = text.strip()
    if not _FLOAT_RE.fullmatch(s):
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not a number: write e.g. 1800 or 0.5")
    v = float(s)
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{_shown(text)} is too large: write a finite number")
    return v


def positive_int(text: str) -> int:
    """A whole number >= 1 (GPUs, trials, lengths, batch sizes, --top, --steps)."""
    v = _whole(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {v}")
    return v


def non_negative_int(text: str) -> int:
    """A whole number >= 0 (--recipes 0 writes none; trial numbers start at 0)."""
    v = _whole(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


def seed(text: str) -> int:
    """A sampler seed, 0 .. 2**32-1 (numpy's range)."""
    v = _whole(text)
    if not 0 <= v <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be between 0 and {SEED_MAX}, got {v}")
    return v


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds)."""
    v = _real(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text.strip()}")
    return v


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (GiB of headroom)."""
    v = _real(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text.strip()}")
    return v


def fraction(text: str) -> float:
    """A share in (0, 1] (gpu_memory_utilization)."""
    v = _real(text)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 1, got {text.strip()}")
    return v


# --------------------------------------------------------------------------------------------
# Names and layouts
# --------------------------------------------------------------------------------------------


def study_name(text: str) -> str:
    """A study name that stays a plain file name under results/ and recipes/: ASCII letters,
    digits and `. _ - + = @ ,`, starting with a letter or digit, at most MAX_NAME_CHARS; empty
    means the default name. Refuses `/`, `\\`, `..` (a path out of results/), spaces and
    non-ASCII."""
    if text == "":
        return text
    if len(text) > MAX_NAME_CHARS:
        raise argparse.ArgumentTypeError(
            f"{_shown(text)} has {len(text)} characters: use at most {MAX_NAME_CHARS}"
        )
    if not _NAME_RE.fullmatch(text) or ".." in text:
        raise argparse.ArgumentTypeError(
            f"{_shown(text)} is not a plain name: use ASCII letters, digits and . _ - "
            "(no / or .., it names files under results/)"
        )
    return text


def model_arg(text: str) -> str:
    """A registry name or a path to a config.json; refuses what cannot be either (empty, control
    characters, names longer than a file system allows) with the same advice as an unknown
    name, instead of an OSError from the path lookup."""
    if not text.strip() or not text.isprintable():
        raise argparse.ArgumentTypeError(
            f"{_shown(text)} is not a model: pass a name from `tune models` or a config.json path"
        )
    too_long = len(os.fsencode(text)) > 4095 or any(
        len(os.fsencode(part)) > 255 for part in Path(text).parts
    )
    if too_long:
        raise argparse.ArgumentTypeError(
            f"unknown model {_shown(text)} ({len(text)} characters): pass a name from "
            "`tune models` or a config.json path"
        )
    return text


def layout_text(text: str) -> str:
    """A parallel layout in the reference notation (`tp4pp2vpp2`, `ep8cp2`, `dp8`,
    `pp8first10last12`), read by the layout's own grammar (tuner.space.layout.read_degrees).
    The degrees' fit to the GPU count is checked by `ParallelLayout.parse` once the cluster is
    known."""
    from tuner.space.layout import read_degrees

    try:
        read_degrees(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(f"{e} (see `tune estimate --help`)") from None
    return text


def path_text(text: str) -> Path:
    """A path argument: not empty, printable, names the file system allows."""
    if not text.strip() or not text.isprintable():
        raise argparse.ArgumentTypeError(f"{_shown(text)} is not a path: pass a file or folder")
    if any(len(os.fsencode(p)) > 255 for p in Path(text).parts):
        raise argparse.ArgumentTypeError(
            f"{_shown(text)} has a name longer than 255 bytes: shorten it"
        )
    return Path(text)


# --------------------------------------------------------------------------------------------
# The file system, checked before a command writes anything
# --------------------------------------------------------------------------------------------


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable_dir(path: Path, flag: str) -> None:
    """`path` is a folder, or can be created as one, and this user may write in it."""
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file, not a folder: move it aside or pass another")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise UserError(
            f"{flag} {path}: {base} is a file, not a folder: move it aside or pass another"
        )
    if not os.access(base, os.W_OK | os.X_OK):
        raise UserError(
            f"{flag} {path}: cannot write in {base}: make it writable or pass another folder"
        )


def check_writable_file(path: Path, flag: str) -> None:
    """`path` is a file (or is not there yet) in a folder this user may write in."""
    if path.is_dir():
        raise UserError(f"{flag} {path} is a folder: pass a file path")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{flag} {path} is read-only: make it writable or pass another path")
    check_writable_dir(path.parent, flag)


def check_readable_file(path: Path, flag: str) -> None:
    """`path` is a file this user may read."""
    if not path.exists():
        raise UserError(f"{flag}: no file at {path}: check the path")
    if path.is_dir():
        raise UserError(f"{flag} {path} is a folder: pass a file in it")
    if not os.access(path, os.R_OK):
        raise UserError(f"{flag} {path} cannot be read: check its permissions")


def check_leaderboard(path: Path, flag: str = "csv") -> list[dict[str, str]]:
    """A readable leaderboard (ours or a reference) whose rows a command can use: no NUL byte,
    and in ours a whole-number `trial` in every row. Returns the rows (our column names)."""
    from tuner.results import read_rows

    check_readable_file(path, flag)
    data = path.read_bytes()
    if b"\0" in data:
        line = data[: data.index(b"\0")].count(b"\n") + 1
        raise UserError(
            f"{path} line {line} holds a NUL byte: the file is damaged; fix or delete that line"
        )
    rows = read_rows(path)
    for i, r in enumerate(rows, start=2):
        if r.get("source") == "reference":
            break
        trial = r.get("trial") or ""
        if not trial.isascii() or not trial.isdigit():
            raise UserError(
                f"{path} line {i}: trial {_shown(trial)} is not a whole number: fix or delete "
                "that row"
            )
    return rows


def known_columns(rows: Iterable[dict[str, str]]) -> set[str]:
    """Columns `--columns`/`--sort` may name: ours, the display ones, and those of the rows."""
    from tuner.leaderboard import DERIVED_COLUMNS, SHORT_NAMES
    from tuner.results import COLUMNS, SHOW_COLUMNS

    known = {*COLUMNS, *SHOW_COLUMNS, "study", *DERIVED_COLUMNS, *SHORT_NAMES.values(), "all"}
    for r in rows:
        known.update(k for k in r if k)
    return known


def check_columns(text: str, rows: list[dict[str, str]], flag: str = "--columns") -> list[str]:
    """Comma-separated column names, each one a column of these leaderboards."""
    cols = [c.strip() for c in text.split(",")]
    if not all(cols):
        raise UserError(f"{flag} {_shown(text)} has an empty name: write e.g. trial,status,step_s")
    known = known_columns(rows)
    unknown = [c for c in cols if c not in known]
    if unknown:
        raise UserError(
            f"{flag}: unknown column {', '.join(map(repr, unknown))}: use names from the CSV "
            "header, e.g. trial,status,train_parallel,tokens_per_s_per_gpu,step_s"
        )
    return cols


# --------------------------------------------------------------------------------------------
# The validate step: per command, what needs the file system or several arguments
# --------------------------------------------------------------------------------------------


def _csv_list(args: argparse.Namespace) -> list[Path]:
    v = getattr(args, "csv", None)
    if v is None:
        return []
    return list(v) if isinstance(v, list) else [v]


def _check_leaderboards(args: argparse.Namespace) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for path in _csv_list(args):
        rows += check_leaderboard(Path(path))
    return rows


def _check_run(args: argparse.Namespace) -> None:
    check_writable_dir(args.results_dir, "--results-dir")
    check_writable_dir(args.recipes_dir, "--recipes-dir")
    if args.storage and "://" not in args.storage:
        check_writable_file(Path(args.storage), "--storage")
    if args.profile is not None:
        check_readable_file(args.profile, "--profile")


def _check_export(args: argparse.Namespace) -> None:
    _check_leaderboards(args)
    check_writable_dir(args.recipes_dir, "--recipes-dir")


def _check_estimate(args: argparse.Namespace) -> None:
    if args.profile is not None:
        check_readable_file(args.profile, "--profile")


def _check_calibrate(args: argparse.Namespace) -> None:
    for path in args.csv:
        check_readable_file(path, "csv")
    if args.start is not None:
        check_readable_file(args.start, "--start")
    if args.gpu is not None:
        from tuner.hardware import get_gpu

        get_gpu(args.gpu)
    if not args.dry_run:
        from tuner.estimate.profile import DEFAULT_PROFILE_PATH

        check_writable_file(args.out or DEFAULT_PROFILE_PATH, "--out")


def _check_table(args: argparse.Namespace) -> None:
    """show and report: the leaderboards, and what selects and orders their rows."""
    rows = _check_leaderboards(args)
    top = getattr(args, "top", None)
    if top is not None and top < 1:
        raise UserError(f"argument --top: must be a positive whole number, got {top}")
    columns = getattr(args, "columns", None)
    if isinstance(columns, str):
        check_columns(columns, rows)
    sort = getattr(args, "sort", None)
    if isinstance(sort, str):
        check_columns(sort, rows, flag="--sort")


PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def _check_plot(args: argparse.Namespace) -> None:
    _check_leaderboards(args)
    out = args.out
    if out is not None:
        if out.suffix.lower() not in PLOT_SUFFIXES:
            raise UserError(f"--out {out}: end the name in {', '.join(PLOT_SUFFIXES)}")
        check_writable_file(out, "--out")
    else:
        check_writable_dir(Path(args.csv).parent, "csv folder (the PNG goes beside it; or --out)")


def _check_report(args: argparse.Namespace) -> None:
    _check_table(args)
    for ref in getattr(args, "reference", None) or ():
        check_readable_file(Path(ref), "--reference")
    out = getattr(args, "out", None)
    if out is not None:
        check_writable_file(Path(out), "--out")
    else:
        check_writable_dir(
            Path(args.csv).parent, "csv folder (the report goes beside it; or --out)"
        )


VALIDATORS: dict[str, Callable[[argparse.Namespace], None]] = {
    "run": _check_run,
    "export": _check_export,
    "estimate": _check_estimate,
    "calibrate": _check_calibrate,
    "show": _check_table,
    "report": _check_report,
    "plot": _check_plot,
}


def validate(args: argparse.Namespace) -> None:
    """The checks of `args.command` that need the file system or several arguments; raises
    UserError. Nothing is written."""
    check = VALIDATORS.get(getattr(args, "command", "") or "")
    if check is not None:
        check(args)


# --------------------------------------------------------------------------------------------
# A crash inside a command, as one line
# --------------------------------------------------------------------------------------------

_HINTS = {
    errno.EACCES: "make it writable or pass another path",
    errno.EPERM: "make it writable or pass another path",
    errno.EROFS: "the file system is read-only: pass a path on another one",
    errno.EISDIR: "it is a folder: pass a file",
    errno.ENOTDIR: "a file is in the way of a folder: move it aside or pass another path",
    errno.EEXIST: "a file is in the way of a folder: move it aside or pass another path",
    errno.ENAMETOOLONG: "shorten the name (at most 255 bytes per name)",
    errno.ENOSPC: "the disk is full: free space or pass a folder on another disk",
    errno.ENOENT: "check the path",
}


def os_error_line(e: OSError) -> str:
    """An OSError from inside a command as one line that says what to change."""
    where = e.filename if e.filename is not None else ""
    what = e.strerror or str(e) or type(e).__name__
    hint = _HINTS.get(e.errno or 0, "check the path and its permissions")
    text = f"{where}: {what}: {hint}" if where else f"{what}: {hint}"
    return " ".join(str(text).splitlines())


def one_line(e: BaseException) -> str:
    """The message of an error as a single line."""
    return " ".join(str(e).split("\n")).strip() or type(e).__name__


def flags_of(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Each option string of `parser` and its action (tests use it to see every flag)."""
    return {s: a for a in parser._actions for s in a.option_strings}
