"""Read the notes beside committed leaderboards: what single files and rows leave out, or why a
fit leaves a row out.

A folder of CSVs may hold a `fit.toml` (NOTES_FILE) with one table per CSV file name:

    ["dapo7b.csv"]
    model = "qwen2.5-7b"              # the model of rows that name none
    rope_fusion = false               # every recipe of the file set apply_rope_fusion=True
    full_logits_trials = [3, 4]       # rows that ran verl's full-logits log-prob path

    ["dapo7b.csv".recipe_inputs]      # inputs a row leaves out that its recipe script set
    9 = { gpu_memory_utilization = 0.8, recompute = "full" }

    ["dapo7b.csv".excluded]           # rows the fits leave out, trial -> why
    1 = "its memory includes what the previous trial left"

Facts about rows live beside the rows, so the fit code (tuner.fit) names no file and no trial.
A file without notes has none (`FileNotes()`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import UserError

NOTES_FILE = "fit.toml"
"""The notes of the CSVs of one folder, beside them."""
RECIPE_INPUT_KEYS = frozenset({"gpu_memory_utilization", "recompute"})
"""What a recipe input may set (tuner.fit.validate reads these)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FileNotes:
    """What the notes say about one leaderboard file."""

    model: str = ""
    """The model of the file's rows that name none (a reference file without a model column)."""
    rope_fusion: bool = False
    """Every recipe script of the file set `apply_rope_fusion=True`, whatever a row says."""
    full_logits_trials: frozenset[int] = frozenset()
    """Trials that ran verl's full-logits log-prob path (estimate/logits.py)."""
    recipe_inputs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Trial -> inputs the row leaves out but its recipe script set (RECIPE_INPUT_KEYS)."""
    excluded: Mapping[str, str] = field(default_factory=dict)
    """Trial -> why the fits leave the row out."""


def _bad(path: Path, what: str) -> UserError:
    return UserError(f"{path}: {what}; see tuner/fit/notes.py for the format")


def _file_notes(path: Path, name: str, table: object) -> FileNotes:
    if not isinstance(table, dict):
        raise _bad(path, f"[{name!r}] must be a table")
    known = {"model", "rope_fusion", "full_logits_trials", "recipe_inputs", "excluded"}
    if unknown := sorted(set(table) - known):
        raise _bad(path, f"[{name!r}] has unknown keys {', '.join(unknown)}")
    inputs = table.get("recipe_inputs", {})
    for trial, given in inputs.items():
        if not isinstance(given, dict) or not set(given) <= RECIPE_INPUT_KEYS:
            keys = ", ".join(sorted(RECIPE_INPUT_KEYS))
            raise _bad(path, f"recipe input of {name} trial {trial} may set only {keys}")
    return FileNotes(
        model=str(table.get("model", "")),
        rope_fusion=bool(table.get("rope_fusion", False)),
        full_logits_trials=frozenset(int(t) for t in table.get("full_logits_trials", ())),
        recipe_inputs={str(k): dict(v) for k, v in inputs.items()},
        excluded={str(k): str(v) for k, v in table.get("excluded", {}).items()},
    )


def notes_for(path: Path) -> FileNotes:
    """The notes about CSV `path` in the NOTES_FILE of its folder (none when it has no entry)."""
    notes = path.parent / NOTES_FILE
    if not notes.is_file():
        return FileNotes()
    try:
        tables = tomllib.loads(notes.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise _bad(notes, f"not valid TOML ({e})") from e
    if path.name not in tables:
        return FileNotes()
    return _file_notes(notes, path.name, tables[path.name])


def excluded_rows(paths: Iterable[Path]) -> dict[str, str]:
    """`FILE NAME:trial` -> why, for the rows of `paths` that their notes exclude."""
    return {f"{p.name}:{trial}": why for p in paths for trial, why in notes_for(p).excluded.items()}
