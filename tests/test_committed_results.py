"""The committed leaderboards (results/*.csv) are usable from any folder, as a user of a fresh
clone runs them: their rows name the models by a path relative to the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.cli import main

REPO = Path(__file__).resolve().parents[1]
BY_PATH = [
    p for p in sorted((REPO / "results").glob("*.csv")) if "scripts/models/" in p.read_text()
]


def test_some_committed_leaderboard_names_its_model_by_a_path() -> None:
    assert BY_PATH


@pytest.mark.parametrize("csv_path", BY_PATH, ids=lambda p: p.stem)
def test_export_and_calibrate_a_committed_leaderboard_from_another_folder(
    csv_path: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if ",ok," not in csv_path.read_text():  # a leaderboard begun but with no ok row yet
        assert main(["export", str(csv_path), "--trial", "0", "--recipes-dir", "recipes"]) == 0
        assert list((workdir / "recipes").rglob("*.sh"))
        return
    assert main(["export", str(csv_path), "--rank", "1", "--recipes-dir", "recipes"]) == 0
    assert list((workdir / "recipes").rglob("*.sh"))
    capsys.readouterr()
    code = main(["calibrate", str(csv_path), "--out", "cal.json"])
    if code == 2:  # its rows were read (the model found), but too few to fit (issue 30)
        assert "measured row(s) give" in capsys.readouterr().err
        assert not (workdir / "cal.json").exists()
        return
    assert code == 0
    assert (workdir / "cal.json").is_file()
    capsys.readouterr()


ALL_CSV = sorted((REPO / "results").glob("*.csv"))


def throughput_check(row: dict[str, str]) -> tuple[float, float] | None:
    """(the row's tokens/s/GPU, its tokens over its time and every GPU of the study) of an ok
    row: verl's own token count of the measured steps (`total_num_tokens` in extra) where verl
    logged one, else the workload's tokens per step as the cost model counts them; the time
    is the step where the row has one, else the phases its scope covers (scope.scope_of).
    None for a row with no throughput."""
    from tuner.estimate import estimate
    from tuner.fit.validate import row_setup
    from tuner.results import number, parse_extra
    from tuner.results.scope import scope_of

    tps = number(row.get("tokens_per_s_per_gpu"))
    if row.get("status") != "ok" or not tps:
        return None
    extra = parse_extra(row.get("extra", ""))
    tokens = number(extra.get("total_num_tokens"))
    if tokens is None:
        m, cl, w, c = row_setup(row)
        tokens = estimate(c, m, cl, w).tokens_per_step
    time = number(row.get("step_s"))
    if not time:
        time = sum(number(row.get(k)) or 0.0 for k in ("old_log_prob_s", "ref_s", "update_actor_s"))
        if scope_of(row.get("source") or "", extra).startswith("gen"):
            time += number(row.get("generation_s")) or 0.0
    return tps, tokens / time / int(row["num_gpus"])


@pytest.mark.parametrize("csv_path", ALL_CSV, ids=lambda p: p.stem)
def test_every_committed_rows_throughput_is_its_tokens_over_its_time_and_all_its_gpus(
    csv_path: Path,
) -> None:
    """Issue 35: a leaderboard's tokens/s/GPU is the project's own figure, tokens over the time
    and every GPU the study used, whatever the runner and placement (a split row once carried
    verl's figure, over its trainer pool alone: twice the truth on 2 + 2 GPUs)."""
    from tuner.results import read_raw

    checked = 0
    for row in read_raw(csv_path):
        got = throughput_check(row)
        if got is None:
            continue
        ours, want = got
        assert ours == pytest.approx(want, rel=0.005), f"trial {row['trial']}"
        checked += 1
    assert checked or ",ok," not in csv_path.read_text()


def test_the_check_catches_a_split_row_that_kept_verls_figure() -> None:
    row = {
        "status": "ok",
        "tokens_per_s_per_gpu": "6168",  # verl's: 262144 tokens / 21.25 s / 2 trainer GPUs
        "step_s": "21.25",
        "num_gpus": "4",
        "extra": "total_num_tokens=262144",
    }
    got = throughput_check(row)
    assert got is not None and got[1] == pytest.approx(262144 / 21.25 / 4)
    assert got[0] != pytest.approx(got[1], rel=0.005)
