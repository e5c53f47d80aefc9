"""The leaderboard DataFrame's columns: their types (and how a column of text gets its type), the
ones `tune show` prints and adds, their headings, and a column named on the command line."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tuner.errors import UserError
from tuner.results import SHORT_NAMES, Status

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
    "scope",
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

DERIVED_COLUMNS = ("file", "origin", "is_reference", "model_family", "vs_ref", "scope")
"""Columns load_leaderboard (and with_reference_ratio) add to the file's own."""


def typed(s: pd.Series, name: str) -> pd.Series:
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


def retyped(s: pd.Series, name: str) -> pd.Series:
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
    return typed(s.astype(object).where(s.notna(), "").astype(str), name)


def column_name(name: str, df: pd.DataFrame, option: str) -> str:
    """A column of `df` by its name or its short heading; UserError naming the choices."""
    long = {v: k for k, v in SHORT_NAMES.items()}.get(name.strip(), name.strip())
    if long not in df.columns:
        raise UserError(
            f"{option}: no column {name!r}: use one of {', '.join(map(str, df.columns))}"
        )
    return long
