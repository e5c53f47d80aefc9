"""The numbers a report is made of: a leaderboard read once with its references (`Study`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tuner import plots
from tuner.errors import UserError
from tuner.leaderboard import (
    PREDICTED_PRUNED,
    REFERENCE_FILES,
    best_reference,
    load_leaderboard,
    same_setup,
    with_reference_ratio,
)

NOT_MEASURED_SOURCES = frozenset({"estimate", "reference", "tuner", ""})
"""Row sources whose numbers were not measured by a runner of this study."""


def reference_dirs() -> list[Path]:
    """Where published reference CSVs are looked for when --reference is not given:
    $TUNER_REFERENCE_DIR, then the checkout's `tests/data/anchors` and `../shared/anchors`."""
    here = Path(__file__).resolve().parents[2]
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


def most_common(s: pd.Series) -> Any:
    """The most common non-empty value of `s` (None where it has none)."""
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
    family = most_common(df["model_family"]) or ""
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
    gpu = str(most_common(df["gpu"]) or "")
    n_gpus = most_common(df["num_gpus"])
    best_ref = None
    if best is not None:
        table = best_reference(both)
        key = same_setup(both.loc[[best.name]]).iloc[0]
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
