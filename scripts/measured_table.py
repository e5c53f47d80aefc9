"""The measured leaderboard as a Markdown table: every trial of the given megatron-runner CSVs,
measured beside predicted, then best tuned vs best reference layout and the median errors.

    python scripts/measured_table.py results/dense-h200-x2.csv results/moe-h200-x2.csv
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from tuner.results import read_raw


def _extra(row: dict[str, str]) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in row.get("extra", "").split(";") if "=" in kv)


def _err(measured: float, predicted: float) -> float:
    return (predicted - measured) / measured * 100


def _knobs(r: dict[str, str]) -> str:
    parts = [f"recompute {r['recompute_granularity']}"]
    offl = [k for k in ("param", "grad", "optimizer") if r[f"{k}_offload"] == "True"]
    if offl:
        parts.append("offload " + "+".join(offl))
    if r["use_dynamic_bsz"] == "True":
        parts.append(f"{int(r['ppo_max_token_len_per_gpu']) // 1024}k tok/GPU")
    else:
        parts.append(f"micro batch {r['ppo_micro_batch_size_per_gpu']}")
    return ", ".join(parts)


def table(path: Path) -> str:
    rows = sorted(read_raw(path), key=lambda r: int(r["trial"]))
    head = rows[0]
    out = [
        f"### {path.name}: {head['model']} on {head['num_gpus']} x {head['gpu']}",
        "",
        "| trial | from | layout | knobs | status | tok/s/GPU (pred, err) | update s (pred) "
        "| peak GiB (pred, err) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    t_err, m_err = [], []
    for r in rows:
        origin = _extra(r).get("origin", "optuna")
        if r["status"] != "ok":
            why = r["reason"][:70]
            out.append(
                f"| {r['trial']} | {origin} | {r['train_parallel']} | {_knobs(r)} | "
                f"{r['status']}: {why} | - | - | - |"
            )
            continue
        tput, ptput = float(r["tokens_per_s_per_gpu"]), float(r["pred_tokens_per_s_per_gpu"])
        mem, pmem = float(r["peak_mem_gib"]), float(r["pred_peak_mem_gib"])
        t_err.append(abs(_err(tput, ptput)))
        m_err.append(abs(_err(mem, pmem)))
        out.append(
            f"| {r['trial']} | {origin} | {r['train_parallel']} | {_knobs(r)} | ok | "
            f"{tput:.0f} ({ptput:.0f}, {_err(tput, ptput):+.0f}%) | "
            f"{float(r['update_actor_s']):.2f} ({float(r['pred_update_actor_s']):.2f}) | "
            f"{mem:.1f} ({pmem:.1f}, {_err(mem, pmem):+.0f}%) |"
        )
    ok = [r for r in rows if r["status"] == "ok"]
    refs = [r for r in ok if _extra(r).get("origin", "").startswith("reference")]
    out.append("")
    if ok:
        best = max(ok, key=lambda r: float(r["tokens_per_s_per_gpu"]))
        line = f"Best: trial {best['trial']} {best['train_parallel']} ({_knobs(best)}), "
        line += f"{float(best['tokens_per_s_per_gpu']):.0f} tokens/s/GPU"
        if refs:
            ref = max(refs, key=lambda r: float(r["tokens_per_s_per_gpu"]))
            ratio = float(best["tokens_per_s_per_gpu"]) / float(ref["tokens_per_s_per_gpu"])
            line += (
                f"; best reference layout: trial {ref['trial']} ({_extra(ref)['origin']}), "
                f"{float(ref['tokens_per_s_per_gpu']):.0f} tokens/s/GPU; ratio {ratio:.2f}x"
            )
        out.append(line + ".")
        out.append(
            f"Median absolute error of the prediction over {len(ok)} ok trials: throughput "
            f"{statistics.median(t_err):.0f}%, peak memory {statistics.median(m_err):.0f}%."
        )
    return "\n".join(out)


if __name__ == "__main__":
    print("\n\n".join(table(Path(p)) for p in sys.argv[1:]))
