"""`tune report`: one self-contained HTML page about a study (figures inline as base64 PNG,
tables by pandas, no script, nothing fetched), answer first.

Sections: the answer (best configuration, its throughput, peak memory, ratio to the best
reference on the same GPUs, the command that reproduces it); search progress; throughput vs
peak memory; which knobs mattered (Optuna fANOVA importances, from the study's storage); time
per phase; failures by reason; what the study cost; predicted vs measured."""

from __future__ import annotations

import html
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tuner import plots
from tuner.errors import UserError, redact
from tuner.leaderboard import (
    PREDICTED_PRUNED,
    REFERENCE_FILES,
    best_reference,
    load_leaderboard,
    with_reference_ratio,
)

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

NOT_MEASURED_SOURCES = frozenset({"estimate", "reference", "tuner", ""})
"""Row sources whose numbers were not measured by a runner of this study."""

TOP_PHASE_ROWS = 5
"""Best rows shown in the time-per-phase section (beside the references)."""

TOP_REFERENCE_ROWS = 3
"""Best reference rows of the study (and published ones on the same GPUs) shown there too."""

MIN_IMPORTANCE_TRIALS = 4
"""Completed trials fANOVA needs before its importances mean anything."""

MAX_IMPORTANCE_CHOICES = 16
"""A categorical knob with more choices than this is left out of fANOVA: one-hot encoded, the
search's `layout` (840 choices for qwen3-30b-moe on 32 GPUs) kept it running for over 18
minutes on 80 trials. The layout is scored through its degrees instead (`LAYOUT_DEGREES`)."""

LAYOUT_DEGREES = ("tp", "pp", "vpp", "cp", "ep", "etp")
"""The layout's degrees as fANOVA scores them: ordered integers (log scale), from each trial's
record."""

MAX_IMPORTANCE_TRIALS = 2000
"""fANOVA is fitted on at most this many completed trials (the latest), so its time is bounded
whatever the study's size (scripts/bench_report.py)."""

KNOB_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("layout", ("train_parallel", "infer_parallel", "tp", "pp", "vpp", "cp", "ep", "etp", "dp")),
    ("pipeline", ("first_stage_layers", "last_stage_layers")),
    (
        "memory",
        (
            "sequence_parallel",
            "recompute_granularity",
            "recompute_method",
            "recompute_num_layers",
            "recompute_modules",
            "param_offload",
            "optimizer_offload",
        ),
    ),
    (
        "batching",
        (
            "use_dynamic_bsz",
            "ppo_max_token_len_per_gpu",
            "log_prob_max_token_len_per_gpu",
            "ppo_micro_batch_size_per_gpu",
            "log_prob_micro_batch_size_per_gpu",
        ),
    ),
    (
        "rollout",
        (
            "rollout_tp",
            "rollout_dp",
            "rollout_ep",
            "gpu_memory_utilization",
            "max_num_batched_tokens",
            "max_num_seqs",
            "enforce_eager",
        ),
    ),
    (
        "kernels",
        (
            "use_fused_kernels",
            "attention_backend",
            "apply_rope_fusion",
            "bias_activation_fusion",
            "masked_softmax_fusion",
            "gradient_accumulation_fusion",
            "moe_grouped_gemm",
            "moe_permute_fusion",
            "moe_token_dispatcher_type",
        ),
    ),
)
"""What the answer's knob table shows, by group (those the leaderboard has)."""


def reference_dirs() -> list[Path]:
    """Where published reference CSVs are looked for when --reference is not given:
    $TUNER_REFERENCE_DIR, then the checkout's `tests/data/anchors` and `../shared/anchors`."""
    here = Path(__file__).resolve().parent.parent
    dirs = [here / "tests" / "data" / "anchors", here.parent / "shared" / "anchors"]
    env = os.environ.get("TUNER_REFERENCE_DIR", "")
    return [Path(env), *dirs] if env else dirs


def default_references(family: str) -> list[Path]:
    """The published reference CSVs of a model family (REFERENCE_FILES), where found."""
    out = []
    for name in REFERENCE_FILES.get(family, ()):
        for d in reference_dirs():
            if (d / name).is_file():
                out.append(d / name)
                break
    return out


# --------------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------------


