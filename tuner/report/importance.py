"""Which knobs mattered: the study's Optuna storage found and fANOVA's importances drawn."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from tuner import plots
from tuner.errors import UserError, redact
from tuner.report.markup import esc, figure_html, paragraph, table_html
from tuner.report.study import Study, most_common
from tuner.space import (
    LAYOUT_DEGREES,  # fANOVA scores them as ordered integers (log scale)
    OLD_PARAMS,
)

MIN_IMPORTANCE_TRIALS = 4
"""Completed trials fANOVA needs before its importances mean anything."""

MAX_IMPORTANCE_CHOICES = 16
"""A categorical knob with more choices than this is left out of fANOVA: one-hot encoded, the
search's `layout` (840 choices for qwen3-30b-moe on 32 GPUs) kept it running for over 18
minutes on 80 trials. The layout is scored through its degrees instead (`LAYOUT_DEGREES`)."""

MAX_IMPORTANCE_TRIALS = 2000
"""fANOVA is fitted on at most this many completed trials (the latest), so its time is bounded
whatever the study's size (scripts/bench_report.py)."""


def storage_url(label: str, folder: Path) -> str:
    """An Optuna storage URL or path from what a leaderboard's `storage` column records
    (tuner.study.storage_label: `sqlite:studies.sqlite3` relative to the leaderboard's
    `folder`, an older `sqlite:/abs/path`, `journal:...`, or a URL)."""
    from tuner.study.storage import label_url

    return label_url(label, folder)


def _open_study(s: Study, storage: str | None) -> tuple[Any, str, str]:
    """(optuna study or None, a sentence on where it came from or why not, the storage's URL
    or path: '' when none). The storage:
    --storage, else the one the CSV names, else `<csv name>.sqlite3` or studies.sqlite3 beside
    the CSV (the committed measured leaderboards keep theirs under the CSV's name)."""
    names = [n for n in s.df["study"].unique() if n]
    if not names:
        return None, "The leaderboard names no study.", ""
    name = str(names[0])
    if storage:
        candidates = [storage]
    else:
        named = str(most_common(s.df["storage"]) or "") if "storage" in s.df.columns else ""
        candidates = [storage_url(named, s.csv.parent)] if named else []
        for beside in (s.csv.with_suffix(".sqlite3"), s.csv.parent / "studies.sqlite3"):
            candidates.append(f"sqlite:///{beside}")
    from tuner.study.storage import file_of

    url = ""
    for c in candidates:
        f, _ = file_of(c)
        # an empty file is no storage: opening it, Optuna would create its tables there
        if f is None or (f.is_file() and f.stat().st_size > 0):
            url = c
            break
    if not url:
        tried = " or ".join(esc(redact(c)) for c in candidates)
        return (
            None,
            f"No Optuna storage found ({tried} does not exist here): pass <code>--storage</code> "
            "to see which knobs mattered.",
            "",
        )
    import optuna

    from tuner.study import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        st = optuna.load_study(study_name=name, storage=open_storage(url))
    except KeyError:
        return None, f"The storage {esc(redact(url))} holds no study named {esc(name)}.", ""
    except UserError as e:
        return None, esc(redact(str(e))), ""
    return st, f"Study {esc(name)} in {esc(redact(url))}.", url


