"""Predicted against measured phase times of leaderboards' measured rows (issue 18).

Per file: the median measured/predicted of each phase against the cost model (pred_<phase>_s
over the scale the study applied, pred_<phase>_scale). Per study, its measured ok rows in trial
order: the error |predicted - measured| / measured of the prediction made at proposal (the row's
pred_<phase>_s), and of the prediction the study's online learning (tuner.study.learn) makes
from its rows before that one, replayed here: the two agree on rows of studies that learned;
rows from before the scales were applied (no pred_<phase>_scale) were predicted by the cost
model alone. The step is its phases summed (the reference pass, weight sync and critic the
cost model's); a phase a row did not time (the megatron runner's generation) is left out.
Generation is learned per launch mode (StudyLearner.scales_for): an eager row ('generation
eager') gets the scale of the eager rows before it, the prior (learn.EAGER_PRIOR) before one.
Last, each study with an eager row replayed with the other files' eager rows after its own, as
if they came next: what a second eager row gets (their at-proposal columns are the cost model).

    python scripts/predicted_vs_measured.py results/verl4k-h100-x1.csv \
        results/gen-check-h100-x1.csv results/gen-check-local-h100-x1.csv \
        > scripts/predicted_vs_measured.out.txt
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from tuner.results import Status, TrialRecord, read_raw
from tuner.study.learn import (
    SCALED_PHASES,
    StudyLearner,
    eager,
    measured,
    measured_phases,
    raw_prediction,
)

PHASES = (*SCALED_PHASES, "step")
AIM = 0.10
"""Issue 18: generation within 10% on the study's own rows after the first."""


def raw_step(rec: TrialRecord) -> float | None:
    """The cost model's step of a row: its pred_step_s less what the scales added."""
    if rec.pred_step_s is None:
        return None
    added = 0.0
    for ph in SCALED_PHASES:
        pred, raw = getattr(rec, f"pred_{ph}_s"), raw_prediction(rec, ph)
        added += (pred or 0.0) - (raw or 0.0)
    return rec.pred_step_s - added


def timed(rec: TrialRecord) -> dict[str, tuple[float, float, float]]:
    """{phase: (measured, cost model, at proposal)} of the phases the row timed."""
    out = {}
    for ph in measured_phases(rec):
        raw, pred = raw_prediction(rec, ph), getattr(rec, f"pred_{ph}_s")
        if raw and pred:
            out[ph] = (float(getattr(rec, f"{ph}_s")), raw, pred)
    raw = raw_step(rec)
    if rec.step_s and raw and rec.pred_step_s:
        out["step"] = (rec.step_s, raw, rec.pred_step_s)
    return out


def online(rec: TrialRecord, scales: dict[str, float]) -> dict[str, float]:
    """{phase: the prediction with `scales`} of the phases of `timed(rec)`."""
    got = timed(rec)
    out = {ph: v[1] * scales[ph] for ph, v in got.items() if ph != "step"}
    if "step" in got:
        added = 0.0
        for ph in SCALED_PHASES:
            raw = raw_prediction(rec, ph)
            added += (scales[ph] - 1) * (raw or 0.0)
        out["step"] = got["step"][1] + added
    return out


