"""Time the CSV view of a 10,000-trial study: validating the existing leaderboard (the check a
study runs on start and resume) and rebuilding it from the storage's records.

    python scripts/bench_leaderboard.py > scripts/bench_leaderboard.out.txt

Records are real ones (from a short estimator study) repeated with new trial numbers; the
storage read itself (Optuna's get_trials, cached in-process after the first) is timed apart."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from tuner.hardware import Cluster, get_gpu
from tuner.models import REGISTRY
from tuner.results.lines import LINE_KEY, line_entry
from tuner.runners.estimate import EstimateRunner
from tuner.study import TuneRequest, run_study
from tuner.study.csv_view import check_leaderboard, write_leaderboard
from tuner.study.storage import RECORD_ATTR, storage_label
from tuner.workload import PRESETS

ROWS = 10_000


def main() -> None:
    import optuna

    with tempfile.TemporaryDirectory() as d:
        req = TuneRequest(
            model=REGISTRY["qwen2.5-7b"],
            model_arg="qwen2.5-7b",
            cluster=Cluster(gpu=get_gpu("h100"), num_gpus=8),
            workload=PRESETS["dapo-math"],
            runner=EstimateRunner(),
            trials=20,
            results_dir=Path(d) / "results",
            recipes_dir=Path(d) / "recipes",
        )
        run_study(req)
        study = optuna.load_study(study_name=req.name, storage=req.storage_url)
        seed = [t.user_attrs[RECORD_ATTR] for t in study.trials if RECORD_ATTR in t.user_attrs]
        records = []
        for i in range(ROWS):
            rec = {k: v for k, v in seed[i % len(seed)].items() if k != LINE_KEY}
            rec["trial"] = i
            records.append({**rec, LINE_KEY: line_entry(rec)})  # as store_record keeps them
        path = req.results_dir / "big.csv"  # beside its storage, as a study's CSV is
        label = storage_label(req.storage_url, req.results_dir)

        t0 = time.perf_counter()
        write_leaderboard(path, records)
        t_write = time.perf_counter() - t0
        t0 = time.perf_counter()
        legacy, notes = check_leaderboard(path, req.name, label)
        t_check = time.perf_counter() - t0
        assert not legacy and not notes
        t0 = time.perf_counter()
        check_leaderboard(path, req.name, label)
        write_leaderboard(path, records)
        t_both = time.perf_counter() - t0
        cache: dict[tuple[int, str], str] = {}
        write_leaderboard(path, records[:-1], cache=cache)
        t0 = time.perf_counter()
        write_leaderboard(path, records, cache=cache)
        t_next = time.perf_counter() - t0
        size = path.stat().st_size
    print(f"rows: {ROWS}, file: {size / 1e6:.1f} MB")
    print(f"rebuild from stored records (join + atomic write): {t_write:.3f} s")
    print(f"validate (read + check every row): {t_check:.3f} s")
    print(f"validate + rebuild (resume): {t_both:.3f} s ({'below' if t_both < 1 else 'ABOVE'} 1 s)")
    print(f"rebuild after one more trial (formatted rows cached): {t_next:.3f} s")


if __name__ == "__main__":
    main()
