"""The package's one-way layering: the estimator (and what it builds on) never imports the
runners or the study, so it can be used, and tested, without them."""

from __future__ import annotations

import ast
from pathlib import Path

TUNER = Path(__file__).resolve().parents[1] / "tuner"
ABOVE_THE_ESTIMATOR = ("tuner.runners", "tuner.study", "tuner.cli", "tuner.report")


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_estimator_and_its_foundations_import_nothing_above_them() -> None:
    below = [*sorted((TUNER / "estimate").glob("*.py")), *sorted((TUNER / "space").glob("*.py"))]
    below += [TUNER / f for f in ("batching.py", "lengths.py", "models.py", "workload.py")]
    bad = {
        f"{p.relative_to(TUNER.parent)} imports {m}"
        for p in below
        for m in _imports(p)
        if m.startswith(ABOVE_THE_ESTIMATOR)
    }
    assert not bad, sorted(bad)
