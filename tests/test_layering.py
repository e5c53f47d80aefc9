"""The package's one-way layering: the estimator (and what it builds on) never imports the
runners or the study, so it can be used, and tested, without them; and the cost model reads no
CSV: fitting it to measured rows is tuner.fit's, above it."""

from __future__ import annotations

import ast
from pathlib import Path

TUNER = Path(__file__).resolve().parents[1] / "tuner"
ABOVE_THE_ESTIMATOR = ("tuner.runners", "tuner.study", "tuner.cli", "tuner.report")
CSV_READERS = ("tuner.results", "tuner.leaderboard", "tuner.fit", "csv", "pandas")
"""What reads leaderboards (or fits to them): the cost model imports none of these."""


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def _forbidden(path: Path, forbidden: tuple[str, ...]) -> set[str]:
    return {m for m in _imports(path) if any(m == f or m.startswith(f"{f}.") for f in forbidden)}


def _bad(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{p.relative_to(TUNER.parent)} imports {m}"
        for p in paths
        for m in _forbidden(p, forbidden)
    )


def test_the_estimator_and_its_foundations_import_nothing_above_them() -> None:
    below = [*sorted((TUNER / "estimate").glob("*.py")), *sorted((TUNER / "space").glob("*.py"))]
    below += sorted((TUNER / "fit").glob("*.py"))
    below += [TUNER / f for f in ("batching.py", "lengths.py", "models.py", "workload.py")]
    assert not _bad(below, ABOVE_THE_ESTIMATOR)


def test_the_cli_checks_import_nothing_of_the_cli() -> None:
    """tuner.cli_args sits below the command line: it reads the options' declaration
    (cli_args.options), never the parser or the commands (checks.py imported cli.build_parser,
    the package's one import circle)."""
    assert not _bad(sorted((TUNER / "cli_args").glob("*.py")), ("tuner.cli", "tuner.cli_parser"))


def test_the_cost_model_reads_no_csv() -> None:
    """Fitting and validating against committed CSVs is tuner.fit's; the cost model
    (tuner.estimate) imports no CSV reader, not even inside a function."""
    assert not _bad(sorted((TUNER / "estimate").glob("*.py")), CSV_READERS)


def test_the_layering_check_sees_a_csv_reader(tmp_path: Path) -> None:
    """The check itself: each way of importing a CSV reader is caught."""
    for line in (
        "import csv",
        "from tuner.results import read_rows",
        "from tuner import results",
        "import tuner.leaderboard as lb",
        "def f():\n    from tuner.fit.validate import load_cases",
    ):
        src = tmp_path / "m.py"
        src.write_text(line + "\n")
        assert _forbidden(src, CSV_READERS), line


def test_optuna_is_used_through_its_public_api_only() -> None:
    """Issue 20: no private Optuna attribute (a FrozenTrial's `_trial_id`, a Study's `_storage`);
    a trial's id comes from the storage's public get_trial_id_from_study_id_trial_number."""
    import re

    private = re.compile(r"\.(_trial_id|_study_id)\b|\bstudy\._\w+|\bst\._storage\b")
    found = [
        f"{p.relative_to(TUNER)}:{n}: {line.strip()}"
        for p in sorted(TUNER.rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if private.search(line) and "self._study_id" not in line
    ]
    assert not found, found
