"""`tune reread`: when the verl log parser learns a metric, the finished rows it missed are filled
from their own trials' logs, as measured by verl and read by the current parser.

For each finished trial whose record is `ok` from the verl runner, the measured fields
(`verl_log.FIELDS`) its record has empty are read from the trial's folder
(`<results>/<study>/trials/<n>/`, where the runner keeps it): verl's metrics file, else the
console lines of its log (`verl.log`, `verl.log.gz`, or `verl.log.tail`, the last part a packed
folder keeps), at the step the row reports. The log must be that row's run: its throughput at
that step is the row's. A value the record holds is never replaced.

Optuna keeps a finished trial's user attrs as they were, so the values go into the study's user
attrs (`storage.REREAD_ATTR`, with the log and the parser that read them), which every reader of
a stored record lays over it (`storage.stored_record`); then the CSV view is rebuilt from the
storage, as the study loop rebuilds it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from tuner.errors import UserError
from tuner.results import Status, TrialRecord
from tuner.runners import verl_log
from tuner.study.csv_view import write_leaderboard
from tuner.study.storage import (
    FINISHED,
    RECIPES_ATTR,
    REREAD_ATTR,
    close_storage,
    open_storage,
    reread_overlay,
    stored_record,
    study_lock,
)

LOG_NAMES = ("verl.log", "verl.log.gz", "verl.log.tail")
"""A trial's verl log as the runner writes it (`runners.verl.LOG_NAME`), gzipped after the
study (scripts/gpu_verl_study.sh `pack`), or its last part (scripts/gpu_pack.sh `trim_logs`)."""
THROUGHPUT_REL_TOL = 1e-6
"""How close the log's throughput at the row's step must be to the row's to be its run (a
record keeps verl's number as logged; the console prints it in full)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Fill:
    """What one trial's log gave: the values filled, or why none."""

    trial: int
    values: dict[str, float]
    """Measured field -> value, only fields the record had empty."""
    source: str = ""
    """The log read, relative to the results folder."""
    why: str = ""
    """Why nothing was filled ('' when something was)."""

    def line(self) -> str:
        if self.values:
            shown = ", ".join(f"{k}={v:.6g}" for k, v in self.values.items())
            return f"trial {self.trial}: filled {shown} from {self.source}"
        return f"trial {self.trial}: {self.why}"


def parser_tag() -> str:
    """What read the values: the package's version and the git blob of verl_log.py
    (`git log --find-object=<blob>` names the commits that had that parser)."""
    from importlib import metadata

    src = Path(verl_log.__file__).read_bytes()
    blob = hashlib.sha1(b"blob %d\0" % len(src) + src, usedforsecurity=False).hexdigest()
    try:
        version = metadata.version("verl-tuner")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return f"verl-tuner {version}, tuner/runners/verl_log.py blob {blob[:12]}"


def reread(name: str, results_dir: Path, storage: str | None = None) -> list[str]:
    """Fill the empty measured fields of study `name`'s ok verl rows from their trials' logs;
    one line per such trial and a last one on what changed. UserError (nothing written) for a
    results folder that is not there, a study no storage holds, or one without ok verl rows."""
    if not results_dir.is_dir():
        raise UserError(
            f"--results-dir {results_dir} is not a folder: pass the folder holding {name}.csv "
            f"and {name}/trials/"
        )
    url, store = _open(name, results_dir, storage)
    try:
        with study_lock(url, name):  # as a worker asks: one reread or ask at a time
            return _reread(name, results_dir, url, store)
    finally:
        close_storage(store)


