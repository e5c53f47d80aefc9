"""Pictures of a leaderboard (a DataFrame from tuner.load_leaderboard): the search's progress,
throughput against peak memory, knob importances, time per phase, failures, predicted against
measured. `tune plot` draws three of them in one PNG; `tune report` embeds each in its HTML.

Needs matplotlib (`pip install -e ".[plot]"`)."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tuner.errors import UserError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PHASES = ("generation", "old_log_prob", "ref", "update_actor", "reshard")
"""The phases of one RL step, as the leaderboard names their times (`<phase>_s`)."""

PHASE_COLORS = {p: f"C{i}" for i, p in enumerate(PHASES)}

LAUNCHED_FAILED = ("oom", "failed", "timeout", "interrupted")
PREDICTED_PRUNED = ("pruned-invalid", "pruned-oom-predicted")


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError('plots need matplotlib: pip install -e ".[plot]"') from None
    return plt


def new_figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, Any]:
    """A figure and its axes (an array when ncols > 1), on the non-interactive backend."""
    plt = _pyplot()
    return plt.subplots(1, ncols, figsize=(width, height), squeeze=ncols == 1)


def close(fig: Figure) -> None:
    _pyplot().close(fig)


def png_base64(fig: Figure, dpi: int = 96) -> str:
    """The figure as a base64 PNG (no timestamp in it, so reports are reproducible); closes
    the figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def memory_column(df: pd.DataFrame) -> str:
    """The measured peak memory column a leaderboard has: device used (what OOM is decided
    on) where recorded, else allocated."""
    if "peak_mem_device_gib" in df.columns and df["peak_mem_device_gib"].notna().any():
        return "peak_mem_device_gib"
    return "peak_mem_gib"


def _trial_x(df: pd.DataFrame) -> pd.Series:
    return df["trial"].astype("float64")


# --------------------------------------------------------------------------------------------
# Panels (each draws on an Axes; the report puts one per figure, `tune plot` three in a row)
# --------------------------------------------------------------------------------------------


def draw_progress(ax: Axes, df: pd.DataFrame, *, estimates: bool = False) -> None:
    """Throughput by trial and the best so far; failed launches, pruned-slow trials and
    candidates pruned before launch (prediction) each with their own marker."""
    what = "estimated tokens/s/GPU" if estimates else "tokens/s/GPU"
    d = df.sort_values("trial", kind="stable")
    ok = d[(d["status"] == "ok") & d["tokens_per_s_per_gpu"].notna()]
    if len(ok):
        best = ok["tokens_per_s_per_gpu"].cummax()
        ax.scatter(_trial_x(ok), ok["tokens_per_s_per_gpu"], s=16, color="C0", label="ok")
        last = float(_trial_x(d).max())
        xs = [*_trial_x(ok).tolist(), last]
        ys = [*best.tolist(), float(best.iloc[-1])]
        ax.step(xs, ys, where="post", color="C3", linewidth=1.6, label="best so far")
    slow = d[d["status"] == "pruned-slow"]
    if len(slow):
        y = slow["tokens_per_s_per_gpu"].fillna(0.0)
        ax.scatter(_trial_x(slow), y, marker="s", s=18, color="C1", label="stopped slow")
    failed = d[d["status"].isin(LAUNCHED_FAILED)]
    if len(failed):
        ax.scatter(
            _trial_x(failed),
            np.zeros(len(failed)),
            marker="x",
            s=28,
            color="C3",
            label="launched, failed",
        )
    pruned = d[d["status"].isin(PREDICTED_PRUNED)]
    if len(pruned):
        ax.scatter(
            _trial_x(pruned),
            np.zeros(len(pruned)),
            marker="v",
            s=18,
            color="0.55",
            label="pruned by prediction",
        )
    ax.set_xlabel("trial")
    ax.set_ylabel(what)
    ax.set_title("search progress")
    ax.set_ylim(bottom=-0.03 * float(max(1.0, d["tokens_per_s_per_gpu"].max(skipna=True) or 1.0)))
    if len(d):
        ax.legend(fontsize=8, loc="best")


