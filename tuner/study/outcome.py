"""What a study leaves when its loop ends: its best rows (whole-step rows first, each candidate
once), their recipes (written, and named in the study's `recipes` attr), and the summary the
command prints (trials, time by part, GPU-hours by rung)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import optuna

from tuner import recipes
from tuner.results import Status, TrialRecord, number, rank, row_of
from tuner.results.scope import WHOLE_STEP, scope_of
from tuner.runners import pinned_knobs
from tuner.space import Candidate
from tuner.study.request import StudySummary, TuneRequest
from tuner.study.storage import RECIPES_ATTR
from tuner.verl_settings import VerlSettings


class Finished(Protocol):
    """What the end of a study reads of it (the loop's study): the Optuna study and its records
    by trial number."""

    @property
    def study(self) -> optuna.Study: ...

    @property
    def records(self) -> Mapping[int, TrialRecord]: ...


def summary_of(
    req: TuneRequest,
    s: Finished,
    *,
    trials_run: int,
    trials_total: int,
    resumed_from: int,
    recipe_paths: list[Path],
    pruned_before_launch: int,
    notes: list[str],
) -> StudySummary:
    """The summary of study `s` after this worker's loop: its counts as the loop kept them, the
    best rows, and where this study's own trials spent their time."""
    own = [r for r in s.records.values() if r.study == req.name]
    measured = sum(r.measured_s or 0.0 for r in own)
    launch = sum(r.launch_s or 0.0 for r in own)
    total = sum(r.duration_s or 0.0 for r in own)
    # extra holds numbers in a live record, text in one read back
    warmup = sum(
        max(0.0, number(str(r.extra.get("warmup_s", ""))) or 0.0) for r in own if r.measured_s
    )
    unmeasured = sum(r.duration_s or 0.0 for r in own if not r.measured_s)
    return StudySummary(
        name=req.name,
        csv_path=req.csv_path,
        storage=req.storage_url,
        trials_run=trials_run,
        trials_total=trials_total,
        resumed_from=resumed_from,
        best_rows=ok_rows(s)[: max(req.recipes, 3)],
        recipe_paths=recipe_paths,
        pruned_before_launch=pruned_before_launch,
        measured_s=measured,
        launch_s=launch,
        warmup_s=warmup,
        unmeasured_s=unmeasured,
        gpu_hours=gpu_hours_by_source(own),
        other_s=max(0.0, total - measured - launch - warmup - unmeasured),
        notes=tuple(notes),
    )


def gpu_hours_by_source(records: list[TrialRecord]) -> tuple[tuple[str, float], ...]:
    """GPU-hours the study's trials held, by the rung that measured them (`source`: megatron,
    verl; the estimator's and the tuner's rows hold no GPU), largest first."""
    hours: dict[str, float] = {}
    for r in records:
        if r.source in ("", "estimate", "tuner") or not r.duration_s:
            continue
        hours[r.source] = hours.get(r.source, 0.0) + r.duration_s * r.num_gpus / 3600
    return tuple(sorted(hours.items(), key=lambda kv: -kv[1]))


def ok_rows(s: Finished) -> list[dict[str, str]]:
    """The ok rows, the fastest first, each candidate once (a repeat's copied result is not a
    second best row: recipes.distinct). Where the study has whole-step rows (verl's) beside
    rows of a partial scope (the fidelity ladder's screens), the whole-step rows rank first:
    a partial step's throughput is never set above a whole one's."""
    got = s.study.user_attrs.get(RECIPES_ATTR)
    recipes_by_trial = got if isinstance(got, dict) else {}
    rows = []
    for r in s.records.values():
        if r.status is Status.OK:
            row = row_of(r.to_dict())
            row["recipe"] = recipes_by_trial.get(row["trial"], row["recipe"])
            rows.append(row)
    ranked = rank(rows, status="ok")
    whole = [r for r in ranked if scope_of(r["source"], r.get("extra", "")) == WHOLE_STEP]
    if whole:
        ranked = whole + [r for r in ranked if all(r is not w for w in whole)]
    return recipes.distinct(ranked)


def write_best_recipes(req: TuneRequest, s: Finished) -> list[Path]:
    """Recipes for the best finished rows; their paths go into the study's `recipes` attr and
    so into the rows' `recipe` column."""
    paths: list[Path] = []
    got = s.study.user_attrs.get(RECIPES_ATTR)
    by_trial: dict[str, str] = dict(got) if isinstance(got, dict) else {}
    for row in ok_rows(s)[: req.recipes]:
        c = Candidate.from_record(row, req.cluster.num_gpus)
        recipe = recipes.render(
            c,
            req.model,
            req.cluster,
            req.workload,
            origin=recipes.origin_of(req.csv_path, row),
            settings=VerlSettings.from_record(row),
            pinned=pinned_knobs(row["source"], row.get("extra", "")),
            runner=row["source"],
            drawn=recipes.drawn_responses(row.get("extra", "")),
        )
        path = recipes.write(
            recipe,
            recipes.model_folder(req.recipes_dir, req.model.name),
            suffix=recipes.suffix_of(req.name, row["trial"]),
            owner=recipes.owner_of(req.csv_path, row),
        )
        by_trial[row["trial"]] = str(path)
        paths.append(path)
    if by_trial != got:
        s.study.set_user_attr(RECIPES_ATTR, by_trial)
    return paths