def _reread(name: str, results_dir: Path, url: str, store: Any) -> list[str]:
    study = optuna.load_study(study_name=name, storage=store)
    csv_path = results_dir / f"{name}.csv"
    kept = _rows_without_record(csv_path, name)
    overlay = reread_overlay(study)
    trials = study.get_trials(deepcopy=False, states=FINISHED)
    targets = []
    for t in trials:
        d = stored_record(t, overlay)
        if d is not None and d.get("status") == Status.OK.value and d.get("runner") == "verl":
            targets.append((t.number, d))
    if not targets:
        raise UserError(
            f"study {name} in {url} has no ok row of the verl runner: tune reread reads the "
            "logs verl wrote; pass --study with a study run with --runner verl"
        )
    parser = parser_tag()
    fills = [_fill(n, d, results_dir, name) for n, d in targets]
    lines = [f.line() for f in fills]
    done = [f for f in fills if f.values]
    new = {k: list(v) for k, v in overlay.items()}
    for f in done:
        new.setdefault(str(f.trial), []).append(
            {"fields": f.values, "from": f.source, "parser": parser}
        )
    if done:
        study.set_user_attr(REREAD_ATTR, new)  # the storage first: the CSV is its view
    if not new:
        return [*lines, f"study {name}: nothing filled; no file changed"]
    recs: list[dict[str, Any]] = []
    for t in trials:
        d = stored_record(t, new)
        if d is not None:
            recs.append(d)
        elif t.number in kept:
            recs.append(kept[t.number])
    got = study.user_attrs.get(RECIPES_ATTR)
    recipes = got if isinstance(got, dict) else None
    # also with nothing new: a CSV left behind by an earlier reread (its write failed) catches up
    wrote = write_leaderboard(csv_path, recs, recipes, skip_unchanged=True)
    view = f"leaderboard {csv_path} {'rebuilt' if wrote else 'unchanged'}"
    if not done:
        return [*lines, f"study {name}: nothing filled; {view}"]
    n_values = sum(len(f.values) for f in done)
    return [
        *lines,
        f"study {name}: {n_values} values filled in {len(done)} trials (kept in {url}, study "
        f"user attr {REREAD_ATTR!r}); {view}",
    ]


def _fill(number: int, d: dict[str, Any], results_dir: Path, name: str) -> Fill:
    """The values trial `number`'s log gives for the measured fields its record `d` lacks."""
    empty = [f for f in verl_log.FIELDS if d.get(f) is None]
    if not empty:
        return Fill(trial=number, values={}, why="nothing to fill")
    empty_text = ", ".join(empty)
    folder = results_dir / name / "trials" / str(number)
    extra = d.get("extra")
    step = extra.get("step") if isinstance(extra, dict) else None
    if not isinstance(step, int) or step < 1:
        step = verl_log.MEASURED_STEP  # the step the row reports, as the runner recorded it
    count = extra.get("measured_steps") if isinstance(extra, dict) else None
    if not isinstance(count, int) or count < 1:
        count = 1  # rows before several steps were measured report one
    # a row that kept verl's own figure apart has the project's throughput, over the study's
    # GPUs (verl_log.throughput); one recorded before that has verl's, which it is checked with
    ours_kept = isinstance(extra, dict) and verl_log.VERL_THROUGHPUT in extra
    gpus = d.get("num_gpus") if ours_kept and isinstance(d.get("num_gpus"), int) else None
    found = [p for p in _logs(folder) if p.is_file()]
    if not found:
        return Fill(
            trial=number,
            values={},
            why=f"nothing filled: {empty_text} empty, no verl log in {folder}",
        )
    why = ""
    for path in found:
        got = verl_log.measures(_steps(path), step, last=step + count - 1, num_gpus=gpus)
        rel = path.relative_to(results_dir).as_posix()
        if got is None:
            why = why or f"nothing filled: {rel} holds no step-{step} metrics"
            continue
        theirs, ours = got.fields.get("tokens_per_s_per_gpu"), d.get("tokens_per_s_per_gpu")
        if (
            isinstance(ours, int | float)
            and theirs is not None
            and not math.isclose(theirs, ours, rel_tol=THROUGHPUT_REL_TOL)
        ):
            why = (
                f"nothing filled: {rel} is another run (step-{step} throughput {theirs:.6g}, "
                f"the row's {ours:.6g})"
            )
            continue
        values = {f: got.fields[f] for f in empty if f in got.fields}
        if not values:
            return Fill(
                trial=number,
                values={},
                why=f"nothing filled: {empty_text} empty, not in {rel} either",
            )
        return Fill(trial=number, values=values, source=rel)
    return Fill(trial=number, values={}, why=why)