def _err(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas


def summary(path: str) -> str:
    recs = [TrialRecord.from_row(r) for r in read_raw(Path(path))]
    ok = [r for r in recs if r.status is Status.OK and measured(r)]
    sources = sorted({r.source for r in ok})
    lines = [
        f"{path}: {len(recs)} rows, {len(ok)} measured ok ({', '.join(sources) or '-'})",
        "  measured / cost model, median over the measured ok rows:",
    ]
    ratios: dict[str, list[float]] = {ph: [] for ph in PHASES}
    for r in ok:
        for ph, (meas, raw, _) in timed(r).items():
            ratios[ph].append(meas / raw)
    lines.append(
        "   "
        + "  ".join(
            f"{ph} {statistics.median(v):.3f} ({len(v)} rows)" if v else f"{ph} - (0 rows)"
            for ph, v in ratios.items()
        )
    )
    for study in sorted({r.study for r in recs}):
        rows = sorted((r for r in recs if r.study == study), key=lambda r: r.trial)
        lines.append(
            f"  study {study}, its measured ok rows in trial order: |predicted - measured| / "
            "measured"
        )
        lines += replay(rows)
    return "\n".join(line.rstrip() for line in lines)


def replay(rows: list[TrialRecord], at_proposal: bool = True) -> list[str]:
    """The table of `rows` in this order: each measured ok row's errors, the online prediction
    from the rows before it (the scales of its launch mode: StudyLearner.scales_for); without
    `at_proposal` (rows of other studies) the at-proposal columns repeat the cost model's."""
    lines = [
        f"    {'trial':>5} {'phase':<13} {'measured':>9} {'cost model':>15}"
        f" {'at proposal (scale)':>26} {'online (scale)':>26}"
    ]
    learner = StudyLearner(capacity_gib=1e6)  # time only: the memory guard plays no part
    first = True
    worst: dict[str, list[float]] = {"proposal": [], "online": []}
    for r in rows:
        if r.status is Status.OK and measured(r):
            scales = learner.scales_for(eager(r))
            now = online(r, scales)
            for ph, (meas, raw, pred) in timed(r).items():
                if not at_proposal:
                    pred = raw
                applied = getattr(r, f"pred_{ph}_scale", None) if ph != "step" else None
                tag = "" if ph == "step" else f"(x{applied:.3f})" if applied else "(none)"
                tag = tag if at_proposal else "(-)"
                on_tag = "" if ph == "step" else f"(x{scales[ph]:.3f})"
                name = f"{ph}{' eager' if ph == 'generation' and eager(r) else ''}"
                lines.append(
                    f"    {r.trial:>5} {name:<16} {meas:>6.2f}"
                    f" {raw:>8.2f} {_err(raw, meas):>6.1%}"
                    f" {pred:>8.2f} {_err(pred, meas):>6.1%} {tag:>10}"
                    f" {now[ph]:>8.2f} {_err(now[ph], meas):>6.1%} {on_tag:>10}"
                )
                if ph == "generation" and not first:
                    worst["proposal"].append(_err(pred, meas))
                    worst["online"].append(_err(now[ph], meas))
            first = False
        learner.observe(r)
    if worst["online"]:
        lines.append(
            f"    generation on the rows after the first ({len(worst['online'])}): largest "
            f"error at proposal {max(worst['proposal']):.1%}, online "
            f"{max(worst['online']):.1%} (aim: within {AIM:.0%})"
        )
    return lines


def second_eager(paths: list[str]) -> str:
    """Each study with an eager row, then the measured eager rows of the other files' studies
    as if they came next: what an eager row gets once the study measured one."""
    recs = {p: [TrialRecord.from_row(r) for r in read_raw(Path(p))] for p in paths}
    lines = []
    for path, rows in recs.items():
        if not any(eager(r) and measured(r) and r.status is Status.OK for r in rows):
            continue
        more = [
            r
            for other, rs in recs.items()
            if other != path
            for r in rs
            if eager(r) and measured(r) and r.status is Status.OK
        ]
        if not more:
            continue
        lines.append(
            f"{path}'s rows in trial order, then the eager rows of "
            f"{', '.join(sorted({r.study for r in more}))} (other studies: at proposal = cost "
            "model): a second eager row"
        )
        lines += replay(sorted(rows, key=lambda r: r.trial) + more, at_proposal=False)
    return "\n".join(line.rstrip() for line in lines)
    return "\n".join(line.rstrip() for line in lines)


if __name__ == "__main__":
    print("\n".join(summary(p) for p in sys.argv[1:]))
    print(second_eager(sys.argv[1:]))
