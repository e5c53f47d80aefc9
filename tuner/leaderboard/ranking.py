"""Filtering and ranking a loaded leaderboard, and each row's throughput against the best
reference row of the same model on the same GPUs."""

from __future__ import annotations

import re

import pandas as pd

from tuner.errors import UserError
from tuner.leaderboard.columns import column_name
from tuner.results import HIGHER_IS_BETTER, ROW_SOURCES, partial
from tuner.results.scope import breadth, comparable

_GPU_FILTER = re.compile(r"^([a-z0-9]+?)(?:x(\d+))?$")


def select(
    df: pd.DataFrame,
    *,
    gpu: str | None = None,
    model: str | None = None,
    status: str | None = None,
    source: str | None = None,
) -> pd.DataFrame:
    """Rows matching every filter given: `gpu` a kind (`h200`) or kind and count (`h200x2`);
    `model` a case-insensitive part of the model column; `status` and `source` exact values,
    several comma-separated. A filter that no row could match because it is misspelt is a
    UserError listing what it may be (`--gpu h100x`, an unknown status or source, a model text
    no row's model holds); a valid filter that leaves no row gives an empty frame."""
    keep = pd.Series(True, index=df.index)
    if gpu:
        kind, count = _gpu_filter(gpu, df)
        keep &= df["gpu"] == kind
        if count:
            keep &= df["num_gpus"] == count
    if model:
        text = model.strip().lower()
        models = sorted({m for m in df["model"].astype(str) if m})
        if not text or not any(text in m.lower() for m in models):
            listed = ", ".join(models[:8]) + (", ..." if len(models) > 8 else "") or "none"
            raise UserError(
                f"--model {model!r}: no row's model holds that text: give part of one of "
                f"the models here ({listed})"
            )
        keep &= df["model"].str.lower().str.contains(text, regex=False)
    if status:
        wanted = _values("--status", status, list(df["status"].cat.categories))
        keep &= df["status"].isin(wanted)
    if source:
        present = [s for s in dict.fromkeys(df["source"].astype(str)) if s]
        wanted = _values(
            "--source", source, [*ROW_SOURCES, *sorted(set(present) - set(ROW_SOURCES))]
        )
        keep &= df["source"].isin(wanted)
    return df[keep.fillna(False).astype(bool)]


def _gpu_filter(text: str, df: pd.DataFrame) -> tuple[str, int]:
    """(kind, count or 0) of a `--gpu` filter: a kind tuner.hardware knows or one of the rows
    holds (`h200`), with a count of 1 or more (`h200x2`); UserError listing the kinds where it
    is none of them (`h100x` matched no row, with exit 0)."""
    from tuner.hardware import GPUS

    kinds = [*GPUS, *sorted({g for g in df["gpu"].astype(str) if g} - set(GPUS))]
    m = _GPU_FILTER.match(text.strip().lower())
    if not m or m.group(1) not in kinds or (m.group(2) is not None and int(m.group(2)) < 1):
        raise UserError(
            f"--gpu {text!r}: write a GPU kind ({', '.join(kinds)}) or a kind and a count of "
            "1 or more (h200x2)"
        )
    return m.group(1), int(m.group(2) or 0)


def _values(flag: str, text: str, known: list[str]) -> list[str]:
    """The comma-separated values of filter `flag`, each one of `known`; UserError naming the
    others and listing `known`."""
    wanted = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in wanted if s not in known]
    if bad or not wanted:
        raise UserError(f"{flag} {','.join(bad) or repr(text)}: use one of {', '.join(known)}")
    return wanted


def same_setup(df: pd.DataFrame) -> pd.Series:
    """What a row is compared within: the model (its reference family), the GPU kind and count,
    and what its throughput covers (results.scope.comparable: a training-only throughput is
    never set against a whole step's)."""
    model = df["model_family"].where(df["model_family"] != "", df["model"].str.lower())
    covers = df["scope"].map(comparable) if "scope" in df else ""
    return model + "|" + df["gpu"] + "|" + df["num_gpus"].astype(str) + "|" + covers


def best_reference(df: pd.DataFrame) -> pd.DataFrame:
    """Per model and GPU kind and count: the best ok reference row (a published row, or a
    reference layout run in the study) with a throughput. Columns: model_family, gpu,
    num_gpus, ref_tokens_per_s_per_gpu, ref_label (file, trial and origin), ref_index."""
    cols = ["model_family", "gpu", "num_gpus", "ref_tokens_per_s_per_gpu", "ref_label"]
    refs = df[df["is_reference"] & (df["status"] == "ok") & df["tokens_per_s_per_gpu"].notna()]
    if refs.empty:
        return pd.DataFrame(columns=[*cols, "ref_index", "key"])
    key = same_setup(refs)
    best = refs.loc[refs["tokens_per_s_per_gpu"].groupby(key).idxmax()]
    label = best["file"] + " trial " + best["trial"].astype(str)
    label = label.where(best["origin"] == "", label + " (" + best["origin"] + ")")
    return pd.DataFrame(
        {
            "model_family": best["model_family"],
            "gpu": best["gpu"],
            "num_gpus": best["num_gpus"],
            "ref_tokens_per_s_per_gpu": best["tokens_per_s_per_gpu"],
            "ref_label": label,
            "ref_index": best.index,
            "key": same_setup(best),
        }
    ).reset_index(drop=True)


def with_reference_ratio(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with `vs_ref`: each row's throughput over the best ok reference row's for the same
    model on the same GPU kind and count (NaN where there is none)."""
    best = best_reference(df)
    out = df.copy()
    ref = same_setup(out).map(dict(zip(best["key"], best["ref_tokens_per_s_per_gpu"], strict=True)))
    out["vs_ref"] = (out["tokens_per_s_per_gpu"] / ref.astype("float64")).astype("float64")
    return out


def default_sort(df: pd.DataFrame) -> str:
    """Throughput where any row has it, else step time (some reference CSVs)."""
    if df["tokens_per_s_per_gpu"].notna().any() or df["step_s"].isna().all():
        return "tokens_per_s_per_gpu"
    return "step_s"


def rank(
    df: pd.DataFrame,
    *,
    sort: str | None = None,
    ascending: bool | None = None,
    top: int | None = None,
) -> pd.DataFrame:
    """Rows sorted by `sort`, rows without the value last, ties by trial; the first `top`.
    Rows that did not finish their measured steps (`partial`: any status but ok) follow the ok
    rows, so a partial measure never heads the table. By default (no `sort`) the rows of the
    broadest scope come first (results.scope.BREADTH: verl's whole step and published rows,
    then gen+train, train only, predicted), the fastest first within a scope, so a screened
    partial step never heads a whole step it ran faster than; `sort` ranks by its column alone."""
    col = column_name(sort, df, "--sort") if sort else default_sort(df)
    asc = ascending if ascending is not None else col not in HIGHER_IS_BETTER
    keys, order = [col], [asc]
    if col != "trial" and "trial" in df.columns:
        keys.append("trial")
        order.append(True)
    if not sort and "scope" in df.columns:
        df = df.assign(_breadth=df["scope"].fillna("").astype(str).map(breadth))
        keys, order = ["_breadth", *keys], [True, *order]
    if "status" in df.columns:
        df = df.assign(_partial=df["status"].fillna("").astype(str).map(partial))
        keys, order = ["_partial", *keys], [True, *order]
    out = df.sort_values(keys, ascending=order, na_position="last", kind="stable")
    out = out.drop(columns=["_partial", "_breadth"], errors="ignore")
    if top is not None:
        if top < 1:
            raise UserError(f"--top must be at least 1, got {top}")
        out = out.head(top)
    return out
