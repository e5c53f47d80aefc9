"""Loading leaderboards into one typed DataFrame: ours (any schema version) and the published
reference CSVs, with the columns every row is compared by (GPU, origin, model family)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tuner.errors import UserError
from tuner.leaderboard.columns import (
    FLOAT_COLUMNS,
    INT_COLUMNS,
    STATUS_ORDER,
    STRING_COLUMNS,
    retyped,
    typed,
)
from tuner.results import is_reference, normalize_reference, upgrade_row
from tuner.results.scope import scope_of
from tuner.space.placement import placement_label

PathLike = str | Path

REFERENCE_FILES: dict[str, tuple[str, ...]] = {
    "qwen2.5-7b": ("dapo7b.csv", "grpo_qwen2.5_7b.csv"),
    "qwen3-30b-moe": ("dapo_moe30b.csv",),
}
"""The published reference leaderboards (shared/anchors, ISEEKYAN/verl_megatron_practice) of
each registry model: the same files tuner/references.py takes its warm-start setups from."""


_HARDWARE = re.compile(r"^\s*(\d+)\s*x\s*(?:nvidia\s+)?([a-z0-9]+)", re.IGNORECASE)


def _paths(path_or_paths: PathLike | Iterable[PathLike]) -> list[Path]:
    if isinstance(path_or_paths, str | Path):
        return [Path(path_or_paths)]
    return [Path(p) for p in path_or_paths]


def _read(path: Path, **kw: object) -> pd.DataFrame:
    """pandas.read_csv with one-line UserErrors for what a user can get wrong."""
    if path.is_dir():
        raise UserError(f"{path} is a folder: pass a leaderboard CSV, e.g. {path}/<study>.csv")
    try:
        return pd.read_csv(path, **kw)  # type: ignore[call-overload, no-any-return]
    except FileNotFoundError:
        raise UserError(f"no leaderboard at {path}: run `tune --model ...` first") from None
    except pd.errors.EmptyDataError:
        raise UserError(f"{path} is empty: it is not a leaderboard yet") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        first = str(e).strip().splitlines()[0][:120]
        raise UserError(f"{path} is not a readable CSV ({first})") from None


def _strings(path: Path) -> pd.DataFrame:
    return _read(path, dtype=str, keep_default_na=False, na_filter=False)


def _one_file(path: Path) -> pd.DataFrame:
    header = [str(c).strip() for c in _read(path, nrows=0).columns]
    if is_reference(header):
        raw = _strings(path)
        raw.columns = header
        records = [normalize_reference(r, path) for r in raw.to_dict("records")]
        df = pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=["status"])
        df = df.fillna("").astype(str)
        df = pd.DataFrame({c: typed(df[c], c) for c in df.columns}, index=df.index)
    elif "schema_version" in header:
        df = _read_ours(path, header)
    else:
        raise UserError(
            f"{path} is neither a verl-tuner leaderboard (no schema_version column) nor a "
            "reference CSV (train_parallel, update_actor): pass a CSV that `tune` wrote"
        )
    df.insert(0, "file", path.name)
    if "model" not in df.columns or not (df["model"] != "").any():
        families = [m for m, files in REFERENCE_FILES.items() if path.name in files]
        df["model_family"] = families[0] if families else ""
    return df


def _read_ours(path: Path, header: list[str]) -> pd.DataFrame:
    """Our CSV, typed by pandas' C parser where the column is known (fast: 10,000 rows in a
    fraction of a second); cell by cell where a known numeric column holds text, or where the
    file is of schema 1 or 2 (its rows read in schema 3's meaning, tuner.results.upgrade_row)."""
    if "mfu_pct" in header:  # every schema-1 and -2 file has it; schema 3 has not
        raw = _strings(path)
        raw.columns = header
        records = [upgrade_row(r) for r in raw.to_dict("records")]
        up = pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=header)
        up = up.drop(columns=["mfu_pct"], errors="ignore").fillna("").astype(str)
        return pd.DataFrame({c: typed(up[c], c) for c in up.columns}, index=up.index)
    dtypes: dict[str, Any] = {}
    for c in header:
        if c in STRING_COLUMNS:
            dtypes[c] = str
        elif c in FLOAT_COLUMNS or c in INT_COLUMNS:
            dtypes[c] = "float64"
    try:
        df = _read(path, dtype=dtypes, keep_default_na=False, na_values=[""])
    except (ValueError, TypeError):  # a damaged number: coerce it to NaN, keep the row
        raw = _strings(path)
        raw.columns = header
        return pd.DataFrame({c: typed(raw[c], c) for c in raw.columns}, index=raw.index)
    df.columns = header
    return pd.DataFrame({c: retyped(df[c], c) for c in df.columns}, index=df.index)


