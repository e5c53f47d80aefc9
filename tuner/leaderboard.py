"""Leaderboards as a pandas DataFrame: loading (ours, any schema version, and the published
reference CSVs), filtering, ranking against the references and formatting.

```python
import tuner

df = tuner.load_leaderboard(["results/dense-h200-x2.csv", "results/moe-h200-x2.csv"])
ok = df[df.status == "ok"]
ok.groupby("train_parallel").tokens_per_s_per_gpu.max()
```
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tuner.errors import UserError
from tuner.results import Status, is_reference, normalize_reference, upgrade_row

PathLike = str | Path

INT_COLUMNS = frozenset(
    {
        "schema_version",
        "trial",
        "num_gpus",
        "gpus_per_node",
        "max_prompt_len",
        "max_response_len",
        "bs",
        "mini_bs",
        "n",
        "tp",
        "pp",
        "vpp",
        "cp",
        "ep",
        "etp",
        "dp",
        "recompute_num_layers",
        "ppo_max_token_len_per_gpu",
        "log_prob_max_token_len_per_gpu",
        "ppo_micro_batch_size_per_gpu",
        "log_prob_micro_batch_size_per_gpu",
        "rollout_tp",
        "max_num_batched_tokens",
        "max_num_seqs",
        "rollout_dp",
        "rollout_ep",
        "actor_budget",
        "log_prob_budget",
        "first_stage_layers",
        "last_stage_layers",
    }
)
"""Counts: typed as pandas' nullable Int64 (an empty cell is <NA>, not a float NaN)."""

FLOAT_COLUMNS = frozenset(
    {
        "tokens_per_s_per_gpu",
        "step_s",
        "rollout_s",
        "generation_s",
        "old_log_prob_s",
        "ref_s",
        "update_actor_s",
        "reshard_s",
        "mfu_update_pct",
        "verl_mfu_actor_pct",
        "peak_mem_gib",
        "peak_mem_reserved_gib",
        "peak_mem_device_gib",
        "launch_s",
        "measured_s",
        "duration_s",
        "response_mean_len",
        "gpu_memory_utilization",
        "pred_tokens_per_s_per_gpu",
        "pred_step_s",
        "pred_generation_s",
        "pred_old_log_prob_s",
        "pred_ref_s",
        "pred_update_actor_s",
        "pred_reshard_s",
        "pred_peak_mem_gib",
        "pred_device_mem_gib",
        "pred_device_mem_corrected_gib",
        "pred_headroom_gib",
        "pred_time_scale",
        "pred_generation_scale",
        "pred_old_log_prob_scale",
        "pred_update_actor_scale",
        "prompt_mean_len",
    }
)
"""Measures: float64 whatever the file holds, NaN where empty (so they are there to plot)."""

STRING_COLUMNS = frozenset(
    {
        "study",
        "status",
        "reason",
        "source",
        "runner",
        "model",
        "gpu",
        "backend",
        "train_parallel",
        "infer_parallel",
        "pred_peak_phase",
        "pred_bottleneck",
        "workload",
        "algorithm",
        "recompute_granularity",
        "recompute_method",
        "hardware",
        "versions",
        "recipe",
        "log_path",
        "extra",
        "started_at",
        "finished_at",
        "origin",
        "file",
        "storage",
        "worker",
        "pred_versions",
        "contributor",
        "other",
    }
)
"""Text, never guessed as numbers (a study named `2` stays a name)."""

STATUS_ORDER = (*(s.value for s in Status), "no-data")
"""Category order of `status`: ours, then the reference CSVs' rows without numbers."""

PREDICTED_PRUNED = frozenset({Status.PRUNED_INVALID.value, Status.PRUNED_OOM.value, "no-data"})
"""Statuses of rows that never launched."""

SHOW_COLUMNS = (
    "trial",
    "status",
    "source",
    "gpu",
    "num_gpus",
    "train_parallel",
    "infer_parallel",
    "tokens_per_s_per_gpu",
    "vs_ref",
    "step_s",
    "generation_s",
    "old_log_prob_s",
    "update_actor_s",
    "mfu_update_pct",
    "verl_mfu_actor_pct",
    "peak_mem_gib",
    "peak_mem_device_gib",
    "pred_peak_mem_gib",
    "origin",
    "reason",
)
"""What `tune show` prints by default (columns empty in every shown row are left out)."""

SHORT_NAMES = {
    "tokens_per_s_per_gpu": "tok/s/gpu",
    "num_gpus": "gpus",
    "generation_s": "gen_s",
    "old_log_prob_s": "logp_s",
    "update_actor_s": "update_s",
    "mfu_update_pct": "mfu_upd_pct",
    "verl_mfu_actor_pct": "verl_mfu_pct",
    "pred_peak_mem_gib": "pred_mem_gib",
    "peak_mem_device_gib": "device_gib",
    "train_parallel": "train",
    "infer_parallel": "rollout",
    "origin": "from",
}
"""Column headings of the text table; `--columns` and `--sort` accept either name."""

