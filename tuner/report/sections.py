"""The report's sections but the knobs, each a piece of HTML computed from a `Study`.

The answer, search progress, throughput vs peak memory, time per phase, failures by reason, what
the study cost, predicted vs measured (the knobs: `tuner.report.importance`)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from tuner import plots
from tuner.leaderboard import PREDICTED_PRUNED
from tuner.report.markup import (
    cell_html,
    esc,
    figure_html,
    has_value,
    paragraph,
    row_label,
    table_html,
)
from tuner.report.study import NOT_MEASURED_SOURCES, Study, median_abs_error, num
from tuner.results import COLUMNS
from tuner.results.scope import GEN_TRAIN, MEANINGS, TRAIN_ONLY
from tuner.space import KNOB_GROUP_OF, KNOB_GROUP_ORDER

TOP_PHASE_ROWS = 5
"""Best rows shown in the time-per-phase section (beside the references)."""

TOP_REFERENCE_ROWS = 3
"""Best reference rows of the study (and published ones on the same GPUs) shown there too."""


LAYOUT_SUMMARY = ("train_parallel", "infer_parallel", "dp")
"""The record's layout columns that are no knob (both layouts' notation, the derived dp): shown
with the layout's degrees."""


def _knob_groups() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Each knob group (tuner.space.KNOB_GROUP_ORDER) with its columns in the leaderboard's
    order: the knob table says which group a knob is in."""
    group_of = {**KNOB_GROUP_OF, **dict.fromkeys(LAYOUT_SUMMARY, "layout")}
    return tuple((g, tuple(c for c in COLUMNS if group_of.get(c) == g)) for g in KNOB_GROUP_ORDER)


KNOB_GROUPS = _knob_groups()
"""What the answer's knob table shows, by group (those the leaderboard has)."""


def section_answer(s: Study) -> str:
    df, b = s.df, s.best
    counts = df["status"].value_counts()
    counts = counts[counts > 0]
    status_text = ", ".join(f"{int(n)} {k}" for k, n in counts.items()) or "no rows"
    if b is None:
        why = "The leaderboard has no rows yet." if df.empty else "No trial finished ok."
        return paragraph(
            f"<strong>No answer yet.</strong> {why} Rows by status: {esc(status_text)}."
        ) + paragraph("See <a href='#failures'>Failures by reason</a> for what went wrong.")
    mem_val = b.get(s.mem)
    mem_kind = "predicted" if s.estimates else "measured"
    mem_name = "device used" if s.mem == "peak_mem_device_gib" else "allocated"
    mem_text = f"{num(mem_val)} GiB ({mem_kind}, {mem_name})"
    if s.capacity_gib and pd.notna(mem_val):
        mem_text += f" of {num(s.capacity_gib)} GiB"
    where = f"{b['num_gpus']} × {b['gpu']}" if b["gpu"] else f"{b['num_gpus']} GPUs"
    tput = float(b["tokens_per_s_per_gpu"])
    head = (
        f'<div class="answer" data-best-trial="{esc(b["trial"])}" '
        f'data-best-tokens-per-s-per-gpu="{tput:.6g}">'
        f"<p class='big'>Best configuration: <strong>{esc(row_label(b))}</strong> on {esc(where)}"
        f" ({esc(b['model'])}): <strong>{num(tput)} {s.what}tokens/s/GPU</strong>"
        f"{esc(_scope_words(b))}, peak {esc(mem_text)}.</p>"
    )
    head += _scope_note(s)
    ratio = ""
    r = s.best_ref
    if r is not None:
        x = tput / float(r["tokens_per_s_per_gpu"])
        ratio = paragraph(
            f'<span data-ratio="{x:.4g}"><strong>{x:.2f}×</strong></span> the best reference on '
            f"the same GPUs: {esc(row_label(r))}, {num(r['tokens_per_s_per_gpu'])} tokens/s/GPU."
        )
    else:
        ratio = paragraph(
            "No reference row with a throughput on the same model and GPUs: no ratio. Pass "
            "<code>--reference CSV</code> with reference rows of this GPU kind and count, or "
            "run the study with its warm start (it tries the reference layouts first)."
        )
    ratio += _published_note(s)
    export = f"tune export {s.csv} --rank 1"
    cmd = (
        "<p>Reproduce it (a runnable verl script under recipes/):</p>"
        f"<pre><code>{esc(export)}</code></pre>"
        f"<p class='small'>Rank 1 is trial {esc(b['trial'])} today; "
        f"<code>--trial {esc(b['trial'])}</code> names it for good.</p>"
    )
    groups = []
    for group, names in KNOB_GROUPS:
        cells = [
            f"{c} {cell_html(b.get(c))}" for c in names if c in df.columns and has_value(b.get(c))
        ]
        if group == "pipeline" and all(str(b.get(c)) in ("0", "<NA>") for c in names):
            continue  # even stages
        if cells:
            groups.append({"knobs": group, "values": " · ".join(cells)})
    table = pd.DataFrame(groups)
    rows = paragraph(f"{len(df)} rows: {esc(status_text)}.")
    return head + ratio + cmd + rows + "</div>" + table_html(table)


