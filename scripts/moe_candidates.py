"""The candidates of the MoE study (issue 37 item 3): the cost model's best colocated
candidates of a MoE model, searched with the knobs the verl runner pins on the kit's hosts
(attention_backend auto, gradient_accumulation_fusion off: scripts/split_candidates.VERL_PINS;
the MoE dispatcher alltoall where DeepEP is missing: tuner/runners/verl_preflight.py), written as
a leaderboard of predicted rows that `tune run --candidates-from` measures in the order given:
the best of each expert-parallel size first (best first), then the next best overall, so that
the measured rows hold at least two EP sizes however few of them run.

usage: python scripts/moe_candidates.py OUT.csv --model CONFIG --gpus N --gpu KIND WORKLOAD...
[--count K] [--expert-imbalance X] (the workload options of `tune run`).
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from split_candidates import VERL_PINS, PinnedEstimate, add_setup_args, setup_of  # noqa: E402

from tuner.estimate import estimate, load_profile  # noqa: E402
from tuner.hardware import Cluster  # noqa: E402
from tuner.models import ModelSpec  # noqa: E402
from tuner.results import read_raw  # noqa: E402
from tuner.space import (  # noqa: E402
    GPU_MEMORY_UTILIZATIONS,
    Candidate,
    ParallelLayout,
    SearchSpace,
    SpaceLimits,
    token_budget,
    validate,
)
from tuner.study import TuneRequest  # noqa: E402
from tuner.study.loop import run_study  # noqa: E402
from tuner.workload import Workload  # noqa: E402

MOE_PINS = (*VERL_PINS, ("moe_token_dispatcher_type", "alltoall"))
"""The verl runner's pins on a host without flash_attn, APEX's wgrad extension and DeepEP."""

MARGIN = 0.05
"""Device memory kept free of each candidate's prediction (the search's headroom, in place of
each phase's own): the issue's goal for the memory prediction is within 5%, so a candidate
predicted at the device's edge may not fit."""


def order(rows: list[dict[str, str]], count: int) -> list[dict[str, str]]:
    """`count` candidates of the ok rows, each of another layout, rollout TP or predicted step:
    the best of each EP size (best first), then the rest by predicted throughput."""
    ok = sorted(
        (r for r in rows if r["status"] == "ok"), key=lambda r: -float(r["tokens_per_s_per_gpu"])
    )
    seen: set[str] = set()
    firsts: list[dict[str, str]] = []
    for r in ok:
        if r["ep"] not in seen:
            seen.add(r["ep"])
            firsts.append(r)
    rest = [r for r in ok if r not in firsts]
    out: list[dict[str, str]] = []
    taken: set[tuple[str, str, str]] = set()
    for r in [*firsts, *rest]:
        # a candidate the cost model cannot tell from one taken (knobs it prices alike) would
        # spend a launch measuring the same prediction twice
        key = (r["train_parallel"], r["infer_parallel"], f"{float(r['step_s']):.1f}")
        if key not in taken:
            taken.add(key)
            out.append(r)
    return out[:count]


def screen(m: ModelSpec, cl: Cluster, w: Workload, headroom: float) -> list[ParallelLayout]:
    """The actor layout of each expert-parallel size the cost model ranks first for one plain
    candidate (verl's defaults but full recompute, a token budget of two samples, rollout TP 4
    or the GPUs there are, the smallest gpu_memory_utilization offered), among those it fits
    with `headroom` GiB to spare; the search then draws every other knob for each."""
    space = SearchSpace(model=m, cluster=cl, workload=w, limits=SpaceLimits(pinned=MOE_PINS))
    best: dict[int, tuple[float, ParallelLayout]] = {}
    for lay in space.layouts.values():
        budget = token_budget(2.0, w.max_seq_len, lay.cp)
        c = Candidate(
            layout=lay,
            sequence_parallel=lay.tp > 1,
            recompute_granularity="full",
            ppo_max_token_len_per_gpu=budget,
            log_prob_max_token_len_per_gpu=budget,
            rollout_tp=min(4, cl.num_gpus),
            gpu_memory_utilization=min(GPU_MEMORY_UTILIZATIONS),
            **dict(MOE_PINS),  # type: ignore[arg-type]
        )
        if validate(c, m, cl, w):
            continue
        e = estimate(c, m, cl, w, headroom_gib=headroom)
        if e.fits and (lay.ep not in best or e.step_s < best[lay.ep][0]):
            best[lay.ep] = (e.step_s, lay)
    for ep, (step, top) in sorted(best.items()):
        print(
            f"moe_candidates: ep{ep}: {top.notation} first ({step:.1f} s a step, plain candidate)"
        )
    return [top for _, top in best.values()]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    add_setup_args(p)
    p.add_argument("--expert-imbalance", type=float)
    p.add_argument("--trials", type=int, default=30, help="trials of each layout's search")
    p.add_argument("--count", type=int, default=6)
    p.add_argument(
        "--margin",
        type=float,
        default=MARGIN,
        help=f"device memory share kept free of the prediction (default {MARGIN:g})",
    )
    a = p.parse_args(argv)
    model, cl, w = setup_of(a, expert_imbalance=a.expert_imbalance)
    headroom = a.margin * cl.gpu.memory_gib
    rows: list[dict[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for lay in screen(model, cl, w, headroom):
            req = TuneRequest(
                model=model,
                model_arg=a.model,
                cluster=cl,
                workload=w,
                runner=PinnedEstimate((("rollout_gpus", 0), ("layout", lay), *MOE_PINS)),
                trials=a.trials,
                study_name=lay.notation,
                results_dir=Path(tmp),
                recipes=0,
                profile=load_profile(None),
                headroom_gib=headroom,
            )
            run_study(req)
            rows += read_raw(Path(tmp) / f"{lay.notation}.csv")
    chosen = order(rows, a.count)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"moe_candidates: {len(rows)} rows of the cost model's searches: {counts}")
    if not chosen:
        print("moe_candidates: no candidate predicted to fit", file=sys.stderr)
        return 2
    with open(a.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(chosen[0]))
        writer.writeheader()
        for i, row in enumerate(chosen):
            writer.writerow({**row, "trial": i, "study": a.out.stem})
            print(
                f"{i}: {row['train_parallel']} rollout {row['infer_parallel']} "
                f"{float(row['tokens_per_s_per_gpu']):.0f} tok/s/gpu predicted, step "
                f"{float(row['step_s']):.1f} s, device {row.get('pred_device_mem_gib')} GiB"
            )
    print(f"wrote {a.out}: {len(chosen)} candidates, EP sizes {sorted({r['ep'] for r in chosen})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
