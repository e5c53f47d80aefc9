"""The checks a command runs before it writes or launches anything: what needs the file system or
several arguments (a results folder that is a file or read-only, a CSV that is a folder or
damaged, an output that would replace an input, `--columns` the leaderboard lacks, a `--storage`
of no known form, or one a reading command would have to create), per command (`validate`).
Each raises a one-line `UserError` that says what to change.
"""

from __future__ import annotations

import argparse
import csv
import errno
import io
import math
import os
import re
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from tuner.cli_args.options import check_runner_options
from tuner.cli_args.values import shown
from tuner.errors import UserError
from tuner.fileio import CSV_MAX_BYTES, JSON_MAX_BYTES, check_input_file, read_input
from tuner.megatron_layers import resolve_layer_spec

# --------------------------------------------------------------------------------------------
# The file system, checked before a command writes anything
# --------------------------------------------------------------------------------------------


NAME_MAX = 255
"""The longest name (bytes) of one file or folder on the file systems tune writes to."""


def _probe(path: Path, flag: str) -> os.stat_result | None:
    """The metadata of `path` (links followed); None where nothing is there. A path the system
    cannot follow (a symbolic link loop, a name too long) is a UserError, not a crash later;
    a name too long is refused even where a folder above it is missing (the system then says
    only that the folder is missing, and the name failed once the study had written)."""
    long = next((p for p in path.parts if len(os.fsencode(p)) > NAME_MAX), None)
    if long is not None:
        shown_name = long if len(long) <= 40 else long[:37] + "..."
        raise UserError(
            f"{flag} {path}: the name {shown_name!r} is {len(os.fsencode(long))} bytes, more "
            f"than the {NAME_MAX} a file name can have: shorten it (or the --study, --model "
            "folder or --storage name it is made of)"
        )
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


def probe_writable_dir(path: Path, flag: str) -> None:
    """A file can really be written in the folder `path` (or the nearest folder above it
    that is there, where it is to be created): a file is created there, one byte written and
    the file removed. `os.access` says only what the mode bits allow: an immutable folder
    (`chattr +i`), a read-only bind mount seen through another path, or a quota pass it, and
    the study ran its trials and then failed to write (issue 38). Run just before a command
    writes, after every check that refuses without writing."""
    import tempfile

    base = _nearest_existing(path)
    try:  # an unnamed, unbuffered file in `base`, gone when closed: a probe, not a file put
        probe = tempfile.TemporaryFile(dir=base, prefix=".tune-probe-", buffering=0)  # noqa: SIM115
    except OSError as e:
        raise UserError(
            f"{flag} {path}: cannot write in {base} ({e.strerror or e}): make it writable or "
            "pass another folder"
        ) from None
    with probe:
        try:
            probe.write(b"\0")
            os.fsync(probe.fileno())
        except OSError as e:
            raise UserError(
                f"{flag} {path}: cannot write a file in {base} ({e.strerror or e}): free "
                "space, raise the limit or pass another folder"
            ) from None


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