FORMATS = ("table", "csv", "json", "markdown")

DERIVED_COLUMNS = ("file", "origin", "is_reference", "model_family", "vs_ref")
"""Columns load_leaderboard (and with_reference_ratio) add to the file's own."""

REFERENCE_FILES: dict[str, tuple[str, ...]] = {
    "qwen2.5-7b": ("dapo7b.csv", "grpo_qwen2.5_7b.csv"),
    "qwen3-30b-moe": ("dapo_moe30b.csv",),
}
"""The published reference leaderboards (shared/anchors, ISEEKYAN/verl_megatron_practice) of
each registry model: the same files tuner/references.py takes its warm-start setups from."""

_ORIGIN = re.compile(r"(?:^|;)origin=([^;]*)")
_HARDWARE = re.compile(r"^\s*(\d+)\s*x\s*(?:nvidia\s+)?([a-z0-9]+)", re.IGNORECASE)


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


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
        df = pd.DataFrame({c: _typed(df[c], c) for c in df.columns}, index=df.index)
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
        return pd.DataFrame({c: _typed(up[c], c) for c in up.columns}, index=up.index)
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
        return pd.DataFrame({c: _typed(raw[c], c) for c in raw.columns}, index=raw.index)
    df.columns = header
    return pd.DataFrame({c: _retyped(df[c], c) for c in df.columns}, index=df.index)


def _typed(s: pd.Series, name: str) -> pd.Series:
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


def _retyped(s: pd.Series, name: str) -> pd.Series:
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
    return _typed(s.astype(object).where(s.notna(), "").astype(str), name)


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
    return _finish(pd.DataFrame({c: _retyped(both[c], c) for c in both.columns}))


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
    cols["is_reference"] = (cols["source"] == "reference") | cols["origin"].str.startswith(
        "reference"
    )
    models = cols["model"]
    fam = models.map({m: model_family(m) for m in models.unique()}).astype(str)
    if "model_family" in cols:
        fam = fam.where(fam != "", cols["model_family"])
    cols["model_family"] = fam
    return pd.DataFrame(cols, index=idx).reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# Filtering, references, ranking
# --------------------------------------------------------------------------------------------

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
    several comma-separated. Unknown status values are a UserError."""
    keep = pd.Series(True, index=df.index)
    if gpu:
        m = _GPU_FILTER.match(gpu.strip().lower())
        if not m:
            raise UserError(f"--gpu {gpu!r}: write a GPU kind (h200) or kind and count (h200x2)")
        keep &= df["gpu"] == m.group(1)
        if m.group(2):
            keep &= df["num_gpus"] == int(m.group(2))
    if model:
        keep &= df["model"].str.lower().str.contains(model.strip().lower(), regex=False)
    if status:
        wanted = [s.strip() for s in status.split(",") if s.strip()]
        known = list(df["status"].cat.categories)
        bad = [s for s in wanted if s not in known]
        if bad:
            raise UserError(f"--status {','.join(bad)}: use one of {', '.join(known)}")
        keep &= df["status"].isin(wanted)
    if source:
        wanted = [s.strip() for s in source.split(",") if s.strip()]
        keep &= df["source"].isin(wanted)
    return df[keep.fillna(False).astype(bool)]


def _same_setup(df: pd.DataFrame) -> pd.Series:
    """What a row is compared within: the model (its reference family) and the GPU kind and
    count."""
    model = df["model_family"].where(df["model_family"] != "", df["model"].str.lower())
    return model + "|" + df["gpu"] + "|" + df["num_gpus"].astype(str)


def best_reference(df: pd.DataFrame) -> pd.DataFrame:
    """Per model and GPU kind and count: the best ok reference row (a published row, or a
    reference layout run in the study) with a throughput. Columns: model_family, gpu,
    num_gpus, ref_tokens_per_s_per_gpu, ref_label (file, trial and origin), ref_index."""
    cols = ["model_family", "gpu", "num_gpus", "ref_tokens_per_s_per_gpu", "ref_label"]
    refs = df[df["is_reference"] & (df["status"] == "ok") & df["tokens_per_s_per_gpu"].notna()]
    if refs.empty:
        return pd.DataFrame(columns=[*cols, "ref_index", "key"])
    key = _same_setup(refs)
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
            "key": _same_setup(best),
        }
    ).reset_index(drop=True)


def with_reference_ratio(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with `vs_ref`: each row's throughput over the best ok reference row's for the same
    model on the same GPU kind and count (NaN where there is none)."""
    best = best_reference(df)
    out = df.copy()
    ref = _same_setup(out).map(
        dict(zip(best["key"], best["ref_tokens_per_s_per_gpu"], strict=True))
    )
    out["vs_ref"] = (out["tokens_per_s_per_gpu"] / ref.astype("float64")).astype("float64")
    return out


