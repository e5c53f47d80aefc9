"""The cost model's results as text: `tune estimate`'s breakdown and `tune calibrate`'s fit.

Also the work of `tune calibrate` that is not the fit itself (reading the leaderboards,
filtering by GPU, saving the profile with its provenance), so the CLI only parses and prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.estimate import Estimate
from tuner.estimate.calibrate import CalibrationResult
from tuner.estimate.profile import Profile
from tuner.hardware import Cluster
from tuner.models import ModelSpec
from tuner.space import Candidate
from tuner.workload import Workload


def format_estimate(
    e: Estimate, c: Candidate, model: ModelSpec, cluster: Cluster, workload: Workload
) -> str:
    """The breakdown of one estimate: time per phase, throughput, memory per GPU, the verdict."""
    lay, mem = c.layout, e.memory
    lines = [
        f"{model.name} on {cluster.num_gpus}x {cluster.gpu.name}, actor {lay.spec} (dp"
        f"{lay.dp}), rollout tp{c.rollout_tp}, {workload.algorithm} "
        f"{workload.batch_size}x{workload.n}, mean sample {workload.mean_seq_len:.0f} tokens "
        "(source=estimate)",
        "time per step",
    ]
    for label, v in (
        ("generation", e.generation_s),
        ("old log-prob", e.old_log_prob_s),
        ("ref log-prob", e.ref_s),
        ("update actor", e.update_actor_s),
        ("critic", e.critic_s),
        ("reshard", e.reshard_s),
        ("step", e.step_s),
    ):
        if label == "critic" and not v:
            continue
        lines.append(f"  {label:16} {v:9.1f} s")
    lines += [
        f"  {'of which offload':16} {e.offload_s:9.1f} s (PCIe)",
        f"  {'throughput':16} {e.throughput_tokens_per_s_per_gpu:9.0f} tokens/s/GPU",
        f"  {'mfu':16} {e.mfu * 100:9.1f} % (actor update)",
        f"  {'bottleneck':16} {e.bottleneck:>9}",
        "memory per GPU (GiB)",
    ]
    for label, v in (
        ("weights", mem.weights_gib),
        ("gradients", mem.grads_gib),
        ("optimizer", mem.optimizer_gib),
        ("activations", mem.activations_gib),
        ("logits", mem.logits_gib),
        ("moe dispatch", mem.dispatch_gib),
        ("reference", mem.reference_gib),
        ("vLLM share", mem.rollout_gib),
        ("vLLM KV cache", mem.kv_cache_gib),
        ("context etc.", mem.overhead_gib),
    ):
        if v:
            lines.append(f"  {label:16} {v:9.1f}")
    for label, v in (
        ("generation peak", mem.generation_peak_gib),
        ("log-prob peak", mem.log_prob_peak_gib),
        ("update peak", mem.update_peak_gib),
    ):
        lines.append(f"  {label:16} {v:9.1f}")
    verdict = "fits" if e.fits else f"does NOT fit: {e.fit_reason}"
    lines.append(
        f"  peak {e.peak_mem_gib:.1f} GiB in {e.peak_phase} of {cluster.gpu.memory_gib:.1f} GiB: "
        f"{verdict}"
    )
    return "\n".join(lines)


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
    paths: Sequence[Path], *, gpu: str | None = None, start: Profile | None = None
) -> LeaderboardFit:
    """Fit the profile's constants to the measured rows of `paths` (only GPU `gpu`, if given),
    starting from `start` (default the built-in constants)."""
    from tuner.estimate.calibrate import calibrate, observations_from_rows
    from tuner.estimate.validate import reported_response_mean
    from tuner.results import read_rows

    rows: list[dict[str, str]] = []
    obs = []
    for path in paths:
        file_rows = read_rows(path)
        if gpu:
            file_rows = [r for r in file_rows if (r.get("gpu") or "").lower() == gpu.lower()]
        rows += file_rows
        obs += observations_from_rows(file_rows, response_mean=reported_response_mean(file_rows))
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
    from tuner.estimate.profile import DEFAULT_PROFILE_PATH, save_profile

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
    for name, (old, new) in res.changes().items():
        lines.append(f"  {name:24} {old:.4g} -> {new:.4g}")
    if not res.changes():
        lines.append("  no constant changed")
    return "\n".join(lines)