def _scope_words(b: pd.Series) -> str:
    """What the headline's throughput covers, in words (results.scope)."""
    meaning = MEANINGS.get(str(b.get("scope", "")), "")
    return f" ({meaning})" if meaning else ""


def _scope_note(s: Study) -> str:
    """Where the best row did not measure the whole step: the cost model's whole step beside it,
    never added to it; and a warning where the ok rows' throughputs cover different parts."""
    b, out = s.best, ""
    if b is not None and str(b.get("scope", "")) in (TRAIN_ONLY, GEN_TRAIN):
        step, gen = b.get("pred_step_s"), b.get("pred_generation_s")
        if has_value(step):
            part = f", of which generation {num(gen)} s" if str(b["scope"]) == TRAIN_ONLY else ""
            out += paragraph(
                f"The whole step is not measured for this row: the cost model predicts "
                f"{num(step)} s{part} (predicted; not added to the measured phases)."
            )
    scopes = sorted({str(x) for x in s.ok.loc[~s.ok["is_reference"], "scope"]} - {""})
    if len(scopes) > 1:
        out += paragraph(
            "The ok rows' throughputs cover different parts of the step ("
            + "; ".join(f"{sc}: {MEANINGS.get(sc, sc)}" for sc in scopes)
            + "): compare rows within one scope (tune show's scope column).",
            "small",
        )
    return out


def _published_note(s: Study) -> str:
    if not s.ref_files:
        return ""
    names = ", ".join(p.name for p in s.ref_files)
    refs = s.refs
    same = refs[(refs["gpu"] == s.gpu) & (refs["num_gpus"] == s.num_gpus)] if s.gpu else refs[:0]
    if len(same):
        wl = ""
        if s.best is not None and "max_response_len" in refs.columns:
            a, b = same["max_response_len"].dropna(), s.best.get("max_response_len")
            if len(a) and has_value(b) and int(a.iloc[0]) != int(b):
                wl = (
                    f" Their workload differs (responses up to {int(a.iloc[0])} tokens, here "
                    f"{int(b)}): compare with care."
                )
        return paragraph(
            f"Published references ({esc(names)}): {len(same)} rows on {s.num_gpus} × "
            f"{esc(s.gpu)}.{esc(wl)}",
            "small",
        )
    kinds = (
        refs.groupby("gpu")["num_gpus"]
        .agg(lambda x: ", ".join(str(int(v)) for v in sorted(x.dropna().unique())))
        .to_dict()
    )
    have = "; ".join(f"{g}: {n} GPUs" for g, n in kinds.items() if g) or "none"
    return paragraph(
        f"Published references ({esc(names)}) have no row on {s.num_gpus} × {esc(s.gpu)} "
        f"(they ran on {esc(have)}): not compared.",
        "small",
    )


def section_progress(s: Study) -> str:
    df = s.df
    if df.empty:
        return paragraph("No trials yet.")
    ran = "estimated" if s.estimates else "launched"
    kind = pd.Series(f"{ran}, ok", index=df.index)
    kind[df["status"].isin(plots.LAUNCHED_FAILED)] = f"{ran}, failed"
    kind[df["status"] == "pruned-slow"] = f"{ran}, stopped slow"
    kind[df["status"].isin(plots.PREDICTED_PRUNED)] = "pruned by prediction (not launched)"
    counts = kind.value_counts().rename_axis("kind").reset_index(name="trials")
    fig, ax = plots.new_figure(9.5, 4.2)
    plots.draw_progress(ax, df, estimates=s.estimates)
    fig.tight_layout()
    launched_word = "estimated" if s.estimates else "launched"
    text = ""
    if s.best is not None:
        first = int(s.best["trial"])
        text = paragraph(
            f"The best row was found at trial {first} of {len(df)} "
            f"({int(kind.str.startswith(ran).sum())} {launched_word}, "
            f"{int((kind == 'pruned by prediction (not launched)').sum())} pruned before launch)."
        )
    return (
        text
        + figure_html(
            fig,
            "best-so-far throughput by trial",
            "Blue: ok trials; red line: best so far; red x: launched and failed; grey triangles: "
            "pruned by the cost model before launch; orange squares: stopped early as slow.",
        )
        + table_html(counts)
    )


