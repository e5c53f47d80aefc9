"""Fit the Profile's efficiency constants to measured rows of the user's own hardware.

Least squares on log(predicted / measured) over every measured phase of every row, with the
constants searched in log space inside the bounds of `profile.CALIBRATED`: Levenberg-Marquardt
with a finite-difference Jacobian (numpy only, which Optuna already needs; no scipy), bounds by
clipping, and a weak pull towards the starting profile so that constants the rows say nothing
about stay where they were. What a running study learns between trials is tuner.fit.online.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

import numpy as np

from tuner.bounds import TRIAL_SECONDS, number_text
from tuner.errors import UserError
from tuner.estimate import Estimate
from tuner.estimate.profile import CALIBRATED, Profile
from tuner.fit.notes import FileNotes
from tuner.fit.validate import Case, case_from_row, predicted_phase

PRIOR_WEIGHT = 1e-2
"""Weight of (log(value / start))^2 per constant, against squared log errors of the rows."""
SENSITIVITY_FLOOR = 1e-6
"""A constant whose 10% change moves no prediction by more than this (relative) is left alone."""
FD_STEP = 1e-3
"""Finite-difference step in log space for the Jacobian."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    case: Case
    phase: str
    measured_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class CalibrationResult:
    profile: Profile
    start: Profile
    rows: int
    observations: int
    fitted: tuple[str, ...]
    """Constants the rows could move (the others kept their start value)."""
    error_before: dict[str, float]
    """Median absolute percentage error per phase (a fraction) with the start profile."""
    error_after: dict[str, float]
    rms_log_before: float
    rms_log_after: float
    iterations: int = 0

    def changes(self) -> dict[str, tuple[float, float]]:
        return {
            f.name: (getattr(self.start, f.name), getattr(self.profile, f.name))
            for f in fields(Profile)
            if getattr(self.start, f.name) != getattr(self.profile, f.name)
        }


DROP_NOT_OK = "not ok (oom, failed, pruned, ...)"
DROP_ESTIMATE = "the estimator's (not measured)"
DROP_UNREAD = "unreadable (an unknown model, layout or knob value)"
DROP_UNMEASURED = "without a Megatron phase time"
DROP_TIME = (
    f"with a phase time over {number_text(TRIAL_SECONDS.high)} s ({TRIAL_SECONDS.why}: the "
    "longest --trial-timeout)"
)
"""Why observations_from_rows leaves a row out (the keys of its `dropped`)."""


def observations_from_rows(
    rows: Iterable[dict[str, str]],
    accept: Callable[[dict[str, str]], bool] | None = None,
    response_mean: int = 0,
    notes: FileNotes | None = None,
    dropped: Counter[str] | None = None,
) -> list[Observation]:
    """Measured phases of the rows that `accept` keeps (default: measured rows, not estimates).

    `response_mean` stands in for reference rows, which do not record it (see
    validate.reported_response_mean); our own rows carry theirs. `notes`: those beside the rows'
    file (tuner.fit.notes). A row with a step or phase time longer than a trial may run
    (TRIAL_SECONDS: a 1e300-s phase) is no measurement. `dropped` counts the rows left out,
    by why (DROP_*)."""
    keep = accept or (lambda r: r.get("source", "") not in ("", "estimate", "tuner"))
    drop: Counter[str] = Counter() if dropped is None else dropped
    out: list[Observation] = []
    for row in rows:
        if row.get("status") != "ok":
            drop[DROP_NOT_OK] += 1
            continue
        if not keep(row):
            drop[DROP_ESTIMATE] += 1
            continue
        try:
            case = case_from_row(row, response_mean, notes)
        except (UserError, KeyError, ValueError):
            drop[DROP_UNREAD] += 1
            continue
        if case is None:
            drop[DROP_UNMEASURED] += 1
            continue
        if any(not 0 < v <= TRIAL_SECONDS.high for v in case.measured.values()):
            drop[DROP_TIME] += 1
            continue
        phases = {k: v for k, v in case.measured.items() if k != "step"}
        if not phases and "step" in case.measured:
            phases = {"step": case.measured["step"]}
        out.extend(Observation(case=case, phase=k, measured_s=v) for k, v in phases.items())
    return out


