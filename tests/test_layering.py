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
    below += [TUNER / f for f in ("batching.py", "lengths.py", "workload.py")]
    below += sorted((TUNER / "models").glob("*.py"))
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
    # phase memory: vLLM's share and KV cache, then each phase's peak, then the node's host
    # memory (what offloading moves there)
    "rollout_memory",
    "memory",
    "host_memory",
    # phase time: generation, then every phase and the step
    "generation",
    "time",
    # the split placement: each pool's times and memory
    "split",
    # the estimate
    "__init__",
    # readings of an estimate: what a runner sees of its memory, the text breakdown
    "runner_memory",
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


# --- import circles (issue 39 item 2) ---------------------------------------------------------


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The nodes under `if TYPE_CHECKING:` (imported for the type checker, never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(test):  # type: ignore[arg-type]
            out.update(id(x) for n in node.body for x in ast.walk(n))
    return out


def import_graph(root: Path, *, run_time_only: bool) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in it, functions too; with
    `run_time_only`, less what is imported under TYPE_CHECKING). `from pkg import name` is an
    edge to the module `pkg.name` where it is one, else to `pkg`."""
    paths = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for mod, path in paths.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree) if run_time_only else set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            pairs: list[tuple[str, str | None]] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    here = here[: len(here) - node.level + 1]
                    base = ".".join([*here, *([node.module] if node.module else [])])
                pairs = [(base, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                pairs = [(a.name, None) for a in node.names]
            for base, name in pairs:
                target = f"{base}.{name}" if name and f"{base}.{name}" in paths else base
                if target in paths and target != mod:
                    graph[mod].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected set of two modules or more (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circle_at_run_time_nor_for_the_type_checker() -> None:
    """Issue 39 item 2: no module of the package imports, through others, a module that imports
    it back, counting imports inside functions (space.rules once reached the knob table so, and
    the study's storage reached up to the CSV view) and those under TYPE_CHECKING (tuner.lengths
    once named the Workload it is given; it takes a protocol, LengthSettings, now)."""
    assert circles(import_graph(TUNER, run_time_only=True)) == []
    assert circles(import_graph(TUNER, run_time_only=False)) == []


def test_the_circle_check_sees_a_circle(tmp_path: Path) -> None:
    """The check itself: a circle through an import inside a function, and one under
    TYPE_CHECKING, which counts for the type checker only."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.d\n"
    )
    (pkg / "d.py").write_text("from pkg.c import x\n")
    assert circles(import_graph(pkg, run_time_only=True)) == [["pkg.a", "pkg.b"]]
    assert circles(import_graph(pkg, run_time_only=False)) == [
        ["pkg.a", "pkg.b"],
        ["pkg.c", "pkg.d"],
    ]


# --- private names (issue 39 item 3) ----------------------------------------------------------


def private_uses(path: Path) -> list[str]:
    """Where `path` reaches another module's private name: `from tuner.x import _name`, or
    `module._name` of a module it imported from the package; and argparse's privates
    (`parser._actions`, `argparse._SubParsersAction`)."""
    tree = ast.parse(path.read_text())
    out = []
    modules = {"argparse"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").startswith("tuner")
        ):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    out.append(f"{node.lineno}: from {node.module} import {a.name}")
                modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            modules.update(
                (a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("tuner")
            )
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and (
                (isinstance(node.value, ast.Name) and node.value.id in modules)
                or node.attr in ("_actions", "_action_groups", "_group_actions")
            )
        ):
            out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_private_name_is_used_across_modules() -> None:
    """Issue 39 item 3: what one module of the package shares with another is public; the CLI
    reads its subcommands from its own declaration, not argparse's private lists."""
    found = [
        f"{p.relative_to(TUNER.parent)}:{line}"
        for p in sorted(TUNER.rglob("*.py"))
        for line in private_uses(p)
    ]
    assert not found, found


def test_the_private_check_sees_each_form(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    for line in (
        "from tuner.report.markup import _e",
        "from .markup import _p",
        "from tuner import recipes\nrecipes._slug('x')",
        "import argparse\nargparse._SubParsersAction",
        "def f(parser):\n    return parser._actions",
    ):
        src.write_text(line + "\n")
        assert private_uses(src), line
    src.write_text(
        "from tuner.recipes import slug\nclass A:\n    def f(self):\n        self._x = 1\n"
    )
    assert not private_uses(src)
