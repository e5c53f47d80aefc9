"""The report's HTML pieces: esc text, paragraphs, inline figures, tables, row labels."""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import pandas as pd

from tuner import plots
from tuner.report.study import num


def esc(x: Any) -> str:
    """`x` as HTML text (quotes esc too)."""
    return html.escape(str(x), quote=True)


def paragraph(text: str, cls: str = "") -> str:
    """A `<p>` of HTML `text`, of class `cls` where given."""
    c = f' class="{cls}"' if cls else ""
    return f"<p{c}>{text}</p>"


def figure_html(fig: Any, alt: str, caption: str = "") -> str:
    """A matplotlib figure as an inline PNG `<figure>`, with its alt text and caption."""
    width, height = (int(round(v * 96)) for v in fig.get_size_inches())
    data = plots.png_base64(fig)
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{esc(alt)}" width="{width}" '
        f'height="{height}">{cap}</figure>'
    )


def table_html(df: pd.DataFrame, index: bool = False) -> str:
    """A table by pandas: numbers formatted as in `tune show`, empty cells blank."""
    out = df.copy()
    for c in out.columns:
        s = out[c]
        if pd.api.types.is_bool_dtype(s) and not pd.api.types.is_numeric_dtype(s.dtype.type):
            out[c] = s.astype("object").map(lambda x: "" if pd.isna(x) else str(bool(x)))
        elif pd.api.types.is_integer_dtype(s):
            out[c] = s.astype("object").map(lambda x: "" if pd.isna(x) else str(int(x)))
        elif pd.api.types.is_float_dtype(s):
            out[c] = s.map(lambda x: "" if pd.isna(x) else num(x))
        else:
            out[c] = s.astype("object").map(lambda x: "" if x is None or pd.isna(x) else str(x))
    return str(out.to_html(index=index, border=0, classes="t", escape=True, na_rep=""))


def _layout(r: pd.Series) -> str:
    rollout = f" / rollout {r['infer_parallel']}" if r["infer_parallel"] else ""
    placed = str(r.get("placement", "") or "")
    split = f" ({placed}, one step off-policy)" if placed.startswith("split") else ""
    return f"{r['train_parallel']}{rollout}{split}"


def row_label(r: pd.Series) -> str:
    """`trial 4 ep2 / rollout tp1`, `dapo7b.csv trial 5 tp4 / rollout tp1`, with the origin of
    a reference layout run in the study: `trial 1 tp2 / rollout tp1 [reference tp2]`."""
    if r["source"] == "reference":
        return f"{r['file']} trial {r['trial']} {_layout(r)}"
    origin = f" [{r['origin']}]" if str(r["origin"]).startswith("reference") else ""
    return f"trial {r['trial']} {_layout(r)}{origin}"


def has_value(v: Any) -> bool:
    """`v` is a value a cell shows (not None, NaN or empty)."""
    return (
        v is not None
        and v is not pd.NA
        and not (isinstance(v, float) and np.isnan(v))
        and (str(v) != "")
    )


def cell_html(v: Any) -> str:
    """A cell's text: a float as `tune show` formats numbers, a boolean as True/False, anything
    else as str()."""
    if isinstance(v, float | np.floating):
        return num(v)
    if isinstance(v, np.bool_ | bool):
        return str(bool(v))
    return str(v)
