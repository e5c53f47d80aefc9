"""Argument types and checks of the `tune` command line, and its one-line error messages; the
names of the modules below, re-exported once.

All of it runs before a command creates or launches anything, or when one fails:

- `values`: `type=` functions for argparse (`positive_int`, `study_name`, `layout_text`, ...),
  the syntax of one value; `OneLineParser` turns every argparse complaint into a `UserError`
  that names the argument (`argument --top: ...`).
- `checks`: `validate(args)`, what needs the file system or several arguments (a results folder
  that is a file or read-only, a CSV that is a folder or damaged, `--columns` the leaderboard
  lacks, a `--storage` of no known form or one `report`/`reread` would have to create).
- `options`: the `tune run` options that serve only some runners or launchers, declared once
  (`RUN_OPTIONS`), and `check_runner_options`, which refuses one given where it does nothing.
- `messages`: an error inside a command (an OSError, a failing storage) as one line.

Every message is one line that says what to change; `tuner.cli.main` prints it and exits 2.
"""

from tuner.cli_args.checks import (
    OUTPUT_KINDS,
    PLOT_SUFFIXES,
    STORAGE_SCHEMES,
    VALIDATORS,
    check_columns,
    check_existing_storage,
    check_leaderboard,
    check_output_file,
    check_readable_file,
    check_storage_url,
    check_stored_storage,
    check_writable_dir,
    check_writable_file,
    known_columns,
    probe_writable_dir,
    validate,
)
from tuner.cli_args.messages import (
    error_line,
    finite_json,
    one_line,
    os_error_line,
    storage_failure_line,
)
from tuner.cli_args.options import RUN_OPTIONS, RunOption, check_runner_options
from tuner.cli_args.values import (
    MAX_NAME_CHARS,
    SEED_MAX,
    OneLineParser,
    env_assignment,
    layout_text,
    model_arg,
    non_negative_float,
    non_negative_int,
    path_text,
    positive_float,
    positive_int,
    seed,
    study_name,
    verl_override_text,
)

__all__ = [
    "MAX_NAME_CHARS",
    "OUTPUT_KINDS",
    "PLOT_SUFFIXES",
    "SEED_MAX",
    "STORAGE_SCHEMES",
    "VALIDATORS",
    "RUN_OPTIONS",
    "OneLineParser",
    "RunOption",
    "check_columns",
    "check_existing_storage",
    "check_leaderboard",
    "check_output_file",
    "check_readable_file",
    "check_runner_options",
    "check_storage_url",
    "check_stored_storage",
    "check_writable_dir",
    "probe_writable_dir",
    "check_writable_file",
    "env_assignment",
    "error_line",
    "finite_json",
    "known_columns",
    "layout_text",
    "model_arg",
    "non_negative_float",
    "non_negative_int",
    "one_line",
    "os_error_line",
    "path_text",
    "positive_float",
    "positive_int",
    "seed",
    "storage_failure_line",
    "study_name",
    "validate",
    "verl_override_text",
]
