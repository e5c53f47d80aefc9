"""The checks a command runs before it writes or launches anything: what needs the file system or
several arguments (a results folder that is a file or read-only, a CSV that is a folder or
damaged, an output that would replace an input, `--columns` the leaderboard lacks), per command
(`validate`). Each raises a one-line `UserError` that says what to change.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from tuner.cli_args.values import shown
from tuner.errors import UserError
from tuner.fileio import CSV_MAX_BYTES, JSON_MAX_BYTES, check_input_file, read_input
from tuner.megatron_layers import resolve_layer_spec

# --------------------------------------------------------------------------------------------
# The file system, checked before a command writes anything
# --------------------------------------------------------------------------------------------


def _probe(path: Path, flag: str) -> os.stat_result | None:
    """The metadata of `path` (links followed); None where nothing is there. A path the system
    cannot follow (a symbolic link loop, a name too long) is a UserError, not a crash later."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        what = "a symbolic link loop" if e.errno == errno.ELOOP else (e.strerror or str(e))
        raise UserError(f"{flag} {path}: {what}: pass another path") from None


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_writable_dir(path: Path, flag: str) -> None:
    """`path` is a folder, or can be created as one, and this user may write in it."""
    st = _probe(path, flag)
    if st is not None and not stat.S_ISDIR(st.st_mode):
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
    """`path` is a regular file (or is not there yet) in a folder this user may write in; a
    pipe or a device is refused (writing one would block, or replace it)."""
    st = _probe(path, flag)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise UserError(f"{flag} {path} is a folder: pass a file path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UserError(
            f"{flag} {path} is not a regular file (a pipe or a device): pass a file path"
        )
    if st is not None and not os.access(path, os.W_OK):
        raise UserError(f"{flag} {path} is read-only: make it writable or pass another path")
    check_writable_dir(path.parent, flag)


OUTPUT_KINDS: dict[str, tuple[str, tuple[bytes, ...]]] = {
    ".html": ("an HTML report", (b"<!doctype html", b"<html")),
    ".png": ("a PNG image", (b"\x89png\r\n\x1a\n",)),
    ".svg": ("an SVG image", (b"<?xml", b"<svg")),
    ".pdf": ("a PDF", (b"%pdf-",)),
    ".json": ("a calibration profile", (b"{",)),
}
"""What each kind of file a command writes (and replaces) starts with, by its suffix."""


def _what_is(head: bytes) -> str:
    if head.startswith(b"SQLite format 3\x00"):
        return "an SQLite database (an Optuna storage?)"
    first = head.split(b"\n", 1)[0]
    if b"schema_version" in first or (b"train_parallel" in first and b"update_actor" in first):
        return "a leaderboard CSV"
    return "a file of another kind"


def check_output_file(
    path: Path, flag: str, *, kind: str, inputs: Iterable[Path | str] = ()
) -> None:
    """A file a command writes (and replaces, if there) is writable, is none of the files the
    command reads (`inputs`: its leaderboards, references, storage, profile), and where a file
    is already there it is one of the `kind` the command writes (`OUTPUT_KINDS`), never an
    Optuna storage, a leaderboard or another file `-o` would destroy."""
    check_writable_file(path, flag)
    for other in inputs:
        if _same_file(path, Path(other)):
            raise UserError(
                f"{flag} {path} is a file this command reads: pass another path for the output"
            )
    if not path.exists() or path.stat().st_size == 0:
        return
    name, starts = OUTPUT_KINDS[kind]
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return  # not readable: writing it fails later with its own line
    if not head.lstrip().lower().startswith(starts):
        raise UserError(
            f"{flag} {path} is {_what_is(head)}, not {name}: pass another path (or move the "
            "file aside)"
        )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_readable_file(path: Path, flag: str, max_bytes: int = CSV_MAX_BYTES) -> None:
    """`path` is a regular file this user may read, of at most `max_bytes` (a pipe or a device
    such as /dev/zero is refused before it is opened: it would block or never end)."""
    check_input_file(path, flag, max_bytes)


def check_leaderboard(path: Path, flag: str = "csv") -> list[dict[str, str]]:
    """A readable leaderboard (ours or a reference) whose rows a command can use: no NUL byte,
    and in ours a whole-number `trial` in every row. Returns the rows (our column names)."""
    from tuner.results import read_rows

    data = read_input(path, flag, CSV_MAX_BYTES)
    if b"\0" in data:
        line = data[: data.index(b"\0")].count(b"\n") + 1
        raise UserError(
            f"{path} line {line} holds a NUL byte: the file is damaged; fix or delete that line"
        )
    rows = read_rows(path)
    numeric = _numeric_columns()
    for i, r in enumerate(rows, start=2):
        ours = r.get("source") != "reference"
        trial = r.get("trial") or ""
        if ours and (not trial.isascii() or not trial.isdigit()):
            raise UserError(
                f"{path} line {i}: trial {shown(trial)} is not a whole number: fix or delete "
                "that row"
            )
        for col in numeric.intersection(r):
            text = (r[col] or "").strip()
            if not text:
                continue
            try:
                finite = math.isfinite(float(text))
            except ValueError:
                if not ours:
                    continue  # the published files' notes ("OOM", "/") are read as no number
                finite = False
            if not finite:
                raise UserError(
                    f"{path} line {i}: {col} {shown(text)} is not a finite number: fix the "
                    "cell or delete that row"
                )
    return rows


