"""The cost model's outputs, pinned: estimate() on every case of tests/data/estimate_golden.json
(the committed leaderboards' rows, the reference rows and drawn candidates; written by
scripts/golden_estimates.py) returns what the file holds, every field, floats to a relative
1e-9. A refactor of tuner/estimate leaves it passing unchanged; a change of the numbers that is
meant rewrites the file with the script, in the same commit."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "estimate_golden.json"
REL_TOL = 1e-9
ABS_TOL = 1e-12
"""Only for values that are zero up to rounding (GiB or seconds: 1e-12 is nothing)."""


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "golden_estimates", REPO / "scripts" / "golden_estimates.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _differences(want: Any, got: Any, path: str = "") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}.{k}: missing" for k in want if k not in got]
        out += [f"{path}.{k}: new" for k in got if k not in want]
        for k in want.keys() & got.keys():
            out += _differences(want[k], got[k], f"{path}.{k}")
        return out
    if isinstance(want, bool) or isinstance(got, bool) or not isinstance(want, int | float):
        return [] if want == got else [f"{path}: {want!r} -> {got!r}"]
    if not isinstance(got, int | float):
        return [f"{path}: {want!r} -> {got!r}"]
    if math.isnan(want) and math.isnan(got):
        return []
    if want == got or math.isclose(want, got, rel_tol=REL_TOL, abs_tol=ABS_TOL):
        return []
    return [f"{path}: {want!r} -> {got!r}"]


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    data = json.loads(GOLDEN.read_text())
    assert data["schema"] == 1
    return data["cases"]  # type: ignore[no-any-return]


def test_the_golden_cases_cover_the_cost_model(golden: dict[str, Any]) -> None:
    """The file holds what it is meant to pin: leaderboard, reference and drawn cases, and
    among them dynamic and fixed batching, MoE, pipelines with virtual stages, context
    parallelism, recompute, offload and split placements."""
    counts = _script().coverage(golden)
    assert len(golden) >= 400
    assert sum(k.startswith("anchor:") for k in golden) >= 40
    assert sum(".csv:" in k for k in golden) >= 140
    assert all(v >= 40 for v in counts.values()), counts


def test_estimate_reproduces_the_golden_outputs(golden: dict[str, Any]) -> None:
    run, outputs_of = (lambda m: (m.run, m.outputs_of))(_script())
    bad = []
    for label, case in golden.items():
        got = json.loads(json.dumps(outputs_of(run(case["inputs"]))))
        bad += [f"{label}{d}" for d in _differences(case["outputs"], got)]
    assert not bad, f"{len(bad)} differences, the first: " + "\n".join(bad[:20])
