"""The CSV leaderboard as a view of the storage: rebuilt atomically from the trial records,
checked on start (a damaged file is set aside, another storage's file is refused)."""

from __future__ import annotations

import csv
import datetime as dt
import os
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.fileio import remove_leftovers, write_atomic
from tuner.results import TrialRecord, locked
from tuner.results.lines import (
    COLOCATED_COLUMNS,
    COLUMNS_KEY,
    FULL_COLUMNS,
    LINE_KEY,
    SPLIT_COLUMNS_KEY,
    is_split,
    record_line,
)
from tuner.study.storage import label_file, same_storage


def _damage(text: str) -> tuple[list[str], list[list[str]], str]:
    """(header, rows, what is wrong: '' when nothing) of a leaderboard file's text."""
    if not text:
        return [], [], "it is empty"
    if not text.endswith("\n"):
        return [], [], "its last line is cut off"
    try:
        lines = list(csv.reader(text.splitlines()))
    except csv.Error as e:
        return [], [], f"it is not CSV ({e})"
    if not lines or not lines[0]:
        return [], [], "it has no header"
    header = lines[0]
    for i, cells in enumerate(lines[1:], start=2):
        if len(cells) != len(header):
            return header, [], f"line {i} has {len(cells)} fields, the header {len(header)}"
    return header, lines[1:], ""


def check_leaderboard(
    path: Path, study: str, label: str, known: Callable[[], Collection[int]] | None = None
) -> tuple[dict[int, TrialRecord], list[str]]:
    """Check the leaderboard a study is about to rebuild.

    Returns (schema-1 records by trial, carried over where the storage has no record of their
    trial, and notes for stderr). A damaged file (torn, truncated, not CSV) is moved aside to
    `<name>.damaged-<UTC time>`; the view is rebuilt from the storage. A file another storage
    made, or one with another study's rows, or one that is not a verl-tuner leaderboard is
    refused (UserError), never overwritten. So is one with rows the storage cannot account for
    (`known`: the trial numbers the study holds in the storage, asked after the file is read,
    as another worker may add a trial and its row meanwhile): a rebuild from the storage would
    drop them (a storage moved aside or replaced, an older version's rows). Nothing is written
    before a refusal."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, []
    header: list[str] = []
    rows: list[list[str]] = []
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        why = "it is not UTF-8 text"
    else:
        header, rows, why = _damage(text)
    if not why and "schema_version" not in header:
        raise UserError(
            f"{path} is not a verl-tuner leaderboard; the study {study} would overwrite it: "
            "move it aside or pass --results-dir with another folder"
        )
    if why:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        aside = path.with_name(f"{path.name}.damaged-{stamp}")
        os.replace(path, aside)
        return {}, [f"{path} was damaged ({why}): kept as {aside}; rebuilt from the storage"]
    legacy: dict[int, TrialRecord] = {}
    i_storage = header.index("storage") if "storage" in header else None
    i_study = header.index("study") if "study" in header else None
    for cells in rows:
        other = cells[i_storage] if i_storage is not None else ""
        if other and not same_storage(other, label, path.parent):
            _, file = label_file(other, path.parent)
            where = other if file is None else str(file)
            if file is not None and not file.exists():
                raise UserError(
                    f"{path} was written by storage {other}, not by {label}, and {file} is not "
                    "there: move that storage back there, or pass --results-dir with another "
                    "folder"
                )
            raise UserError(
                f"{path} was written by storage {other}, not by {label}: pass --storage "
                f"{where}, or --results-dir with another folder"
            )
        name = cells[i_study] if i_study is not None else ""
        if name != study:
            raise UserError(
                f"{path} holds rows of study {name!r}, not only of {study}: "
                "pass --results-dir with another folder"
            )
        if not other:
            try:
                rec = TrialRecord.from_row(dict(zip(header, cells, strict=True)))
            except (ValueError, TypeError):
                continue
            legacy[rec.trial] = rec
    if known is not None:
        _check_known(path, study, label, header, rows, set(known()))
    return legacy, []


def _check_known(
    path: Path, study: str, label: str, header: list[str], rows: list[list[str]], known: set[int]
) -> None:
    """UserError where a row's trial is not one the storage holds for the study."""
    i_trial = header.index("trial") if "trial" in header else None
    lost = [
        cells[i_trial] if i_trial is not None else "?"
        for cells in rows
        if i_trial is None or not cells[i_trial].isdigit() or int(cells[i_trial]) not in known
    ]
    if not lost:
        return
    shown = ", ".join(lost[:5]) + (", ..." if len(lost) > 5 else "")
    held = f"{len(known)} other trial(s)" if known else "no trial"
    raise UserError(
        f"{path} has {len(lost)} row(s) of trial {shown} that storage {label} does not hold "
        f"(it holds {held} of study {study}), and rebuilding the CSV would drop them: pass "
        "--storage with the storage that wrote them, move the CSV aside, or pass --study NEW_NAME"
    )


def write_leaderboard(
    path: Path,
    records: Iterable[dict[str, Any]],
    recipes: dict[str, str] | None = None,
    cache: dict[tuple[int, str, str], str] | None = None,
    *,
    skip_unchanged: bool = False,
) -> int:
    """Rewrite the leaderboard from record dicts (`TrialRecord.to_dict()`), sorted by trial;
    `recipes` maps trial numbers (text) to recipe paths. `cache` keeps the formatted line of
    each (trial, recipe) between calls (a finished record never changes), so rebuilding after
    each trial formats only the new ones. Returns the number of rows; with `skip_unchanged`, a
    file that already holds that text is left as it is (not even its time touched) and 0 is
    returned."""
    recipes = recipes or {}
    cache = {} if cache is None else cache
    records = list(records)
    split = any(is_split(d) for d in records)  # then every row has the placement column
    cols, key = (FULL_COLUMNS, SPLIT_COLUMNS_KEY) if split else (COLOCATED_COLUMNS, COLUMNS_KEY)
    lines: list[tuple[int, str]] = []
    for d in records:
        n = int(d["trial"])
        recipe = recipes.get(str(n), "")
        line = cache.get((n, recipe, key))
        if line is None and not recipe:
            got = d.get(LINE_KEY)
            if isinstance(got, list) and len(got) == 2 and got[0] == key:
                line = cache[(n, recipe, key)] = got[1]
        if line is None:
            line = cache[(n, recipe, key)] = record_line(d, recipe, cols)
        lines.append((n, line))
    lines.sort(key=lambda x: x[0])
    text = ",".join(cols) + "\n" + "".join(line for _, line in lines)
    with locked(path):  # every writer of a leaderboard holds it (results.locked)
        remove_leftovers(path)
        if skip_unchanged and _holds(path, text):
            return 0
        write_atomic(path, text)
    return len(lines)


def _holds(path: Path, text: str) -> bool:
    try:
        return path.read_bytes() == text.encode()
    except OSError:
        return False
