"""`tune calibrate`'s work around the fit: read the leaderboards, keep one GPU's rows, fit the
profile (tuner.fit.calibrate), save it with its provenance, and the fit as text; so the CLI only
parses and prints."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import UserError
from tuner.estimate.profile import DEFAULT_PROFILE_PATH, Profile, save_profile
from tuner.fit.calibrate import CalibrationResult, calibrate, observations_from_rows
from tuner.fit.notes import notes_for
from tuner.fit.validate import reported_response_mean
from tuner.results import read_rows


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaderboardFit:
    """A calibration fitted to the measured rows of some leaderboards."""

    result: CalibrationResult
    """The fit: the profile, its errors before and after, the constants it changed."""
    gpus: list[str]
    """GPU kinds of the rows used."""
    sources: list[str]
    """Runners of the ok rows (the estimator's own rows are never used)."""
    paths: list[Path]
    """The leaderboards read."""


def fit_leaderboards(
    paths: Sequence[Path],
    *,
    gpu: str | None = None,
    start: Profile | None = None,
    source: str | None = None,
) -> LeaderboardFit:
    """Fit the profile's constants to the measured rows of `paths` (only GPU `gpu` and runner
    `source`, if given), starting from `start` (default the built-in constants)."""
    rows: list[dict[str, str]] = []
    obs = []
    dropped: Counter[str] = Counter()
    for path in paths:
        file_rows = read_rows(path)
        if gpu:
            kept = [r for r in file_rows if (r.get("gpu") or "").lower() == gpu.lower()]
            dropped[f"of another GPU than --gpu {gpu}"] += len(file_rows) - len(kept)
            file_rows = kept
        if source:
            kept = [r for r in file_rows if r.get("source") == source]
            dropped[f"of another runner than --source {source}"] += len(file_rows) - len(kept)
            file_rows = kept
        rows += file_rows
        obs += observations_from_rows(
            file_rows,
            response_mean=reported_response_mean(file_rows),
            notes=notes_for(path),
            dropped=dropped,
        )
    if not obs:
        why = "; ".join(f"{n} {what}" for what, n in dropped.items() if n) or "no rows"
        raise UserError(
            f"no measured row to calibrate from in {', '.join(map(str, paths))} (rows left out: "
            f"{why}): pass leaderboards with ok rows a real runner (megatron, verl) measured"
            + (", or change the filters" if gpu or source else "")
        )
    res = calibrate(obs, start or Profile())
    return LeaderboardFit(
        result=res,
        gpus=sorted({o.case.cluster.gpu.name for o in obs}),
        sources=sorted(
            {r.get("source", "") for r in rows if r.get("status") == "ok"} - {"estimate"}
        ),
        paths=list(paths),
    )


def save_fit(fit: LeaderboardFit, out: Path | None = None) -> Path:
    """Write the fitted profile with its provenance (default results/calibration.json)."""
    res = fit.result
    return save_profile(
        res.profile,
        out or DEFAULT_PROFILE_PATH,
        rows=res.rows,
        observations=res.observations,
        gpus=fit.gpus,
        sources=[str(p) for p in fit.paths],
        fitted=list(res.fitted),
        error_before=res.error_before,
        error_after=res.error_after,
    )


def format_fit(fit: LeaderboardFit) -> str:
    """The fit's rows, errors before and after per phase, and the constants it changed."""
    res = fit.result
    lines = [
        f"calibrating on {res.rows} measured rows ({res.observations} phase times; GPU "
        f"{', '.join(fit.gpus)}; sources {', '.join(fit.sources)})"
    ]
    phases = sorted(set(res.error_before) | set(res.error_after))
    for label, err, rms in (
        ("before", res.error_before, res.rms_log_before),
        ("after", res.error_after, res.rms_log_after),
    ):
        parts = ", ".join(f"{ph} {err.get(ph, float('nan')) * 100:.1f}%" for ph in phases)
        lines.append(f"  {label:6} median abs error: {parts}; rms log error {rms:.3f}")
    if {"megatron", "verl"} <= set(fit.sources):
        lines.append(
            "  note: rows of both runners: verl's old_log_prob and update include its controller "
            "and data dispatch (up to 1.5 x the megatron runner's on the same candidates); "
            "--source verl fits verl's steps"
        )
    for name, (old, new) in res.changes().items():
        lines.append(f"  {name:24} {old:.4g} -> {new:.4g}")
    if not res.changes():
        lines.append("  no constant changed")
    return "\n".join(lines)