SQLITE_MAGIC = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file (sqlite.org/fileformat.html)."""

OUTPUT_KINDS: dict[str, tuple[str, tuple[bytes, ...]]] = {
    ".html": ("an HTML report", (b"<!doctype html", b"<html")),
    ".png": ("a PNG image", (b"\x89png\r\n\x1a\n",)),
    ".svg": ("an SVG image", (b"<?xml", b"<svg")),
    ".pdf": ("a PDF", (b"%pdf-",)),
    ".json": ("a calibration profile", (b"{",)),
}
"""What each kind of file a command writes (and replaces) starts with, by its suffix."""


def _what_is(head: bytes) -> str:
    if head.startswith(SQLITE_MAGIC):
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


def check_leaderboard(
    path: Path, flag: str = "csv", *, needs_ours: str = ""
) -> list[dict[str, str]]:
    """A readable leaderboard (ours or a reference) whose rows a command can use: UTF-8 text
    without a NUL byte, every row as many fields as the header (a file cut short mid-row, a row
    that lost cells), and in ours a whole-number `trial` in every row. `needs_ours`: what the
    command does with it, where a published reference CSV cannot serve (`tune export`).
    Returns the rows (our column names)."""
    from tuner.results import is_reference, read_rows, row_problem

    data = read_input(path, flag, CSV_MAX_BYTES)
    if b"\0" in data:
        line = data[: data.index(b"\0")].count(b"\n") + 1
        raise UserError(
            f"{path} line {line} holds a NUL byte: the file is damaged; fix or delete that line"
        )
    header = _check_csv_shape(data, path)
    if needs_ours and header and is_reference(header):
        raise UserError(
            f"{flag} {path} is a published reference CSV: {needs_ours} takes a leaderboard that "
            "`tune` wrote (results/<study>.csv)"
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
        # ours: every cell as its column's type, a known schema and status, no impossible
        # number (results.row_problem); the published files' numbers finite and not negative
        why = row_problem(r) if ours else _reference_problem(r, numeric)
        if why:
            raise UserError(f"{path} line {i}: {why}")
    return rows


def _reference_problem(row: dict[str, str], numeric: frozenset[str]) -> str | None:
    """A published reference row's number that is not finite, or negative; their notes in a
    numeric column ("OOM", "/") are read as no number."""
    for col in numeric.intersection(row):
        text = (row[col] or "").strip()
        try:
            value = float(text)
        except ValueError:
            continue
        if not math.isfinite(value):
            return f"{col} {shown(text)} is not a finite number: fix the cell or delete that row"
        if value < 0:
            return f"{col} {shown(text)} is negative: fix the cell or delete that row"
    return None


def _check_csv_shape(data: bytes, path: Path) -> list[str]:
    """The CSV text `data` of `path` decodes as UTF-8 and each row has the header's number of
    fields; returns the header. csv.DictReader fills a short row with None and keeps a long
    row's extra cells under None, so a leaderboard cut short mid-row (a copy interrupted) or a
    row that lost cells was read as a row of empty measures."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UserError(
            f"{path} line {line} is not UTF-8 text (byte 0x{data[e.start]:02x}): save the file "
            "as UTF-8, or fix or delete that line"
        ) from None
    reader = csv.reader(io.StringIO(text, newline=""))
    header: list[str] = []
    try:
        for row in reader:
            if not header:
                header = row
                continue
            if row and len(row) != len(header):
                line = reader.line_num
                cut = not text.endswith(("\n", "\r")) and line == text.count("\n") + 1
                why = (
                    "the file ends in the middle of it (cut short?): copy the file again or "
                    "delete that line"
                    if cut
                    else "the row is damaged: fix or delete that line"
                )
                raise UserError(
                    f"{path} line {line} has {len(row)} fields, the header {len(header)}: {why}"
                )
    except csv.Error as e:
        raise UserError(f"{path} line {reader.line_num}: {e}: fix or delete that line") from None
    return header


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
    if args.storage:
        path = check_storage_url(args.storage)
    else:  # the default storage, results/studies.sqlite3, is opened by a sqlite:/// URL too
        default = str(args.results_dir / "studies.sqlite3")
        path = check_storage_url(default, "--results-dir (its studies.sqlite3)")
    if path is not None:
        check_writable_file(path, "--storage")
        _check_storage_kind(path)
    if args.profile is not None:
        check_readable_file(args.profile, "--profile", JSON_MAX_BYTES)
    if args.candidates_from is not None:
        check_leaderboard(args.candidates_from, "--candidates-from", needs_ours="--candidates-from")
    check_runner_options(args)
    layer_spec = getattr(args, "layer_spec", "auto")
    if layer_spec != "auto":
        resolve_layer_spec(layer_spec)  # te without transformer-engine: one line, exit 2


def _check_storage_kind(path: Path) -> None:
    """An SQLite storage file that is there is an Optuna storage of a schema this Optuna opens
    (study.storage.check_storage_file), read without writing: refused before the study's
    set-up, not after it. A journal is read once, where it is opened."""
    from tuner.study.storage.urls import JOURNAL_SUFFIXES

    st = _probe(path, "--storage")
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return
    if path.suffix in JOURNAL_SUFFIXES:
        return
    from tuner.study.storage.opening import check_storage_file

    check_storage_file(path, journal=False)


STORAGE_SCHEMES = ("sqlite", "postgresql", "mysql", "mariadb", "oracle", "mssql")
"""URL schemes of the databases SQLAlchemy, under Optuna's RDBStorage, has a dialect for (a
driver may follow after `+`: postgresql+psycopg2://)."""
_URL_LIKE = re.compile(r"([A-Za-z][A-Za-z0-9+]*):/{0,2}(.*)", re.DOTALL)