def _numeric_columns() -> frozenset[str]:
    from tuner.leaderboard import FLOAT_COLUMNS, INT_COLUMNS

    return FLOAT_COLUMNS | INT_COLUMNS


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
        raise UserError(f"{flag} {shown(text)} has an empty name: write e.g. trial,status,step_s")
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
        check_readable_file(args.profile, "--profile", JSON_MAX_BYTES)
    check_runner_options(args)


_FOR_LAUNCHER = re.compile(r"--launcher (\w+):")


def check_runner_options(args: argparse.Namespace) -> None:
    """No option is given where it does nothing: the options of the `verl runner` group need
    `--runner verl`, and those whose help starts `--launcher X:` need that launcher (a
    `--ray-address` under `--runner estimate` was ignored without a word)."""
    from tuner.cli import build_parser

    if args.measure_generation is not None and args.runner not in ("megatron", "auto"):
        raise UserError(
            f"--{'' if args.measure_generation else 'no-'}measure-generation applies to the "
            f"megatron runner (--runner megatron or auto), not --runner {args.runner}: leave it "
            "out (the verl runner always generates, the estimator never does)"
        )
    layer_spec = getattr(args, "layer_spec", "auto")
    if layer_spec != "auto":
        if args.runner not in ("megatron", "auto"):
            raise UserError(
                f"--layer-spec {layer_spec} applies to the megatron runner (--runner "
                f"megatron or auto), not --runner {args.runner}: leave it out"
            )
        resolve_layer_spec(layer_spec)  # te without transformer-engine: one line, exit 2
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    for group in run._action_groups:
        if not (group.title or "").startswith("verl runner"):
            continue
        for a in group._group_actions:
            value = getattr(args, a.dest, a.default)
            if value == a.default or value in (None, [], False):
                continue
            flag = a.option_strings[0]
            if args.runner != "verl":
                raise UserError(
                    f"{flag} applies to --runner verl only, not --runner {args.runner}: add "
                    f"--runner verl or leave {flag} out"
                )
            m = _FOR_LAUNCHER.match(a.help or "")
            if m and args.launcher != m.group(1):
                raise UserError(
                    f"{flag} applies to --launcher {m.group(1)} only, not --launcher "
                    f"{args.launcher}: add --launcher {m.group(1)} or leave {flag} out"
                )


def _check_export(args: argparse.Namespace) -> None:
    if args.rank is not None and args.trial is not None:
        raise UserError(
            f"--rank {args.rank} and --trial {args.trial} both choose the row: pass one of them"
        )
    _check_leaderboards(args)
    check_writable_dir(args.recipes_dir, "--recipes-dir")


def _check_estimate(args: argparse.Namespace) -> None:
    if args.profile is not None:
        check_readable_file(args.profile, "--profile", JSON_MAX_BYTES)


def _check_calibrate(args: argparse.Namespace) -> None:
    _check_leaderboards(args)
    if args.start is not None:
        check_readable_file(args.start, "--start", JSON_MAX_BYTES)
    if args.gpu is not None:
        from tuner.hardware import get_gpu

        get_gpu(args.gpu)
    if not args.dry_run:
        from tuner.estimate.profile import DEFAULT_PROFILE_PATH

        reads = [*args.csv, *([args.start] if args.start else [])]
        check_output_file(args.out or DEFAULT_PROFILE_PATH, "--out", kind=".json", inputs=reads)


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
        check_output_file(out, "--out", kind=out.suffix.lower(), inputs=[args.csv])
    else:
        check_writable_dir(Path(args.csv).parent, "csv folder (the PNG goes beside it; or --out)")
        out = Path(args.csv).with_suffix(".png")
        check_output_file(out, "the PNG beside the csv (or --out)", kind=".png", inputs=[args.csv])


def _check_report(args: argparse.Namespace) -> None:
    _check_table(args)
    refs = [Path(r) for r in getattr(args, "reference", None) or ()]
    for ref in refs:
        check_readable_file(ref, "--reference")
    storage = getattr(args, "storage", None) or ""
    reads = [Path(args.csv), *refs]
    if storage and (storage.startswith("sqlite:///") or "://" not in storage):
        reads.append(Path(storage.removeprefix("sqlite:///")))
    out = getattr(args, "out", None)
    if out is None:
        check_writable_dir(
            Path(args.csv).parent, "csv folder (the report goes beside it; or --out)"
        )
        out, flag = Path(args.csv).with_suffix(".html"), "the report beside the csv (or --out)"
    else:
        flag = "--out"
    check_output_file(Path(out), flag, kind=".html", inputs=reads)


def _check_reread(args: argparse.Namespace) -> None:
    """The results folder is there (reread creates none) and its CSV may be rewritten."""
    results = args.results_dir
    st = _probe(results, "--results-dir")
    if st is None or not stat.S_ISDIR(st.st_mode):
        what = "does not exist" if st is None else "is not a folder"
        raise UserError(
            f"--results-dir {results} {what}: pass the folder holding {args.study}.csv and "
            f"{args.study}/trials/ (tune run's --results-dir)"
        )
    check_writable_file(results / f"{args.study}.csv", "leaderboard of the study:")
    if args.storage and "://" not in args.storage:
        check_writable_file(Path(args.storage), "--storage")


VALIDATORS: dict[str, Callable[[argparse.Namespace], None]] = {
    "run": _check_run,
    "export": _check_export,
    "estimate": _check_estimate,
    "calibrate": _check_calibrate,
    "show": _check_table,
    "report": _check_report,
    "reread": _check_reread,
    "plot": _check_plot,
}


def validate(args: argparse.Namespace) -> None:
    """The checks of `args.command` that need the file system or several arguments; raises
    UserError. Nothing is written."""
    check = VALIDATORS.get(getattr(args, "command", "") or "")
    if check is not None:
        check(args)