def load_leaderboard(path_or_paths: PathLike | Iterable[PathLike]) -> pd.DataFrame:
    """One DataFrame of the rows of one or several leaderboards, ours (any schema version:
    unknown columns are kept, missing ones added empty) or published reference CSVs (their
    column names mapped to ours, `source` = `reference`).

    Typed columns: counts are nullable Int64 (`trial`, `num_gpus`, `tp`, ...), measures float64
    with NaN where empty, true/false columns nullable booleans, `status` a categorical. Always
    present: `file` (the CSV's name), `study`, `trial`, `status`, `source`, `model`, `gpu`
    (lower case, e.g. `h200`), `num_gpus`, `train_parallel`, `infer_parallel`, the measures,
    `origin` (where a warm-start row came from, e.g. `reference tp2`), `is_reference` (a
    published row or one of the reference layouts run in the study) and `model_family` (the
    registry model whose references apply).

    Raises UserError (one line) for a missing, empty or unreadable file, or a CSV that is not
    a leaderboard."""
    paths = _paths(path_or_paths)
    if not paths:
        raise UserError("no leaderboard given: pass one or more CSV paths")
    frames = [_one_file(p) for p in paths]
    if len(frames) == 1:
        return _finish(frames[0])
    both = pd.concat(frames, ignore_index=True, sort=False)
    return _finish(pd.DataFrame({c: retyped(both[c], c) for c in both.columns}))


@functools.lru_cache(maxsize=256)
def model_family(model: str) -> str:
    """The registry model whose reference rows compare with rows of `model`: the registry name
    itself, a config.json of the same layer shape in a folder named `<registry name>-...`
    (tuner.references.reference_family), or the reference CSVs' spelling (`qwen2.5 7b math`,
    `Qwen3-30B`); "" if none."""
    from tuner.models import REGISTRY, get_model
    from tuner.references import REFERENCE_SETUPS, reference_family

    text = model.strip()
    if not text:
        return ""
    try:
        fam = reference_family(get_model(text))
        if fam:
            return fam
    except (UserError, ValueError, OSError):
        pass
    name = Path(text).parent.name if text.endswith(".json") else text
    key = name.lower()
    for fam in REFERENCE_SETUPS:
        if key == fam or key.startswith(fam + "-"):
            return fam
    squashed = re.sub(r"[^a-z0-9]", "", key)
    for fam in sorted(REFERENCE_SETUPS, key=len, reverse=True):
        base = re.sub(r"[^a-z0-9]", "", fam.removesuffix("-moe"))
        if squashed.startswith(base) and (squashed == base or not squashed[len(base)].isdigit()):
            return fam
    return key if key in REGISTRY else ""


def _blank(index: pd.Index) -> pd.Series:
    return pd.Series("", index=index, dtype=str)


def _placement(cols: dict[str, pd.Series], idx: pd.Index) -> pd.Series:
    """Each row's placement (space.placement.placement_label: `colocated` or `split r2+t2`),
    from its rollout_gpus and num_gpus; empty in every row where none is split, so a colocated
    leaderboard shows as it did before placement was searched."""
    r = pd.to_numeric(cols.get("rollout_gpus", _blank(idx)), errors="coerce").fillna(0)
    if not bool((r > 0).any()):
        return _blank(idx)
    n = pd.to_numeric(cols["num_gpus"], errors="coerce").fillna(0)
    labels = [placement_label(int(a), int(b)) for a, b in zip(r, n, strict=True)]
    return pd.Series(labels, index=idx, dtype=str)


def _finish(df: pd.DataFrame) -> pd.DataFrame:
    cols: dict[str, pd.Series] = {c: df[c] for c in df.columns}
    idx = df.index
    for name in ("study", "source", "model", "train_parallel", "infer_parallel", "reason"):
        cols.setdefault(name, _blank(idx))
    for name in FLOAT_COLUMNS:
        cols.setdefault(name, pd.Series(np.nan, index=idx, dtype="float64"))
    for name in ("trial", "num_gpus"):
        cols.setdefault(name, pd.Series(pd.NA, index=idx, dtype="Int64"))
    gpu = cols.get("gpu", _blank(idx)).str.strip().str.lower()
    missing = gpu == ""
    if bool(missing.any()) and "hardware" in cols:
        parsed = cols["hardware"][missing].str.extract(_HARDWARE)
        gpu[missing] = parsed[1].fillna("").str.lower()
        n = pd.to_numeric(parsed[0], errors="coerce").astype("Int64")
        cols["num_gpus"] = cols["num_gpus"].astype("Int64").fillna(n.reindex(idx))
    cols["gpu"] = gpu
    status = cols.get("status", _blank(idx)).astype(str).str.strip()
    extra = sorted(set(status.unique()) - set(STATUS_ORDER))
    cols["status"] = pd.Series(
        pd.Categorical(status, categories=[*STATUS_ORDER, *extra]), index=idx
    )
    if "origin" not in cols:
        ex = cols.get("extra", _blank(idx))
        has = ex.str.contains("origin=", regex=False)
        origin = _blank(idx)
        if bool(has.any()):
            after = ex[has].str.partition("origin=")[2].str.partition(";")[0]
            origin[has] = after
        cols["origin"] = origin
    ex = cols.get("extra", _blank(idx)).astype(str)
    cols["scope"] = pd.Series(
        [scope_of(str(src), e) for src, e in zip(cols["source"], ex, strict=True)],
        index=idx,
        dtype=str,
    )
    cols["placement"] = _placement(cols, idx)
    cols["is_reference"] = (cols["source"] == "reference") | cols["origin"].str.startswith(
        "reference"
    )
    models = cols["model"]
    fam = models.map({m: model_family(m) for m in models.unique()}).astype(str)
    if "model_family" in cols:
        fam = fam.where(fam != "", cols["model_family"])
    cols["model_family"] = fam
    return pd.DataFrame(cols, index=idx).reset_index(drop=True)
