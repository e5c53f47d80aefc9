"""The leaderboard DataFrame's columns: their types (and how a column of text gets its type), the
ones `tune show` prints and adds, their headings, and a column named on the command line."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tuner.errors import UserError
from tuner.results import COLUMN_TYPES, SHORT_NAMES, Status
from tuner.results import SHOW_COLUMNS as SHOW_COLUMNS  # re-exported: what `tune show` prints

REFERENCE_INT_COLUMNS = frozenset({"actor_budget", "log_prob_budget"})
"""Counts of the published reference CSVs only (their micro-batch or token budget columns:
results.files.normalize_reference)."""
REFERENCE_FLOAT_COLUMNS = frozenset({"rollout_s"})
"""Times of the reference CSVs that our rows do not have."""
REFERENCE_STRING_COLUMNS = frozenset({"contributor", "other"})
"""Text of the reference CSVs only."""


def _of_type(kind: type) -> frozenset[str]:
    return frozenset(c for c, t in COLUMN_TYPES.items() if t is kind)


INT_COLUMNS = _of_type(int) | REFERENCE_INT_COLUMNS
"""Counts: typed as pandas' nullable Int64 (an empty cell is <NA>, not a float NaN). The
leaderboard's int columns (results.COLUMN_TYPES: the record's and the knobs'), and the
references'."""

FLOAT_COLUMNS = _of_type(float) | REFERENCE_FLOAT_COLUMNS
"""Measures: float64 whatever the file holds, NaN where empty (so they are there to plot)."""

STRING_COLUMNS = _of_type(str) | REFERENCE_STRING_COLUMNS | {"file", "placement"}
"""Text, never guessed as numbers (a study named `2` stays a name); `file` is added by
load_leaderboard. The true/false columns are not typed by name: a column of true and false is
boolean, of other text text."""

STATUS_ORDER = (*(s.value for s in Status), "no-data")
"""Category order of `status`: ours, then the reference CSVs' rows without numbers."""

PREDICTED_PRUNED = frozenset({Status.PRUNED_INVALID.value, Status.PRUNED_OOM.value, "no-data"})
"""Statuses of rows that never launched."""

DERIVED_COLUMNS = (
    "file",
    "origin",
    "is_reference",
    "model_family",
    "vs_ref",
    "scope",
    "placement",
)
"""Columns load_leaderboard (and with_reference_ratio) add to the file's own."""


def typed(s: pd.Series, name: str) -> pd.Series:
    """One column of text with its type: by name where known, else by what every non-empty
    cell is (true/false, numbers, or text)."""
    if name in STRING_COLUMNS:
        return s.astype(str)
    blank = s.str.strip() == ""
    if name in INT_COLUMNS or name in FLOAT_COLUMNS:
        num = pd.to_numeric(s.where(~blank), errors="coerce").astype("float64")
        return _to_int(num) if name in INT_COLUMNS else num
    cells = s[~blank]
    if cells.empty:
        return s.astype(str)
    low = cells.str.strip().str.lower()
    if bool(low.isin(("true", "false")).all()):
        return s.str.strip().str.lower().map({"true": True, "false": False}).astype("boolean")
    num = pd.to_numeric(cells, errors="coerce")
    if bool(num.notna().all()):
        return pd.to_numeric(s.where(~blank), errors="coerce").astype("float64")
    return s.astype(str)


def _to_int(num: pd.Series) -> pd.Series:
    """Int64 where every value is whole, else float64."""
    num = num.astype("float64")
    return num.astype("Int64") if bool((num.dropna() % 1 == 0).all()) else num


def retyped(s: pd.Series, name: str) -> pd.Series:
    """A column pandas has read (or concatenated) brought to its type: text without NaN,
    counts Int64, measures float64, true/false columns boolean."""
    if name in STRING_COLUMNS:
        return s.fillna("").astype(str)
    if name in INT_COLUMNS:
        return _to_int(pd.to_numeric(s, errors="coerce"))
    if name in FLOAT_COLUMNS:
        return pd.to_numeric(s, errors="coerce").astype("float64")
    if pd.api.types.is_bool_dtype(s) or isinstance(s.dtype, pd.CategoricalDtype):
        return s if not pd.api.types.is_bool_dtype(s) else s.astype("boolean")
    if pd.api.types.is_numeric_dtype(s):
        return s
    values = s.dropna()
    if len(values) and bool(values.map(lambda v: isinstance(v, bool | np.bool_)).all()):
        return s.astype("boolean")
    return typed(s.astype(object).where(s.notna(), "").astype(str), name)


def column_name(name: str, df: pd.DataFrame, option: str) -> str:
    """A column of `df` by its name or its short heading; UserError naming the choices."""
    long = {v: k for k, v in SHORT_NAMES.items()}.get(name.strip(), name.strip())
    if long not in df.columns:
        raise UserError(
            f"{option}: no column {name!r}: use one of {', '.join(map(str, df.columns))}"
        )
    return long
