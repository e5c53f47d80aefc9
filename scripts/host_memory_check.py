"""Host memory of the committed verl rows against the cost model (tuner/estimate/host_memory.py).

    python scripts/host_memory_check.py   # committed output: scripts/host_memory_check.out.txt

Every verl row of results/*.csv that logged verl's `perf/cpu_memory_used_gb` (psutil's used
memory of the whole node, at the end of the update: verl/workers/engine_workers.py) is a
measurement (a split row's, vLLM and the actor on GPUs of their own, is listed but not fitted:
tuner/estimate/host_memory.py); every row that Ray's memory monitor killed
(`failure=host-oom`) is a lower bound, whose node size and kill line its own log gives
("exceeded threshold of <B>B (95.0% of <B>B limit)"). First the least-squares fit of the three
constants on the measured rows (host = base + per_model x the model's bf16 GiB + per_offloaded
x the GiB the trainer GPUs offload); then each row with the code's constants: measured or
killed, predicted, error, and for the killed rows whether the prediction would have pruned
them on their node.
"""

from __future__ import annotations

import gzip
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.estimate import estimate, load_profile  # noqa: E402
from tuner.estimate.context import get_context  # noqa: E402
from tuner.estimate.host_memory import (  # noqa: E402
    HOST_BASE_GIB,
    HOST_PER_MODEL_GIB,
    HOST_PER_OFFLOADED_GIB,
    RAY_KILL_FRACTION,
    offloaded_bytes,
)
from tuner.estimate.memory import BF16  # noqa: E402
from tuner.fit.validate import case_from_row  # noqa: E402
from tuner.hardware import GIB  # noqa: E402
from tuner.results import read_raw  # noqa: E402
from tuner.results.record import parse_extra  # noqa: E402
from tuner.space.placement import pools  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LIMIT = re.compile(rb"exceeded threshold of \d+B \([\d.]+% of (\d+)B limit\)")


def node_gib(row: dict[str, str]) -> float | None:
    """The node's memory Ray's kill message names, from the row's committed log."""
    folder = ROOT / "results" / row["study"] / "trials" / row["trial"]
    for log in (folder / "verl.log.gz", folder / "verl.log"):
        if log.exists():
            raw = log.read_bytes()
            text = gzip.decompress(raw) if log.suffix == ".gz" else raw
            m = LIMIT.search(text)
            return int(m.group(1)) / GIB if m else None
    return None


def main() -> int:
    measured, killed, split = [], [], []
    for path in sorted((ROOT / "results").glob("*.csv")):
        for row in read_raw(path):
            if row.get("runner") != "verl":
                continue
            extra = parse_extra(row.get("extra", ""))
            used = extra.get("cpu_memory_used_gb")
            oom = extra.get("failure") == "host-oom"
            if used is None and not oom:
                continue
            # the case's prediction needs a phase; a killed row has none measured
            case = case_from_row({**row, "status": "ok", "update_actor_s": "1"})
            if case is None:
                continue
            c, cl = case.candidate, case.cluster
            ctx = get_context(
                case.model, pools(c.rollout_gpus, cl).trainer, case.workload, load_profile(None)
            )
            gpus = pools(c.rollout_gpus, cl).trainer.local_gpus
            x = (ctx.total_params * BF16 / GIB, offloaded_bytes(ctx, c) * gpus / GIB)
            pred = estimate(c, case.model, cl, case.workload).host_mem_gib
            label = f"{path.stem}:{row['trial']}"
            knobs = (
                f"{row['train_parallel']} x{cl.num_gpus} param_offload "
                f"{c.param_offload} optimizer_offload {c.optimizer_offload}"
            )
            if used is not None and c.rollout_gpus:
                split.append((label, knobs, x, float(used), pred))
            elif used is not None:
                measured.append((label, knobs, x, float(used), pred))
            else:
                killed.append((label, knobs, x, node_gib(row), pred))
    a = np.array([[1.0, m, o] for _, _, (m, o), _, _ in measured])
    y = np.array([u for *_, u, _ in measured])
    fit, *_ = np.linalg.lstsq(a, y, rcond=None)
    print(
        f"fit on {len(measured)} measured rows: base {fit[0]:.2f} GiB + {fit[1]:.3f} x model "
        f"bf16 GiB + {fit[2]:.3f} x offloaded GiB"
    )
    print(
        f"code: HOST_BASE_GIB {HOST_BASE_GIB}, HOST_PER_MODEL_GIB {HOST_PER_MODEL_GIB}, "
        f"HOST_PER_OFFLOADED_GIB {HOST_PER_OFFLOADED_GIB}"
    )
    print()
    print(
        f"{'row':<22} {'what ran':<58} {'model':>6} {'offl.':>6} {'measured':>9} "
        f"{'predicted':>9} {'error':>6}"
    )
    notes = [""] * len(measured) + ["  split: not in the fit, not modelled"] * len(split)
    for (label, knobs, (m, o), used, pred), note in zip([*measured, *split], notes, strict=True):
        print(
            f"{label:<22} {knobs:<58} {m:>6.2f} {o:>6.2f} {used:>9.1f} {pred:>9.1f} "
            f"{pred / used - 1:>+6.1%}{note}"
        )
    for label, knobs, (m, o), node, pred in killed:
        line = RAY_KILL_FRACTION * node if node else None
        verdict = (
            f"killed above {line:.1f} of {node:.1f} GiB: predicted "
            f"{'over, pruned' if pred > line else 'under, NOT pruned'}"
            if line
            else "killed; node size not in its log"
        )
        print(f"{label:<22} {knobs:<58} {m:>6.2f} {o:>6.2f} {'killed':>9} {pred:>9.1f}  {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
