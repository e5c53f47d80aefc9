"""The package's one-way layering: the estimator (and what it builds on) never imports the
runners or the study, so it can be used, and tested, without them; the cost model reads no
CSV: fitting it to measured rows is tuner.fit's, above it; and inside the cost model each layer
imports only the layers below it (ESTIMATE_ORDER)."""

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


ESTIMATE_ORDER = (
    # foundations: a term's memo, the calibration constants, the per-study numbers, the
    # logits' passes
    "memo",
    "profile",
    "context",
    "logits",
    # how a batch splits into micro-batches (over tuner.batching): memory and time read it
    "micro_batches",
    # device memory outside PyTorch: CUDA context, NCCL buffers, vLLM's process, slack, headroom
    "device",
    # phase memory: vLLM's share and KV cache, then each phase's peak
    "rollout_memory",
    "memory",
    # phase time: generation, then every phase and the step
    "generation",
    "time",
    # the split placement: each pool's times and memory
    "split",
    # the estimate
    "__init__",
    # readings of an estimate: what a runner sees of its memory, the text breakdown
    "view",
    "report_text",
)
"""Issue 31 item 5: the cost model's layers, lowest first. A module of tuner/estimate imports
only modules listed before it, so a candidate's walk through the cost model flows one way
(micro-batches -> device memory -> phase memory -> phase time -> estimate), never back up."""


def _estimate_imports(path: Path) -> set[str]:
    """The modules of tuner/estimate that `path` imports (anywhere in it: inside functions and
    under TYPE_CHECKING too); a name the package exports counts as its __init__."""
    out = set()
    for name in _imports(path):
        parts = name.split(".")
        if parts[:2] != ["tuner", "estimate"]:
            continue
        mod = parts[2] if len(parts) > 2 else "__init__"
        out.add(mod if (TUNER / "estimate" / f"{mod}.py").is_file() else "__init__")
    return out


def _upward(path: Path, module: str) -> list[str]:
    """Imports of `module` (at `path`) that are not below it in ESTIMATE_ORDER."""
    rank = {m: i for i, m in enumerate(ESTIMATE_ORDER)}
    return sorted(
        f"estimate/{module} imports estimate/{m}"
        for m in _estimate_imports(path)
        if rank.get(m, len(rank)) >= rank[module]
    )


def _module_path(name: str) -> Path | None:
    """The file of tuner module `name`, or of the module a name imported from it lives in."""
    parts = name.split(".")[1:]
    while parts:
        for p in (TUNER.joinpath(*parts).with_suffix(".py"), TUNER.joinpath(*parts, "__init__.py")):
            if p.is_file():
                return p
        parts = parts[:-1]
    return None


def test_every_module_of_the_cost_model_has_its_layer() -> None:
    modules = {p.stem for p in (TUNER / "estimate").glob("*.py")}
    assert modules == set(ESTIMATE_ORDER), "place a new module of tuner/estimate in ESTIMATE_ORDER"


def test_the_cost_model_flows_one_way() -> None:
    """No module of tuner/estimate imports one at or above its own layer."""
    bad = [line for m in ESTIMATE_ORDER for line in _upward(TUNER / "estimate" / f"{m}.py", m)]
    assert not bad, bad


def test_what_the_cost_model_builds_on_imports_nothing_of_it() -> None:
    """The package modules below the cost model (tuner.batching, lengths, models, space, ...),
    and everything they import in turn, import no module of tuner/estimate: no way back up
    through another room."""
    seen: set[Path] = set()
    todo = [
        p
        for m in ESTIMATE_ORDER
        for name in _imports(TUNER / "estimate" / f"{m}.py")
        if name.startswith("tuner.") and not name.startswith("tuner.estimate")
        if (p := _module_path(name)) is not None
    ]
    bad = []
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            if name == "tuner.estimate" or name.startswith("tuner.estimate."):
                bad.append(f"{path.relative_to(TUNER.parent)} imports {name}")
            elif name.startswith("tuner.") and (p := _module_path(name)) is not None:
                todo.append(p)
    assert TUNER / "batching.py" in seen
    assert not bad, sorted(bad)


def test_the_layering_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The check itself: device memory importing phase memory, or the estimate's type under
    TYPE_CHECKING, is caught; importing a lower layer is not."""
    src = tmp_path / "device.py"
    for line, caught in (
        ("from tuner.estimate.memory import MemoryBreakdown", True),
        ("if TYPE_CHECKING:\n    from tuner.estimate import Estimate", True),
        ("def f():\n    from tuner.estimate.time import phase_times_of", True),
        ("import tuner.estimate.device", True),
        ("from tuner.estimate.context import Context", False),
        ("from tuner.estimate.micro_batches import micro_batches", False),
    ):
        src.write_text(line + "\n")
        assert bool(_upward(src, "device")) == caught, line