def num(x: Any, digits: int = 3) -> str:
    """A number for text: whole above 100, else `digits` significant digits; "-" if missing."""
    if x is None or (isinstance(x, float) and np.isnan(x)) or x is pd.NA:
        return "-"
    v = float(x)
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.{digits}g}"


def median_abs_error(pred: pd.Series, meas: pd.Series) -> float:
    """Median of |predicted - measured| / measured over rows with both (NaN if none)."""
    both = pred.notna() & meas.notna() & (meas != 0)
    if not both.any():
        return float("nan")
    return float(((pred[both] - meas[both]).abs() / meas[both]).median())


@dataclass(frozen=True, kw_only=True, slots=True)
class Study:
    """What the sections need, computed once from the leaderboard."""

    csv: Path
    """The leaderboard the report is about."""
    df: pd.DataFrame
    """Its rows (load_leaderboard), with `vs_ref` against in-study and published references."""
    refs: pd.DataFrame
    """Published reference rows (from --reference or the model's anchor files), all GPUs."""
    ref_files: tuple[Path, ...]
    """The published reference CSVs read."""
    estimates: bool
    """True when no row was measured: every number is the cost model's."""
    ok: pd.DataFrame
    """ok rows with a throughput, the fastest first."""
    best: pd.Series | None
    """The best ok row; None when no row finished ok."""
    best_ref: pd.Series | None
    """The best ok reference row on the best row's model and GPUs (in the study or published)."""
    mem: str
    """The measured peak memory column used (device used, else allocated)."""
    gpu: str
    num_gpus: int | None
    capacity_gib: float | None
    """Memory of one GPU of this kind (tuner.hardware), when the kind is known."""
    notes: list[str] = field(default_factory=list)
    """Things the reader should know about the inputs (one sentence each)."""

    @property
    def what(self) -> str:
        return "estimated " if self.estimates else ""


def _mode(s: pd.Series) -> Any:
    s = s.dropna()
    s = s[s.astype(str) != ""]
    return s.mode().iloc[0] if len(s) else None


def load_study(csv: Path, references: Sequence[Path] = ()) -> Study:
    df = load_leaderboard(csv)
    if (df["source"] == "reference").all() and len(df):
        raise UserError(
            f"{csv} is a published reference CSV: report on a leaderboard that `tune` wrote "
            "(pass this file with --reference)"
        )
    family = _mode(df["model_family"]) or ""
    ref_files = tuple(references) if references else tuple(default_references(family))
    refs = load_leaderboard(ref_files) if ref_files else df.iloc[0:0]
    if len(refs):
        refs = refs.assign(is_reference=True)
        if family:
            same_model = refs["model_family"].isin([family, ""])
            refs = refs[same_model]
    both = pd.concat([df, refs], ignore_index=True) if len(refs) else df
    both = with_reference_ratio(both)
    df = both.iloc[: len(df)].copy()
    launched = df[~df["status"].isin(PREDICTED_PRUNED)]
    measured = launched[~launched["source"].isin(NOT_MEASURED_SOURCES)]
    estimates = len(df) > 0 and measured.empty and (launched["source"] == "estimate").any()
    ok = df[(df["status"] == "ok") & df["tokens_per_s_per_gpu"].notna()]
    ok = ok.sort_values(["tokens_per_s_per_gpu", "trial"], ascending=[False, True])
    best = ok.iloc[0] if len(ok) else None
    gpu = str(_mode(df["gpu"]) or "")
    n_gpus = _mode(df["num_gpus"])
    best_ref = None
    if best is not None:
        table = best_reference(both)
        key = (
            str(best["model_family"] or str(best["model"]).lower())
            + "|"
            + str(best["gpu"])
            + "|"
            + str(best["num_gpus"])
        )
        hit = table[table["key"] == key]
        if len(hit):
            best_ref = both.loc[int(hit["ref_index"].iloc[0])]
    capacity = None
    if gpu:
        from tuner.hardware import GPUS

        spec = GPUS.get(gpu)
        capacity = spec.memory_gib if spec else None
    notes = []
    if len(df) and len(df["study"].unique()) > 1:
        notes.append(f"{csv.name} holds {df['study'].nunique()} studies; the report covers all.")
    return Study(
        csv=csv,
        df=df,
        refs=refs,
        ref_files=ref_files,
        estimates=bool(estimates),
        ok=ok,
        best=best,
        best_ref=best_ref,
        mem=plots.memory_column(ok if len(ok) else df),
        gpu=gpu,
        num_gpus=None if n_gpus is None else int(n_gpus),
        capacity_gib=capacity,
        notes=notes,
    )


