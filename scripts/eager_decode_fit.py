"""The host time per op of vLLM's eager decode step (Profile.eager_op_host_s), from measured rows.

With `enforce_eager=True` vLLM 0.24.0 runs its model uncompiled, op by op from Python
(tuner.estimate.generation.eager_ops: the source count), and a small decode batch waits on the
host. This script reads leaderboards' measured generation rows and prints, per row, the
measurement beside the cost model's prediction as the row recorded it (the model before the
eager op count, `pred_generation_s` over the study's scale) and as the model predicts it now
(default profile); then the per-op host time the eager rows imply, fitted by least squares on
log(predicted / measured) (the prediction rises with it), for all eager rows together and each
alone; and the same for the reference leaderboards' eager rows (tests/data/anchors: other hosts,
vLLM before 0.24), whose generation check the default must keep.

    python scripts/eager_decode_fit.py results/verl4k-h100-x1.csv \
        results/gen-check-local-h100-x1.csv results/gen-check-h100-x1.csv \
        > scripts/eager_decode_fit.out.txt
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

from tuner.estimate import Profile
from tuner.estimate.context import get_context
from tuner.estimate.generation import eager_ops
from tuner.fit.validate import Case, anchor_paths, case_from_row, load_cases, validate
from tuner.results import TrialRecord, read_raw
from tuner.study.learn import measured, raw_prediction

ANCHORS = Path(__file__).resolve().parents[1] / "tests" / "data" / "anchors"
BOUNDS = (1e-6, 1e-3)
"""Per-op host times searched, seconds."""


def generation_rows(path: str) -> list[tuple[TrialRecord, Case]]:
    """The rows of `path` that timed generation (ok or oom), but copies of another trial."""
    out = []
    for row in read_raw(Path(path)):
        rec = TrialRecord.from_row(row)
        if not rec.generation_s or not measured(rec):
            continue
        case = case_from_row(row)
        if case is not None and "generation" in case.measured:
            out.append((rec, case))
    return out


def fit(cases: list[Case]) -> float:
    """The per-op host time at which the mean log(predicted / measured) generation of `cases`
    is zero (bisection in log space: the prediction rises with it)."""

    def mean_log(c: float) -> float:
        p = Profile(eager_op_host_s=c)
        return statistics.fmean(
            math.log(x.predict(p).generation_s / x.measured["generation"]) for x in cases
        )

    lo, hi = (math.log(b) for b in BOUNDS)
    if mean_log(math.exp(lo)) > 0 or mean_log(math.exp(hi)) < 0:
        raise SystemExit("the eager rows' per-op host time lies outside the searched bounds")
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_log(math.exp(mid)) < 0 else (lo, mid)
    return math.exp((lo + hi) / 2)


def _err(pred: float, meas: float) -> str:
    return f"{(pred - meas) / meas:+7.1%}"


def rows_table(
    rows: list[tuple[str, TrialRecord, Case]], profiles: dict[str, Profile]
) -> list[str]:
    head = f"  {'row':<24} {'eager':>5} {'mns':>4} {'util':>4} {'measured':>8} {'recorded':>16}"
    lines = [head + "".join(f" {name:>16}" for name in profiles)]
    for label, rec, case in rows:
        meas = case.measured["generation"]
        before = raw_prediction(rec, "generation")
        line = (
            f"  {label:<24} {case.candidate.enforce_eager!s:>5} {case.candidate.max_num_seqs:>4}"
            f" {case.candidate.gpu_memory_utilization:>4} {meas:>8.2f}"
            + (f" {before:>8.2f} {_err(before, meas)}" if before else f" {'-':>16}")
        )
        for p in profiles.values():
            now = case.predict(p).generation_s
            line += f" {now:>8.2f} {_err(now, meas)}"
        lines.append(line)
    return lines


def reference_check(profiles: dict[str, Profile]) -> list[str]:
    cases = load_cases(anchor_paths(ANCHORS))
    eager = [c for c in cases if c.candidate.enforce_eager and "generation" in c.measured]
    lines = [
        f"reference leaderboards ({ANCHORS.name}: {len(eager)} eager rows of "
        f"{sum('generation' in c.measured for c in cases)} with generation; other hosts, vLLM "
        "before 0.24):",
        f"  per-op host time their eager rows imply: {fit(eager) * 1e6:.1f} us",
    ]
    by_label = {c.label: c for c in cases}
    pair = ("grpo_qwen2.5_7b:12", "grpo_qwen2.5_7b:8")  # eager and graphs, same rollout
    for name, p in profiles.items():
        s = validate(cases, p)
        a, b = (by_label[x].predict(p).generation_s for x in pair)
        lines.append(
            f"  {name:<16} generation median error {s.median_ape['generation']:.1%} (goal 20%);"
            f" {pair[0]} / {pair[1]} predicted {a / b:.3f}"
        )
    a, b = (by_label[x].measured["generation"] for x in pair)
    lines.append(f"  {pair[0]} / {pair[1]} measured {a / b:.3f}")
    return lines


def decomposition(case: Case, c: float) -> list[str]:
    """Per decode step of the eager workload: measured, and the model's parts at `c`."""
    p = Profile(eager_op_host_s=c)
    ctx = get_context(case.model, case.cluster, case.workload, p)
    steps = case.workload.response_len
    seqs = case.workload.batch_size * case.workload.n
    ops = eager_ops(ctx)
    fixed = p.decode_step_overhead_s + seqs * p.decode_seq_overhead_s
    return [
        f"  {case.label}: {case.measured['generation'] / steps * 1e3:.2f} ms per step measured "
        f"({steps} steps of {seqs} sequences); the model: {ops} eager ops x {c * 1e6:.1f} us = "
        f"{ops * c * 1e3:.2f} ms of launches + {fixed * 1e3:.2f} ms fixed host "
        f"(decode_step_overhead_s + {seqs} x decode_seq_overhead_s), the GPU's share hidden "
        "under the launches"
    ]