def importance_study(
    trials: Sequence[Any], overlay: dict[str, Any] | None = None
) -> tuple[Any, list[str]]:
    """An in-memory Optuna study of the completed `trials` on a bounded parameterization, for
    fANOVA: each knob as sampled, except a categorical of more than `MAX_IMPORTANCE_CHOICES`
    choices (left out), plus the layout's degrees from each trial's record (`stored_record`,
    with the study's `tune reread` fills, `overlay`) as integers.
    Returns (the study, the knobs left out)."""
    import optuna

    from tuner.study.storage import stored_record

    dists = optuna.distributions
    left_out: set[str] = set()
    rows: list[tuple[dict[str, Any], dict[str, Any], float]] = []
    for t in trials[-MAX_IMPORTANCE_TRIALS:]:
        params, dist = {}, {}
        for name, v in t.params.items():
            d, k = t.distributions[name], OLD_PARAMS.get(name, name)
            if isinstance(d, dists.CategoricalDistribution) and len(d.choices) > (
                MAX_IMPORTANCE_CHOICES
            ):
                left_out.add(k)
                continue
            params[k], dist[k] = v, d
        rec = stored_record(t, overlay)
        if rec is not None:
            for k in LAYOUT_DEGREES:
                v = rec.get(k)
                if isinstance(v, int) and v >= 1 and k not in params:
                    params[k] = v
        rows.append((params, dist, float(t.value)))
    for k in LAYOUT_DEGREES:
        seen = [p[k] for p, _, _ in rows if k in p]
        if len(seen) == len(rows) and min(seen) < max(seen):
            d = dists.IntDistribution(min(seen), max(seen), log=True)
            for _, dist, _ in rows:
                dist[k] = d
        else:
            for p, _, _ in rows:
                p.pop(k, None)
    study = optuna.create_study(direction="maximize")
    study.add_trials(
        [optuna.trial.create_trial(params=p, distributions=d, value=v) for p, d, v in rows]
    )
    return study, sorted(left_out)


def _dashboard(url: str) -> str:
    """The optuna-dashboard command for the storage the report read (none: no hint, it would
    name a file that does not exist and the dashboard would create it empty)."""
    if not url:
        return ""
    from tuner.study import storage_label

    # a file as the report found it (relative stays relative); a server without its password
    shown = url if url.startswith("sqlite:") or "://" not in url else storage_label(url)
    return (
        "<p class='small'>Browse the study interactively: <code>pip install optuna-dashboard"
        f" &amp;&amp; optuna-dashboard {esc(shown)}</code>.</p>"
    )


def section_knobs(s: Study, storage: str | None) -> str:
    st, where, url = _open_study(s, storage)
    if st is None:
        return paragraph(f"Not computed. {where}")
    dash = _dashboard(url)
    import optuna

    done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(done) < MIN_IMPORTANCE_TRIALS:
        return (
            paragraph(
                f"{where} Only {len(done)} completed trials (fANOVA needs at least "
                f"{MIN_IMPORTANCE_TRIALS} with varied knobs): not computed."
            )
            + dash
        )
    try:
        from tuner.study.storage import reread_overlay

        bounded, left_out = importance_study(done, reread_overlay(st))
        ev = optuna.importance.FanovaImportanceEvaluator(seed=0)
        imp = optuna.importance.get_param_importances(bounded, evaluator=ev)
    except ImportError:
        return (
            paragraph(f"{where} fANOVA needs scikit-learn: <code>pip install scikit-learn</code>.")
            + dash
        )
    except (RuntimeError, ValueError) as e:
        return paragraph(f"{where} fANOVA could not run: {esc(str(e).splitlines()[0])}.") + dash
    if not imp:
        return paragraph(f"{where} No knob varied across the completed trials.") + dash
    series = pd.Series(imp, dtype="float64")
    fig, ax = plots.new_figure(8.5, 0.35 * len(series) + 1.4)
    plots.draw_importances(ax, series)
    fig.tight_layout()
    table = series.rename_axis("knob").reset_index(name="importance")
    top = series.idxmax()
    used = min(len(done), MAX_IMPORTANCE_TRIALS)
    note = ""
    if left_out:
        note = (
            f" Left out ({len(left_out)}, more than {MAX_IMPORTANCE_CHOICES} choices): "
            f"{esc(', '.join(left_out))}; the layout is scored as its degrees."
        )
    return (
        paragraph(
            f"{where} fANOVA (Optuna's FanovaImportanceEvaluator) over {used} completed "
            f"trials{' (the latest)' if used < len(done) else ''}: <strong>{esc(top)}</strong> "
            f"explains {series.max():.0%} of the variance of the {s.what}throughput.{note}"
        )
        + figure_html(fig, "parameter importances")
        + table_html(table)
        + dash
    )