# --------------------------------------------------------------------------------------------
# HTML pieces
# --------------------------------------------------------------------------------------------


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _p(text: str, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f"<p{c}>{text}</p>"


def _figure(fig: Any, alt: str, caption: str = "") -> str:
    width, height = (int(round(v * 96)) for v in fig.get_size_inches())
    data = plots.png_base64(fig)
    cap = f"<figcaption>{_e(caption)}</figcaption>" if caption else ""
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{_e(alt)}" width="{width}" '
        f'height="{height}">{cap}</figure>'
    )


def _table(df: pd.DataFrame, index: bool = False) -> str:
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
    return f"{r['train_parallel']}{rollout}"


def _label(r: pd.Series) -> str:
    """`trial 4 ep2 / rollout tp1`, `dapo7b.csv trial 5 tp4 / rollout tp1`, with the origin of
    a reference layout run in the study: `trial 1 tp2 / rollout tp1 [reference tp2]`."""
    if r["source"] == "reference":
        return f"{r['file']} trial {r['trial']} {_layout(r)}"
    origin = f" [{r['origin']}]" if str(r["origin"]).startswith("reference") else ""
    return f"trial {r['trial']} {_layout(r)}{origin}"


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


def section_answer(s: Study) -> str:
    df, b = s.df, s.best
    counts = df["status"].value_counts()
    counts = counts[counts > 0]
    status_text = ", ".join(f"{int(n)} {k}" for k, n in counts.items()) or "no rows"
    if b is None:
        why = "The leaderboard has no rows yet." if df.empty else "No trial finished ok."
        return _p(f"<strong>No answer yet.</strong> {why} Rows by status: {_e(status_text)}.") + _p(
            "See <a href='#failures'>Failures by reason</a> for what went wrong."
        )
    mem_val = b.get(s.mem)
    mem_kind = "predicted" if s.estimates else "measured"
    mem_name = "device used" if s.mem == "peak_mem_device_gib" else "allocated"
    mem_text = f"{num(mem_val)} GiB ({mem_kind}, {mem_name})"
    if s.capacity_gib and pd.notna(mem_val):
        mem_text += f" of {num(s.capacity_gib)} GiB"
    where = f"{b['num_gpus']} × {b['gpu']}" if b["gpu"] else f"{b['num_gpus']} GPUs"
    tput = float(b["tokens_per_s_per_gpu"])
    head = (
        f'<div class="answer" data-best-trial="{_e(b["trial"])}" '
        f'data-best-tokens-per-s-per-gpu="{tput:.6g}">'
        f"<p class='big'>Best configuration: <strong>{_e(_label(b))}</strong> on {_e(where)}"
        f" ({_e(b['model'])}): <strong>{num(tput)} {s.what}tokens/s/GPU</strong>, peak "
        f"{_e(mem_text)}.</p>"
    )
    ratio = ""
    r = s.best_ref
    if r is not None:
        x = tput / float(r["tokens_per_s_per_gpu"])
        ratio = _p(
            f'<span data-ratio="{x:.4g}"><strong>{x:.2f}×</strong></span> the best reference on '
            f"the same GPUs: {_e(_label(r))}, {num(r['tokens_per_s_per_gpu'])} tokens/s/GPU."
        )
    else:
        ratio = _p(
            "No reference row with a throughput on the same model and GPUs: no ratio. Pass "
            "<code>--reference CSV</code> with reference rows of this GPU kind and count, or "
            "run the study with its warm start (it tries the reference layouts first)."
        )
    ratio += _published_note(s)
    export = f"tune export {s.csv} --rank 1"
    cmd = (
        "<p>Reproduce it (a runnable verl script under recipes/):</p>"
        f"<pre><code>{_e(export)}</code></pre>"
        f"<p class='small'>Rank 1 is trial {_e(b['trial'])} today; "
        f"<code>--trial {_e(b['trial'])}</code> names it for good.</p>"
    )
    groups = []
    for group, names in KNOB_GROUPS:
        cells = [f"{c} {_cell(b.get(c))}" for c in names if c in df.columns and _has(b.get(c))]
        if group == "pipeline" and all(str(b.get(c)) in ("0", "<NA>") for c in names):
            continue  # even stages
        if cells:
            groups.append({"knobs": group, "values": " · ".join(cells)})
    table = pd.DataFrame(groups)
    rows = _p(f"{len(df)} rows: {_e(status_text)}.")
    return head + ratio + cmd + rows + "</div>" + _table(table)


