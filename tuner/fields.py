"""Copying values from one typed record to another by field name (`same_named`).

A measure travels through several types: the cost model's phase times (`PhaseTimes`) into its
`Estimate`, an `Estimate` or a worker's result into a runner's `TrialResult`, a `TrialResult`
into the study's `TrialRecord` (a CSV column each). Each of those copies is this one call, so a
new measure is a field of the types that carry it, under the same name (with a prefix, such as
the record's `pred_`), and no copying code changes. A leaf module: it imports the stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import Any


def same_named(
    src: Any, dst: type, *, prefix: str = "", skip: Iterable[str] = ()
) -> dict[str, Any]:
    """The values of dataclass instance `src`'s fields that dataclass `dst` declares as
    `prefix + name`, keyed by `dst`'s name, in `src`'s field order; `skip` names fields of `src`
    the caller sets itself (each must be a field of `src`: a ValueError otherwise, so a renamed
    field is not skipped silently)."""
    key = (type(src), dst, prefix, tuple(skip))
    pairs = _PAIRS.get(key)
    if pairs is None:
        pairs = _PAIRS[key] = _pairs(*key)
    return {d: getattr(src, s) for s, d in pairs}


_PAIRS: dict[tuple[type, type, str, tuple[str, ...]], tuple[tuple[str, str], ...]] = {}
"""(source field, destination field) of each copy made so far: the estimator's hot path pays
for the fields' look-up once."""


def _pairs(src: type, dst: type, prefix: str, skip: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    names = [f.name for f in fields(src)]
    unknown = sorted(set(skip) - set(names))
    if unknown:
        raise ValueError(f"same_named: {src.__name__} has no field {', '.join(unknown)}")
    wanted = {f.name for f in fields(dst)}
    return tuple((n, prefix + n) for n in names if prefix + n in wanted and n not in skip)
