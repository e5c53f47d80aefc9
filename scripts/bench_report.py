"""How long `tune report` takes on the studies the tool makes (the target is under a minute on
2 cores), and what fANOVA on the raw sampled parameters took before.

The README's study: `tune --model qwen3-30b-moe --gpus 32 --trials 80` with the estimator, in a
temporary folder; then a larger one of the same model (--trials 400). For each: `tune report`
as a new process (interpreter, imports, every section, the importances from the study's
storage), and the importances alone (tuner.report.importance_study + Optuna's fANOVA). The old
way, fANOVA on the trials' own parameters (the `layout` categorical, one-hot encoded, among
them), runs in a child process stopped after LIMIT_S.

    python scripts/bench_report.py > scripts/bench_report.out.txt
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

from tuner.report import importance_study

LIMIT_S = 300
STUDY = "qwen3-30b-moe-h100x32-estimate"
OLD_WAY = """
import sys, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
st = optuna.load_study(study_name=sys.argv[1], storage=sys.argv[2])
optuna.importance.get_param_importances(
    st, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))
"""


def _tune(*args: str, cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    load = os.getloadavg()[0]
    print(
        f"python {platform.python_version()}, optuna {optuna.__version__}, "
        f"{os.cpu_count()} CPUs ({platform.machine()}), load average {load:.1f}"
    )
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        argv = ["--model", "qwen3-30b-moe", "--gpus", "32", "--no-progress"]
        for trials in (80, 400):
            made = _tune(*argv, "--trials", str(trials), cwd=work)
            csv = work / "results" / f"{STUDY}.csv"
            url = f"sqlite:///{work / 'results' / 'studies.sqlite3'}"
            report = _tune("report", str(csv), "-o", str(work / "r.html"), cwd=work)
            st = optuna.load_study(study_name=STUDY, storage=url)
            done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE]
            layouts = len(done[0].distributions["layout"].choices)  # type: ignore[attr-defined]
            t0 = time.perf_counter()
            bounded, left_out = importance_study(done)
            imp = optuna.importance.get_param_importances(
                bounded, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0)
            )
            alone = time.perf_counter() - t0
            top = ", ".join(f"{k} {v:.2f}" for k, v in list(imp.items())[:3])
            print(
                f"\nstudy of {trials} counted trials ({len(st.trials)} in the storage, "
                f"{len(done)} complete; layout: {layouts} choices), made in {made:.0f} s"
            )
            print(f"  tune report, new process        {report:6.1f} s")
            print(f"  importances alone            {alone:6.1f} s  (left out {left_out}; {top})")
            if trials == 80:
                t0 = time.perf_counter()
                try:
                    subprocess.run(
                        [sys.executable, "-c", OLD_WAY, STUDY, url], timeout=LIMIT_S, check=True
                    )
                    old = f"{time.perf_counter() - t0:6.1f} s"
                except subprocess.TimeoutExpired:
                    old = f"not done after {LIMIT_S} s (stopped)"
                print(f"  before: fANOVA on the raw params {old}")


if __name__ == "__main__":
    main()