ROLLOUT_KEYS = ("rollout_tp", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens")


def same_rollout(rows: list[tuple[str, TrialRecord, Case]]) -> list[str]:
    """Rows of different files that ran one rollout (eager or graphs): their measured ratio,
    and the worker (VM) each ran on."""
    lines = []
    for i, (a, ra, ca) in enumerate(rows):
        for b, rb, cb in rows[i + 1 :]:
            keys = (*ROLLOUT_KEYS, "enforce_eager")
            if a.split(":")[0] == b.split(":")[0] or any(
                getattr(ca.candidate, k) != getattr(cb.candidate, k) for k in keys
            ):
                continue
            ma, mb = ca.measured["generation"], cb.measured["generation"]
            steps = ca.workload.response_len
            lines.append(
                f"  eager {ca.candidate.enforce_eager!s:<5} {a} / {b}: {ma:.2f} s / {mb:.2f} s ="
                f" {ma / mb:.3f} ({(ma - mb) / steps * 1e3:+.2f} ms per step; workers"
                f" {ra.worker} / {rb.worker})"
            )
    return lines


def main(paths: list[str]) -> str:
    rows = [
        (f"{Path(path).stem}:{rec.trial}", rec, case)
        for path in paths
        for rec, case in generation_rows(path)
    ]
    eager = [(label, case) for label, rec, case in rows if case.candidate.enforce_eager]
    if not eager:
        raise SystemExit("no eager row with generation measured in " + ", ".join(paths))
    fits: dict[str, float] = {"all eager rows": fit([c for _, c in eager])}
    fits.update({label: fit([c]) for label, c in eager})
    default = Profile()
    lines = [
        "rows: " + ", ".join(paths),
        "per-op host time of vLLM 0.24.0's eager decode step (eager_op_host_s) the rows imply:",
        *(f"  {name:<28} {c * 1e6:6.1f} us" for name, c in fits.items()),
        f"  default (tuner/estimate/profile.py) {default.eager_op_host_s * 1e6:.1f} us",
        "",
        "eager decode step, measured against the model:",
    ]
    for label, case in eager:
        lines += decomposition(case, fits[label])
    lines += [
        "",
        "the same rollout measured by verl and by vLLM's LLM.generate (the megatron runner):",
        *same_rollout(rows),
        "  Not modeled: an extra host time per step in verl would show with CUDA graphs too (a",
        "  step's host work must fit in its ~5.4 ms there, a 6 ms term could not hide), so the",
        "  eager gap is per op: a slower host (the rows ran on different VMs) or contention beside",
        "  the launching process (verl starts vLLM with distributed_executor_backend 'mp', a",
        "  worker process fed over a shared-memory queue: verl/workers/rollout/vllm_rollout/",
        "  vllm_async_server.py; LLM.generate at TP 1 runs the worker in the engine's process).",
        "  Nothing in these rows tells which.",
    ]
    h100 = Profile(eager_op_host_s=fits["all eager rows"])
    profiles: dict[str, Profile] = {"default": default, "H100 rows' fit": h100}
    lines += [
        "",
        "generation, measured against the cost model: as recorded at proposal (pred_generation_s "
        "over its scale), and now (default profile; the profile with the eager rows' fit):",
        *rows_table(rows, profiles),
        "",
        *reference_check(profiles),
    ]
    return "\n".join(line.rstrip() for line in lines)


if __name__ == "__main__":
    print(main(sys.argv[1:]))
