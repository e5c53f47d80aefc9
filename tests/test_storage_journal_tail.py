"""A journal file whose last line a write cut short (the disk full, a file-size limit): the
next run keeps every complete entry, sets the cut line aside beside the journal, says where,
and goes on (it appended after the cut line: a JSONDecodeError, then the file refused)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import optuna

from tuner.results import read_raw
from tuner.study.storage import TORN_SUFFIX, open_storage, set_aside_torn_tail

TUNE = [sys.executable, "-m", "tuner.cli", "--model", "qwen2.5-7b", "--gpus", "8", "--no-progress"]
TUNE += ["--no-warm-start"]  # the estimator's warm start enqueues its search's best, ~100 KB
STUDY = "qwen2.5-7b-h100x8-estimate"
LIMIT = 40_000
"""A file-size limit the journal reaches within a few dozen estimated trials; the CSV and the
recipes stay far below it."""


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def _trials(journal: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=STUDY, storage=open_storage(str(journal))).trials


def test_a_journal_cut_by_a_full_disk_resumes_with_every_complete_entry(workdir: Path) -> None:
    journal = Path("results/s.log")
    cut = subprocess.run(
        [*TUNE, "--storage", str(journal), "--trials", "1000"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_file_size,  # writes past LIMIT fail (EFBIG), as on a full disk
    )
    assert cut.returncode == 2, cut.stderr[-2000:]
    assert cut.stderr.splitlines()[-1].startswith("tune: error:"), cut.stderr
    data = journal.read_bytes()
    set_aside = set(journal.parent.glob(f"s.log{TORN_SUFFIX}*"))
    # the last line was cut at LIMIT; the cut run's own exit may already have set it aside
    assert len(data) == LIMIT or (data.endswith(b"\n") and len(set_aside) == 1)
    whole = data[: data.rindex(b"\n") + 1]
    before = {t.number: (t.state, t.params) for t in _trials(journal) if t.state.is_finished()}
    assert len(before) > 2

    done = subprocess.run(
        [*TUNE, "--storage", str(journal), "--trials", str(len(before) + 3)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # each cut line set aside once, by the run that found it (the cut run's own exit may cut
    # another line at the limit while it records its end, which the next run sets aside)
    asides = sorted(journal.parent.glob(f"s.log{TORN_SUFFIX}*"))
    assert asides
    for aside in asides:
        offset = int(aside.name[len("s.log" + TORN_SUFFIX) :].split("-")[0])  # where it began
        assert offset + len(aside.read_bytes()) == LIMIT  # the cut line, as it was written
    said = [ln for ln in (cut.stderr + done.stderr).splitlines() if "cut short" in ln]
    assert len(said) == len(asides)
    assert all(any(str(a.resolve()) in ln for ln in said) for a in asides)
    after = journal.read_bytes()
    assert after.startswith(whole)  # every complete entry kept, as it was
    trials = _trials(journal)
    assert {t.number: (t.state, t.params) for t in trials if t.number in before} == before
    rows = read_raw(Path("results") / f"{STUDY}.csv")
    assert sorted(int(r["trial"]) for r in rows) == [
        t.number for t in trials if t.state.is_finished()
    ]
    # the journal reads whole from now on: a third run goes on, nothing more set aside
    again = subprocess.run(
        [*TUNE, "--storage", str(journal), "--trials", str(len(before) + 5)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert "cut short" not in again.stderr
    assert sorted(journal.parent.glob(f"s.log{TORN_SUFFIX}*")) == asides


def test_a_cut_line_is_set_aside_only_when_there_is_one(workdir: Path) -> None:
    """A journal ending with a whole line is left as it is; a cut line at the same offset as
    one set aside before gets a file of its own (the first is kept)."""
    journal = workdir / "j.log"
    optuna.create_study(study_name="s", storage=open_storage(str(journal)))
    whole = journal.read_bytes()
    assert set_aside_torn_tail(journal) is None and journal.read_bytes() == whole
    firsts = []
    for cut in (b'{"op_code": 4, "wor', b'{"op_'):
        journal.write_bytes(whole + cut)
        aside = set_aside_torn_tail(journal)
        assert aside is not None and aside.read_bytes() == cut
        assert journal.read_bytes() == whole
        firsts.append(aside)
    assert firsts[0] != firsts[1] and firsts[0].read_bytes() == b'{"op_code": 4, "wor'
