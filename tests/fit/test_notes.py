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


def test_the_test_copies_exclude_what_results_excludes() -> None:
    """tests/data/memory holds copies of results/ leaderboards: their notes agree."""
    for copy in sorted((DATA / "memory").glob("*.csv")):
        assert excluded_rows([copy]) == excluded_rows([REPO / "results" / copy.name])
    assert excluded_rows([DATA / "memory" / "moe8k-h200-x2.csv"])
