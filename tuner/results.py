"""Trial results, and the CSV leaderboard: atomic upserts, reading (ours and the references'),
ranking and formatting."""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.space import CANDIDATE_FIELDS

SCHEMA_VERSION = 1


class Status(StrEnum):
    OK = "ok"
    OOM = "oom"
    FAILED = "failed"
    TIMEOUT = "timeout"
    PRUNED_INVALID = "pruned-invalid"
    PRUNED_OOM = "pruned-oom-predicted"
    PRUNED_SLOW = "pruned-slow"
    """Stopped early by Optuna's pruner: its first measured steps were far slower than the best."""
    INTERRUPTED = "interrupted"
    """Its worker was killed mid-trial; a resumed study re-runs it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialResult:
    """What a runner reports for one trial. Times in seconds, memory in GiB."""

    status: Status
    source: str
    """estimate, megatron or verl: where the numbers come from."""
    reason: str = ""
    """Why it failed or was pruned; a short line."""
    step_s: float | None = None
    generation_s: float | None = None
    old_log_prob_s: float | None = None
    ref_s: float | None = None
    update_actor_s: float | None = None
    reshard_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mfu_pct: float | None = None
    peak_mem_gib: float | None = None
    """Peak allocated memory, max over GPUs."""
    peak_mem_reserved_gib: float | None = None
    """Peak memory reserved by PyTorch's caching allocator, max over GPUs."""
    peak_mem_device_gib: float | None = None
    """Peak device memory in use (torch.cuda.mem_get_info / NVML: CUDA context, NCCL, cuBLAS
    workspaces and fragmentation included), max over GPUs: what an OOM is decided on."""
    backend: str = ""
    """What actually ran, e.g. `megatron-core (update, old_log_prob); generation predicted`."""
    launch_s: float | None = None
    """Wall time from launch to the first measured step (start-up, model build, warm-up)."""
    measured_s: float | None = None
    """Wall time spent in measured steps."""
    hardware: str = ""
    """What it ran on, e.g. `4x NVIDIA H200`; `model` for estimates."""
    versions: str = ""
    log_path: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    """Runner-specific measures, kept in the row's `extra` column as k=v pairs."""

    @property
    def value(self) -> float | None:
        """The objective: tokens/s/GPU of a run that finished."""
        if self.status is Status.OK and self.tokens_per_s_per_gpu is not None:
            return self.tokens_per_s_per_gpu
        return None


