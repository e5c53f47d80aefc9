"""The reference rows as validate scores them: what each ran, where its mean response comes from,
and the log-prob goal."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.fit.notes import notes_for
from tuner.fit.validate import (
    anchor_paths,
    case_from_row,
    load_cases,
    mfu_response_bound,
    reported_response_mean,
    validate,
)
from tuner.results import read_rows

LOG_PROB_TARGET = 0.15
"""scripts/validate_estimator.py TARGET: the median error goal of each phase on the anchors."""


def test_rows_published_before_verls_megatron_fused_kernels_ran_full_logits(
    anchors: Path,
) -> None:
    """verl's megatron backend got fused log-prob kernels on 2025-07-11 (PR #2210): the dapo7b
    H100 rows and dapo_moe30b rows 3-9 were published before and computed the full logits
    whatever their recipe said; the later rows ran the fused kernel."""
    cases = {c.label: c.candidate for c in load_cases(anchor_paths(anchors))}
    full = {label for label, c in cases.items() if not c.use_fused_kernels}
    dapo7b = {3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16, 17, 18}  # the megatron rows of 3-18
    assert full == {f"dapo7b:{n}" for n in dapo7b} | {f"dapo_moe30b:{n}" for n in range(3, 10)}
    assert cases["dapo7b:19"].use_fused_kernels and cases["dapo_moe30b:10"].use_fused_kernels


def test_the_update_mfu_bounds_the_mean_response_from_above(anchors: Path) -> None:
    """verl's MFU divides the step's FLOPs by update_policy's time, part of what update_actor
    times: the mean it implies with the whole update_actor time is at least the true one. The
    grpo rows, whose throughput gives their true mean, check it."""
    path = anchors / "grpo_qwen2.5_7b.csv"
    rows = read_rows(path)
    mean = reported_response_mean(rows)
    assert 450 < mean < 550
    bounds = []
    for row in rows:
        case = case_from_row(row, mean, notes_for(path))
        if case is not None and case.status == "ok":
            bounds.append(mfu_response_bound(row, case))
    assert len(bounds) == 9
    assert all(mean <= b < 2 * mean for b in bounds), bounds


def test_a_dapo_row_keeps_the_default_mean_and_says_what_its_mfu_allows(anchors: Path) -> None:
    """The dapo files give no token counts: the default mean stands, and the note says so with
    the bound the row's MFU puts on it. A row without an MFU has no bound."""
    path = anchors / "dapo7b.csv"
    rows = {r["trial"]: r for r in read_rows(path)}
    case = case_from_row(rows["5"], notes=notes_for(path))
    assert case is not None and case.workload.response_mean == 0
    bound = mfu_response_bound(rows["5"], case)
    assert 1100 < bound < 1400
    assert case.notes.startswith("response mean 1229: default, no token counts")
    assert f"<= {bound}" in case.notes
    assert mfu_response_bound({**rows["5"], "verl_mfu_actor_pct": ""}, case) == 0
    # a higher MFU over the same time means more FLOPs, hence a longer mean
    more = mfu_response_bound({**rows["5"], "verl_mfu_actor_pct": "40"}, case)
    assert more > bound


def test_the_reference_log_prob_phase_meets_its_target(anchors: Path) -> None:
    """Median error of old_log_prob over the anchors' rows: 15.8% while every row was scored
    with verl's fused kernel and the full-logits path cost 10 bytes per logit."""
    summary = validate(load_cases(anchor_paths(anchors)))
    assert summary.median_ape["old_log_prob"] <= LOG_PROB_TARGET, summary.median_ape
    assert summary.ok_fit == summary.ok_rows
    assert summary.oom_caught == summary.oom_rows


@pytest.mark.parametrize("trial", ["5", "12", "16"])
def test_full_logits_rows_are_no_longer_under_predicted(anchors: Path, trial: str) -> None:
    """dapo7b rows on one H100 node that ran the full logits: 0.82-0.94x of their measured
    log-prob when scored as fused; within 10% once scored as they ran."""
    path = anchors / "dapo7b.csv"
    rows = {r["trial"]: r for r in read_rows(path)}
    summary = validate([c for c in [case_from_row(rows[trial], notes=notes_for(path))] if c])
    (o,) = summary.outcomes
    ratio = o.estimate.old_log_prob_s / o.case.measured["old_log_prob"]
    assert 0.9 < ratio < 1.1