def _has(v: Any) -> bool:
    return (
        v is not None
        and v is not pd.NA
        and not (isinstance(v, float) and np.isnan(v))
        and (str(v) != "")
    )


def _cell(v: Any) -> str:
    if isinstance(v, float | np.floating):
        return num(v)
    if isinstance(v, np.bool_ | bool):
        return str(bool(v))
    return str(v)


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
            if len(a) and _has(b) and int(a.iloc[0]) != int(b):
                wl = (
                    f" Their workload differs (responses up to {int(a.iloc[0])} tokens, here "
                    f"{int(b)}): compare with care."
                )
        return _p(
            f"Published references ({_e(names)}): {len(same)} rows on {s.num_gpus} × "
            f"{_e(s.gpu)}.{_e(wl)}",
            "small",
        )
    kinds = (
        refs.groupby("gpu")["num_gpus"]
        .agg(lambda x: ", ".join(str(int(v)) for v in sorted(x.dropna().unique())))
        .to_dict()
    )
    have = "; ".join(f"{g}: {n} GPUs" for g, n in kinds.items() if g) or "none"
    return _p(
        f"Published references ({_e(names)}) have no row on {s.num_gpus} × {_e(s.gpu)} "
        f"(they ran on {_e(have)}): not compared.",
        "small",
    )


def section_progress(s: Study) -> str:
    df = s.df
    if df.empty:
        return _p("No trials yet.")
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
        text = _p(
            f"The best row was found at trial {first} of {len(df)} "
            f"({int(kind.str.startswith(ran).sum())} {launched_word}, "
            f"{int((kind == 'pruned by prediction (not launched)').sum())} pruned before launch)."
        )
    return (
        text
        + _figure(
            fig,
            "best-so-far throughput by trial",
            "Blue: ok trials; red line: best so far; red x: launched and failed; grey triangles: "
            "pruned by the cost model before launch; orange squares: stopped early as slow.",
        )
        + _table(counts)
    )


def section_memory(s: Study) -> str:
    ok = s.ok
    if ok.empty or ok[s.mem].isna().all():
        return _p("No ok row with a peak memory: nothing to draw.")
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
    table = front[cols].copy()
    text = f"{len(ok)} ok rows; {len(front)} on the Pareto front (no row both faster and smaller)."
    if s.capacity_gib and s.best is not None and pd.notna(s.best.get(s.mem)):
        left = s.capacity_gib - float(s.best[s.mem])
        table["headroom_gib"] = s.capacity_gib - table[s.mem]
        text += (
            f" The best row peaks at {num(s.best[s.mem])} GiB of the {_e(s.gpu)}'s "
            f"{num(s.capacity_gib)} GiB: {num(left)} GiB headroom."
        )
    if headroom:
        text += f" The study kept {num(headroom)} GiB free when it decided what fits."
    return (
        _p(text) + _figure(fig, "throughput vs peak memory with the Pareto front") + _table(table)
    )


def storage_url(label: str) -> str:
    """An Optuna storage URL or path from what a leaderboard's `storage` column records
    (tuner.study.storage_label: `sqlite:/abs/path`, `journal:/abs/path`, or a URL)."""
    if label.startswith("sqlite:") and not label.startswith("sqlite://"):
        return "sqlite:///" + label.removeprefix("sqlite:")
    if label.startswith("journal:"):
        return label.removeprefix("journal:")
    return label


