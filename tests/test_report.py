"""`tune report`: one self-contained HTML page per study, its numbers checked against the CSV,
and the page opened in a real headless browser with the network off."""

from __future__ import annotations

import base64
import csv
import html
import re
import shutil
import statistics
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.report import SECTIONS

pytest.importorskip("matplotlib")

REPO = Path(__file__).resolve().parents[1]
DENSE = REPO / "results" / "dense-h200-x2.csv"
MOE = REPO / "results" / "moe-h200-x2.csv"
MEASURED = [REPO / "results" / f"{n}.csv" for n in
            ("dense8k-h200-x2", "moe8k-h200-x2", "small16k-h100-x1")]  # fmt: skip
VERL = REPO / "results" / "verl4k-h100-x1.csv"
NOT_LAUNCHED = {"pruned-invalid", "pruned-oom-predicted"}


def _raw(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _sections(page: str) -> dict[str, str]:
    return dict(re.findall(r'<section id="(\w+)">(.*?)</section>', page, flags=re.S))


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _attr(page: str, name: str) -> float:
    m = re.search(rf"{name}=[\"']([^\"']+)[\"']", page)
    assert m, name
    return float(m.group(1))


def _report(csv_path: Path, out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["report", str(csv_path), "-o", str(out), *extra]) == 0
    assert Path(capsys.readouterr().out.strip()) == out
    return out.read_text()


def _check_self_contained(page: str) -> None:
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched
    assert "<script" not in page
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert images and all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    assert 'class="dataframe t"' in page  # tables by pandas


@pytest.mark.parametrize("csv_path", [DENSE, MOE], ids=["dense", "moe"])
def test_report_of_a_measured_leaderboard(
    csv_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = _report(csv_path, tmp_path / "r.html", capsys)
    raw = _raw(csv_path)
    sec = _sections(page)
    assert list(sec) == [i for i, _ in SECTIONS]
    _check_self_contained(page)

    ok = [r for r in raw if r["status"] == "ok"]
    best = max(ok, key=lambda r: float(r["tokens_per_s_per_gpu"]))
    ref = max(
        (r for r in ok if "origin=reference" in r["extra"]),
        key=lambda r: float(r["tokens_per_s_per_gpu"]),
    )
    assert _attr(sec["answer"], "data-best-tokens-per-s-per-gpu") == pytest.approx(
        float(best["tokens_per_s_per_gpu"]), rel=1e-5
    )
    assert _attr(sec["answer"], "data-best-trial") == int(best["trial"])
    ratio = float(best["tokens_per_s_per_gpu"]) / float(ref["tokens_per_s_per_gpu"])
    assert _attr(sec["answer"], "data-ratio") == pytest.approx(ratio, rel=1e-3)
    answer = _text(sec["answer"])
    assert f"tune export {csv_path} --rank 1" in answer
    from tuner.export import choose_row

    assert choose_row(raw, csv_path, rank=1)["trial"] == best["trial"]  # the command's row
    counts = {s: sum(r["status"] == s for r in raw) for s in {r["status"] for r in raw}}
    for status, n in counts.items():
        assert f"{n} {status}" in answer
    assert f"{float(best['peak_mem_gib']):.1f} GiB (measured, allocated)" in answer

    bad = [r for r in raw if r["status"] != "ok"]
    assert f"{len(bad)} of {len(raw)} trials did not finish ok" in _text(sec["failures"])
    launched = [r for r in raw if r["status"] not in NOT_LAUNCHED]
    gpu_h = sum(float(r["duration_s"]) * int(r["num_gpus"]) for r in launched) / 3600
    assert _attr(sec["cost"], "data-gpu-hours") == pytest.approx(gpu_h, rel=1e-4)
    assert f"{len(launched)} launched trials took {gpu_h:.2f} GPU-hours" in _text(sec["cost"])

    errs = [
        abs(float(r["pred_tokens_per_s_per_gpu"]) - float(r["tokens_per_s_per_gpu"]))
        / float(r["tokens_per_s_per_gpu"])
        for r in ok
    ]
    got = _attr(sec["prediction"], "data-median-error-throughput")
    assert got == pytest.approx(100 * statistics.median(errs), abs=0.05)
    # no storage beside the committed CSVs: the importance section says so, and names no
    # storage to open (the dashboard would create the missing file, empty)
    assert "Not computed" in _text(sec["knobs"]) and "optuna-dashboard" not in sec["knobs"]
    assert "update actor" in _text(sec["phases"]) or "update_actor" in sec["phases"]


@pytest.mark.parametrize("csv_path", [DENSE, MOE, *MEASURED, VERL], ids=lambda p: p.stem)
def test_committed_reports_match_their_csv(csv_path: Path) -> None:
    """results/<name>.html is committed beside each measured leaderboard and agrees with it
    (regenerate with `tune report results/<name>.csv`)."""
    page = csv_path.with_suffix(".html").read_text()
    ok = [r for r in _raw(csv_path) if r["status"] == "ok"]
    best = max(float(r["tokens_per_s_per_gpu"]) for r in ok)
    assert _attr(page, "data-best-tokens-per-s-per-gpu") == pytest.approx(best, rel=1e-5)
    assert list(_sections(page)) == [i for i, _ in SECTIONS]
    _check_self_contained(page)


def test_a_measured_leaderboard_finds_its_committed_storage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The measured leaderboards keep their Optuna storage as results/<name>.sqlite3 (the CSV
    names the device's path): the report finds it and computes the importances."""
    csv_path = MEASURED[1]
    assert csv_path.with_suffix(".sqlite3").is_file()
    knobs = _text(_sections(_report(csv_path, tmp_path / "m.html", capsys))["knobs"])
    assert "fANOVA" in knobs and "Not computed" not in knobs
    (shown,) = re.findall(r"optuna-dashboard (sqlite:///\S+)", knobs)
    assert Path(shown.removeprefix("sqlite:///")) == csv_path.with_suffix(".sqlite3")
    page = csv_path.with_suffix(".html").read_text()
    assert "Not computed" not in _text(_sections(page)["knobs"])


@pytest.fixture(scope="module")
def estimate_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real estimator study (real Optuna storage beside the CSV), shared by the tests here."""
    d = tmp_path_factory.mktemp("study")
    argv = ["--model", "qwen2.5-7b", "--gpus", "8", "--trials", "16", "--no-progress"]
    dirs = ["--results-dir", str(d / "results"), "--recipes-dir", str(d / "recipes")]
    assert main([*argv, *dirs]) == 0
    (csv_path,) = (d / "results").glob("*.csv")
    assert (d / "results" / "studies.sqlite3").is_file()
    return csv_path


def test_estimate_only_report_is_labelled_and_has_importances(
    estimate_study: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = _report(estimate_study, tmp_path / "e.html", capsys)
    sec = _sections(page)
    assert "Estimates." in _text(page.split("<nav>")[0])
    assert "estimated tokens/s/GPU" in _text(sec["answer"])
    assert "(predicted" in _text(sec["answer"])
    knobs = _text(sec["knobs"])
    assert "fANOVA" in knobs and "Not computed" not in knobs
    assert re.search(r"<th>importance</th>", sec["knobs"])
    assert "Estimate-only study" in _text(sec["prediction"])
    assert "no GPU time" in _text(sec["cost"])
    raw = _raw(estimate_study)
    best = max(float(r["tokens_per_s_per_gpu"]) for r in raw if r["status"] == "ok")
    assert _attr(sec["answer"], "data-best-tokens-per-s-per-gpu") == pytest.approx(best, rel=1e-5)
    pruned = sum(r["status"] in NOT_LAUNCHED for r in raw)
    assert f"{pruned} pruned before launch" in _text(sec["progress"])


def test_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    (tmp_path / "empty.csv").write_text("")
    for name in ("other.csv", "empty.csv", "missing.csv"):
        assert main(["report", str(tmp_path / name), "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tune: error:"), err
        assert not out.exists()

    header, *lines = DENSE.read_text().splitlines()
    (tmp_path / "header.csv").write_text(header + "\n")
    sec = _sections(_report(tmp_path / "header.csv", out, capsys))
    assert "No answer yet" in _text(sec["answer"]) and "no rows yet" in _text(sec["answer"])
    assert "No trials yet" in _text(sec["progress"])

    moe_header, *moe_lines = MOE.read_text().splitlines()
    failed = [line for line in moe_lines if ",failed," in line]
    (tmp_path / "failed.csv").write_text("\n".join([moe_header, *failed]) + "\n")
    sec = _sections(_report(tmp_path / "failed.csv", out, capsys))
    assert "No trial finished ok" in _text(sec["answer"])
    assert f"{len(failed)} of {len(failed)} trials did not finish ok" in _text(sec["failures"])
    assert re.search(r"<td>crash</td>\s*<td>" + str(len(failed)) + "</td>", sec["failures"])


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on PATH: `apt-get install -y chromium` (.ci/run installs it)",
)
def test_report_opens_offline_in_a_real_browser(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from playwright import sync_api  # the dev extra; drives the system chromium

    page_path = tmp_path / "moe.html"
    _report(MOE, page_path, capsys)
    shot = tmp_path / "report.png"
    errors: list[str] = []
    blocked: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(offline=True, viewport={"width": 1200, "height": 900})

            def route(r: object) -> None:
                url = r.request.url  # type: ignore[attr-defined]
                if url == page_path.as_uri():
                    r.continue_()  # type: ignore[attr-defined]
                else:
                    blocked.append(url)
                    r.abort()  # type: ignore[attr-defined]

            context.route("**/*", route)
            page = context.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.as_uri(), wait_until="load")
            sizes = page.eval_on_selector_all(
                "img, svg",
                """els => els.map(e => {
                    const r = e.getBoundingClientRect();
                    return [e.tagName, r.width, r.height,
                            e.tagName === 'IMG' ? (e.complete ? e.naturalWidth : 0) : 1];
                })""",
            )
            headings = page.eval_on_selector_all(
                "section h2", "els => els.map(e => e.id || e.textContent)"
            )
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    print(f"report screenshot: {shot}")
    assert errors == [] and blocked == []
    assert len(sizes) >= 5, sizes
    assert all(w > 0 and h > 0 and natural > 0 for _, w, h, natural in sizes), sizes
    assert headings == [h for _, h in SECTIONS]
    assert shot.stat().st_size > 10_000


def test_importances_run_on_a_bounded_parameterization() -> None:
    """fANOVA one-hot encodes a categorical: the search's `layout` (840 choices for
    qwen3-30b-moe on 32 GPUs) kept `tune report` in fANOVA for over 18 minutes. It is left out
    and scored as its degrees (integers from each trial's record); small knobs stay as sampled
    (the time on the README's study: scripts/bench_report.py)."""
    import optuna

    from tuner.report import MAX_IMPORTANCE_CHOICES, importance_study
    from tuner.study.storage import RECORD_ATTR

    layouts = [f"tp{tp}pp{pp}x{i}" for tp in (1, 2, 4, 8) for pp in (1, 2, 4) for i in range(20)]
    assert len(layouts) > MAX_IMPORTANCE_CHOICES
    dist = {
        "layout": optuna.distributions.CategoricalDistribution(layouts),
        "use_dynamic_bsz": optuna.distributions.CategoricalDistribution([False, True]),
    }
    trials = [
        optuna.trial.create_trial(
            params={"layout": layouts[(7 * i) % len(layouts)], "use_dynamic_bsz": i % 3 == 0},
            distributions=dist,
            value=100.0 + i,
            user_attrs={RECORD_ATTR: {"tp": 2 ** (i % 4), "pp": 2 ** (i % 3), "cp": 1}},
        )
        for i in range(12)
    ]
    study, left_out = importance_study(trials)
    assert left_out == ["layout"]
    (t, *_) = study.trials
    assert set(t.params) == {"use_dynamic_bsz", "tp", "pp"}  # cp never varied
    assert isinstance(t.distributions["tp"], optuna.distributions.IntDistribution)
    imp = optuna.importance.get_param_importances(
        study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0)
    )
    assert set(imp) == {"use_dynamic_bsz", "tp", "pp"}


def test_the_headline_says_what_its_throughput_covers(tmp_path: Path) -> None:
    """A training-only best row is labelled so, with the cost model's whole step beside it and
    not added to it; verl's row is the whole step."""
    small = REPO / "results" / "small16k-h100-x1.csv"
    verl = REPO / "results" / "verl4k-h100-x1.csv"
    for path, words in (
        (small, ("old_log_prob + update only, measured; generation not measured",
                 "not added to the measured phases")),
        (verl, ("the whole step, measured by verl",)),
    ):  # fmt: skip
        out = tmp_path / f"{path.stem}.html"
        assert main(["report", str(path), "-o", str(out)]) == 0
        answer = _text(_sections(out.read_text())["answer"])
        assert all(w in answer for w in words), (path.name, answer[:400])
