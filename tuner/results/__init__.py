"""Trial results and the CSV leaderboard; the names of the modules below, re-exported once.

- `result`: what a runner reports for one trial (`Status`, `TrialResult`).
- `record`: the typed row (`TrialRecord`), its CSV columns and text form, older schemas read in
  the current one's meaning (`upgrade_row`).
- `files`: the CSV files: atomic upserts under a lock, reading ours and the reference CSVs.
- `table`: ranking rows and the text table (shared with `tune show`, tuner.leaderboard).
"""

from tuner.results.files import (
    csv_text,
    is_reference,
    lock_of,
    locked,
    normalize_reference,
    read_raw,
    read_rows,
    upsert_row,
)
from tuner.results.record import (
    AT_LEAST_ONE,
    BOTH_PHASES_MFU,
    COLUMN_TYPES,
    COLUMNS,
    MEASURE_COLUMNS,
    NUMERIC,
    OLD_LOG_PROB_RUN,
    PRED_COLUMNS,
    READ_VERSIONS,
    SCHEMA_VERSION,
    TrialRecord,
    fmt,
    number,
    parse_extra,
    row_of,
    row_problem,
    upgrade_row,
)
from tuner.results.result import ROW_SOURCES, Status, TrialResult
from tuner.results.table import (
    HIGHER_IS_BETTER,
    SHORT_NAMES,
    SHOW_COLUMNS,
    SUMMARY_LEAVES_OUT,
    format_table,
    number_text,
    partial,
    rank,
    text_table,
)

__all__ = [
    "AT_LEAST_ONE",
    "BOTH_PHASES_MFU",
    "COLUMN_TYPES",
    "COLUMNS",
    "HIGHER_IS_BETTER",
    "MEASURE_COLUMNS",
    "NUMERIC",
    "OLD_LOG_PROB_RUN",
    "PRED_COLUMNS",
    "READ_VERSIONS",
    "ROW_SOURCES",
    "SCHEMA_VERSION",
    "SHORT_NAMES",
    "SHOW_COLUMNS",
    "SUMMARY_LEAVES_OUT",
    "Status",
    "TrialRecord",
    "TrialResult",
    "fmt",
    "csv_text",
    "format_table",
    "is_reference",
    "lock_of",
    "locked",
    "normalize_reference",
    "number",
    "number_text",
    "parse_extra",
    "partial",
    "rank",
    "read_raw",
    "read_rows",
    "row_of",
    "row_problem",
    "text_table",
    "upgrade_row",
    "upsert_row",
]
