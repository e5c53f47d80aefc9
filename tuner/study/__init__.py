"""Optuna wiring: the request, the storage (source of truth), the warm start, the trial loop,
what a study learns between trials, what it leaves at the end (best rows, recipes, summary:
`outcome`), and the CSV leaderboard as a view of the storage."""

from tuner.study.csv_view import check_leaderboard, write_leaderboard
from tuner.study.learn import SlowerThanBestPruner, StudyLearner
from tuner.study.loop import MAX_CONSECUTIVE_UNFIT, run_study
from tuner.study.outcome import write_best_recipes
from tuner.study.request import Progress, StudySummary, TuneRequest, default_study_name
from tuner.study.storage import open_storage, storage_label
from tuner.study.warmstart import WARM_START_BEST, WARM_START_POOL, warm_start_params

__all__ = [
    "MAX_CONSECUTIVE_UNFIT",
    "WARM_START_BEST",
    "WARM_START_POOL",
    "Progress",
    "SlowerThanBestPruner",
    "StudyLearner",
    "StudySummary",
    "TuneRequest",
    "check_leaderboard",
    "default_study_name",
    "open_storage",
    "run_study",
    "storage_label",
    "warm_start_params",
    "write_best_recipes",
    "write_leaderboard",
]