def section_memory(s: Study) -> str:
    ok = s.ok
    if ok.empty or ok[s.mem].isna().all():
        return paragraph("No ok row with a peak memory: nothing to draw.")
    headroom = None
    if "pred_headroom_gib" in ok.columns and ok["pred_headroom_gib"].notna().any():
        headroom = float(ok["pred_headroom_gib"].median())
    fig, ax = plots.new_figure(9.5, 4.6)
    plots.draw_pareto(
        ax,
        ok,
        s.mem,
        capacity_gib=s.capacity_gib,
        headroom_gib=headroom,
        estimates=s.estimates,
    )
    fig.tight_layout()
    front = plots.pareto_front(ok, s.mem)
    cols = ["trial", "train_parallel", "infer_parallel", "tokens_per_s_per_gpu", s.mem]
    if "placement" in front and bool((front["placement"] != "").any()):
        cols.insert(3, "placement")  # a study that searched placement (--allow-off-policy)
    table = front[cols].copy()
    text = f"{len(ok)} ok rows; {len(front)} on the Pareto front (no row both faster and smaller)."
    if s.capacity_gib and s.best is not None and pd.notna(s.best.get(s.mem)):
        left = s.capacity_gib - float(s.best[s.mem])
        table["headroom_gib"] = s.capacity_gib - table[s.mem]
        text += (
            f" The best row peaks at {num(s.best[s.mem])} GiB of the {esc(s.gpu)}'s "
            f"{num(s.capacity_gib)} GiB: {num(left)} GiB headroom."
        )
    if headroom:
        text += f" The study kept {num(headroom)} GiB free when it decided what fits."
    return (
        paragraph(text)
        + figure_html(fig, "throughput vs peak memory with the Pareto front")
        + table_html(table)
    )


def phase_table(s: Study) -> pd.DataFrame:
    """Seconds per phase, measured (or estimated) and predicted, of the best rows and the
    reference rows on the same GPUs; index: row labels, columns: plots.PHASES."""
    top = s.ok[~s.ok["is_reference"]].head(TOP_PHASE_ROWS)
    ours_refs = s.ok[s.ok["is_reference"]].head(TOP_REFERENCE_ROWS)
    published = s.refs
    if len(published) and s.gpu:
        published = published[
            (published["gpu"] == s.gpu)
            & (published["num_gpus"] == s.num_gpus)
            & (published["status"] == "ok")
        ].head(3)
    else:
        published = published[:0]
    rows = pd.concat([top, ours_refs, published])
    measured_word = "estimated" if s.estimates else "measured"
    out = []
    for _, r in rows.iterrows():
        base = row_label(r)
        meas = {p: r.get(f"{p}_s") for p in plots.PHASES}
        word = "published" if r["source"] == "reference" else measured_word
        if any(has_value(v) for v in meas.values()):
            out.append({"row": f"{base} {word}", **meas})
        pred = {p: r.get(f"pred_{p}_s") for p in plots.PHASES}
        if any(has_value(v) for v in pred.values()) and not s.estimates:
            out.append({"row": f"{base} predicted", **pred})
    if not out:
        return pd.DataFrame(columns=list(plots.PHASES))
    table = pd.DataFrame(out).set_index("row")
    return table.apply(pd.to_numeric, errors="coerce").astype("float64")


def section_phases(s: Study) -> str:
    table = phase_table(s)
    if table.empty or table.isna().all().all():
        return paragraph("No row has phase times.")
    table = table.loc[:, table.notna().any()]
    fig, ax = plots.new_figure(10, 0.42 * len(table) + 1.6)
    plots.draw_phases(ax, table)
    fig.tight_layout()
    shown = table.copy()
    shown["sum_s"] = shown.sum(axis=1, min_count=1)
    note = ""
    if not s.estimates and (s.ok["source"] == "megatron").any():
        note = paragraph(
            "The megatron runner measures the actor update only; the other phases appear as "
            "predicted.",
            "small",
        )
    return (
        note
        + figure_html(fig, "seconds per phase of the best and reference rows")
        + table_html(shown.rename_axis("row").reset_index())
    )


