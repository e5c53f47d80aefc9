"""Rendering leaderboard rows as `tune show` prints them: an aligned text table (the one
tuner.results.format_table prints), CSV, JSON or Markdown."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pandas as pd

from tuner.errors import UserError
from tuner.leaderboard.columns import SHORT_NAMES, SHOW_COLUMNS, column_name
from tuner.results import number_text, text_table

FORMATS = ("table", "csv", "json", "markdown")


def _cells(s: pd.Series, name: str, max_text: int) -> list[str]:
    """Display strings of one column: numbers to 3 significant digits (whole above 100), empty
    where missing. Plain Python lists: 10,000 rows format in a few milliseconds."""
    if name == "vs_ref":
        return ["" if x != x else f"{x:.2f}x" for x in s.astype("float64").tolist()]
    if pd.api.types.is_bool_dtype(s):
        return ["" if x is None or x is pd.NA else str(bool(x)) for x in s.tolist()]
    if pd.api.types.is_integer_dtype(s):
        return ["" if x is None or x is pd.NA else str(int(x)) for x in s.tolist()]
    if pd.api.types.is_float_dtype(s):
        return ["" if x != x else number_text(x) for x in s.tolist()]
    out = [str(x) for x in s.tolist()]
    return [x[:max_text] for x in out] if name == "reason" else out


def resolve_columns(df: pd.DataFrame, columns: Sequence[str] | None) -> list[str]:
    """Requested columns (names or short headings), or the default ones that hold a value in
    some row. `all` means every column."""
    if columns is None:
        cols = [c for c in SHOW_COLUMNS if c in df.columns]
        has = [c for c in cols if _has_value(df[c])]
        return has or cols[:4]
    if list(columns) == ["all"]:
        return list(df.columns)
    return [column_name(c, df, "--columns") for c in columns]


def _has_value(s: pd.Series) -> bool:
    if pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s):
        return bool(s.notna().any())
    return bool((s.astype(str) != "").any())


def render(df: pd.DataFrame, columns: Sequence[str], fmt: str = "table", max_text: int = 60) -> str:
    """The rows as an aligned text table, CSV, JSON (a list of objects, null where empty) or a
    Markdown table."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    part = df[list(columns)]
    if fmt == "csv":
        return part.to_csv(index=False).rstrip("\n")
    if fmt == "json":
        plain = part.astype(object).where(part.notna(), None)
        return json.dumps(plain.to_dict("records"), default=_json_default, indent=1)
    heads = [SHORT_NAMES.get(c, c) if fmt == "table" else c for c in columns]
    body = [_cells(part[c], c, max_text) for c in columns]
    if fmt == "table":
        return text_table(heads, body)
    rows = list(zip(*body, strict=True)) if body else []
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    lines += ["| " + " | ".join(v.replace("|", r"\|") for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _json_default(x: object) -> object:
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return None if np.isnan(x) else float(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return str(x)