def _log_errors(obs: list[Observation], profile: Profile) -> np.ndarray:
    """log(predicted / measured) per observation (a large value where the model says inf)."""
    cache: dict[int, Estimate] = {}
    out = np.empty(len(obs))
    for i, o in enumerate(obs):
        e = cache.get(id(o.case))
        if e is None:
            c = o.case
            e = cache[id(o.case)] = c.predict(profile)
        pred = predicted_phase(e, o.phase)
        out[i] = math.log(pred / o.measured_s) if 0 < pred < math.inf else 5.0
    return out


def _median_ape(obs: list[Observation], logs: np.ndarray) -> dict[str, float]:
    per: dict[str, list[float]] = {}
    for o, x in zip(obs, logs, strict=True):
        per.setdefault(o.phase, []).append(abs(math.exp(x) - 1.0))
    return {k: statistics.median(v) for k, v in per.items()}


def _profile_at(base: Profile, names: list[str], x: np.ndarray) -> Profile:
    return base.with_values(**{n: float(math.exp(v)) for n, v in zip(names, x, strict=True)})


def _clip(names: list[str], x: np.ndarray) -> np.ndarray:
    lo = np.array([math.log(CALIBRATED[n][0]) for n in names])
    hi = np.array([math.log(CALIBRATED[n][1]) for n in names])
    return np.minimum(hi, np.maximum(lo, x))


def calibrate(
    observations: list[Observation],
    start: Profile | None = None,
    *,
    max_iterations: int = 60,
) -> CalibrationResult:
    """Fit the CALIBRATED constants of `start` (default: built-in defaults) to `observations`."""
    if not observations:
        raise UserError(
            "no measured rows to calibrate from: pass leaderboards with rows whose source is a "
            "real runner (megatron, verl), not the estimator"
        )
    p0 = start or Profile()
    obs = observations
    r0 = _log_errors(obs, p0)
    names: list[str] = []
    for name in CALIBRATED:
        v = getattr(p0, name)
        lo, hi = CALIBRATED[name]
        moved = p0.with_values(**{name: min(hi, max(lo, v * 1.1))})
        if moved == p0:
            moved = p0.with_values(**{name: min(hi, max(lo, v / 1.1))})
        if np.max(np.abs(_log_errors(obs, moved) - r0)) > SENSITIVITY_FLOOR:
            names.append(name)
    if len(obs) < len(names):
        rows = len({id(o.case) for o in obs})
        raise UserError(
            f"{rows} measured row(s) give {len(obs)} phase time(s), fewer than the {len(names)} "
            f"constants they move ({', '.join(names)}): pass leaderboards with more measured "
            f"rows (at least {len(names)} phase times)"
        )
    x0 = np.array([math.log(getattr(p0, n)) for n in names])
    x = _clip(names, x0.copy())
    w = math.sqrt(PRIOR_WEIGHT)

    def residuals(xv: np.ndarray) -> np.ndarray:
        data = _log_errors(obs, _profile_at(p0, names, xv))
        return np.concatenate([data, w * (xv - x0)])

    r = residuals(x)
    cost = float(r @ r)
    lam = 1e-2
    it = 0
    for it in range(1, max_iterations + 1):  # noqa: B007 (reported)
        if not names:
            break
        jac = np.empty((len(r), len(names)))
        for j, name in enumerate(names):
            xs = x.copy()
            h = FD_STEP if x[j] + FD_STEP <= math.log(CALIBRATED[name][1]) else -FD_STEP
            xs[j] += h
            jac[:, j] = (residuals(xs) - r) / h
        jtj, jtr = jac.T @ jac, jac.T @ r
        improved = False
        for _ in range(12):
            step = np.linalg.solve(jtj + lam * np.diag(np.diag(jtj) + 1e-9), -jtr)
            xn = _clip(names, x + step)
            rn = residuals(xn)
            cn = float(rn @ rn)
            if cn < cost:
                gain = cost - cn
                x, r, cost, improved = xn, rn, cn, True
                lam = max(lam / 3, 1e-7)
                break
            lam *= 4
        if not improved or gain < 1e-10 * max(1.0, cost):
            break
    fitted = _profile_at(p0, names, x) if names else p0
    r1 = _log_errors(obs, fitted)
    return CalibrationResult(
        profile=fitted,
        start=p0,
        rows=len({id(o.case) for o in obs}),
        observations=len(obs),
        fitted=tuple(names),
        error_before=_median_ape(obs, r0),
        error_after=_median_ape(obs, r1),
        rms_log_before=float(np.sqrt(np.mean(r0 * r0))),
        rms_log_after=float(np.sqrt(np.mean(r1 * r1))),
        iterations=it,
    )
