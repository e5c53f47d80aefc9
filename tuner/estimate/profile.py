"""Efficiency constants of the cost model, and the profile file `tune calibrate` writes.

The defaults are first-principles guesses (fractions of datasheet peaks), not fits to any
reference row; `tune calibrate` fits them to the user's own measured rows.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from tuner.errors import UserError

PROFILE_SCHEMA = 1
DEFAULT_PROFILE_PATH = Path("results") / "calibration.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    """Fractions of the datasheet peaks a real run reaches, and fixed overheads."""

    train_mfu: float = 0.45
    """Matmul efficiency of forward+backward at large micro-batches."""
    forward_mfu: float = 0.40
    """Matmul efficiency of the log-prob forward passes."""
    hbm_efficiency: float = 0.70
    """Fraction of memory bandwidth decode reaches."""
    comm_efficiency: float = 0.70
    """Fraction of link bandwidth collectives reach."""
    decode_step_overhead_s: float = 0.004
    """Host/scheduler time per decode step of one vLLM engine."""
    context_gib: float = 2.5
    """CUDA context, NCCL buffers and framework overhead per GPU."""
    fragmentation: float = 0.08
    """Allocator fragmentation, as a fraction of the tensors in use."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (v >= 0):
                raise UserError(f"calibration constant {f.name} must be >= 0, got {v}")

    def with_values(self, **kw: float) -> Profile:
        return replace(self, **kw)


def load_profile(path: Path | None = None) -> Profile:
    """The profile at `path`, else the default file if present, else the built-in defaults."""
    p = path or DEFAULT_PROFILE_PATH
    if not p.exists():
        if path is not None:
            raise UserError(f"no calibration profile at {p}: run `tune calibrate` first")
        return Profile()
    try:
        data = json.loads(p.read_text())
        if data.get("schema") != PROFILE_SCHEMA:
            raise ValueError(f"schema {data.get('schema')} != {PROFILE_SCHEMA}")
        known = {f.name for f in fields(Profile)}
        return Profile(**{k: float(v) for k, v in data["constants"].items() if k in known})
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(
            f"calibration profile {p} is unreadable ({e}): delete it or re-run `tune calibrate`"
        ) from None


def save_profile(profile: Profile, path: Path | None = None, **meta: object) -> Path:
    p = path or DEFAULT_PROFILE_PATH
    p.parent.mkdir(parents=True, exist_ok=True)
    payload = {"schema": PROFILE_SCHEMA, "constants": asdict(profile), **meta}
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=p.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, p)
    return p
