"""Leaderboard CSV files: atomic upserts under a lock, and reading ours (any schema) and the
published reference CSVs with our column names."""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.fileio import write_atomic
from tuner.results.record import (
    COLOCATED_ONLY_OMITTED,
    COLUMNS,
    SCHEMA_VERSION_CELL,
    fmt,
    upgrade_row,
)


def csv_text(rows: Iterable[dict[str, str]]) -> str:
    """The leaderboard file's text for rows of COLUMNS (less COLOCATED_ONLY_OMITTED where no
    row sets them)."""
    rows = list(rows)
    cols = [
        c
        for c in COLUMNS
        if c not in COLOCATED_ONLY_OMITTED or any(r.get(c) not in (None, "", "0", 0) for r in rows)
    ]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def lock_of(path: Path) -> Path:
    """The lock file `locked(path)` takes: `<path>.lock`."""
    return path.with_name(path.name + ".lock")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside `path` (`lock_of`), so several tuner workers can share one
    leaderboard or one storage file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_of(path), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def upsert_row(path: Path, row: dict[str, Any]) -> None:
    """Write `row` into the leaderboard, replacing the row of the same (study, trial).

    For leaderboards kept outside a study (tests, hand-made files); a study rebuilds its CSV
    from its storage instead. The file is replaced atomically (tuner.fileio.write_atomic)."""
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown leaderboard columns: {sorted(unknown)}")
    with locked(path):
        rows = [upgrade_row(r) for r in read_raw(path)] if path.exists() else []
        key = (str(row.get("study", "")), str(row.get("trial", "")))
        rows = [r for r in rows if (r.get("study", ""), r.get("trial", "")) != key]
        rows.append({k: fmt(v) for k, v in row.items()})
        rows.sort(key=lambda r: (r.get("study", ""), int(r.get("trial") or 0)))
        write_atomic(path, csv_text({**r, "schema_version": SCHEMA_VERSION_CELL} for r in rows))


def read_raw(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # a spreadsheet's BOM too
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


def normalize_reference(r: dict[str, str], path: Path) -> dict[str, str]:
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
    if out.get("mfu"):  # verl's perf/mfu/actor of the published runs, a fraction
        with contextlib.suppress(ValueError):
            out["verl_mfu_actor_pct"] = fmt(float(out.pop("mfu")) * 100)
    return out


def is_reference(header: Iterable[str]) -> bool:
    h = set(header)
    return "schema_version" not in h and "train_parallel" in h and "update_actor" in h


def read_rows(path: Path) -> list[dict[str, str]]:
    """Rows of a leaderboard of ours (in schema 3's meaning: `upgrade_row`) or a reference CSV,
    with our column names."""
    rows = read_raw(path)
    if rows and is_reference(rows[0].keys()):
        return [normalize_reference(r, path) for r in rows]
    if rows and "schema_version" not in rows[0]:
        raise UserError(
            f"{path} is neither a verl-tuner leaderboard (no schema_version column) nor a "
            "reference CSV: pass a CSV that `tune` wrote"
        )
    return [upgrade_row(r) for r in rows]