MEASURE_COLUMNS = (
    "tokens_per_s_per_gpu",
    "step_s",
    "generation_s",
    "old_log_prob_s",
    "ref_s",
    "update_actor_s",
    "reshard_s",
    "mfu_pct",
    "peak_mem_gib",
    "peak_mem_reserved_gib",
)
PRED_COLUMNS = (
    "pred_tokens_per_s_per_gpu",
    "pred_step_s",
    "pred_generation_s",
    "pred_old_log_prob_s",
    "pred_update_actor_s",
    "pred_peak_mem_gib",
    "pred_peak_phase",
    "pred_fits",
    "pred_bottleneck",
)
COLUMNS: tuple[str, ...] = (
    "schema_version",
    "study",
    "trial",
    "status",
    "reason",
    "source",
    "runner",
    "model",
    "gpu",
    "num_gpus",
    "gpus_per_node",
    "backend",
    "train_parallel",
    "infer_parallel",
    *MEASURE_COLUMNS,
    *PRED_COLUMNS,
    "workload",
    "algorithm",
    "max_prompt_len",
    "max_response_len",
    "response_mean_len",
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
    *CANDIDATE_FIELDS,
    "hardware",
    "versions",
    "recipe",
    "log_path",
    "extra",
    "started_at",
    "finished_at",
    "duration_s",
)
NUMERIC = {
    *MEASURE_COLUMNS,
    *PRED_COLUMNS[:-3],
    "trial",
    "num_gpus",
    "gpus_per_node",
    "max_prompt_len",
    "max_response_len",
    "response_mean_len",
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
    "duration_s",
    "ppo_max_token_len_per_gpu",
    "log_prob_max_token_len_per_gpu",
    "ppo_micro_batch_size_per_gpu",
    "log_prob_micro_batch_size_per_gpu",
    "rollout_tp",
    "gpu_memory_utilization",
    "max_num_batched_tokens",
    "recompute_num_layers",
}


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    if isinstance(v, dict):
        return ";".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside the CSV, so several tuner workers can share one leaderboard."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def upsert_row(path: Path, row: dict[str, Any]) -> None:
    """Write `row` into the leaderboard, replacing the row of the same (study, trial).

    The whole file is rewritten to a temporary file and renamed over the old one, so a kill at
    any moment leaves either the old or the new file, never a torn one."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown leaderboard columns: {sorted(unknown)}")
    with _locked(path):
        rows = read_raw(path) if path.exists() else []
        key = (str(row.get("study", "")), str(row.get("trial", "")))
        rows = [r for r in rows if (r.get("study", ""), r.get("trial", "")) != key]
        rows.append({k: _fmt(v) for k, v in row.items()})
        rows.sort(key=lambda r: (r.get("study", ""), int(r.get("trial") or 0)))
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(COLUMNS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "schema_version": str(SCHEMA_VERSION)})
        _write_atomic(path, buf.getvalue())


def read_raw(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        raise UserError(f"no leaderboard at {path}: run `tune --model ...` first") from None
    except (csv.Error, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not a readable CSV ({e})") from None


# --------------------------------------------------------------------------------------------
# Reading, ours and the reference leaderboards'
# --------------------------------------------------------------------------------------------

_REFERENCE_RENAMES = {
    "GPU": "gpu",
    "step": "step_s",
    "rollout": "rollout_s",
    "generation": "generation_s",
    "update_actor": "update_actor_s",
    "old_logp": "old_log_prob_s",
    "reshard": "reshard_s",
    "Throughput": "tokens_per_s_per_gpu",
    "Other": "reason",
    "contributor": "contributor",
    "gpu_memory_util": "gpu_memory_utilization",
    "number": "trial",
}


def _tokens(v: str) -> str:
    """`2k` -> 2048, `100K` -> 102400 (the references' shorthand), else unchanged."""
    s = v.strip().lower()
    if s.endswith("k") and s[:-1].replace(".", "").isdigit():
        return str(int(float(s[:-1]) * 1024))
    return v.strip()


def _normalize_reference(r: dict[str, str], path: Path) -> dict[str, str]:
    out: dict[str, str] = {"source": "reference", "study": path.stem}
    for k, v in r.items():
        if k is None:
            continue
        v = (v or "").strip()
        if v in ("/",):
            v = ""
        if k in _REFERENCE_RENAMES:
            out[_REFERENCE_RENAMES[k]] = v
        elif k.startswith("micro_bs_actor") or k.startswith("dynamic_max_token(micro_bs_actor"):
            out["actor_budget"] = _tokens(v)
        elif k.startswith("micro_bs_logp") or k.startswith("dynamic_max_token(micro_bs_logp"):
            out["log_prob_budget"] = _tokens(v)
        elif k in ("max_prompt_len", "max_response_len"):
            out[k] = _tokens(v)
        else:
            out[k.lower().replace(" ", "_")] = v
    out["train_parallel"] = out.get("train_parallel", "").lower()
    out["infer_parallel"] = out.get("infer_parallel", "").lower()
    if out.get("step_s", "").upper() == "OOM":
        out["status"], out["step_s"] = "oom", ""
    elif out.get("step_s") or out.get("update_actor_s"):
        out["status"] = "ok"
    else:
        out["status"] = "no-data"
    if out.get("mfu"):
        with contextlib.suppress(ValueError):
            out["mfu_pct"] = _fmt(float(out.pop("mfu")) * 100)
    return out


def is_reference(header: Iterable[str]) -> bool:
    h = set(header)
    return "schema_version" not in h and "train_parallel" in h and "update_actor" in h


def read_rows(path: Path) -> list[dict[str, str]]:
    """Rows of a leaderboard of ours or a reference CSV, with our column names."""
    rows = read_raw(path)
    if rows and is_reference(rows[0].keys()):
        return [_normalize_reference(r, path) for r in rows]
    if rows and "schema_version" not in rows[0]:
        raise UserError(f"{path} is neither a verl-tuner leaderboard nor a reference CSV")
    return rows


def number(v: str | None) -> float | None:
    if v is None or v == "":
        return None
    try:
        x = float(v)
    except ValueError:
        return None
    return None if math.isnan(x) else x


def rank(
    rows: list[dict[str, str]],
    *,
    sort_by: str | None = None,
    status: str | None = None,
    top: int | None = None,
    descending: bool | None = None,
) -> list[dict[str, str]]:
    """Filter by status and sort (rows without the value last). By default the fastest first:
    by throughput, or by step time where the rows have no throughput (some reference files)."""
    if sort_by is None:
        has_tput = not rows or "tokens_per_s_per_gpu" in rows[0]
        sort_by = "tokens_per_s_per_gpu" if has_tput else "step_s"
    if rows and sort_by not in rows[0]:
        raise UserError(f"no column {sort_by!r}: use one of {', '.join(rows[0])}")
    if status:
        rows = [r for r in rows if r.get("status") == status]
    desc = (
        descending
        if descending is not None
        else sort_by in ("tokens_per_s_per_gpu", "mfu_pct", "pred_tokens_per_s_per_gpu")
    )
    present = [r for r in rows if r.get(sort_by)]
    missing = [r for r in rows if not r.get(sort_by)]
    if all(number(r[sort_by]) is not None for r in present):
        out = sorted(present, key=lambda r: number(r[sort_by]) or 0.0, reverse=desc)
    else:
        out = sorted(present, key=lambda r: r[sort_by], reverse=desc)
    out += missing
    return out[:top] if top else out


SHOW_COLUMNS = (
    "trial",
    "status",
    "source",
    "train_parallel",
    "infer_parallel",
    "tokens_per_s_per_gpu",
    "step_s",
    "generation_s",
    "old_log_prob_s",
    "update_actor_s",
    "mfu_pct",
    "peak_mem_gib",
    "pred_peak_mem_gib",
    "reason",
)
_SHORT = {
    "tokens_per_s_per_gpu": "tok/s/gpu",
    "generation_s": "gen_s",
    "old_log_prob_s": "logp_s",
    "update_actor_s": "update_s",
    "pred_peak_mem_gib": "pred_mem_gib",
    "train_parallel": "train",
    "infer_parallel": "rollout",
}


def format_table(
    rows: list[dict[str, str]], columns: Iterable[str] = SHOW_COLUMNS, max_reason: int = 60
) -> str:
    cols = [c for c in columns if any(r.get(c) for r in rows)] or list(columns)[:4]
    head = [_SHORT.get(c, c) for c in cols]

    def cell(r: dict[str, str], c: str) -> str:
        v = r.get(c) or ""
        x = number(v) if c in NUMERIC or c.endswith("_s") else None
        if x is not None and c != "trial":
            v = f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"
        return v[:max_reason] if c == "reason" else v

    body = [[cell(r, c) for c in cols] for r in rows]
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths, strict=True)) for b in body]
    return "\n".join(line.rstrip() for line in lines)