def check_storage_url(text: str, flag: str = "--storage", *, writes: bool = True) -> Path | None:
    """The form of a `--storage` value, before anything opens it: a URL of a database scheme
    SQLAlchemy knows (`ftp://` was tried as a SQLAlchemy plugin and failed with 'move the file
    aside'), a SQLite URL naming a file (`sqlite://` alone is an in-memory database that keeps
    nothing; `sqlite://x.db` names a host), or a file path that is not a URL missing its `//`
    (`sqlite:x.db` became a SQLite file of that name). No control character (a file was made
    of `a<newline>b.db`); a SQLite file the name of the one SQLAlchemy opens
    (`_sqlite_file_problem`); and where the command writes (`writes`), no server URL that asks
    for a read-only session. Returns the storage file of a path or a sqlite:/// URL, None for a
    server's URL."""
    odd = next((ch for ch in text if not ch.isprintable()), None)
    if odd is not None:
        raise UserError(
            f"{flag} {shown(text)} holds the control character {odd!r}: write the storage "
            "without it (a file name made of it cannot be typed back)"
        )
    if "://" not in text:
        m = _URL_LIKE.fullmatch(text)
        scheme = m.group(1).lower().split("+")[0] if m else ""
        if m and (scheme in STORAGE_SCHEMES or scheme == "postgres"):
            fix = f"sqlite:///{m.group(2)}" if scheme == "sqlite" else f"{m.group(1)}://..."
            raise UserError(f"{flag} {text} is a URL without its //: write {fix}")
        from tuner.study.storage.urls import JOURNAL_SUFFIXES

        if Path(text).suffix not in JOURNAL_SUFFIXES:  # opened as sqlite:///<it>
            _sqlite_file_problem(text, text, flag)
        return Path(text)
    scheme, rest = text.split("://", 1)
    base = scheme.lower().split("+")[0]
    if base not in STORAGE_SCHEMES:
        hint = " (SQLAlchemy's name is postgresql)" if base == "postgres" else ""
        raise UserError(
            f"{flag} {text}: unknown scheme {scheme!r}{hint}: write sqlite:///<file>, "
            "postgresql://<user>@<host>/<db>, mysql://<user>@<host>/<db>, or a file path "
            "(*.log: a journal file)"
        )
    if base != "sqlite":
        if writes:
            _read_only_problem(text, flag)
        return None
    if rest == "":
        rest = "/"  # sqlite:// alone: SQLAlchemy's in-memory database, as sqlite:///:memory:
    if not rest.startswith("/"):
        raise UserError(
            f"{flag} {text} names a host, which SQLite has not: write sqlite:///{rest} (three "
            "slashes; four for an absolute path)"
        )
    path = rest[1:]
    if path in ("", ":memory:") or path.startswith(("file::memory:", ":memory:?")):
        raise UserError(
            f"{flag} {text} is an in-memory database, which keeps nothing once tune exits: "
            "write sqlite:///<file>"
        )
    _sqlite_file_problem(path, text, flag)
    return Path(path)


def _sqlite_file_problem(path: str, text: str, flag: str) -> None:
    """UserError where SQLAlchemy would open another file than `path`, the one tune checks,
    locks and records: a `?` starts the URL's query (`sqlite:///x.db?mode=ro` opened x.db, and
    wrote it, beside a lock named `x.db?mode=ro.lock`), a `%XX` is unescaped (`a%20b.db` opened
    `a b.db`). SQLite's URL options (mode=ro, immutable) would also open a storage tune must
    write read-only."""
    from sqlalchemy.engine import make_url

    url = make_url(f"sqlite:///{path}")
    if url.query:
        options = "&".join(f"{k}={v}" for k, v in url.query.items())
        raise UserError(
            f"{flag} {text}: SQLAlchemy reads ?{options} as SQLite options and opens "
            f"{url.database}, not the file tune checks and locks; tune writes its study "
            f"there, so write the file alone: sqlite:///{url.database}"
        )
    if url.database != path:
        raise UserError(
            f"{flag} {text}: SQLAlchemy unescapes the % in it and opens {url.database}, not "
            f"{path}: name a file without %XX"
        )


READ_ONLY_SESSIONS = ("read-only", "standby", "prefer-standby")
"""PostgreSQL's (libpq's) `target_session_attrs` values that connect to a server, or a session,
that cannot write."""
_READ_ONLY_SETTING = re.compile(r"\b(?:default_)?transaction_read_only\s*=\s*(on|true|yes|1)\b")
"""A `-c` setting of libpq's `options` that makes every transaction read-only."""


def _read_only_problem(text: str, flag: str) -> None:
    """UserError where a server URL's query asks for a read-only session: tune writes its
    study's trials to the storage, so every write would fail once the study starts."""
    from urllib.parse import parse_qsl, urlsplit

    for key, value in parse_qsl(urlsplit(text).query):
        low = value.strip().lower()
        if (key.lower() == "target_session_attrs" and low in READ_ONLY_SESSIONS) or (
            key.lower() == "options" and _READ_ONLY_SETTING.search(low)
        ):
            raise UserError(
                f"{flag} {text}: {key}={value} opens a read-only session, and tune writes its "
                f"study to the storage: leave {key} out"
            )


