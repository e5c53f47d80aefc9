"""`tune report`: one self-contained HTML page about a study, answer first.

Figures inline as base64 PNG, tables by pandas, no script, nothing fetched. Sections: the answer
(best configuration, its throughput, peak memory, ratio to the best reference on the same GPUs,
the command that reproduces it); search progress; throughput vs peak memory; which knobs mattered
(Optuna fANOVA importances, from the study's storage); time per phase; failures by reason; what
the study cost; predicted vs measured.

The modules, by concern: `study` (the numbers, read once), `markup` (HTML pieces), `sections`
(every section but the knobs), `importance` (the knobs: storage and fANOVA), `page` (the page and
its write). The public names are re-exported here once.
"""

from tuner.report.importance import (
    LAYOUT_DEGREES,
    MAX_IMPORTANCE_CHOICES,
    MAX_IMPORTANCE_TRIALS,
    MIN_IMPORTANCE_TRIALS,
    importance_study,
    section_knobs,
    storage_url,
)
from tuner.report.page import SECTIONS, build_report, write_report
from tuner.report.sections import (
    KNOB_GROUPS,
    TOP_PHASE_ROWS,
    TOP_REFERENCE_ROWS,
    failure_kinds,
    phase_table,
    section_answer,
    section_cost,
    section_failures,
    section_memory,
    section_phases,
    section_prediction,
    section_progress,
)
from tuner.report.study import (
    NOT_MEASURED_SOURCES,
    Study,
    default_references,
    load_study,
    median_abs_error,
    num,
    reference_dirs,
)

__all__ = [
    "KNOB_GROUPS",
    "LAYOUT_DEGREES",
    "MAX_IMPORTANCE_CHOICES",
    "MAX_IMPORTANCE_TRIALS",
    "MIN_IMPORTANCE_TRIALS",
    "NOT_MEASURED_SOURCES",
    "SECTIONS",
    "TOP_PHASE_ROWS",
    "TOP_REFERENCE_ROWS",
    "Study",
    "build_report",
    "default_references",
    "failure_kinds",
    "importance_study",
    "load_study",
    "median_abs_error",
    "num",
    "phase_table",
    "reference_dirs",
    "section_answer",
    "section_cost",
    "section_failures",
    "section_knobs",
    "section_memory",
    "section_phases",
    "section_prediction",
    "section_progress",
    "storage_url",
    "write_report",
]
