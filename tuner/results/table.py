"""Ranking leaderboard rows and printing them as a text table; the table layout, number format,
short headings and sort directions are the ones `tune show` (tuner.leaderboard) uses too."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tuner.errors import UserError
from tuner.results.record import NUMERIC, number

HIGHER_IS_BETTER = frozenset(
    {
        "tokens_per_s_per_gpu",
        "pred_tokens_per_s_per_gpu",
        "mfu_update_pct",
        "verl_mfu_actor_pct",
        "vs_ref",
    }
)
"""Columns ranked highest first by default (`rank` here and tuner.leaderboard.rank)."""


def partial(status: str) -> bool:
    """Whether a row ranks after the ok ones (`rank` here and tuner.leaderboard.rank): any
    status but ok (rows without a status, some reference files, count as ok); a pruned-slow
    row's number is the step it was stopped at."""
    return status not in ("ok", "")


def rank(
    rows: list[dict[str, str]],
    *,
    sort_by: str | None = None,
    status: str | None = None,
    top: int | None = None,
    descending: bool | None = None,
) -> list[dict[str, str]]:
    """Filter by status and sort (rows without the value last). By default the fastest first:
    by throughput, or by step time where the rows have no throughput (some reference files).
    Rows of any status but ok (`partial`) follow the ok ones, as in tuner.leaderboard.rank."""
    if sort_by is None:
        has_tput = not rows or "tokens_per_s_per_gpu" in rows[0]
        sort_by = "tokens_per_s_per_gpu" if has_tput else "step_s"
    if rows and sort_by not in rows[0]:
        raise UserError(f"no column {sort_by!r}: use one of {', '.join(rows[0])}")
    if status:
        rows = [r for r in rows if r.get("status") == status]
    desc = descending if descending is not None else sort_by in HIGHER_IS_BETTER
    present = [r for r in rows if r.get(sort_by)]
    missing = [r for r in rows if not r.get(sort_by)]
    if all(number(r[sort_by]) is not None for r in present):
        out = sorted(present, key=lambda r: number(r[sort_by]) or 0.0, reverse=desc)
    else:
        out = sorted(present, key=lambda r: r[sort_by], reverse=desc)
    out += missing
    out.sort(key=lambda r: partial(r.get("status", "")))  # stable: ok rows first
    return out[:top] if top else out


SHOW_COLUMNS = (
    "trial",
    "status",
    "source",
    "gpu",
    "num_gpus",
    "train_parallel",
    "infer_parallel",
    "placement",
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
"""What `tune show` prints by default (columns empty in every shown row are left out; `scope`
and `vs_ref` are tuner.leaderboard's, added to the rows it loads), and of which a finished
`tune run` prints all but SUMMARY_LEAVES_OUT."""
SUMMARY_LEAVES_OUT = frozenset({"gpu", "num_gpus", "peak_mem_device_gib", "origin", "reason"})
"""What the summary of a finished `tune run` leaves out of SHOW_COLUMNS: the study's own GPU
kind and count (the same in every row), the device peak, why each row was tried, and the
reason (empty in its ok rows)."""
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


def number_text(x: float) -> str:
    """A measure in a text table: 3 significant digits, whole from 100 up."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def text_table(heads: Sequence[str], columns: Sequence[Sequence[str]]) -> str:
    """An aligned text table from its headings and each column's cells: two spaces between
    columns, no trailing blanks."""
    widths = [max([len(h), *map(len, c)]) for h, c in zip(heads, columns, strict=True)]
    line = "  ".join(f"{{:<{w}}}" for w in widths).format
    rows = zip(*columns, strict=True) if columns else ()
    return "\n".join([line(*heads).rstrip(), *(line(*r).rstrip() for r in rows)])


def format_table(
    rows: list[dict[str, str]], columns: Iterable[str] = SHOW_COLUMNS, max_reason: int = 60
) -> str:
    """Rows of a leaderboard (text cells) as a text table; columns empty in every row are left
    out."""
    cols = [c for c in columns if any(r.get(c) for r in rows)] or list(columns)[:4]

    def cell(r: dict[str, str], c: str) -> str:
        v = r.get(c) or ""
        x = number(v) if c in NUMERIC or c.endswith("_s") else None
        if x is not None and c != "trial":
            v = number_text(x)
        return v[:max_reason] if c == "reason" else v

    return text_table(
        [SHORT_NAMES.get(c, c) for c in cols], [[cell(r, c) for r in rows] for c in cols]
    )