def check_stored_storage(text: str, flag: str = "--storage") -> Path | None:
    """A storage a command only reads or adds to (`tune report`, `tune reread`): a server's
    URL, or a file that is there and is an Optuna storage. An empty or missing file was
    opened all the same, and Optuna created its tables in it. Returns the file, None for a
    server's URL (check_storage_url)."""
    path = check_storage_url(text, flag, writes=False)
    if path is not None:
        check_existing_storage(path, flag)
    return path


def check_existing_storage(path: Path, flag: str) -> None:
    """`path` is an existing Optuna storage file: a journal (by its suffix) or an SQLite
    database that is not another application's. Read without writing to it."""
    from tuner.study.storage import JOURNAL_SUFFIXES, OPTUNA_TABLES, sqlite_tables

    st = _probe(path, flag)
    if st is None:
        raise UserError(
            f"{flag} {path}: no such file: pass the study's storage (this command reads one, "
            "it creates none)"
        )
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{flag} {path} is a folder: pass the study's storage file")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{flag} {path} is not a regular file (a pipe or a device): pass a file")
    if st.st_size == 0:
        raise UserError(
            f"{flag} {path} is empty, not an Optuna storage: pass the study's storage (or "
            "delete the empty file)"
        )
    if not os.access(path, os.R_OK):
        raise UserError(f"{flag} {path} cannot be read: check its permissions")
    if path.suffix in JOURNAL_SUFFIXES:
        return  # its entries are checked by open_storage (storage.journal_damage)
    with open(path, "rb") as f:
        head = f.read(16)
    if head != SQLITE_MAGIC:
        raise UserError(
            f"{flag} {path} is not an SQLite database (an Optuna storage): pass the study's storage"
        )
    tables = sqlite_tables(path)
    if tables and not tables >= OPTUNA_TABLES:
        raise UserError(
            f"{flag} {path} is another application's SQLite database, not an Optuna storage: "
            "pass the study's storage"
        )


def _check_export(args: argparse.Namespace) -> None:
    if args.rank is not None and args.trial is not None:
        raise UserError(
            f"--rank {args.rank} and --trial {args.trial} both choose the row: pass one of them"
        )
    check_leaderboard(Path(args.csv), needs_ours="`tune export`")
    check_writable_dir(args.recipes_dir, "--recipes-dir")


def _check_estimate(args: argparse.Namespace) -> None:
    if args.micro_batch is not None:  # dynamic batching off: its token budgets do nothing
        for flag, value in (
            ("--max-token-len", args.max_token_len),
            ("--logprob-max-token-len", args.logprob_max_token_len),
        ):
            if value is not None:
                raise UserError(
                    f"{flag} {value} is a dynamic-batching token budget, and --micro-batch "
                    f"{args.micro_batch} turns dynamic batching off: pass one of them"
                )
    if args.profile is not None:
        check_readable_file(args.profile, "--profile", JSON_MAX_BYTES)


def _check_calibrate(args: argparse.Namespace) -> None:
    _check_leaderboards(args)
    if args.start is not None:
        check_readable_file(args.start, "--start", JSON_MAX_BYTES)
    if args.gpu is not None:
        from tuner.hardware import get_gpu

        get_gpu(args.gpu)
    if args.dry_run and args.out is not None:  # nothing is written: --out would do nothing
        raise UserError(
            f"--out {args.out} names where the profile is written, and --dry-run writes none: "
            "pass one of them"
        )
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
        check_leaderboard(ref, "--reference")
    storage = getattr(args, "storage", None) or ""
    reads = [Path(args.csv), *refs]
    stored = check_stored_storage(storage) if storage else None
    if stored is not None:
        reads.append(stored)
    out = getattr(args, "out", None)
    if out is None:
        check_writable_dir(
            Path(args.csv).parent, "csv folder (the report goes beside it; or --out)"
        )
        out, flag = Path(args.csv).with_suffix(".html"), "the report beside the csv (or --out)"
    else:
        flag = "--out"
    check_output_file(Path(out), flag, kind=".html", inputs=reads)
    if Path(out).suffix.lower() not in (".html", ".htm"):  # r.png was written as HTML
        raise UserError(
            f"--out {out}: the report is an HTML page: end the name in .html (a PNG of the "
            "leaderboard is tune plot's)"
        )


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
    if args.storage:
        path = check_storage_url(args.storage)
        if path is not None:  # reread adds to it: there, an Optuna storage, writable
            check_existing_storage(path, "--storage")
            check_writable_file(path, "--storage")
        return
    for default in (results / f"{args.study}.sqlite3", results / "studies.sqlite3"):
        if _probe(default, "storage of the study") is not None:  # tune reread opens each there
            check_existing_storage(default, "storage of the study")


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