def pareto_front(ok: pd.DataFrame, mem: str) -> pd.DataFrame:
    """Rows no other row beats on both throughput (higher) and peak memory (lower), by memory."""
    d = ok[ok[mem].notna() & ok["tokens_per_s_per_gpu"].notna()]
    d = d.sort_values([mem, "tokens_per_s_per_gpu"], ascending=[True, False], kind="stable")
    keep = d["tokens_per_s_per_gpu"] > d["tokens_per_s_per_gpu"].cummax().shift(fill_value=-1.0)
    return d[keep]


def draw_pareto(
    ax: Axes,
    ok: pd.DataFrame,
    mem: str,
    *,
    capacity_gib: float | None,
    headroom_gib: float | None,
    estimates: bool = False,
) -> None:
    """Throughput against peak memory for every ok row, the Pareto front, the GPU's capacity
    and the headroom the study keeps below it."""
    d = ok[ok[mem].notna() & ok["tokens_per_s_per_gpu"].notna()]
    ax.scatter(d[mem], d["tokens_per_s_per_gpu"], s=18, color="C0", alpha=0.8, label="ok rows")
    front = pareto_front(d, mem)
    if len(front):
        ax.step(
            front[mem],
            front["tokens_per_s_per_gpu"],
            where="post",
            color="C3",
            linewidth=1.5,
            marker="o",
            markersize=5,
            label="Pareto front",
        )
    if capacity_gib:
        ax.axvline(capacity_gib, color="k", linewidth=1.2, label=f"GPU {capacity_gib:.0f} GiB")
        if headroom_gib:
            ax.axvspan(
                capacity_gib - headroom_gib,
                capacity_gib,
                color="C1",
                alpha=0.15,
                label=f"headroom {headroom_gib:.1f} GiB",
            )
        right = max(capacity_gib * 1.04, float(d[mem].max()) * 1.04 if len(d) else 0.0)
        low = float(d[mem].min()) if len(d) else 0.0
        ax.set_xlim(max(0.0, 10 * np.floor(0.85 * low / 10)), right)
    ax.set_ylim(bottom=0)
    kind = "predicted" if estimates else "measured"
    label = "device used" if mem == "peak_mem_device_gib" else "allocated"
    ax.set_xlabel(f"{kind} peak memory, {label} (GiB per GPU)")
    ax.set_ylabel("estimated tokens/s/GPU" if estimates else "tokens/s/GPU")
    ax.set_title("throughput vs peak memory")
    ax.legend(fontsize=8, loc="best")


def draw_best_by_layout(ax: Axes, ok: pd.DataFrame) -> None:
    """The best throughput of each actor/rollout layout, fastest on top."""
    d = ok[ok["tokens_per_s_per_gpu"].notna()]
    lay = d["train_parallel"] + "/r" + d["infer_parallel"]
    best = d["tokens_per_s_per_gpu"].groupby(lay).max().sort_values().tail(15)
    ax.barh(best.index.tolist(), best.to_numpy(), color="C0")
    ax.set_xlabel("best tokens/s/GPU")
    ax.set_title("best per layout (actor/rollout)")
    ax.tick_params(axis="y", labelsize=7)


def draw_importances(ax: Axes, importances: pd.Series) -> None:
    """Optuna parameter importances, the largest on top."""
    s = importances.sort_values()
    ax.barh(s.index.tolist(), s.to_numpy(), color="C2")
    ax.set_xlabel("importance (fANOVA, share of the objective's variance)")
    ax.set_xlim(0, max(0.05, float(s.max()) * 1.1) if len(s) else 1.0)
    ax.set_title("which knobs mattered")


