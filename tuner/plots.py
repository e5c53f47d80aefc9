"""Pictures of a leaderboard: the search's progress, throughput by layout, predicted vs measured.

Needs matplotlib (`pip install -e ".[plot]"`)."""

from __future__ import annotations

from pathlib import Path

from tuner.errors import UserError
from tuner.results import number


def plot_leaderboard(rows: list[dict[str, str]], out: Path, title: str = "") -> Path:
    """One PNG with three panels; returns its path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError('plots need matplotlib: pip install -e ".[plot]"') from None
    ok = [r for r in rows if r.get("status") == "ok" and number(r.get("tokens_per_s_per_gpu"))]
    if not ok:
        raise UserError("no ok rows to plot: see `tune show` for why trials failed")
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))

    ax = axes[0]
    by_trial = sorted(ok, key=lambda r: int(r.get("trial") or 0))
    xs = [int(r.get("trial") or 0) for r in by_trial]
    ys = [number(r["tokens_per_s_per_gpu"]) or 0.0 for r in by_trial]
    best, running = 0.0, []
    for y in ys:
        best = max(best, y)
        running.append(best)
    failed = [r for r in rows if r.get("status") != "ok"]
    ax.scatter(xs, ys, s=12, label="ok trial")
    ax.step(xs, running, where="post", color="C3", label="best so far")
    if failed:
        ax.scatter(
            [int(r.get("trial") or 0) for r in failed],
            [0] * len(failed),
            marker="x",
            color="0.5",
            s=12,
            label="pruned / failed",
        )
    ax.set_xlabel("trial")
    ax.set_ylabel("tokens/s/GPU")
    ax.set_title("search progress")
    ax.legend(fontsize=8)

    ax = axes[1]
    best_by_layout: dict[str, float] = {}
    for r in ok:
        lay = f"{r.get('train_parallel', '')}/r{r.get('infer_parallel', '')}"
        best_by_layout[lay] = max(
            best_by_layout.get(lay, 0.0), number(r["tokens_per_s_per_gpu"]) or 0.0
        )
    top = sorted(best_by_layout.items(), key=lambda kv: -kv[1])[:15]
    ax.barh([k for k, _ in top][::-1], [v for _, v in top][::-1], color="C0")
    ax.set_xlabel("best tokens/s/GPU")
    ax.set_title("best per layout (actor/rollout)")
    ax.tick_params(axis="y", labelsize=7)

    ax = axes[2]
    phase, pts = prediction_pairs(ok)
    if pts:
        ax.scatter([p for p, _ in pts], [m for _, m in pts], s=14)
        hi = max(max(p, m) for p, m in pts) * 1.1
        ax.plot([0, hi], [0, hi], color="0.6", linestyle="--", linewidth=1)
        ax.set_xlim(0, hi)
        ax.set_ylim(0, hi)
    sources = {r.get("source", "") for r in ok}
    what = phase.replace("_", " ")
    ax.set_xlabel(f"predicted {what} (s)")
    ax.set_ylabel(f"{'/'.join(sorted(sources))} {what} (s)")
    ax.set_title("cost model vs result")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def prediction_pairs(ok: list[dict[str, str]]) -> tuple[str, list[tuple[float, float]]]:
    """(phase, [(predicted s, result s)]): the whole step where the runner measured it, else
    the update alone (the megatron runner measures only the update)."""
    phase = "step" if any(number(r.get("step_s")) for r in ok) else "update_actor"
    pts = []
    for r in ok:
        p, m = number(r.get(f"pred_{phase}_s")), number(r.get(f"{phase}_s"))
        if p and m:
            pts.append((p, m))
    return phase, pts
