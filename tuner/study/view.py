"""The CSV leaderboard as a view of the storage: rebuilt atomically from the trial records,
checked on start (a damaged file is set aside, another storage's file is refused)."""

from __future__ import annotations

import csv
import datetime as dt
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.fileio import write_atomic
from tuner.results import TrialRecord, csv_text, locked, row_of


def _damage(text: str) -> tuple[list[str], list[dict[str, str]], str]:
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
    return header, [dict(zip(header, cells, strict=True)) for cells in lines[1:]], ""


def check_leaderboard(
    path: Path, study: str, label: str
) -> tuple[dict[int, TrialRecord], list[str]]:
    """Check the leaderboard a study is about to rebuild.

    Returns (schema-1 records by trial, carried over where the storage has no record of their
    trial, and notes for stderr). A damaged file (torn, truncated, not CSV) is moved aside to
    `<name>.damaged-<UTC time>`; the view is rebuilt from the storage. A file another storage
    made, or one with another study's rows, or one that is not a verl-tuner leaderboard is
    refused (UserError), never overwritten."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, []
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        header, rows, why = [], [], "it is not UTF-8 text"
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
    for r in rows:
        other = r.get("storage", "")
        if other and other != label:
            raise UserError(
                f"{path} was written by storage {other}, not by {label}: pass --storage "
                f"{other.partition(':')[2] or other}, or --results-dir with another folder"
            )
        if r.get("study") != study:
            raise UserError(
                f"{path} holds rows of study {r.get('study')!r}, not only of {study}: "
                "pass --results-dir with another folder"
            )
        if not other:
            try:
                rec = TrialRecord.from_row(r)
            except (ValueError, TypeError):
                continue
            legacy[rec.trial] = rec
    return legacy, []


def write_leaderboard(
    path: Path, records: Iterable[dict[str, Any]], recipes: dict[str, str] | None = None
) -> int:
    """Rewrite the leaderboard from record dicts (`TrialRecord.to_dict()`), sorted by trial;
    `recipes` maps trial numbers (text) to recipe paths. Returns the number of rows."""
    recipes = recipes or {}
    rows = []
    for d in sorted(records, key=lambda d: int(d["trial"])):
        row = row_of(d)
        r = recipes.get(row["trial"])
        if r:
            row["recipe"] = r
        rows.append(row)
    with locked(path):
        write_atomic(path, csv_text(rows))
    return len(rows)
