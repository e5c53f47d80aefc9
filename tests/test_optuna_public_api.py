"""The tuner uses Optuna through its public API only: a private module (`optuna.x._y`) may move
or change in any release (storage.journal_damage imported `optuna.storages.journal._storage`)."""

from __future__ import annotations

import ast
from pathlib import Path

import tuner

PACKAGE = Path(tuner.__file__).parent


def _private_optuna_uses(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):
            parts = [node.attr]
            value = node.value
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                names = [".".join([value.id, *reversed(parts)])]
        for name in names:
            head, *rest = name.split(".")
            if head == "optuna" and any(p.startswith("_") for p in rest):
                found.append(f"line {getattr(node, 'lineno', '?')}: {name}")
    return found


def test_no_module_of_the_tuner_reaches_into_a_private_optuna_module() -> None:
    found = {
        str(path.relative_to(PACKAGE)): uses
        for path in sorted(PACKAGE.rglob("*.py"))
        if (uses := _private_optuna_uses(ast.parse(path.read_text(), str(path))))
    }
    assert not found