_PHASE_IN_REASON = re.compile(
    r"\b(generation|old_log_prob|log_prob|ref|update_actor|update|reshard)\b"
)
_DIGITS = re.compile(r"\b\d+(?:\.\d+)?\b")


def failure_kinds(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that did not finish ok, with `kind` (OOM with its phase, timeout, crash, refused
    layout, predicted OOM with its phase, stopped slow, interrupted) and `reason_kind` (the
    reason with its numbers replaced by #)."""
    bad = df[(df["status"] != "ok") & (df["source"] != "reference")].copy()
    if bad.empty:
        return bad.assign(kind=pd.Series(dtype=str), reason_kind=pd.Series(dtype=str))
    phase = bad["reason"].str.extract(_PHASE_IN_REASON)[0]
    if "pred_peak_phase" in bad.columns:
        phase = phase.fillna(bad["pred_peak_phase"].replace("", np.nan))
    phase = phase.fillna("")
    in_phase = np.where(phase != "", " in " + phase, "")
    status = bad["status"].astype(str)
    kind = pd.Series(status, index=bad.index).map(
        {
            "oom": "OOM",
            "timeout": "timeout",
            "failed": "crash",
            "interrupted": "interrupted",
            "pruned-invalid": "refused layout",
            "pruned-oom-predicted": "predicted OOM",
            "pruned-slow": "stopped slow",
        }
    )
    kind = kind.fillna(status)
    oomish = status.isin(["oom", "pruned-oom-predicted"])
    kind = kind.where(~oomish, kind + pd.Series(in_phase, index=bad.index))
    bad["kind"] = kind
    bad["reason_kind"] = bad["reason"].str.replace(_DIGITS, "#", regex=True).str.slice(0, 110)
    return bad


def section_failures(s: Study) -> str:
    bad = failure_kinds(s.df)
    if bad.empty:
        return paragraph("Every trial finished ok." if len(s.df) else "No trials yet.")
    counts = bad["kind"].value_counts()
    fig, ax = plots.new_figure(8, 0.4 * len(counts) + 1.5)
    plots.draw_failures(ax, counts)
    fig.tight_layout()
    by = (
        bad.groupby(["kind", "reason_kind"], sort=False)
        .agg(trials=("trial", "size"), example=("reason", "first"), first_trial=("trial", "min"))
        .reset_index()
        .sort_values(["trials", "kind"], ascending=[False, True])
    )
    by = by.drop(columns="reason_kind")
    launched = bad[~bad["status"].isin(PREDICTED_PRUNED)]
    return (
        paragraph(
            f"{len(bad)} of {len(s.df)} trials did not finish ok: {len(launched)} "
            f"{'estimated' if s.estimates else 'launched'} and failed, "
            f"{len(bad) - len(launched)} pruned before launch."
        )
        + figure_html(fig, "failures by kind")
        + table_html(by)
    )


def section_cost(s: Study) -> str:
    df = s.df
    launched = df[~df["status"].isin(PREDICTED_PRUNED) & (df["source"] != "reference")]
    if launched.empty:
        return paragraph("Nothing was launched.")
    gpu_s = (launched["duration_s"] * launched["num_gpus"].astype("float64")).sum(min_count=1)
    wall = launched["duration_s"].sum(min_count=1)
    if s.estimates:
        text = (
            f"The estimator ran {len(launched)} trials on the CPU in {num(wall)} s: no GPU time. "
            "The numbers below are what the estimated speed-up would be worth."
        )
        gpu_hours = 0.0
    else:
        gpu_hours = float(gpu_s) / 3600 if pd.notna(gpu_s) else float("nan")
        text = (
            f"<span data-gpu-hours='{gpu_hours:.6g}'>{len(launched)} launched trials took "
            f"<strong>{gpu_hours:.2f} GPU-hours</strong></span> (duration × GPUs of each launched "
            f"row; {num(wall)} s of wall time)."
        )
    rows: list[dict[str, str]] = []
    b, r = s.best, s.best_ref
    if b is not None and r is not None:
        n = int(b["num_gpus"])
        best_t, ref_t = float(b["tokens_per_s_per_gpu"]), float(r["tokens_per_s_per_gpu"])
        speedup = best_t / ref_t
        saved_h = 24.0 * n * (1.0 - ref_t / best_t)
        rows = [
            {
                "what": f"speed-up over the best reference on {n} × {b['gpu']}",
                "value": f"{speedup:.2f}×",
            },
            {"what": "tokens per day, best reference", "value": f"{ref_t * n * 86400:,.0f}"},
            {"what": "tokens per day, best configuration", "value": f"{best_t * n * 86400:,.0f}"},
            {
                "what": "GPU-hours saved per day of training at the reference's pace",
                "value": f"{saved_h:.1f}",
            },
        ]
        if gpu_hours and saved_h > 0:
            rows.append(
                {
                    "what": "days of training that pay for the study",
                    "value": f"{gpu_hours / saved_h:.2g}",
                }
            )
        text += (
            f" A day of training on these {n} GPUs at the reference's pace takes "
            f"{24.0 * ref_t / best_t:.1f} h with the best configuration."
        )
    elif b is not None:
        n = int(b["num_gpus"])
        text += " No reference on the same GPUs to price the speed-up against."
        rows = [
            {
                "what": f"tokens per day, best configuration on {n} × {b['gpu']}",
                "value": f"{float(b['tokens_per_s_per_gpu']) * n * 86400:,.0f}",
            }
        ]
    return paragraph(text) + (table_html(pd.DataFrame(rows)) if rows else "")


def section_prediction(s: Study) -> str:
    if s.estimates:
        return paragraph(
            "Estimate-only study: nothing was measured, so there is nothing to compare the "
            "cost model with. Run with <code>--runner megatron</code> or <code>verl</code> on GPUs."
        )
    ok = s.ok[~s.ok["source"].isin(NOT_MEASURED_SOURCES)]
    if ok.empty:
        return paragraph("No measured ok row: nothing to compare.")
    pairs = [("throughput", "tokens_per_s_per_gpu", "pred_tokens_per_s_per_gpu", "tokens/s/GPU")]
    if ok.get("peak_mem_device_gib", pd.Series(dtype=float)).notna().any() and (
        ok.get("pred_device_mem_gib", pd.Series(dtype=float)).notna().any()
    ):
        pairs.append(("peak memory (device)", "peak_mem_device_gib", "pred_device_mem_gib", "GiB"))
    else:
        pairs.append(("peak memory", "peak_mem_gib", "pred_peak_mem_gib", "GiB"))
    for p in ("step", "update_actor", "generation", "old_log_prob"):
        pairs.append((f"{p.replace('_', ' ')} time", f"{p}_s", f"pred_{p}_s", "s"))
    rows: list[dict[str, Any]] = []
    shown: list[tuple[str, str, str, str]] = []
    for what, m, pcol, unit in pairs:
        if m not in ok.columns or pcol not in ok.columns:
            continue
        both = ok[m].notna() & ok[pcol].notna()
        if not both.any():
            continue
        err = median_abs_error(ok[pcol], ok[m])
        signed = float(((ok[pcol][both] - ok[m][both]) / ok[m][both]).median())
        rows.append(
            {
                "measure": what,
                "rows": int(both.sum()),
                "median_abs_error_pct": round(err * 100, 1),
                "median_signed_error_pct": round(signed * 100, 1),
            }
        )
        if len(shown) < 2:
            shown.append((what, m, pcol, unit))
    if not rows:
        return paragraph("No measured row has a prediction beside it.")
    fig, axes = plots.new_figure(11, 4.4, ncols=len(shown))
    for ax, (what, m, pcol, unit) in zip(axes[0], shown, strict=False):
        both = ok[m].notna() & ok[pcol].notna()
        plots.draw_predicted_vs_measured(ax, ok[pcol][both], ok[m][both], what=what, unit=unit)
    fig.tight_layout()
    t = pd.DataFrame(rows)
    first = t.iloc[0]
    return (
        paragraph(
            f"Median absolute error of the prediction over {int(first['rows'])} measured ok "
            "rows: throughput <strong "
            f"data-median-error-throughput='{first['median_abs_error_pct']}'>"
            f"{first['median_abs_error_pct']:.0f}%</strong>"
            + (
                f", {esc(t.iloc[1]['measure'])} <strong>{t.iloc[1]['median_abs_error_pct']:.0f}%"
                "</strong>"
                if len(t) > 1
                else ""
            )
            + ". Error = (predicted − measured) / measured."
        )
        + figure_html(fig, "predicted vs measured")
        + table_html(t)
    )