def _logs(folder: Path) -> list[Path]:
    """The files of a trial's folder its metrics may be read from, in the runner's order:
    verl's metrics file (`verl_command.metrics_path`), then the log's console lines."""
    from tuner.verl_command import PROJECT

    metrics = sorted((folder / PROJECT).glob("*.jsonl")) if (folder / PROJECT).is_dir() else []
    return [*metrics, *(folder / n for n in LOG_NAMES)]


def _steps(path: Path) -> dict[int, dict[str, float]]:
    """Step -> metrics of a metrics file or a log (its last `LOG_TAIL_BYTES`, as the runner
    reads a log's console lines)."""
    from tuner.runners.verl import log_text_tail

    if path.suffix == ".jsonl":
        return verl_log.read_jsonl(path)
    return verl_log.read_console(log_text_tail(path))


def _rows_without_record(csv_path: Path, name: str) -> dict[int, dict[str, Any]]:
    """The leaderboard's rows by trial, as records (for trials the storage keeps no record of:
    legacy and interrupted rows, kept as they are); UserError if the file is not a leaderboard
    of study `name` only."""
    try:
        text = csv_path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError:
        text = ""
    try:
        cells = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error:
        cells = []
    header = cells[0] if cells else []
    if "schema_version" not in header or "study" not in header:
        raise UserError(
            f"{csv_path} is not a verl-tuner leaderboard; tune reread would overwrite it: move "
            "it aside or pass --results-dir with the study's folder"
        )
    out: dict[int, dict[str, Any]] = {}
    for row in (dict(zip(header, c, strict=False)) for c in cells[1:] if c):
        if row.get("study") != name:
            raise UserError(
                f"{csv_path} holds rows of study {row.get('study')!r}, not only of {name}: "
                "pass --results-dir with the study's folder"
            )
        try:
            rec = TrialRecord.from_row(row)
        except (ValueError, TypeError):
            continue
        out[rec.trial] = {**rec.to_dict(), "storage": row.get("storage", "")}
    return out


def _open(name: str, results_dir: Path, storage: str | None) -> tuple[str, Any]:
    """(url, the opened storage) of the one holding study `name`: --storage, else
    `<results>/<name>.sqlite3` (the committed studies' name), else `<results>/studies.sqlite3`
    (tune run's default); a file that is not there is not opened (Optuna would create it)."""
    if storage:
        where = [storage]
        path = None if "://" in storage else Path(storage)
        if path is not None and not path.is_file():
            raise UserError(f"--storage {storage}: no such file: pass the study's storage")
    else:
        files = [results_dir / f"{name}.sqlite3", results_dir / "studies.sqlite3"]
        where = [str(p) for p in files if p.is_file()]
        if not where:
            there = sorted(p.name for p in results_dir.glob("*.sqlite3"))
            held = f"; it holds {', '.join(there)}" if there else ""
            raise UserError(
                f"no storage of study {name!r} in {results_dir} (neither {files[0].name} nor "
                f"{files[1].name}{held}): pass --study with the study's name, --results-dir "
                "with its folder, or --storage"
            )
    others: list[str] = []
    for url in where:
        store = open_storage(url)
        names = [s.study_name for s in store.get_all_studies()]
        if name in names:
            return url, store
        others += names
        close_storage(store)
    if others:
        fix = f"pass --study with one of {', '.join(sorted(set(others)))}, or --storage"
    else:
        fix = "it holds no study: pass --storage"
    raise UserError(f"no study {name!r} in {' or '.join(where)}: {fix} with the study's storage")
