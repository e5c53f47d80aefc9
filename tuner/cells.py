"""A leaderboard cell's text read as its column's type, strictly: the one reader of a CSV cell
that becomes a knob or a count (a candidate read back from a row, the leaderboard check every
command that takes a CSV runs first). `15360.5` was read as the count 15360, `maybe` as false and
`yes` as true (issue 38 item 4); each is now a ValueError whose text says what the cell holds. A
leaf module: it imports the stdlib only.
"""

from __future__ import annotations

import math
from typing import Any

TRUE_CELLS = ("true", "1")
"""A true/false cell that reads as true (any case): what `tune` writes (`True`), and 1."""
FALSE_CELLS = ("false", "0")
"""A true/false cell that reads as false (any case)."""


def cell_value(text: str, typ: type) -> Any:
    """`text` (a CSV cell, stripped) as `typ`: an int is a whole number (`4`, also `4.0` or
    `4e0`, as a spreadsheet may save it), a float a finite number, a bool one of TRUE_CELLS or
    FALSE_CELLS; any other type as `typ(text)`. ValueError naming the cell where it is not."""
    s = text.strip()
    shown = repr(s if len(s) <= 40 else s[:40] + "...")
    if typ is bool:
        low = s.lower()
        if low in TRUE_CELLS or low in FALSE_CELLS:
            return low in TRUE_CELLS
        raise ValueError(f"{shown} is not true or false")
    if typ is int:
        try:
            return int(s)
        except ValueError:
            pass
        x = _finite(s, shown)
        if not x.is_integer():
            raise ValueError(f"{shown} is not a whole number")
        return int(x)
    if typ is float:
        return _finite(s, shown)
    return typ(text)


def _finite(s: str, shown: str) -> float:
    try:
        x = float(s)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise ValueError(f"{shown} is not a finite number")
    return x
