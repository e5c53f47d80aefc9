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

import numpy as np
import pandas as pd

from tuner.errors import UserError
from tuner.results import Status, _normalize_reference, is_reference

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
        "mfu_pct",
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
    }
)
"""Measures: float64 whatever the file holds, NaN where empty (so they are there to plot)."""

STRING_COLUMNS = frozenset(
    {
        "study",
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
    "mfu_pct",
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


def _read_strings(path: Path) -> pd.DataFrame:
    """Every cell as text ("" where empty), or one-line UserErrors."""
    if path.is_dir():
        raise UserError(f"{path} is a folder: pass a leaderboard CSV, e.g. {path}/<study>.csv")
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False)
    except FileNotFoundError:
        raise UserError(f"no leaderboard at {path}: run `tune --model ...` first") from None
    except pd.errors.EmptyDataError:
        raise UserError(f"{path} is empty: it is not a leaderboard yet") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        first = str(e).strip().splitlines()[0][:120]
        raise UserError(f"{path} is not a readable CSV ({first})") from None


def _one_file(path: Path) -> pd.DataFrame:
    raw = _read_strings(path)
    raw.columns = [str(c).strip() for c in raw.columns]
    if is_reference(raw.columns):
        records = [_normalize_reference(r, path) for r in raw.to_dict("records")]
        df = pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=["status"])
        df = df.fillna("")
    elif "schema_version" in raw.columns:
        df = raw
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


def _typed(s: pd.Series, name: str) -> pd.Series:
    """One column with its type: by name where known, else by what every non-empty cell is."""
    if name in STRING_COLUMNS:
        return s.astype(str)
    blank = s.str.strip() == ""
    if name in INT_COLUMNS or name in FLOAT_COLUMNS:
        num = pd.to_numeric(s.where(~blank), errors="coerce")
        if name in INT_COLUMNS and bool((num.dropna() % 1 == 0).all()):
            return num.astype("Int64")
        return num.astype("float64")
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


def load_leaderboard(path_or_paths: PathLike | Iterable[PathLike]) -> pd.DataFrame:
    """One DataFrame of the rows of one or several leaderboards, ours (any schema version:
    unknown columns are kept, missing ones added empty) or published reference CSVs (their
    column names mapped to ours, `source` = `reference`).

    Typed columns: counts are nullable Int64 (`trial`, `num_gpus`, `tp`, ...), measures float64
    with NaN where empty, true/false columns nullable booleans, `status` a categorical. Always
    present: `file` (the CSV's name), `study`, `trial`, `status`, `source`, `model`, `gpu`
    (lower case, e.g. `h200`), `num_gpus`, `train_parallel`, `infer_parallel`, the measures,
    `origin` (where a warm-start row came from, e.g. `reference tp2`) and `is_reference` (a
    published row or one of the reference layouts run in the study).

    Raises UserError (one line) for a missing, empty or unreadable file, or a CSV that is not
    a leaderboard."""
    paths = _paths(path_or_paths)
    if not paths:
        raise UserError("no leaderboard given: pass one or more CSV paths")
    frames = [_one_file(p) for p in paths]
    raw = pd.concat(frames, ignore_index=True, sort=False) if len(frames) > 1 else frames[0]
    raw = raw.fillna("")
    return _finish(raw)


def _finish(raw: pd.DataFrame) -> pd.DataFrame:
    cols: dict[str, pd.Series] = {}
    n = len(raw)
    for name in raw.columns:
        cols[name] = _typed(raw[name].astype(str), name)
    for name in ("study", "source", "model", "train_parallel", "infer_parallel", "reason"):
        cols.setdefault(name, pd.Series([""] * n, index=raw.index, dtype=str))
    for name in FLOAT_COLUMNS:
        cols.setdefault(name, pd.Series(np.nan, index=raw.index, dtype="float64"))
    for name in ("trial", "num_gpus"):
        cols.setdefault(name, pd.Series(pd.NA, index=raw.index, dtype="Int64"))
    hw = cols.get("hardware", pd.Series([""] * n, index=raw.index, dtype=str))
    parsed = hw.str.extract(_HARDWARE)
    gpu = cols.get("gpu", pd.Series([""] * n, index=raw.index, dtype=str)).str.strip().str.lower()
    cols["gpu"] = gpu.where(gpu != "", parsed[1].fillna("").str.lower())
    from_hw = pd.to_numeric(parsed[0], errors="coerce").astype("Int64")
    cols["num_gpus"] = cols["num_gpus"].fillna(from_hw)
    status = cols.get("status", pd.Series([""] * n, index=raw.index, dtype=str)).str.strip()
    extra = sorted(set(status.unique()) - set(STATUS_ORDER))
    cols["status"] = pd.Categorical(status, categories=[*STATUS_ORDER, *extra])
    if "origin" not in cols:
        ex = cols.get("extra", pd.Series([""] * n, index=raw.index, dtype=str))
        cols["origin"] = ex.str.extract(_ORIGIN)[0].fillna("").astype(str)
    cols["is_reference"] = (cols["source"] == "reference") | cols["origin"].str.startswith(
        "reference"
    )
    fam = cols["model"].map(model_family).astype(str)
    if "model_family" in cols:
        fam = fam.where(fam != "", cols["model_family"])
    cols["model_family"] = fam
    return pd.DataFrame(cols, index=raw.index).reset_index(drop=True)


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
    {"tokens_per_s_per_gpu", "pred_tokens_per_s_per_gpu", "mfu_pct", "vs_ref"}
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


def _cells(s: pd.Series, name: str, max_text: int) -> pd.Series:
    """Display strings of one column: numbers to 3 significant digits (whole above 100)."""
    if name == "vs_ref":
        return s.map(lambda x: "" if pd.isna(x) else f"{x:.2f}x")
    if pd.api.types.is_bool_dtype(s):
        return s.astype("object").map(lambda x: "" if pd.isna(x) else str(bool(x)))
    if pd.api.types.is_integer_dtype(s):
        return s.astype("object").map(lambda x: "" if pd.isna(x) else str(int(x)))
    if pd.api.types.is_float_dtype(s):
        return s.map(lambda x: "" if pd.isna(x) else (f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"))
    out = s.astype(str)
    return out.str.slice(0, max_text) if name == "reason" else out


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
    if fmt == "markdown":
        esc = [b.str.replace("|", r"\|", regex=False) for b in body]
        lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
        if len(part):
            row = esc[0]
            for b in esc[1:]:
                row = row + " | " + b
            lines += ("| " + row + " |").tolist()
        return "\n".join(lines)
    widths = [
        max(len(h), int(b.str.len().max()) if len(b) else 0)
        for h, b in zip(heads, body, strict=True)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()]
    if len(part):
        row = body[0].str.ljust(widths[0])
        for b, w in zip(body[1:], widths[1:], strict=True):
            row = row + "  " + b.str.ljust(w)
        lines += row.str.rstrip().tolist()
    return "\n".join(lines)


def _json_default(x: object) -> object:
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return None if np.isnan(x) else float(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return str(x)
