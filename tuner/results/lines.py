"""A record's line of the CSV leaderboard, formatted once: the study keeps it beside the record
in its storage (`LINE_KEY`) and the leaderboard view joins the stored lines (study.csv_view), so a
large study's CSV is rebuilt without reformatting. Below both the storage and the view, which
each read it."""

from __future__ import annotations

import csv
import io
import zlib
from typing import Any

from tuner.results.record import COLOCATED_ONLY_OMITTED, COLUMNS, SCHEMA_VERSION, fmt


def _cell(v: Any) -> str:
    t = type(v)
    if t is str:
        return v  # type: ignore[no-any-return]
    if v is None:
        return ""
    if t is float:
        return "" if v != v else f"{v:.6g}"
    if t is bool or t is int:
        return str(v)
    return fmt(v)


FULL_COLUMNS = COLUMNS
"""The columns of a leaderboard holding a split row: every one."""
COLOCATED_COLUMNS = tuple(c for c in COLUMNS if c not in COLOCATED_ONLY_OMITTED)
"""The columns of a leaderboard whose rows are all colocated (results.files.csv_text leaves the
placement out the same way): what it wrote before placement was searched."""
_VERSION_CELL = str(SCHEMA_VERSION)


def is_split(d: dict[str, Any]) -> bool:
    """The record dict is of a split candidate (rollout GPUs of its own)."""
    v = d.get("rollout_gpus")
    return v not in (None, "", 0, "0")


def _key_of(columns: tuple[str, ...]) -> str:
    return f"{SCHEMA_VERSION}:{zlib.crc32((','.join(columns) + chr(10)).encode()):08x}"


def record_line(d: dict[str, Any], recipe: str = "", columns: tuple[str, ...] | None = None) -> str:
    """One CSV line (with its newline) of a record dict (`TrialRecord.to_dict()`), in `columns`
    (default: the full set for a split record, the colocated set otherwise)."""
    cols = columns or (FULL_COLUMNS if is_split(d) else COLOCATED_COLUMNS)
    cells = [v if type(v) is str else "" if v is None else _cell(v) for v in map(d.get, cols)]
    cells[0] = _VERSION_CELL
    if recipe:
        cells[cols.index("recipe")] = recipe
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(cells)
    return buf.getvalue()


COLUMNS_KEY = _key_of(COLOCATED_COLUMNS)
"""Identifies the column set a stored line was formatted for (knobs change between versions):
a colocated record's (the same key as before placement existed, so stored lines stay valid)."""
SPLIT_COLUMNS_KEY = _key_of(FULL_COLUMNS)
"""The same for a split record's line: every column, the placement's too."""
LINE_KEY = "_csv_line"
"""Key of a record dict's formatted CSV line, [COLUMNS_KEY, line], kept beside the record in
the storage so that rebuilding a large study's CSV is a join, not a reformatting."""


def line_entry(d: dict[str, Any]) -> list[str]:
    return [SPLIT_COLUMNS_KEY if is_split(d) else COLUMNS_KEY, record_line(d)]