def draw_phases(ax: Axes, table: pd.DataFrame) -> None:
    """Stacked phase times, one bar per row of `table` (columns: PHASES, index: labels);
    predicted bars (labels ending in `predicted`) hatched."""
    labels = list(table.index)[::-1]
    left = np.zeros(len(labels))
    hatch = ["//" if str(label).endswith("predicted") else "" for label in labels]
    for p in PHASES:
        if p not in table.columns:
            continue
        v = table[p].reindex(labels).fillna(0.0).to_numpy(dtype=float)
        if not v.any():
            continue
        bars = ax.barh(labels, v, left=left, color=PHASE_COLORS[p], label=p.replace("_", " "))
        for b, h in zip(bars, hatch, strict=True):
            b.set_hatch(h)
            b.set_edgecolor("white")
        left += v
    ax.set_xlabel("seconds per step")
    ax.set_title("time per phase (hatched: predicted)")
    ax.tick_params(axis="y", labelsize=8)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def draw_failures(ax: Axes, counts: pd.Series) -> None:
    """Trials per failure kind."""
    s = counts.sort_values()
    ax.barh(s.index.tolist(), s.to_numpy(), color="C3")
    ax.set_xlabel("trials")
    ax.set_title("failures by reason")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def draw_predicted_vs_measured(
    ax: Axes, pred: pd.Series, meas: pd.Series, *, what: str, unit: str
) -> None:
    """Predicted (x) against measured (y), with the y = x line."""
    ax.scatter(pred, meas, s=18, color="C0")
    hi = float(np.nanmax([pred.max(), meas.max()])) * 1.1 if len(pred) else 1.0
    ax.plot([0, hi], [0, hi], color="0.6", linestyle="--", linewidth=1, label="y = x")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel(f"predicted {what} ({unit})")
    ax.set_ylabel(f"measured {what} ({unit})")
    ax.set_title(f"{what}: predicted vs measured")
    ax.legend(fontsize=8, loc="upper left")


# --------------------------------------------------------------------------------------------
# tune plot
# --------------------------------------------------------------------------------------------


def prediction_pairs(
    ok: pd.DataFrame | list[dict[str, str]],
) -> tuple[str, list[tuple[float, float]]]:
    """(phase, [(predicted s, result s)]): the whole step where the runner measured it, else
    the update alone (the megatron runner measures only the update)."""
    d = ok if isinstance(ok, pd.DataFrame) else pd.DataFrame(ok)
    num = {c: pd.to_numeric(d.get(c), errors="coerce") for c in _PAIR_COLUMNS if c in d}
    phase = "step" if "step_s" in num and num["step_s"].fillna(0).gt(0).any() else "update_actor"
    p = num.get(f"pred_{phase}_s", pd.Series(dtype=float))
    m = num.get(f"{phase}_s", pd.Series(dtype=float))
    both = (p > 0) & (m > 0)
    return phase, list(zip(p[both].astype(float), m[both].astype(float), strict=True))


_PAIR_COLUMNS = ("step_s", "pred_step_s", "update_actor_s", "pred_update_actor_s")


def plot_leaderboard(df: pd.DataFrame, out: Path, title: str = "") -> Path:
    """One image (PNG, SVG or PDF by `out`'s suffix) with three panels: search progress, best
    per layout, the cost model against the result; returns its path."""
    ok = df[(df["status"] == "ok") & df["tokens_per_s_per_gpu"].notna()]
    if ok.empty:
        raise UserError("no ok rows to plot: see `tune show` for why trials failed")
    estimates = bool((ok["source"] == "estimate").all())
    fig, grid = new_figure(16, 4.8, ncols=3)
    axes = grid[0]
    draw_progress(axes[0], df, estimates=estimates)
    draw_best_by_layout(axes[1], ok)
    ax = axes[2]
    phase, pts = prediction_pairs(ok)
    if pts:
        ax.scatter([p for p, _ in pts], [m for _, m in pts], s=14)
        hi = max(max(p, m) for p, m in pts) * 1.1
        ax.plot([0, hi], [0, hi], color="0.6", linestyle="--", linewidth=1)
        ax.set_xlim(0, hi)
        ax.set_ylim(0, hi)
    what = phase.replace("_", " ")
    sources = "/".join(sorted(set(ok["source"].astype(str))))
    ax.set_xlabel(f"predicted {what} (s)")
    ax.set_ylabel(f"{sources} {what} (s)")
    ax.set_title("cost model vs result")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, metadata={"Software": None} if out.suffix == ".png" else None)
    close(fig)
    return out
