"""The notes beside committed leaderboards: their format, and the copies agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import UserError
from tuner.fit.notes import NOTES_FILE, FileNotes, excluded_rows, notes_for

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"


def test_a_file_without_notes_has_none(tmp_path: Path) -> None:
    assert notes_for(tmp_path / "a.csv") == FileNotes()
    (tmp_path / NOTES_FILE).write_text('["b.csv"]\nmodel = "qwen2.5-7b"\n')
    assert notes_for(tmp_path / "a.csv") == FileNotes()
    assert notes_for(tmp_path / "b.csv").model == "qwen2.5-7b"


def test_the_anchors_notes_say_what_the_rows_leave_out() -> None:
    dapo = notes_for(DATA / "anchors" / "dapo7b.csv")
    assert dapo.model == "qwen2.5-7b" and not dapo.rope_fusion
    assert dapo.full_logits_trials == frozenset(range(3, 19))
    assert dapo.recipe_inputs["9"] == {"gpu_memory_utilization": 0.8}
    moe = notes_for(DATA / "anchors" / "dapo_moe30b.csv")
    assert moe.rope_fusion and moe.recipe_inputs["17"]["recompute"] == "full"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('["a.csv"\n', "not valid TOML"),
        ('["a.csv"]\nmodels = "x"\n', "unknown keys models"),
        ('["a.csv".recipe_inputs]\n3 = { n = 4 }\n', "may set only"),
    ],
)
def test_bad_notes_say_which_file_and_what(tmp_path: Path, text: str, match: str) -> None:
    (tmp_path / NOTES_FILE).write_text(text)
    with pytest.raises(UserError, match=match) as e:
        notes_for(tmp_path / "a.csv")
    assert NOTES_FILE in str(e.value)


def test_every_exclusion_names_a_row_of_its_file_and_the_copies_keep_theirs() -> None:
    """A note excludes a trial of its own file: it must name a row there. tests/data/memory holds
    the leaderboards as they were before the worker-pool fix (their two spoiled MoE rows
    excluded); results/ holds the re-made studies, whose trials 1 and 2 are other, healthy runs,
    so results/fit.toml must not exclude them (it did, dropping two good rows from every fit)."""
    import csv

    for folder in (DATA / "memory", REPO / "results"):
        for path in sorted(folder.glob("*.csv")):
            with path.open(newline="") as f:
                trials = {r["trial"] for r in csv.DictReader(f)}
            for key in excluded_rows([path]):
                assert key.rsplit(":", 1)[1] in trials, key
    assert set(excluded_rows([DATA / "memory" / "moe8k-h200-x2.csv"])) == {
        "moe8k-h200-x2.csv:1",
        "moe8k-h200-x2.csv:2",
    }
    assert not excluded_rows([REPO / "results" / "moe8k-h200-x2.csv"])