def _storage_file(url: str) -> Path | None:
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///"))
    return None if "://" in url else Path(url)


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
        named = str(_mode(s.df["storage"]) or "") if "storage" in s.df.columns else ""
        candidates = [storage_url(named)] if named else []
        for beside in (s.csv.with_suffix(".sqlite3"), s.csv.parent / "studies.sqlite3"):
            candidates.append(f"sqlite:///{beside}")
    url = ""
    for c in candidates:
        f = _storage_file(c)
        if f is None or f.is_file():
            url = c
            break
    if not url:
        tried = " or ".join(_e(redact(c)) for c in candidates)
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
        return None, f"The storage {_e(redact(url))} holds no study named {_e(name)}.", ""
    except UserError as e:
        return None, _e(redact(str(e))), ""
    return st, f"Study {_e(name)} in {_e(redact(url))}.", url


def importance_study(trials: Sequence[Any]) -> tuple[Any, list[str]]:
    """An in-memory Optuna study of the completed `trials` on a bounded parameterization, for
    fANOVA: each knob as sampled, except a categorical of more than `MAX_IMPORTANCE_CHOICES`
    choices (left out), plus the layout's degrees from each trial's record as integers.
    Returns (the study, the knobs left out)."""
    import optuna

    from tuner.study.storage import RECORD_ATTR

    dists = optuna.distributions
    left_out: set[str] = set()
    rows: list[tuple[dict[str, Any], dict[str, Any], float]] = []
    for t in trials[-MAX_IMPORTANCE_TRIALS:]:
        params, dist = {}, {}
        for k, v in t.params.items():
            d = t.distributions[k]
            if isinstance(d, dists.CategoricalDistribution) and len(d.choices) > (
                MAX_IMPORTANCE_CHOICES
            ):
                left_out.add(k)
                continue
            params[k], dist[k] = v, d
        rec = t.user_attrs.get(RECORD_ATTR)
        if isinstance(rec, dict):
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
        f" &amp;&amp; optuna-dashboard {_e(shown)}</code>.</p>"
    )


