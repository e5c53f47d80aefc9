"""The trial records a storage keeps, the study's source of truth (the CSV is a view of them):
the whole `TrialRecord` in a trial's user attrs (`RECORD_ATTR`), with the values `tune reread`
filled later laid over it (`REREAD_ATTR`, a study user attr: Optuna keeps a finished trial's
user attrs as they were); and what Optuna is told of a result (`told`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import optuna

from tuner.errors import UserError
from tuner.results import Status, TrialRecord, TrialResult
from tuner.results.lines import LINE_KEY, line_entry

RECORD_ATTR = "record"
"""The trial user attr holding the TrialRecord (`to_dict()`, JSON)."""
RECIPES_ATTR = "recipes"
"""Study user attr: {trial number: recipe path} of the recipes written for the best rows."""
REREAD_ATTR = "reread"
"""Study user attr: the measured values `tune reread` read later from finished trials' own logs
(Optuna keeps a finished trial's user attrs as they were): {trial number: [{"fields": {field:
value}, "from": the log, relative to the results folder, "parser": what read it}, ...]}, one
entry per reread that filled something. `stored_record` lays them over the trial's record."""
REREAD_EXTRA = "reread"
"""`extra` key of a record with values filled by `tune reread`: their fields, comma-separated."""
FINISHED = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
    optuna.trial.TrialState.FAIL,
)
"""The states of a trial that ended (with a record, or interrupted)."""
NOT_COUNTED = frozenset({Status.PRUNED_INVALID, Status.PRUNED_OOM, Status.INTERRUPTED})
"""Statuses that do not count against --trials: nothing was launched, or it was cut off."""


def reread_overlay(study: optuna.Study) -> dict[str, Any]:
    """The study's values filled by `tune reread` (`REREAD_ATTR`), by trial number (text)."""
    got = study.user_attrs.get(REREAD_ATTR)
    return got if isinstance(got, dict) else {}


def stored_record(
    t: optuna.trial.FrozenTrial, overlay: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The record dict the trial keeps (`RECORD_ATTR`, `TrialRecord.to_dict()`), with the values
    `tune reread` read later from its own log (`overlay`: the study's `reread_overlay`) where
    the record has none; a value the record holds is never replaced. Such a record names the
    filled fields in its `extra` (`REREAD_EXTRA`) and loses its formatted CSV line, which
    predates them. None when the trial keeps no record. Every reader of a stored record reads
    it through here."""
    d = t.user_attrs.get(RECORD_ATTR)
    if not isinstance(d, dict):
        return None
    number = d.get("trial")
    whole = isinstance(number, int) or (isinstance(number, str) and number.isdecimal())
    if number is not None and (isinstance(number, bool) or not whole or not str(number).isascii()):
        raise UserError(
            f"trial {t.number} of the study's storage keeps a damaged record (its trial is "
            f"{json.dumps(number)[:40]}, not a whole number): restore the storage from a copy, "
            "or pass --study NEW_NAME (and --storage with a new file)"
        )
    fills = (overlay or {}).get(str(t.number))
    if not isinstance(fills, list):
        return d
    out = {k: v for k, v in d.items() if k != LINE_KEY}
    filled: list[str] = []
    for fill in fills:
        values = fill.get("fields") if isinstance(fill, dict) else None
        for k, v in (values or {}).items():
            if out.get(k) is None and v is not None:
                out[k] = v
                filled.append(k)
    if not filled:
        return d
    extra = out.get("extra")
    out["extra"] = {**(extra if isinstance(extra, dict) else {}), REREAD_EXTRA: ",".join(filled)}
    return out


def record_of(
    t: optuna.trial.FrozenTrial, overlay: Mapping[str, Any] | None = None
) -> TrialRecord | None:
    """The trial's record (`stored_record`: with the values `tune reread` filled), or None."""
    d = stored_record(t, overlay)
    if d is None:
        return None
    try:
        return TrialRecord.from_dict(d)
    except ValueError:
        return None


def store_record(trial: optuna.Trial, rec: TrialRecord) -> None:
    """Keep the whole record in the trial's user attrs, with the few attrs users filter on."""
    d = rec.to_dict()
    trial.set_user_attr(RECORD_ATTR, {**d, LINE_KEY: line_entry(d)})
    for k in ("status", "reason", "train_parallel", "source"):
        trial.set_user_attr(k, str(getattr(rec, k)))


def state_for(status: Status) -> optuna.trial.TrialState:
    """Optuna's state of a trial that ended with `status`."""
    if status is Status.OK:
        return optuna.trial.TrialState.COMPLETE
    if status in (Status.PRUNED_INVALID, Status.PRUNED_OOM, Status.PRUNED_SLOW):
        return optuna.trial.TrialState.PRUNED
    return optuna.trial.TrialState.FAIL


def told(res: TrialResult) -> tuple[float | None, optuna.trial.TrialState]:
    """What Optuna is told of a trial that gave `res`: its value and state (an ok result
    without a value is a failure)."""
    state = state_for(res.status)
    value = res.value if state is optuna.trial.TrialState.COMPLETE else None
    if state is optuna.trial.TrialState.COMPLETE and value is None:
        state = optuna.trial.TrialState.FAIL
    return value, state
