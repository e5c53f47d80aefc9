"""Would a study predict eager generation better by learning vLLM's per-op host time online
than by the multiplicative eager scale it learns now (tuner.study.learn EAGER_GENERATION)?
A replay over the eager rows measured so far (issue 18 item 4: within 10% at proposal).

With `enforce_eager` every decode step is host-bound (tuner.estimate.generation
_decode_step_s: the host's chain, eager_ops x eager_op_host_s plus the engine's work, outlasts
the GPU's share, which it hides), so the cost model's generation time is linear in
Profile.eager_op_host_s: R + K x op_s, K the launch-bound decode steps times eager_ops (read
from the model at two per-op times and checked at a third: LINEAR_RANGE), R the rest (the
engine's host work of each step, prefill). A measured
row gives op_s = (measured - R) / K. Each eager row is predicted, with the current cost model
for every row, by three learners from the other rows (each alone, then both; two or more: the
median in log space, as tuner.fit.online.time_scales):
  scale       measured / cost model, times the target's cost model (what the study does now);
  per-op      op_s solved from each source row, the target's R + K x op_s;
  per-op, R x graph   the same with each row's R times the graph-mode generation scale its
              study had learned before it (its file's ok graph rows before it, in trial order).
The prior (no eager row learned) is the cost model's default (20 us per op) for all three but
the third, whose R is still scaled. Within each study the eager row is its study's only one,
so in study order every row is predicted from the prior.

gen8k-h200-x1 trial 8 was stopped as pruned-slow after its generation was measured (134.0 s);
StudyLearner.observe learns its generation (measured whole before the stop), as here.

    python scripts/eager_online_check.py > scripts/eager_online_check.out.txt
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuner.estimate import Profile
from tuner.fit.validate import Case, case_from_row
from tuner.results import Status, TrialRecord, read_raw
from tuner.study.learn import eager, measured_phases

EAGER_ROWS = (
    ("results/verl4k-h100-x1.csv", 6),
    ("results/gen-check-local-h100-x1.csv", 4),
    ("results/gen8k-h200-x1.csv", 8),
)
"""Every eager row of results/ that measured generation: verl, the megatron runner's
LLM.generate on an H100, the same on an H200 (verl4k-h100-x1 trial 8 copies trial 6)."""
LINEAR_RANGE = (30e-6, 120e-6)
"""Per-op host times where every decode step of these rows is host-bound, so the model is R + K x
op_s: read at its ends and checked at its middle. The default (20 us) lies just below (the
longest contexts' steps are GPU-bound there): the prior is the model's own number."""
LINEAR_TOL = 1e-9
Learner = Callable[[list["EagerRow"], "EagerRow"], float]


@dataclass(frozen=True, kw_only=True, slots=True)
class EagerRow:
    """One measured eager row and the cost model's linear form of its generation."""

    label: str
    worker: str
    gpu: str
    measured_s: float
    model_s: float
    """The cost model's generation at the default per-op time."""
    rest_s: float
    """R: what does not scale with the per-op time."""
    op_weight: float
    """K: seconds per second of per-op host time (launch-bound decode steps x eager_ops)."""
    graph_scale: float
    """Measured / cost model of graph-mode generation, median (log) over the ok graph rows its
    study measured before it (1 with none)."""

    def op_s(self, rest_scale: float = 1.0) -> float:
        return (self.measured_s - self.rest_s * rest_scale) / self.op_weight

    def predict(self, op_s: float, rest_scale: float = 1.0) -> float:
        if not LINEAR_RANGE[0] <= op_s <= LINEAR_RANGE[1]:
            raise SystemExit(f"{self.label}: {op_s * 1e6:.1f} us per op outside LINEAR_RANGE")
        return self.rest_s * rest_scale + self.op_weight * op_s


def generation_s(case: Case, op_s: float | None = None) -> float:
    p = Profile() if op_s is None else Profile(eager_op_host_s=op_s)
    return case.predict(p).generation_s


def log_median(xs: list[float]) -> float:
    return math.exp(statistics.median(math.log(x) for x in xs))


def eager_row(path: str, trial: int) -> EagerRow:
    rows = read_raw(Path(path))
    graph: list[float] = []
    for row in rows:
        rec = TrialRecord.from_row(row)
        case = case_from_row({**row, "status": "ok"})  # a pruned-slow row timed generation too
        if case is None:
            continue
        if rec.trial == trial:
            lo, hi = LINEAR_RANGE
            a, b, mid = (generation_s(case, op) for op in (lo, hi, (lo + hi) / 2))
            k = (b - a) / (hi - lo)
            rest = a - k * lo
            if abs(rest + k * (lo + hi) / 2 - mid) > LINEAR_TOL * mid:
                raise SystemExit(f"{path}:{trial}: generation not linear in the per-op time")
            return EagerRow(
                label=f"{Path(path).stem}:{trial}",
                worker=rec.worker,
                gpu=rec.gpu,
                measured_s=case.measured["generation"],
                model_s=generation_s(case),
                rest_s=rest,
                op_weight=k,
                graph_scale=log_median(graph) if graph else 1.0,
            )
        if rec.status is Status.OK and not eager(rec) and "generation" in measured_phases(rec):
            graph.append(case.measured["generation"] / generation_s(case))
    raise SystemExit(f"no trial {trial} in {path}")


def by_scale(src: list[EagerRow], t: EagerRow) -> float:
    return t.model_s * log_median([r.measured_s / r.model_s for r in src]) if src else t.model_s


def by_op(src: list[EagerRow], t: EagerRow) -> float:
    return t.predict(log_median([r.op_s() for r in src])) if src else t.model_s


def by_op_graph_rest(src: list[EagerRow], t: EagerRow) -> float:
    if not src:  # the model at the default per-op time, its R scaled
        return t.model_s - (1.0 - t.graph_scale) * t.rest_s
    return t.predict(log_median([r.op_s(r.graph_scale) for r in src]), t.graph_scale)


LEARNERS: dict[str, Learner] = {
    "scale": by_scale,
    "per-op": by_op,
    "per-op, R x graph": by_op_graph_rest,
}


def err(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def main() -> str:
    rows = [eager_row(path, trial) for path, trial in EAGER_ROWS]
    lines = [
        "eager rows (the current cost model; generation = R + K x per-op host time):",
        f"  {'row':<28} {'gpu':<5} {'worker':<8} {'measured':>8} {'model':>7} {'R':>6}"
        f" {'K x 1us':>7} {'per-op':>8} {'launch':>6} {'graph':>6}",
    ]
    for r in rows:
        lines.append(
            f"  {r.label:<28} {r.gpu:<5} {r.worker:<8} {r.measured_s:8.2f} {r.model_s:7.2f}"
            f" {r.rest_s:6.2f} {r.op_weight * 1e-6:7.2f} {r.op_s() * 1e6:6.1f}us"
            f" {r.op_weight * r.op_s() / r.measured_s:6.1%} x{r.graph_scale:.3f}"
        )
    ops = [r.op_s() for r in rows]
    lines += [
        "  per-op: the host time per op the row implies; launch: K x that per-op time over the",
        "  measured (the share a per-op learner moves); graph: the graph-mode generation scale its",
        f"  study had learned before it. The implied per-op times span x{max(ops) / min(ops):.2f}.",
        "",
        "each row predicted from the others: prediction and error against the measured",
        f"  {'target':<26} {'learned from':<46}" + "".join(f" {name:>17}" for name in LEARNERS),
    ]
    errors: dict[str, dict[str, list[float]]] = {name: {} for name in LEARNERS}
    diffs: dict[str, list[float]] = {}
    for t in rows:
        others = [r for r in rows if r is not t]
        for kind, src in (
            ("prior", []),
            *(("one", [r]) for r in others),
            ("both", others),
        ):
            line = f"  {t.label:<26} {' + '.join(r.label for r in src) or '(prior)':<46}"
            for name, learn in LEARNERS.items():
                pred = learn(src, t)
                e = err(pred, t.measured_s)
                errors[name].setdefault(kind, []).append(abs(e))
                line += f" {pred:8.2f} {e:+7.1%}"
                if kind != "prior":
                    diffs.setdefault(name, []).append(
                        abs(e) - abs(err(by_scale(src, t), t.measured_s))
                    )
            lines.append(line)
    lines += ["", "|error| over the predictions of each kind (median / max; aim: within 10%):"]
    for kind, what in (
        ("prior", "prior (in study order: each study's eager row is its first)"),
        ("one", "from one other row (6)"),
        ("both", "from the two others (3)"),
    ):
        cells = "".join(
            f" {name} {statistics.median(errors[name][kind]):5.1%} / "
            f"{max(errors[name][kind]):5.1%};"
            for name in LEARNERS
        )
        lines.append(f"  {what:<62}{cells.rstrip(';')}")
    lines += ["", "against the scale, per prediction learned from other rows (9): |error| change"]
    for name in list(LEARNERS)[1:]:
        d = diffs[name]
        lines.append(
            f"  {name:<18} lower on {sum(x < -0.005 for x in d)} (at most"
            f" {-min(d) * 100:.1f} points), higher on {sum(x > 0.005 for x in d)} (at most"
            f" {max(d) * 100:.1f} points), within half a point on"
            f" {sum(abs(x) <= 0.005 for x in d)}"
        )
    return "\n".join(line.rstrip() for line in lines)


if __name__ == "__main__":
    sys.stdout.write(main() + "\n")