def section_knobs(s: Study, storage: str | None) -> str:
    st, where, url = _open_study(s, storage)
    if st is None:
        return _p(f"Not computed. {where}")
    dash = _dashboard(url)
    import optuna

    done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(done) < MIN_IMPORTANCE_TRIALS:
        return (
            _p(
                f"{where} Only {len(done)} completed trials (fANOVA needs at least "
                f"{MIN_IMPORTANCE_TRIALS} with varied knobs): not computed."
            )
            + dash
        )
    try:
        bounded, left_out = importance_study(done)
        ev = optuna.importance.FanovaImportanceEvaluator(seed=0)
        imp = optuna.importance.get_param_importances(bounded, evaluator=ev)
    except ImportError:
        return (
            _p(f"{where} fANOVA needs scikit-learn: <code>pip install scikit-learn</code>.") + dash
        )
    except (RuntimeError, ValueError) as e:
        return _p(f"{where} fANOVA could not run: {_e(str(e).splitlines()[0])}.") + dash
    if not imp:
        return _p(f"{where} No knob varied across the completed trials.") + dash
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
            f"{_e(', '.join(left_out))}; the layout is scored as its degrees."
        )
    return (
        _p(
            f"{where} fANOVA (Optuna's FanovaImportanceEvaluator) over {used} completed "
            f"trials{' (the latest)' if used < len(done) else ''}: <strong>{_e(top)}</strong> "
            f"explains {series.max():.0%} of the variance of the {s.what}throughput.{note}"
        )
        + _figure(fig, "parameter importances")
        + _table(table)
        + dash
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
        base = _label(r)
        meas = {p: r.get(f"{p}_s") for p in plots.PHASES}
        word = "published" if r["source"] == "reference" else measured_word
        if any(_has(v) for v in meas.values()):
            out.append({"row": f"{base} {word}", **meas})
        pred = {p: r.get(f"pred_{p}_s") for p in plots.PHASES}
        if any(_has(v) for v in pred.values()) and not s.estimates:
            out.append({"row": f"{base} predicted", **pred})
    if not out:
        return pd.DataFrame(columns=list(plots.PHASES))
    table = pd.DataFrame(out).set_index("row")
    return table.apply(pd.to_numeric, errors="coerce").astype("float64")


def section_phases(s: Study) -> str:
    table = phase_table(s)
    if table.empty or table.isna().all().all():
        return _p("No row has phase times.")
    table = table.loc[:, table.notna().any()]
    fig, ax = plots.new_figure(10, 0.42 * len(table) + 1.6)
    plots.draw_phases(ax, table)
    fig.tight_layout()
    shown = table.copy()
    shown["sum_s"] = shown.sum(axis=1, min_count=1)
    note = ""
    if not s.estimates and (s.ok["source"] == "megatron").any():
        note = _p(
            "The megatron runner measures the actor update only; the other phases appear as "
            "predicted.",
            "small",
        )
    return (
        note
        + _figure(fig, "seconds per phase of the best and reference rows")
        + _table(shown.rename_axis("row").reset_index())
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
        return _p("Every trial finished ok." if len(s.df) else "No trials yet.")
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
        _p(
            f"{len(bad)} of {len(s.df)} trials did not finish ok: {len(launched)} "
            f"{'estimated' if s.estimates else 'launched'} and failed, "
            f"{len(bad) - len(launched)} pruned before launch."
        )
        + _figure(fig, "failures by kind")
        + _table(by)
    )


def section_cost(s: Study) -> str:
    df = s.df
    launched = df[~df["status"].isin(PREDICTED_PRUNED) & (df["source"] != "reference")]
    if launched.empty:
        return _p("Nothing was launched.")
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
    return _p(text) + (_table(pd.DataFrame(rows)) if rows else "")


def section_prediction(s: Study) -> str:
    if s.estimates:
        return _p(
            "Estimate-only study: nothing was measured, so there is nothing to compare the "
            "cost model with. Run with <code>--runner megatron</code> or <code>verl</code> on GPUs."
        )
    ok = s.ok[~s.ok["source"].isin(NOT_MEASURED_SOURCES)]
    if ok.empty:
        return _p("No measured ok row: nothing to compare.")
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
        return _p("No measured row has a prediction beside it.")
    fig, axes = plots.new_figure(11, 4.4, ncols=len(shown))
    for ax, (what, m, pcol, unit) in zip(axes[0], shown, strict=False):
        both = ok[m].notna() & ok[pcol].notna()
        plots.draw_predicted_vs_measured(ax, ok[pcol][both], ok[m][both], what=what, unit=unit)
    fig.tight_layout()
    t = pd.DataFrame(rows)
    first = t.iloc[0]
    return (
        _p(
            f"Median absolute error of the prediction over {int(first['rows'])} measured ok "
            "rows: throughput <strong "
            f"data-median-error-throughput='{first['median_abs_error_pct']}'>"
            f"{first['median_abs_error_pct']:.0f}%</strong>"
            + (
                f", {_e(t.iloc[1]['measure'])} <strong>{t.iloc[1]['median_abs_error_pct']:.0f}%"
                "</strong>"
                if len(t) > 1
                else ""
            )
            + ". Error = (predicted − measured) / measured."
        )
        + _figure(fig, "predicted vs measured")
        + _table(t)
    )


# --------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------

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
        banner = _p(
            "<strong>Estimates.</strong> Every number on this page comes from the cost model "
            "(<code>source=estimate</code>): no GPU ran these trials. Measure the best rows with "
            "<code>--runner megatron</code> or <code>verl</code> before relying on them.",
            "banner",
        )
    elif s.df.empty:
        banner = _p(
            "<strong>Empty leaderboard.</strong> It has a header but no rows yet.", "banner"
        )
    where = f"{s.num_gpus} × {s.gpu}" if s.gpu else "unknown GPUs"
    models = ", ".join(sorted({str(m) for m in s.df["model"].unique() if m})) or "-"
    meta = _p(
        f"Leaderboard <code>{_e(csv)}</code>: {len(s.df)} rows, model {_e(models)}, "
        f"{_e(where)}, {_e(kind)}." + (f" {_e(' '.join(s.notes))}" if s.notes else ""),
        "meta",
    )
    nav = "<nav>" + "".join(f'<a href="#{i}">{_e(h)}</a>' for i, h in SECTIONS) + "</nav>"
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
        f'<section id="{i}"><h2>{_e(h)}</h2>{bodies[i]}</section>' for i, h in SECTIONS
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>verl-tuner report: {_e(title)}</title><style>{_CSS}</style></head>"
        f"<body><main><h1>verl-tuner report: {_e(title)}</h1>{meta}{banner}{nav}"
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
