"""The report's page: its sections in order, the style, and the atomic write of the HTML file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tuner.report.importance import section_knobs
from tuner.report.markup import esc, paragraph
from tuner.report.sections import (
    section_answer,
    section_cost,
    section_failures,
    section_memory,
    section_phases,
    section_prediction,
    section_progress,
)
from tuner.report.study import load_study

SECTIONS = (
    ("answer", "The answer"),
    ("progress", "Search progress"),
    ("memory", "Throughput vs peak memory"),
    ("knobs", "Which knobs mattered"),
    ("phases", "Time per phase"),
    ("failures", "Failures by reason"),
    ("cost", "What the study cost"),
    ("prediction", "Predicted vs measured"),
)
"""(id, heading) of each section, in the page's order."""


_CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2330;
margin:0;background:#f6f7f9}
main{max-width:1080px;margin:0 auto;padding:24px 28px 60px;background:#fff}
h1{font-size:1.6em;margin:.2em 0}h2{font-size:1.25em;margin:1.8em 0 .5em;border-bottom:
1px solid #dde;padding-bottom:4px}
.meta,.small{color:#5a6272;font-size:.9em}.big{font-size:1.15em}
.banner{background:#fff4d6;border:1px solid #e8c66b;padding:8px 12px;border-radius:4px}
.answer{background:#eef6ee;border:1px solid #9cc79c;padding:6px 14px;border-radius:4px}
nav a{margin-right:12px}
table.t{border-collapse:collapse;margin:8px 0 16px;font-size:.88em}
table.t th,table.t td{padding:3px 9px;border-bottom:1px solid #e3e6ea;text-align:left}
table.t thead th{background:#f0f2f5}table.t tbody tr:nth-child(even){background:#fafbfc}
figure{margin:10px 0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#5a6272;font-size:.85em}
pre{background:#f3f4f6;padding:8px 12px;border-radius:4px;overflow-x:auto}
"""


def build_report(csv: Path, *, storage: str | None = None, references: Sequence[Path] = ()) -> str:
    """The report's HTML for the leaderboard at `csv`. Raises UserError (one line) where the
    file is not a leaderboard; an empty or all-failed one gives a page that says so."""
    s = load_study(csv, references)
    title = ", ".join(str(x) for x in s.df["study"].unique() if x) or csv.stem
    kind = "estimates (cost model, nothing measured)" if s.estimates else "measured"
    banner = ""
    if s.estimates:
        banner = paragraph(
            "<strong>Estimates.</strong> Every number on this page comes from the cost model "
            "(<code>source=estimate</code>): no GPU ran these trials. Measure the best rows with "
            "<code>--runner megatron</code> or <code>verl</code> before relying on them.",
            "banner",
        )
    elif s.df.empty:
        banner = paragraph(
            "<strong>Empty leaderboard.</strong> It has a header but no rows yet.", "banner"
        )
    where = f"{s.num_gpus} × {s.gpu}" if s.gpu else "unknown GPUs"
    models = ", ".join(sorted({str(m) for m in s.df["model"].unique() if m})) or "-"
    meta = paragraph(
        f"Leaderboard <code>{esc(csv)}</code>: {len(s.df)} rows, model {esc(models)}, "
        f"{esc(where)}, {esc(kind)}." + (f" {esc(' '.join(s.notes))}" if s.notes else ""),
        "meta",
    )
    nav = "<nav>" + "".join(f'<a href="#{i}">{esc(h)}</a>' for i, h in SECTIONS) + "</nav>"
    bodies = {
        "answer": section_answer(s),
        "progress": section_progress(s),
        "memory": section_memory(s),
        "knobs": section_knobs(s, storage),
        "phases": section_phases(s),
        "failures": section_failures(s),
        "cost": section_cost(s),
        "prediction": section_prediction(s),
    }
    sections = "".join(
        f'<section id="{i}"><h2>{esc(h)}</h2>{bodies[i]}</section>' for i, h in SECTIONS
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>verl-tuner report: {esc(title)}</title><style>{_CSS}</style></head>"
        f"<body><main><h1>verl-tuner report: {esc(title)}</h1>{meta}{banner}{nav}"
        f"{sections}</main></body></html>\n"
    )


def write_report(
    csv: Path,
    out: Path | None = None,
    *,
    storage: str | None = None,
    references: Sequence[Path] = (),
) -> Path:
    """Build the report and write it atomically (default: beside the CSV, `.html`)."""
    from tuner.fileio import write_atomic

    text = build_report(csv, storage=storage, references=references)
    path = out or csv.with_suffix(".html")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    return path