def column_name(name: str, df: pd.DataFrame, option: str) -> str:
    """A column of `df` by its name or its short heading; UserError naming the choices."""
    long = {v: k for k, v in SHORT_NAMES.items()}.get(name.strip(), name.strip())
    if long not in df.columns:
        raise UserError(
            f"{option}: no column {name!r}: use one of {', '.join(map(str, df.columns))}"
        )
    return long


def default_sort(df: pd.DataFrame) -> str:
    """Throughput where any row has it, else step time (some reference CSVs)."""
    if df["tokens_per_s_per_gpu"].notna().any() or df["step_s"].isna().all():
        return "tokens_per_s_per_gpu"
    return "step_s"


HIGHER_IS_BETTER = frozenset(
    {
        "tokens_per_s_per_gpu",
        "pred_tokens_per_s_per_gpu",
        "mfu_update_pct",
        "verl_mfu_actor_pct",
        "vs_ref",
    }
)


def rank(
    df: pd.DataFrame,
    *,
    sort: str | None = None,
    ascending: bool | None = None,
    top: int | None = None,
) -> pd.DataFrame:
    """Rows sorted by `sort` (default: the fastest first), rows without the value last, ties
    by trial; the first `top`."""
    col = column_name(sort, df, "--sort") if sort else default_sort(df)
    asc = ascending if ascending is not None else col not in HIGHER_IS_BETTER
    keys, order = [col], [asc]
    if col != "trial" and "trial" in df.columns:
        keys.append("trial")
        order.append(True)
    out = df.sort_values(keys, ascending=order, na_position="last", kind="stable")
    if top is not None:
        if top < 1:
            raise UserError(f"--top must be at least 1, got {top}")
        out = out.head(top)
    return out


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------


def _number(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _cells(s: pd.Series, name: str, max_text: int) -> list[str]:
    """Display strings of one column: numbers to 3 significant digits (whole above 100), empty
    where missing. Plain Python lists: 10,000 rows format in a few milliseconds."""
    if name == "vs_ref":
        return ["" if x != x else f"{x:.2f}x" for x in s.astype("float64").tolist()]
    if pd.api.types.is_bool_dtype(s):
        return ["" if x is None or x is pd.NA else str(bool(x)) for x in s.tolist()]
    if pd.api.types.is_integer_dtype(s):
        return ["" if x is None or x is pd.NA else str(int(x)) for x in s.tolist()]
    if pd.api.types.is_float_dtype(s):
        return ["" if x != x else _number(x) for x in s.tolist()]
    out = [str(x) for x in s.tolist()]
    return [x[:max_text] for x in out] if name == "reason" else out


def resolve_columns(df: pd.DataFrame, columns: Sequence[str] | None) -> list[str]:
    """Requested columns (names or short headings), or the default ones that hold a value in
    some row. `all` means every column."""
    if columns is None:
        cols = [c for c in SHOW_COLUMNS if c in df.columns]
        has = [c for c in cols if _has_value(df[c])]
        return has or cols[:4]
    if list(columns) == ["all"]:
        return list(df.columns)
    return [column_name(c, df, "--columns") for c in columns]


def _has_value(s: pd.Series) -> bool:
    if pd.api.types.is_numeric_dtype(s) or pd.api.types.is_bool_dtype(s):
        return bool(s.notna().any())
    return bool((s.astype(str) != "").any())


def render(df: pd.DataFrame, columns: Sequence[str], fmt: str = "table", max_text: int = 60) -> str:
    """The rows as an aligned text table, CSV, JSON (a list of objects, null where empty) or a
    Markdown table."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    part = df[list(columns)]
    if fmt == "csv":
        return part.to_csv(index=False).rstrip("\n")
    if fmt == "json":
        plain = part.astype(object).where(part.notna(), None)
        return json.dumps(plain.to_dict("records"), default=_json_default, indent=1)
    heads = [SHORT_NAMES.get(c, c) if fmt == "table" else c for c in columns]
    body = [_cells(part[c], c, max_text) for c in columns]
    rows = list(zip(*body, strict=True)) if body else []
    if fmt == "markdown":
        lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
        lines += ["| " + " | ".join(v.replace("|", r"\|") for v in r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max([len(h), *map(len, b)]) for h, b in zip(heads, body, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()]
    line = "  ".join(f"{{:<{w}}}" for w in widths).format
    lines += [line(*r).rstrip() for r in rows]
    return "\n".join(lines)


def _json_default(x: object) -> object:
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return None if np.isnan(x) else float(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return str(x)
