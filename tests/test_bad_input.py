"""Bad and awkward input, as a new user types it (issue 11): every case is exit code 2, one line
on stderr that names the argument, and no file created, changed or removed.

Each case runs `main(argv)` in-process in its own folder holding a real leaderboard (made once by
a real estimator study), a few damaged copies and whatever the case sets up; the folder's tree,
sizes, modes and mtimes are compared before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tuner.cli_args
from tests.conftest import ANCHORS
from tuner.cli import build_parser, main
from tuner.cli_args import RUN_OPTIONS

R = ["--model", "qwen2.5-7b", "--gpus", "8", "--trials", "2", "--no-progress"]
"""A search that would run (and write results/) if the case's bad argument were accepted."""
E = ["estimate", "--model", "qwen2.5-7b", "--gpus", "8"]
"""An estimate that would print if the bad argument were accepted."""
GOOD = "lb.csv"
X4 = "x4.csv"
NUL = "nul.csv"
JUNK = "junk.csv"

Setup = Callable[[Path, pytest.MonkeyPatch], None]


def _file(name: str, text: str = "not a folder\n") -> Setup:
    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)

    return setup


def _dir(name: str) -> Setup:
    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        (d / name).mkdir(parents=True)

    return setup


def _read_only(name: str) -> Setup:
    """A folder this user cannot write in. Root writes anywhere, so for root the check's view
    (os.access) is made to say what it says to everyone else."""

    def setup(d: Path, mp: pytest.MonkeyPatch) -> None:
        folder = d / name
        folder.mkdir()
        (folder / "keep.txt").write_text("x")
        folder.chmod(0o555)
        if os.geteuid() == 0:
            real = os.access

            def access(path: object, mode: int, **kw: object) -> bool:
                p = Path(str(path)).absolute()
                if mode & os.W_OK and (p == folder or folder in p.parents):
                    return False
                return real(path, mode, **kw)  # type: ignore[arg-type]

            mp.setattr(tuner.cli_args.checks.os, "access", access)

    return setup


def _config_json(text: str) -> Setup:
    return _file("config.json", text)


def _none(_d: Path, _mp: pytest.MonkeyPatch) -> None:
    return None


SECONDS = 20
"""A bad input is refused within seconds: a case still running after this is a hang (failed)."""


def _within(seconds: int, fn: Callable[..., int], *args: object) -> int:
    """fn(*args), failing the test if it runs past `seconds` (a blocking open of a fifo, a read
    of /dev/zero, a loop of a token per pass) instead of hanging the test run."""

    def hang(_sig: int, _frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s: a hang, not a refusal")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        return fn(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _fifo(name: str) -> Setup:
    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        os.mkfifo(d / name)

    return setup


def _loop(name: str) -> Setup:
    """A symbolic link loop: name -> name.2 -> name."""

    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        (d / name).symlink_to(f"{name}.2")
        (d / f"{name}.2").symlink_to(name)

    return setup


def _sparse(name: str, size: int) -> Setup:
    """A file of `size` bytes that takes no disk (a hole)."""

    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        with open(d / name, "wb") as f:
            f.truncate(size)

    return setup


def _cell(name: str, column: str, value: str, source: str = GOOD) -> Setup:
    """A copy of the good leaderboard with one cell of its first row set to `value`."""

    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        with open(d / source, newline="") as f:
            rows = list(csv.DictReader(f))
        rows[0][column] = value
        with open(d / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)

    return setup


def _foreign_sqlite(name: str) -> Setup:
    """Another application's SQLite database."""

    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        with contextlib.closing(sqlite3.connect(d / name)) as c:
            c.execute("CREATE TABLE notes (x)")
            c.commit()

    return setup


def _optuna_sqlite(name: str, library_version: str = "") -> Setup:
    """An Optuna SQLite storage holding one study; `library_version`: as if a newer Optuna had
    made it (schema and version unknown to this one)."""

    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = optuna.storages.RDBStorage(f"sqlite:///{d / name}")
        optuna.create_study(study_name="s", storage=storage)
        # the file as the command finds it: closed, its write-ahead log folded in (a connection
        # left to the garbage collector folds it in while the command runs, and the file that
        # the test compares changes under it)
        storage.engine.dispose()
        if library_version:
            with contextlib.closing(sqlite3.connect(d / name)) as c:
                c.execute("UPDATE alembic_version SET version_num = 'v99.0.0.a'")
                c.execute("UPDATE version_info SET library_version = ?", (library_version,))
                c.commit()

    return setup


def _journal(name: str, *lines: str) -> Setup:
    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        text = "".join(line + "\n" for line in lines)
        (d / name).write_bytes(text.encode("utf-8", "surrogateescape"))  # \udcff: byte 0xff

    return setup


def _stdout_closed(_d: Path, mp: pytest.MonkeyPatch) -> None:
    mp.setattr(sys, "stdout", None)  # what Python sets when started with stdout closed


def _all(*setups: Setup) -> Setup:
    def setup(d: Path, mp: pytest.MonkeyPatch) -> None:
        for one in setups:
            one(d, mp)

    return setup


def _config(**fields: object) -> str:
    """A config.json of a small dense model with `fields` set (None: left out)."""
    cfg: dict[str, object] = {
        "model_type": "llama",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    }
    cfg.update(fields)
    return json.dumps({k: v for k, v in cfg.items() if v is not None})


EC = ["estimate", "--model", "config.json", "--gpus", "8", "--layout", "tp2"]
"""An estimate of the model in ./config.json."""
ENTRY = '{"op_code": 0, "worker_id": "w", "study_name": "s", "directions": [1]}'
"""A journal line Optuna replays (a study created)."""


# (id, argv, fragment of the one stderr line, setup)
CASES: list[tuple[str, list[str], str, Setup]] = [
    # --- tune run: cluster and model
    ("gpus-zero", [*R[:2], "--gpus", "0", *R[4:]], "argument --gpus: must be a positive", _none),
    ("gpus-negative", [*R[:2], "--gpus", "-8", *R[4:]], "argument --gpus: must be a pos", _none),
    ("gpus-word", [*R[:2], "--gpus", "eight", *R[4:]], "argument --gpus: 'eight' is not", _none),
    ("gpus-fullwidth", [*R[:2], "--gpus", "８", *R[4:]], "argument --gpus: '８' is not a", _none),
    ("gpus-fraction", [*R[:2], "--gpus", "8.5", *R[4:]], "argument --gpus: '8.5' is not", _none),
    ("gpus-underscore", [*R[:2], "--gpus", "1_6", *R[4:]], "argument --gpus:", _none),
    ("gpus-per-node-zero", [*R, "--gpus-per-node", "0"], "argument --gpus-per-node:", _none),
    ("gpus-not-nodes", [*R[:2], "--gpus", "12", *R[4:]], "--gpus-per-node 8", _none),
    ("gpu-kind", [*R, "--gpu", "v100"], "unknown GPU kind 'v100'", _none),
    ("model-unknown", ["--model", "gpt-5", *R[2:]], "unknown model 'gpt-5'", _none),
    ("model-empty", ["--model", "", *R[2:]], "argument --model: '' is not a model", _none),
    ("model-300", ["--model", "q" * 300, *R[2:]], "argument --model: unknown model", _none),
    ("model-nul", ["--model", "qwen\x00", *R[2:]], "argument --model:", _none),
    ("model-bad-json", ["--model", "config.json", *R[2:]], "not valid JSON", _config_json("{x")),
    ("missing-gpus", ["--model", "qwen2.5-7b", "--no-progress"], "required: --gpus", _none),
    ("unknown-flag", [*R, "--gpuz", "8"], "unrecognized arguments: --gpuz", _none),
    ("unknown-command", ["shwo", GOOD], "unknown command 'shwo'", _none),
    # --- tune run: workload
    ("workload-unknown", [*R, "--workload", "x"], "unknown workload 'x'", _none),
    (  # issue 29: the megatron runner measures colocated phases only
        "off-policy-megatron",
        [*R, "--runner", "megatron", "--allow-off-policy"],
        "--allow-off-policy: --runner megatron runs every candidate colocated; use --runner verl",
        _none,
    ),
    (  # issue 29: no split of one GPU
        "off-policy-one-gpu",
        [*R[:2], "--gpus", "1", *R[4:], "--runner", "estimate", "--allow-off-policy"],
        "--allow-off-policy on 1 GPU: a split needs 2 GPUs or more",
        _none,
    ),
    ("algorithm", [*R, "--algorithm", "sft"], "argument --algorithm: invalid choice", _none),
    ("prompt-len-zero", [*R, "--prompt-len", "0"], "argument --prompt-len:", _none),
    ("response-len-neg", [*R, "--response-len", "-1"], "argument --response-len:", _none),
    ("response-mean-zero", [*R, "--response-mean", "0"], "argument --response-mean:", _none),
    ("prompt-mean-word", [*R, "--prompt-mean", "half"], "argument --prompt-mean:", _none),
    ("batch-zero", [*R, "--batch", "0"], "argument --batch:", _none),
    ("batch-not-mini", [*R, "--batch", "100"], "not a multiple of --mini", _none),
    ("n-zero", [*R, "--n", "0"], "argument --n:", _none),
    ("mini-batch-zero", [*R, "--mini-batch", "0"], "argument --mini-batch:", _none),
    # issue 37 item 4: the routing a trained MoE router has, declared
    ("imbalance-below-1", [*R, "--expert-imbalance", "0.5"], "argument --expert-imbalance:", _none),
    ("imbalance-nan", [*E, "--expert-imbalance", "nan"], "argument --expert-imbalance:", _none),
    ("imbalance-dense", [*R, "--expert-imbalance", "1.5"], "qwen2.5-7b is dense", _none),
    (
        "imbalance-above-ceiling",
        [*R[:1], "qwen3-30b-moe", *R[2:], "--expert-imbalance", "17"],
        "above qwen3-30b-moe's ceiling 16 (every token on the same 8 of its 128 experts)",
        _none,
    ),
    # --- tune run: search
    ("trials-zero", [*R, "--trials", "0"], "argument --trials: must be a positive", _none),
    ("trials-negative", [*R, "--trials", "-3"], "argument --trials:", _none),
    ("timeout-zero", [*R, "--timeout", "0"], "argument --timeout: must be more than 0", _none),
    ("timeout-nan", [*R, "--timeout", "nan"], "argument --timeout: 'nan' is not", _none),
    ("timeout-inf", [*R, "--timeout", "1e999"], "argument --timeout: '1e999' is too", _none),
    ("trial-timeout-zero", [*R, "--trial-timeout", "0"], "argument --trial-timeout:", _none),
    ("trial-timeout-neg", [*R, "--trial-timeout", "-5"], "argument --trial-timeout:", _none),
    ("runner", [*R, "--runner", "gpu"], "argument --runner: invalid choice", _none),
    ("launcher", [*R, "--launcher", "k8s"], "argument --launcher: invalid choice", _none),
    ("study-escapes", [*R, "--study", "../../escaped"], "argument --study:", _none),
    ("study-slash", [*R, "--study", "a/b"], "argument --study: 'a/b' is not a plain", _none),
    ("study-300", [*R, "--study", "s" * 300], "argument --study: 'sss", _none),
    ("study-fullwidth", [*R, "--study", "ｓｔｕｄｙ"], "argument --study:", _none),
    ("study-hidden", [*R, "--study", ".hidden"], "argument --study:", _none),
    ("study-space", [*R, "--study", "my study"], "argument --study:", _none),
    ("study-dotdot", [*R, "--study", "a..b"], "argument --study:", _none),
    ("seed-negative", [*R, "--seed", "-1"], "argument --seed: must be between 0", _none),
    ("seed-huge", [*R, "--seed", str(2**32)], "argument --seed: must be between 0", _none),
    ("recipes-negative", [*R, "--recipes", "-1"], "argument --recipes: must be 0 or more", _none),
    ("headroom-negative", [*R, "--headroom-gib", "-1"], "argument --headroom-gib:", _none),
    ("headroom-word", [*R, "--headroom-gib", "lots"], "argument --headroom-gib:", _none),
    # --- tune run: where it writes
    ("results-is-file", R, "--results-dir results is a file", _file("results")),
    ("recipes-is-file", R, "--recipes-dir recipes is a file", _file("recipes")),
    ("results-under-file", [*R, "--results-dir", "f/results"], "f is a file", _file("f")),
    ("results-read-only", R, "--results-dir results: cannot write", _read_only("results")),
    ("results-dir-empty", [*R, "--results-dir", ""], "argument --results-dir:", _none),
    ("results-dir-long", [*R, "--results-dir", "r" * 300], "argument --results-dir:", _none),
    ("storage-is-dir", [*R, "--storage", "db"], "--storage db is a folder", _dir("db")),
    ("study-csv-is-dir", [*R, "--study", "s"], "leaderboard of study s", _dir("results/s.csv")),
    ("study-dir-is-file", [*R, "--study", "s"], "trial folder of study s", _file("results/s")),
    ("profile-missing", [*R, "--profile", "p.json"], "--profile: no file at p.json", _none),
    ("profile-is-dir", [*R, "--profile", "p"], "--profile p is a folder", _dir("p")),
    # --- tune estimate
    ("layout-twice", [*E, "--layout", "tp2tp4"], "gives tp more than once", _none),
    ("layout-empty", [*E, "--layout", ""], "argument --layout: cannot read layout ''", _none),
    ("layout-fullwidth", [*E, "--layout", "ｔｐ２"], "argument --layout: cannot read", _none),
    ("layout-fullwidth-digit", [*E, "--layout", "tp２"], "argument --layout: cannot read", _none),
    ("layout-unknown-degree", [*E, "--layout", "tp4xx2"], "argument --layout: cannot read", _none),
    ("layout-no-degree", [*E, "--layout", "tp"], "argument --layout: cannot read", _none),
    ("layout-does-not-fit", [*E, "--layout", "tp3"], "layout 'tp3' does not fit 8 GPUs", _none),
    ("layout-heads", [*E, "--layout", "tp8"], "tp(8) does not divide the 28 attention", _none),
    ("layout-ep-dense", [*E, "--layout", "ep2"], "layout ep2: ep(2)", _none),
    ("layout-missing", E, "required: --layout", _none),
    ("micro-batch-zero", [*E, "--layout", "tp2", "--micro-batch", "0"], "--micro-batch:", _none),
    ("rollout-tp-zero", [*E, "--layout", "tp2", "--rollout-tp", "0"], "--rollout-tp:", _none),
    ("gmu-above-1", [*E, "--layout", "tp2", "--gpu-memory-utilization", "1.5"], "at most 1", _none),
    ("gmu-zero", [*E, "--layout", "tp2", "--gpu-memory-utilization", "0"], "--gpu-memory", _none),
    ("max-token-len-zero", [*E, "--layout", "tp2", "--max-token-len", "0"], "--max-token", _none),
    ("batched-neg", [*E, "--layout", "tp2", "--max-num-batched-tokens", "-1"], "--max-num", _none),
    ("recompute", [*E, "--layout", "tp2", "--recompute", "some"], "--recompute: invalid", _none),
    # --- tune export
    ("export-steps-zero", ["export", GOOD, "--steps", "0"], "argument --steps:", _none),
    ("export-rank-zero", ["export", GOOD, "--rank", "0"], "argument --rank:", _none),
    ("export-rank-past", ["export", GOOD, "--rank", "999"], "pass --rank 1..", _none),
    ("export-trial-negative", ["export", GOOD, "--trial", "-1"], "argument --trial:", _none),
    ("export-trial-absent", ["export", GOOD, "--trial", "12345"], "no trial 12345", _none),
    ("export-missing-csv", ["export", "nope.csv"], "csv: no file at nope.csv", _none),
    ("export-csv-is-dir", ["export", "results"], "csv results is a folder", _dir("results")),
    ("export-trial-x4", ["export", X4], "trial 'x4' is not a whole number", _none),
    ("export-nul", ["export", NUL], "holds a NUL byte", _none),
    ("export-junk", ["export", JUNK], "neither a verl-tuner leaderboard", _none),
    ("export-recipes-file", ["export", GOOD], "--recipes-dir recipes is a file", _file("recipes")),
    # --- tune show
    ("show-dir", ["show", "results"], "csv results is a folder", _dir("results")),
    ("show-missing", ["show", "nope.csv"], "csv: no file at nope.csv", _none),
    ("show-top-negative", ["show", GOOD, "--top", "-1"], "argument --top:", _none),
    ("show-top-zero", ["show", GOOD, "--top", "0"], "argument --top:", _none),
    ("show-columns-unknown", ["show", GOOD, "--columns", "trial,nosuch"], "'nosuch'", _none),
    ("show-columns-empty", ["show", GOOD, "--columns", "trial,,status"], "--columns", _none),
    ("show-sort-unknown", ["show", GOOD, "--sort", "speed"], "--sort: unknown column", _none),
    ("show-x4", ["show", X4], "trial 'x4' is not a whole number", _none),
    ("show-nul", ["show", NUL], "holds a NUL byte", _none),
    ("show-second-missing", ["show", GOOD, "gone.csv"], "no file at gone.csv", _none),
    # --- tune plot
    ("plot-dir", ["plot", "results"], "csv results is a folder", _dir("results")),
    ("plot-out-suffix", ["plot", GOOD, "--out", "p.txt"], "--out p.txt: end the name in", _none),
    ("plot-out-dir", ["plot", GOOD, "--out", "p.png"], "--out p.png is a folder", _dir("p.png")),
    ("plot-x4", ["plot", X4], "trial 'x4' is not a whole number", _none),
    # --- tune report
    ("report-dir", ["report", "results"], "csv results is a folder", _dir("results")),
    (
        "report-out-dir",
        ["report", GOOD, "--out", "r.html"],
        "--out r.html is a folder",
        _dir("r.html"),
    ),
    ("report-ref-missing", ["report", GOOD, "--reference", "r.csv"], "--reference: no file", _none),
    ("report-x4", ["report", X4], "trial 'x4' is not a whole number", _none),
    # --- tune calibrate, tune models
    ("calibrate-missing", ["calibrate", "nope.csv"], "csv: no file at nope.csv", _none),
    ("calibrate-out-dir", ["calibrate", GOOD, "--out", "o"], "--out o is a folder", _dir("o")),
    ("calibrate-start-missing", ["calibrate", GOOD, "--start", "s.json"], "--start", _none),
    ("calibrate-gpu", ["calibrate", GOOD, "--gpu", "v100"], "unknown GPU kind 'v100'", _none),
    ("calibrate-source", ["calibrate", GOOD, "--source", "estimate"], "invalid choice", _none),
    ("calibrate-source-rows", ["calibrate", GOOD, "--source", "verl"], "no measured row", _none),
    ("models-extra", ["models", "--all"], "unrecognized arguments: --all", _none),
    # --- issue 19: config.json values (tracebacks and silent acceptance before)
    (
        "config-heads-zero",
        EC,
        "num_attention_heads is 0",
        _config_json(_config(num_attention_heads=0)),
    ),
    (
        "config-heads-inf",
        EC,
        "Infinity is not a number",
        _config_json(
            _config().replace('"num_attention_heads": 8', '"num_attention_heads": Infinity')
        ),
    ),
    (
        "config-5000-digits",
        EC,
        "5000 digits is too large",
        _config_json(_config().replace('"vocab_size": 1000', '"vocab_size": ' + "7" * 5000)),
    ),
    (
        "config-1e999",
        EC,
        "1e999 is too large",
        _config_json(_config().replace('"vocab_size": 1000', '"vocab_size": 1e999')),
    ),
    (
        "config-nan",
        EC,
        "NaN is not a number",
        _config_json(_config().replace('"vocab_size": 1000', '"vocab_size": NaN')),
    ),
    ("config-vocab-zero", EC, "vocab_size is 0", _config_json(_config(vocab_size=0))),
    (
        "config-layers-fraction",
        EC,
        "num_hidden_layers is 27.9, not a whole",
        _config_json(_config(num_hidden_layers=27.9)),
    ),
    (
        "config-layers-true",
        EC,
        "num_hidden_layers is true, not a whole",
        _config_json(_config(num_hidden_layers=True)),
    ),
    (
        "config-kv-heads-zero",
        EC,
        "num_key_value_heads is 0",
        _config_json(_config(num_key_value_heads=0)),
    ),
    (
        "config-layers-text",
        EC,
        'num_hidden_layers is "28"',
        _config_json(_config(num_hidden_layers="28")),
    ),
    (
        "config-bias-text",
        EC,
        'attention_bias is "yes", not true or false',
        _config_json(_config(attention_bias="yes")),
    ),
    ("config-deep", EC, "nests too deeply", _config_json("[" * 100_000 + "]" * 100_000)),
    # --- issue 19: inputs that hung (a fifo, /dev/zero) or that no reader should take whole
    ("model-fifo", EC, "config.json is a pipe (fifo)", _fifo("config.json")),
    ("model-dev-null", [*EC[:2], "/dev/null", *EC[3:]], "/dev/null is a device", _none),
    ("model-huge", EC, "MiB, more than the 4 MiB", _sparse("config.json", 5 << 20)),
    (
        "run-profile-fifo",
        [*R, "--profile", "p.json"],
        "--profile p.json is a pipe",
        _fifo("p.json"),
    ),
    (
        "estimate-profile-dev-null",
        [*E, "--layout", "tp2", "--profile", "/dev/null"],
        "--profile /dev/null is a device",
        _none,
    ),
    ("show-dev-null", ["show", "/dev/null"], "csv /dev/null is a device", _none),
    ("show-fifo", ["show", "f.csv"], "csv f.csv is a pipe (fifo)", _fifo("f.csv")),
    ("plot-huge", ["plot", "h.csv"], "more than the 512 MiB", _sparse("h.csv", 513 << 20)),
    (
        "calibrate-start-fifo",
        ["calibrate", GOOD, "--start", "s.json"],
        "--start s.json is a pipe",
        _fifo("s.json"),
    ),
    (
        "report-reference-dev-null",
        ["report", GOOD, "--reference", "/dev/null"],
        "--reference /dev/null is a device",
        _none,
    ),
    # --- issue 19: paths the system cannot follow, outputs that are no files
    (
        "results-dir-loop",
        [*R, "--results-dir", "loop"],
        "--results-dir loop: a symbolic link loop",
        _loop("loop"),
    ),
    (
        "results-dir-under-loop",
        [*R, "--results-dir", "loop/sub"],
        "a symbolic link loop",
        _loop("loop"),
    ),
    (
        "storage-loop",
        [*R, "--storage", "loop"],
        "--storage loop: a symbolic link loop",
        _loop("loop"),
    ),
    ("show-loop", ["show", "loop"], "csv loop: a symbolic link loop", _loop("loop")),
    (
        "storage-fifo",
        [*R, "--storage", "s.db"],
        "--storage s.db is not a regular file",
        _fifo("s.db"),
    ),
    (
        "report-out-fifo",
        ["report", GOOD, "-o", "r.html"],
        "--out r.html is not a regular file",
        _fifo("r.html"),
    ),
    ("stdout-closed", ["models"], "stdout is closed", _stdout_closed),
    # --- issue 19: leaderboard numbers that are not finite (ranked first, a plot traceback)
    (
        "show-inf",
        ["show", "i.csv"],
        "tokens_per_s_per_gpu 'inf' is not a finite",
        _cell("i.csv", "tokens_per_s_per_gpu", "inf"),
    ),
    (
        "plot-inf",
        ["plot", "i.csv"],
        "line 2: tokens_per_s_per_gpu 'inf'",
        _cell("i.csv", "tokens_per_s_per_gpu", "inf"),
    ),
    (
        "export-nan",
        ["export", "i.csv"],
        "step_s 'nan' is not a finite",
        _cell("i.csv", "step_s", "nan"),
    ),
    (
        "report-minus-inf",
        ["report", "i.csv"],
        "peak_mem_gib '-inf'",
        _cell("i.csv", "peak_mem_gib", "-inf"),
    ),
    (
        "show-word",
        ["show", "i.csv"],
        "step_s 'fast' is not a finite",
        _cell("i.csv", "step_s", "fast"),
    ),
    # --- issue 19: -o onto what a command reads or keeps (it was overwritten with HTML, exit 0)
    (
        "report-out-storage",
        ["report", GOOD, "-o", "studies.sqlite3"],
        "--out studies.sqlite3 is an SQLite database",
        _optuna_sqlite("studies.sqlite3"),
    ),
    (
        "report-out-leaderboard",
        ["report", GOOD, "-o", X4],
        "--out x4.csv is a leaderboard CSV",
        _none,
    ),
    (
        "report-out-itself",
        ["report", GOOD, "-o", GOOD],
        "--out lb.csv is a file this command reads",
        _none,
    ),
    (
        "report-out-its-storage",
        ["report", GOOD, "--storage", "st.db", "-o", "st.db"],
        "--out st.db is a file this command reads",
        _optuna_sqlite("st.db"),
    ),
    (
        "report-default-out-is-input",
        ["report", "lb.html"],
        "lb.html is a file this command reads",
        _cell("lb.html", "reason", ""),
    ),
    (
        "plot-out-storage",
        ["plot", GOOD, "--out", "s.png"],
        "--out s.png is an SQLite database",
        _optuna_sqlite("s.png"),
    ),
    (
        "plot-default-out-is-input",
        ["plot", "lb.png"],
        "lb.png is a file this command reads",
        _cell("lb.png", "reason", ""),
    ),
    (
        "calibrate-out-csv",
        ["calibrate", GOOD, "--out", GOOD],
        "--out lb.csv is a file this command reads",
        _none,
    ),
    (
        "calibrate-out-storage",
        ["calibrate", GOOD, "--out", "c.json"],
        "--out c.json is an SQLite database",
        _optuna_sqlite("c.json"),
    ),
    # --- issue 19: storages
    (
        "storage-foreign",
        [*R, "--storage", "app.db"],
        "another application's SQLite database (tables notes)",
        _foreign_sqlite("app.db"),
    ),
    (
        "storage-foreign-url",
        [*R, "--storage", "sqlite:///app.db"],
        "another application's SQLite",
        _foreign_sqlite("app.db"),
    ),
    (
        "storage-future",
        [*R, "--storage", "new.db"],
        "(set up by optuna 99.0.0). Please try updating optuna to the latest version by "
        "`$ pip install -U optuna`.",
        _optuna_sqlite("new.db", "99.0.0"),
    ),
    (
        "storage-password",
        [*R, "--storage", "postgresql://user:secretpw@localhost:1/db"],
        "storage postgresql://user:***@localhost:1/db",
        _none,
    ),
    (
        "journal-garbage-line",
        [*R, "--storage", "j.log"],
        "(line 2 is not a journal entry)",
        _journal("j.log", ENTRY, "garbage{"),
    ),
    (
        "journal-list-line",
        [*R, "--storage", "j.log"],
        "(line 2 is not a journal entry)",
        _journal("j.log", ENTRY, "[1, 2]"),
    ),
    (
        "journal-binary-line",
        [*R, "--storage", "j.log"],
        "(line 2 is not a journal entry)",
        _journal("j.log", ENTRY, "\udcff"),
    ),
    (
        "journal-no-worker",
        [*R, "--storage", "j.log"],
        "line 2 has no worker_id",
        _journal("j.log", ENTRY, '{"op_code": 4}'),
    ),
    (
        "journal-cannot-replay",
        [*R, "--storage", "j.log"],
        "cannot replay: KeyError 'study_name'",
        _journal("j.log", '{"op_code": 0, "worker_id": "w"}'),
    ),
    # --- issue 19: options another runner or launcher ignored without a word
    (
        "launcher-without-verl",
        [*R, "--launcher", "slurm"],
        "--launcher applies to --runner verl or ladder only",
        _none,
    ),
    (
        "ray-address-without-verl",
        [*R, "--ray-address", "http://h:8265"],
        "--ray-address applies to --runner verl or ladder only",
        _none,
    ),
    (
        "train-file-without-verl",
        [*R, "--train-file", "t.parquet"],
        "--train-file applies to --runner verl or ladder only",
        _none,
    ),
    (
        "ray-address-under-slurm",
        [*R, "--runner", "verl", "--launcher", "slurm", "--ray-address", "http://h:8265"],
        "--ray-address applies to --launcher ray only",
        _none,
    ),
    (
        "export-rank-and-trial",
        ["export", GOOD, "--rank", "2", "--trial", "5"],
        "--rank 2 and --trial 5 both choose the row",
        _none,
    ),
]


def _snapshot(root: Path) -> dict[str, tuple[bool, int, int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (p.is_dir(), st.st_size, st.st_mode, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def leaderboards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real leaderboard of a 4-trial estimator study, and damaged copies of it."""
    d = tmp_path_factory.mktemp("lb")
    cwd = os.getcwd()
    os.chdir(d)
    try:
        argv = ["--model", "qwen2.5-7b", "--gpus", "8", "--trials", "4", "--no-progress"]
        assert main(argv) == 0
    finally:
        os.chdir(cwd)
    out = tmp_path_factory.mktemp("lbs")
    good = d / "results" / "qwen2.5-7b-h100x8-estimate.csv"
    shutil.copy(good, out / GOOD)
    with open(good, newline="") as f:
        rows = list(csv.DictReader(f))
    for name, trial in ((X4, "x4"), (NUL, "\x001")):
        rows[1]["trial"] = trial
        with open(out / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    (out / JUNK).write_text("name,value\nalpha,1\n")
    return out


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 60
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    ("argv", "fragment", "setup"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input(
    argv: list[str],
    fragment: str,
    setup: Setup,
    leaderboards: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _assert_refused(argv, fragment, setup, leaderboards, workdir, monkeypatch, capsys)


def _assert_refused(
    argv: list[str],
    fragment: str,
    setup: Setup,
    leaderboards: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """main(argv) in `workdir` (the leaderboards copied in, then `setup`): exit code 2 within
    SECONDS, one line on stderr holding `fragment`, no file created, changed or removed.
    Returns the line."""
    for name in (GOOD, X4, NUL, JUNK):
        shutil.copy(leaderboards / name, workdir / name)
    setup(workdir, monkeypatch)
    before = _snapshot(workdir)
    try:
        code = _within(SECONDS, main, argv)
    finally:
        for p in workdir.rglob("*"):  # let tmp_path clean up a read-only folder
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("tune: error: ") and fragment in lines[0], lines[0]
    after = _snapshot(workdir)
    for p in after:  # the chmod above is the test's own change
        if after[p][0] and p in before:
            after[p] = (True, before[p][1], before[p][2], after[p][3])
    for p in [p for p in after if p not in before and _empty_lock(p, after[p])]:
        del after[p]
    assert after == before
    return lines[0]


def _empty_lock(path: str, entry: tuple[bool, int, int, int]) -> bool:
    """An empty `<storage>.lock` (flock only): open_storage takes it before it reads a storage
    file, so that workers starting together create the tables once; it holds no data."""
    return path.endswith(".lock") and not entry[0] and entry[1] == 0


def test_every_option_is_checked() -> None:
    """Each option has a type, choices or is a flag; free text only where anything goes."""
    free_text = {
        "--gpu",  # checked against the GPU table (get_gpu) before anything is written
        "--workload",  # a preset name, checked by get_workload
        "--storage",  # a URL or a path; a path is checked by the validate step
        "--model-path",  # a path on the cluster, which this machine may not see
        "--ray-address",
        "--slurm-partition",
        "--slurm-account",
        "--slurm-arg",
        "--slurm-setup",
        "--status",  # show: filters (no match: an empty table)
        "--model",  # show's filter; run's and estimate's --model have a type
        "--source",
        "--sort",  # show: checked against the leaderboard's columns by the validate step
        "--columns",  # show: likewise
    }
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    unchecked = []
    for cmd, p in sub.choices.items():  # type: ignore[attr-defined]
        for a in p._actions:
            if not a.option_strings or a.nargs == 0 or a.dest == "help":
                continue
            if a.type is None and a.choices is None and a.option_strings[0] not in free_text:
                unchecked.append(f"{cmd} {a.option_strings[0]}")
    assert not unchecked


def test_os_error_inside_a_command_is_one_line(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file-system error the checks could not foresee (the disk fills, a folder turns
    read-only mid-study) ends as one line and exit 2, not a traceback."""
    import errno

    import tuner.study

    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "results/x.csv")

    monkeypatch.setattr(tuner.study, "run_study", full)
    assert main(R) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "results/x.csv: No space left on device: the disk is full" in line


def test_broken_pipe_is_quiet(workdir: Path, leaderboards: Path) -> None:
    """`tune show big.csv | head -1`: the first line, nothing on stderr, exit 1 (Python's
    documented handling of a closed stdout), not a BrokenPipeError traceback."""
    with open(leaderboards / GOOD, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(workdir / "big.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for i in range(4000):
            w.writerow({**rows[i % len(rows)], "trial": str(i)})
    out = subprocess.run(
        [
            "bash",
            "-c",
            f'"{sys.executable}" -m tuner show big.csv | head -n 1; exit "${{PIPESTATUS[0]}}"',
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=workdir,
    )
    assert out.stdout.startswith("trial") and len(out.stdout.splitlines()) == 1
    assert out.stderr == ""
    assert out.returncode == 1


@pytest.mark.parametrize("text", ["tp2tp4", "tp2pp2tp2", "", "  ", "ｔｐ２", "tp２", "tp2ｐｐ2"])
def test_layout_parse_refuses_what_the_cli_refuses(text: str) -> None:
    """ParallelLayout.parse (also used on leaderboard rows and reference layouts) refuses a
    degree given twice, an empty layout and non-ASCII digits, as `--layout` does."""
    from tuner.errors import UserError
    from tuner.space import ParallelLayout

    with pytest.raises(UserError, match="layout"):
        ParallelLayout.parse(text, 8)


# --------------------------------------------------------------------------------------------
# Generated: each class of bad input of issue 19, over every place it can come in
# --------------------------------------------------------------------------------------------


def _bad_values(least: int) -> list[tuple[str, object]]:
    from tuner.models import MAX_COUNT

    return [
        ("below", least - 1),
        ("fraction", 2.5),
        ("bool", True),
        ("text", "8"),
        ("list", [8]),
        ("above", MAX_COUNT + 1),
    ]


def _config_cases() -> list[tuple[str, dict[str, object], str]]:
    from tuner.models import CONFIG_COUNTS, CONFIG_FLAGS

    cases = [
        (f"{key}-{kind}", {key: value}, f"{key} is ")
        for key, least in CONFIG_COUNTS.items()
        for kind, value in _bad_values(least)
    ]
    cases += [
        (f"{key}-{kind}", {key: value}, f"{key} is {json.dumps(value)}, not true or false")
        for key in CONFIG_FLAGS
        for kind, value in (("text", "yes"), ("number", 1), ("list", [True]))
    ]
    return cases


@pytest.mark.parametrize(
    ("fields", "fragment"), [c[1:] for c in _config_cases()], ids=[c[0] for c in _config_cases()]
)
def test_every_config_json_value_is_checked(
    fields: dict[str, object],
    fragment: str,
    leaderboards: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every count and switch the config.json reader may use (models.CONFIG_COUNTS and
    CONFIG_FLAGS) is refused when it is not a whole JSON number in its range, or not true or
    false: 0 heads divided by zero, Infinity overflowed, 27.9 and true were read as 27 and 1."""
    setup = _config_json(_config(**fields))
    _assert_refused(EC, fragment, setup, leaderboards, workdir, monkeypatch, capsys)


INPUT_PATHS: list[tuple[str, list[str], int]] = [
    ("run --model", ["--model", "{}", "--gpus", "8", "--trials", "1", "--no-progress"], 4 << 20),
    ("estimate --model", [*EC[:2], "{}", *EC[3:]], 4 << 20),
    ("run --profile", [*R, "--profile", "{}"], 16 << 20),
    ("estimate --profile", [*E, "--layout", "tp2", "--profile", "{}"], 16 << 20),
    ("show", ["show", "{}"], 512 << 20),
    ("show second", ["show", GOOD, "{}"], 512 << 20),
    ("export", ["export", "{}"], 512 << 20),
    ("plot", ["plot", "{}"], 512 << 20),
    ("report", ["report", "{}"], 512 << 20),
    ("report --reference", ["report", GOOD, "--reference", "{}"], 512 << 20),
    ("calibrate", ["calibrate", "{}", "--dry-run"], 512 << 20),
    ("calibrate --start", ["calibrate", GOOD, "--start", "{}", "--dry-run"], 16 << 20),
]
"""Every option or argument that names a file tune reads, the file's largest size."""
INPUT_KINDS: list[tuple[str, Callable[[str, int], Setup], str]] = [
    ("fifo", lambda name, _size: _fifo(name), "is a pipe (fifo)"),
    ("huge", lambda name, size: _sparse(name, size + 1), "MiB, more than the"),
    ("folder", lambda name, _size: _dir(name), "is a folder"),
    ("loop", lambda name, _size: _loop(name), "symbolic link loop"),
]


@pytest.mark.parametrize(
    ("argv", "kind", "size"),
    [(a, k, n) for _, a, n in INPUT_PATHS for k in INPUT_KINDS],
    ids=[f"{where}-{k[0]}" for where, _, _ in INPUT_PATHS for k in INPUT_KINDS],
)
def test_every_input_path_is_a_bounded_regular_file(
    argv: list[str],
    kind: tuple[str, Callable[[str, int], Setup], str],
    size: int,
    leaderboards: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each file tune reads is refused, at once and unchanged, when it is a pipe (reading one
    blocked for good), a file over its size cap (/dev/zero grew without bound), a folder or a
    symbolic link loop."""
    name = "in.json"
    kind_name, make, fragment = kind
    model = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--model"]
    if model == ["{}"] and kind_name == "folder":
        fragment = "no config.json at"  # --model takes a folder holding one, or a file
    args = [a.replace("{}", name) for a in argv]
    _assert_refused(args, fragment, make(name, size), leaderboards, workdir, monkeypatch, capsys)


def test_devices_are_refused_as_input(
    leaderboards: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A device wherever a file is read (/dev/null here: /dev/zero, endless, is read in a
    process of bounded memory by the next test)."""
    for _, argv, _ in INPUT_PATHS:
        args = [a.replace("{}", "/dev/null") for a in argv]
        _assert_refused(
            args, "/dev/null is a device", _none, leaderboards, workdir, monkeypatch, capsys
        )


@pytest.mark.parametrize(
    "argv",
    [["show", "/dev/zero"], ["estimate", "--model", "/dev/zero", "--gpus", "8", "--layout", "tp2"]],
)
def test_dev_zero_is_refused_at_once(argv: list[str], workdir: Path) -> None:
    """`--model /dev/zero` and `tune show /dev/zero` read without bound until the kernel killed
    the process; here in a process whose address space is capped (4 GiB), so that a reader that
    regresses fails this test instead of exhausting the machine."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    out = subprocess.run(
        [sys.executable, "-m", "tuner", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=workdir,
        preexec_fn=cap,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        f"tune: error: {'csv' if argv[0] == 'show' else 'model config'} /dev/zero is a device: "
        "pass a regular file"
    ]


NUMERIC_CELLS = [("tokens_per_s_per_gpu", "inf"), ("step_s", "-inf"), ("peak_mem_gib", "nan")]
NUMERIC_CELLS += [("tp", "1e999"), ("pred_step_s", "Infinity"), ("mfu_update_pct", "fast")]


@pytest.mark.parametrize("command", ["show", "plot", "export", "report", "calibrate"])
@pytest.mark.parametrize(("column", "value"), NUMERIC_CELLS)
def test_every_leaderboard_number_is_finite(
    command: str,
    column: str,
    value: str,
    leaderboards: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A leaderboard cell of a numeric column that is not a finite number (an inf throughput
    was ranked first; `tune plot` crashed on it) is refused by every command, naming the line
    and the column."""
    argv = [command, "bad.csv", *(["--dry-run"] if command == "calibrate" else [])]
    fragment = f"bad.csv line 2: {column} {value!r} is not a finite number"
    setup = _cell("bad.csv", column, value)
    _assert_refused(argv, fragment, setup, leaderboards, workdir, monkeypatch, capsys)


OUTPUTS: list[tuple[str, list[str], str]] = [
    ("report -o", ["report", GOOD, "-o", "{}"], ".html"),
    ("plot --out", ["plot", GOOD, "--out", "{}"], ".png"),
    ("plot --out svg", ["plot", GOOD, "--out", "{}"], ".svg"),
    ("calibrate --out", ["calibrate", GOOD, "--out", "{}"], ".json"),
]
"""Every option naming a file a command writes over, and the kind it writes."""
TARGETS: list[tuple[str, Callable[[str], Setup], str]] = [
    ("optuna-storage", lambda name: _optuna_sqlite(name), "is an SQLite database"),
    ("other-sqlite", lambda name: _foreign_sqlite(name), "is an SQLite database"),
    ("leaderboard", lambda name: _cell(name, "reason", ""), "is a file this command reads"),
    ("text", lambda name: _file(name, "my notes\n"), "is a file of another kind"),
    ("fifo", lambda name: _fifo(name), "is not a regular file"),
]


@pytest.mark.parametrize(
    ("argv", "suffix", "target"),
    [(a, x, t) for _, a, x in OUTPUTS for t in TARGETS],
    ids=[f"{w}-{t[0]}" for w, _, _ in OUTPUTS for t in TARGETS],
)
def test_no_output_replaces_an_input_a_storage_or_another_file(
    argv: list[str],
    suffix: str,
    target: tuple[str, Callable[[str], Setup], str],
    leaderboards: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`tune report X -o results/studies.sqlite3` overwrote the storage with HTML and exited 0.
    An output is never a file the command reads, and where a file is there it must be of the
    kind the command writes."""
    kind, make, fragment = target
    name = f"t{suffix}"
    args = [a.replace("{}", name) for a in argv]
    if kind == "leaderboard":  # the command reads the very file it would write
        args = [name if a == GOOD else a for a in args]
    _assert_refused(args, fragment, make(name), leaderboards, workdir, monkeypatch, capsys)


def test_an_output_of_its_own_kind_is_replaced(
    leaderboards: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard lets a command rewrite what it wrote before (the report's content is not
    what this tests: a stand-in keeps it fast)."""
    monkeypatch.setattr("tuner.report.page.build_report", lambda *_a, **_k: "<!DOCTYPE html>\n")
    shutil.copy(leaderboards / GOOD, workdir / GOOD)
    (workdir / "r.html").write_text("<!DOCTYPE html>\n<html><body>an old report</body></html>\n")
    assert main(["report", GOOD, "-o", "r.html"]) == 0
    assert "an old report" not in (workdir / "r.html").read_text()
    assert main(["plot", GOOD, "--out", "p.png"]) == 0
    assert main(["plot", GOOD, "--out", "p.png"]) == 0


def _run_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices["run"]  # type: ignore[attr-defined,no-any-return]


def flags_of(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Each option string of `parser` and its action (argparse's own list: a test may look)."""
    return {s: a for a in parser._actions for s in a.option_strings}


def _takes(a: argparse.Action, text: str) -> bool:
    """Whether option `a` takes `text` as its value."""
    if a.type is None or not callable(a.type):
        return True
    try:
        a.type(text)
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False
    return True


def _runner_options() -> list[tuple[str, list[str]]]:
    """Each option `RUN_OPTIONS` declares, with a value that is not its default."""
    actions = flags_of(_run_parser())
    out = []
    for flag in RUN_OPTIONS:
        a = actions[flag]
        if a.nargs == 0:
            given = [flag]
        elif a.choices:
            given = [flag, next(c for c in a.choices if c != a.default)]
        else:
            given = [flag, "x=y" if _takes(a, "x=y") else "4"]  # a count: --verl-steps
        out.append((flag, given))
    return out


def test_the_verl_runner_options_are_declared() -> None:
    """Every option of the parser's `verl runner` group is declared in RUN_OPTIONS as the verl
    runner's, with the launcher its help names: the check reads the declaration, not the
    help."""
    import re

    run = _run_parser()
    for group in run._action_groups:
        if not (group.title or "").startswith("verl runner"):
            continue
        for a in group._group_actions:
            opt = RUN_OPTIONS[a.option_strings[0]]
            assert "verl" in opt.runners.names, opt
            m = re.match(r"--launcher (\w+):", a.help or "")
            assert opt.launcher == (m.group(1) if m else ""), opt
            assert a.default == opt.parser_default, opt


@pytest.mark.parametrize(
    ("flag", "given"), _runner_options(), ids=[o[0] for o in _runner_options()]
)
def test_runner_options_need_their_runner(
    flag: str,
    given: list[str],
    leaderboards: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A verl-runner option under another runner (`--ray-address` with the estimator), a
    megatron-runner option under the verl runner, and a launcher's option under another
    launcher, was ignored without a word."""
    opt = RUN_OPTIONS[flag]
    runners = flags_of(_run_parser())["--runner"].choices
    for runner in (r for r in runners if r not in opt.runners.names):
        argv = [*R, "--runner", runner, *given]
        fragment = f"applies to {opt.runners.text}, not --runner {runner}"
        _assert_refused(argv, fragment, _none, leaderboards, workdir, monkeypatch, capsys)
    if opt.launcher:
        other = "local" if opt.launcher != "local" else "ray"
        argv = [*R, "--runner", "verl", "--launcher", other, *given]
        fragment = f"{flag} applies to --launcher {opt.launcher} only, not --launcher {other}"
        _assert_refused(argv, fragment, _none, leaderboards, workdir, monkeypatch, capsys)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://user:s3cret@localhost:1/db",
        "postgresql+psycopg2://user:s3cret@db.example:5432/optuna",
        "mysql://root:s3cret@127.0.0.1/optuna",
        "mysql+pymysql://u:s3cret@h/o?charset=utf8",
    ],
)
def test_no_password_is_printed(
    url: str,
    leaderboards: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An error about a server storage names it without its password (printed lines end in
    terminals, logs and bug reports)."""
    argv = [*R, "--storage", url]
    line = _assert_refused(argv, ":***@", _none, leaderboards, workdir, monkeypatch, capsys)
    assert "s3cret" not in line


def test_a_report_names_no_password(leaderboards: Path, workdir: Path) -> None:
    """`tune report --storage postgresql://user:pass@...` wrote the password into the HTML
    (where the storage could not be opened, and where it could)."""
    shutil.copy(leaderboards / GOOD, workdir / GOOD)
    url = "postgresql://user:s3cret@localhost:1/db"
    assert main(["report", GOOD, "--storage", url, "-o", "r.html"]) == 0
    html = (workdir / "r.html").read_text()
    assert "s3cret" not in html and "postgresql://user:***@localhost:1/db" in html


def test_length_sampler_is_fast_for_any_cap() -> None:
    """--response-len 100000000 hung: the sampler moved one token per pass over the batch to
    meet the mean; the remainder is now spread in one sort (tests/test_lengths.py: the same
    lengths as before)."""
    from tuner.lengths import draw_response_lengths

    out = _within(5, lambda: len(draw_response_lengths(8192, max_len=10**8, mean_len=15e6, seed=1)))
    assert out == 8192


def test_estimate_json_is_json(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`tune estimate --json` of a configuration that cannot fit printed `"step_s": Infinity`,
    which strict JSON readers refuse. A step that is not finite is now no estimate at all (exit
    2, one line: tests/test_nonsense_38.py); one that does not fit in memory prints strict JSON."""
    argv = [*E, "--layout", "tp2", "--response-len", "1000000", "--json"]
    assert _within(SECONDS, main, argv) == 2
    assert "does not fit and has no step time" in capsys.readouterr().err
    argv = [*E, "--layout", "tp2", "--response-len", "65536", "--json"]
    assert _within(SECONDS, main, argv) == 0

    def refuse(name: str) -> None:
        raise ValueError(f"{name} in the output")

    d = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert d["fits"] is False and d["step_s"] > 0


def test_no_layout_fits_is_exit_2(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU count no layout fits ended with exit 0 and "no trial finished ok"; the README
    promises exit 2 and one line, and nothing is written (no storage, no leaderboard)."""
    for argv in (
        ["--model", "llama3.1-70b", "--gpus", "1", "--no-progress", "--no-warm-start"],
        ["--model", "qwen2.5-7b", "--gpus", "1", "--response-len", "1000000"],
    ):
        assert _within(SECONDS, main, argv) == 2  # the hang guard: ends within SECONDS
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "no configuration of" in lines[0], lines
        assert "fits 1x h100" in lines[0] and "--gpus" in lines[0]
        assert not list(workdir.iterdir())


def test_a_bom_copy_of_a_leaderboard_is_read(leaderboards: Path, workdir: Path) -> None:
    """A leaderboard saved by a spreadsheet starts with a UTF-8 byte order mark: it was
    refused as 'neither a verl-tuner leaderboard nor a reference CSV'."""
    (workdir / "bom.csv").write_bytes(b"\xef\xbb\xbf" + (leaderboards / GOOD).read_bytes())
    for argv in (["show", "bom.csv"], ["export", "bom.csv"], ["plot", "bom.csv"]):
        assert main(argv) == 0, argv


def test_the_storage_failing_mid_study_is_one_line_naming_it(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SQLite's 'database or disk is full' mid-study (raised through sqlalchemy and Optuna)
    was a traceback; one line now, naming the storage."""
    import optuna
    import sqlalchemy.exc

    import tuner.study

    def full(*_a: object, **_k: object) -> None:
        cause = sqlite3.OperationalError("database or disk is full")
        try:
            raise sqlalchemy.exc.OperationalError("INSERT", {}, cause)
        except sqlalchemy.exc.OperationalError as e:
            raise optuna.exceptions.StorageInternalError("commit failed") from e

    monkeypatch.setattr(tuner.study, "run_study", full)
    assert main(R) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "studies.sqlite3: the disk is full: free space" in line, line


def test_a_full_disk_names_the_file(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write's ENOSPC carries no file name ('No space left on device: the disk is full'
    said not where): write_atomic names the file it was writing."""
    import errno

    from tuner.cli_args import os_error_line
    from tuner.fileio import write_atomic

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as e:
        write_atomic(workdir / "results" / "x.csv", "a\n")
    assert os_error_line(e.value).startswith(f"{workdir / 'results' / 'x.csv'}: No space left")
    assert not (workdir / "results" / "x.csv").exists()


def test_stdout_closed_is_one_line(workdir: Path) -> None:
    """`tune models >&-` was an AttributeError traceback."""
    out = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -m tuner models >&-'],
        capture_output=False,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        cwd=workdir,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "tune: error: stdout is closed: run tune with its output open, e.g. > tune.out"
    ]


# --------------------------------------------------------------------------------------------
# The CLI audit: classes of bad input that ran, wrote files or named the wrong fix before
# (a --storage of no known scheme, readers creating a storage, leaderboards cut short mid-row,
# --candidates-from read unchecked, files a study writes blocked below the checked folders,
# config.json and calibration-profile values read silently)
# --------------------------------------------------------------------------------------------

STUDY = "qwen2.5-7b-h100x8-estimate"
"""The default study name of R (the search a case would run)."""


def _unreadable(name: str, text: str = "{}") -> Setup:
    """A file of mode 000. Root reads anything, so for root the check's view (os.access) is
    made to say what it says to everyone else."""

    def setup(d: Path, mp: pytest.MonkeyPatch) -> None:
        if not (d / name).exists():
            (d / name).write_text(text)
        (d / name).chmod(0)
        if os.geteuid() == 0:
            real = os.access
            target = (d / name).absolute()

            def access(path: object, mode: int, **kw: object) -> bool:
                if mode & os.R_OK and Path(str(path)).absolute() == target:
                    return False
                return real(path, mode, **kw)  # type: ignore[arg-type]

            mp.setattr(os, "access", access)

    return setup


def _closed_folder(name: str) -> Setup:
    """A folder of mode 000 holding a config.json: this user may not look inside. Root may, so
    for root a stat inside it through a relative path (as tune's lookups are here) raises the
    PermissionError everyone else gets."""

    def setup(d: Path, mp: pytest.MonkeyPatch) -> None:
        import errno

        folder = d / name
        folder.mkdir()
        (folder / "config.json").write_text(_config())
        folder.chmod(0)
        if os.geteuid() == 0:
            real = os.stat

            def stat(path: object, *a: object, **kw: object) -> os.stat_result:
                p = Path(os.fsdecode(path)) if isinstance(path, str | bytes | Path) else None
                if p is not None and not p.is_absolute() and folder in (d / p).parents:
                    raise PermissionError(errno.EACCES, "Permission denied", str(path))
                return real(path, *a, **kw)  # type: ignore[arg-type]

            mp.setattr(os, "stat", stat)

    return setup


def _damaged(name: str, how: str) -> Setup:
    """A copy of the good leaderboard damaged as a copy or an editor damages one: `cut` (the
    file ends in the middle of its last row), `short` (a row lost cells), `long` (a row gained
    cells), `latin1` (a byte that is not UTF-8), `huge-cell` (one cell of 200,000 characters)."""

    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        data = (d / GOOD).read_bytes()
        lines = data.split(b"\n")
        if how == "cut":
            last = data.rstrip(b"\r\n").rsplit(b"\n", 1)[1]
            data = data.rstrip(b"\r\n")[: -len(last) // 2]
        elif how == "short":
            lines[2] = b",".join(lines[2].split(b",")[:5]) + b"\r"
            data = b"\n".join(lines)
        elif how == "long":
            lines[2] = lines[2].rstrip(b"\r") + b",x,y\r"
            data = b"\n".join(lines)
        elif how == "latin1":
            lines[2] = lines[2].replace(b",ok,", b",\xf6k,", 1)
            data = b"\n".join(lines)
        elif how == "huge-cell":
            data = data.replace(b",ok,", b",ok" + b"x" * 200_000 + b",", 1)
        (d / name).write_bytes(data)

    return setup


def _reference(name: str) -> Setup:
    """A published reference leaderboard (tests/data/anchors/dapo7b.csv)."""

    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        shutil.copy(ANCHORS / "dapo7b.csv", d / name)

    return setup


def _profile(**constants: object) -> Setup:
    return _file("p.json", json.dumps({"schema": 2, "constants": constants}))


# (id, argv, fragment of the one stderr line, setup)
AUDIT_CASES: list[tuple[str, list[str], str, Setup]] = [
    # --storage forms: tried as a SQLAlchemy plugin ('move the file aside'), or taken as a file
    # name (sqlite:x.db), or an in-memory database that kept nothing (sqlite://)
    ("storage-ftp", [*R, "--storage", "ftp://h/x.db"], "unknown scheme 'ftp'", _none),
    ("storage-redis", [*R, "--storage", "redis://h:6379"], "unknown scheme 'redis'", _none),
    ("storage-typo", [*R, "--storage", "sqllite:///x.db"], "unknown scheme 'sqllite'", _none),
    ("storage-postgres", [*R, "--storage", "postgres://u@h/db"], "name is postgresql", _none),
    ("storage-no-slashes", [*R, "--storage", "sqlite:x.db"], "write sqlite:///x.db", _none),
    ("storage-host", [*R, "--storage", "sqlite://x.db"], "write sqlite:///x.db (three", _none),
    ("storage-memory", [*R, "--storage", "sqlite://"], "in-memory database", _none),
    ("storage-memory-path", [*R, "--storage", "sqlite:///:memory:"], "in-memory", _none),
    # a command that reads a storage (report, reread) created one, or Optuna's tables in one
    (
        "report-storage-missing",
        ["report", GOOD, "--storage", "no.db", "-o", "r.html"],
        "--storage no.db: no such file",
        _none,
    ),
    (
        "report-storage-url-missing",
        ["report", GOOD, "--storage", "sqlite:///no.db", "-o", "r.html"],
        "--storage no.db: no such file",
        _none,
    ),
    (
        "report-storage-empty",
        ["report", GOOD, "--storage", "e.db", "-o", "r.html"],
        "--storage e.db is empty, not an Optuna storage",
        _file("e.db", ""),
    ),
    (
        "report-storage-text",
        ["report", GOOD, "--storage", "n.db", "-o", "r.html"],
        "--storage n.db is not an SQLite database",
        _file("n.db", "my notes\n"),
    ),
    (
        "report-storage-foreign",
        ["report", GOOD, "--storage", "f.db", "-o", "r.html"],
        "another application's SQLite database",
        _foreign_sqlite("f.db"),
    ),
    (
        "report-storage-folder",
        ["report", GOOD, "--storage", "f", "-o", "r.html"],
        "--storage f is a folder",
        _dir("f"),
    ),
    (
        "report-storage-ftp",
        ["report", GOOD, "--storage", "ftp://h/x", "-o", "r.html"],
        "unknown scheme 'ftp'",
        _none,
    ),
    (
        "reread-storage-empty",
        ["reread", "--study", "s", "--results-dir", "st", "--storage", "e.db"],
        "--storage e.db is empty",
        _all(_dir("st"), _file("e.db", "")),
    ),
    (
        "reread-storage-url-missing",
        ["reread", "--study", "s", "--results-dir", "st", "--storage", "sqlite:///no.db"],
        "--storage no.db: no such file",
        _dir("st"),
    ),
    (
        "reread-default-storage-empty",
        ["reread", "--study", "s", "--results-dir", "st"],
        "storage of the study st/s.sqlite3 is empty",
        _file("st/s.sqlite3", ""),
    ),
    # only a leaderboard tune wrote will do ('no column step_s'; 'no ok row')
    (
        "export-reference",
        ["export", "ref.csv"],
        "ref.csv is a published reference CSV: `tune export` takes",
        _reference("ref.csv"),
    ),
    (
        "candidates-reference",
        [*R, "--candidates-from", "ref.csv"],
        "--candidates-from ref.csv is a published reference CSV",
        _reference("ref.csv"),
    ),
    # --candidates-from was read unchecked: 'run `tune --model ...` first' for a missing file,
    # 'make it writable' for an unreadable one, another model's rows taken
    (
        "candidates-missing",
        [*R, "--candidates-from", "no.csv"],
        "--candidates-from: no file",
        _none,
    ),
    (
        "candidates-folder",
        [*R, "--candidates-from", "d"],
        "--candidates-from d is a folder",
        _dir("d"),
    ),
    ("candidates-junk", [*R, "--candidates-from", JUNK], "neither a verl-tuner", _none),
    ("candidates-nul", [*R, "--candidates-from", NUL], "holds a NUL byte", _none),
    (
        "candidates-unreadable",
        [*R, "--candidates-from", "c.csv"],
        "--candidates-from c.csv cannot be read: check its permissions",
        _all(_cell("c.csv", "reason", ""), _unreadable("c.csv")),
    ),
    (
        "candidates-other-model",
        [*R, "--candidates-from", "o.csv"],
        "ran model 'llama3.1-70b', not qwen2.5-7b",
        _cell("o.csv", "model", "llama3.1-70b"),
    ),
    # a file in the way below the checked folders stopped the study after its trials ran
    (
        "recipe-folder-is-file",
        R,
        "recipe folder of model qwen2.5-7b: recipes/qwen2.5-7b is a file",
        _file("recipes/qwen2.5-7b"),
    ),
    (
        "csv-lock-is-folder",
        R,
        f"lock file of study {STUDY}: results/{STUDY}.csv.lock is a folder",
        _dir(f"results/{STUDY}.csv.lock"),
    ),
    (
        "storage-lock-is-folder",
        [*R, "--storage", "s.db"],
        "s.db.lock is a folder",
        _dir("s.db.lock"),
    ),
    (
        "study-lock-is-folder",
        [*R, "--storage", "s.db", "--study", "st"],
        "lock file of study st: s.db.st.lock is a folder",
        _dir("s.db.st.lock"),
    ),
    (
        "journal-lock-is-folder",
        [*R, "--storage", "j.log"],
        "j.log.lock is a folder",
        _dir("j.log.lock"),
    ),
    # config.json values read without a word: a head width floored, a model_type of 5
    (
        "config-head-width",
        EC,
        "hidden_size 250 is not a multiple of num_attention_heads 8",
        _config_json(_config(hidden_size=250)),
    ),
    ("config-model-type", EC, "model_type is 5, not text", _config_json(_config(model_type=5))),
    (
        "config-name-list",
        EC,
        "_name_or_path is [1], not text",
        _config_json(_config(_name_or_path=[1])),
    ),
    # a folder tune may not look into: 'Permission denied: make it writable'
    (
        "model-folder-closed",
        [*EC[:2], "m", *EC[3:]],
        "model config m/config.json cannot be read: check its permissions",
        _closed_folder("m"),
    ),
    (
        "model-file-in-closed-folder",
        [*EC[:2], "m/config.json", *EC[3:]],
        "model config m/config.json cannot be read",
        _closed_folder("m"),
    ),
    # calibration profiles: values outside what calibrate fits, text, true, misspelt names
    # dropped, 'unreadable (schema None != 2)', "unreadable ('constants')"
    (
        "profile-below",
        [*E, "--layout", "tp2", "--profile", "p.json"],
        "gemm_efficiency 0.2 is outside 0.3..1",
        _profile(gemm_efficiency=0.2),
    ),
    (
        "profile-above",
        [*R, "--profile", "p.json"],
        "hbm_efficiency 1.5 is outside 0.3..1",
        _profile(hbm_efficiency=1.5),
    ),
    (
        "profile-huge",
        [*R, "--profile", "p.json"],
        "layer_host_s 1e+300 is outside",
        _profile(layer_host_s=1e300),
    ),
    (
        "profile-text",
        [*R, "--profile", "p.json"],
        'gemm_efficiency is "0.5", not a number',
        _profile(gemm_efficiency="0.5"),
    ),
    (
        "profile-true",
        [*R, "--profile", "p.json"],
        "gemm_efficiency is true, not a number",
        _profile(gemm_efficiency=True),
    ),
    (
        "profile-misspelt",
        [*R, "--profile", "p.json"],
        "unknown constant 'gemm_efficency'",
        _profile(gemm_efficency=0.5),
    ),
    (
        "profile-negative",
        [*R, "--profile", "p.json"],
        "collective_latency_s -1 is outside 1e-06..0.001 (the range the cost model takes)",
        _profile(collective_latency_s=-1),
    ),
    (
        "profile-no-schema",
        [*R, "--profile", "p.json"],
        "has schema null, not 2",
        _file("p.json", '{"gemm_efficiency": 0.5}'),
    ),
    (
        "profile-no-constants",
        [*R, "--profile", "p.json"],
        'has no "constants" object',
        _file("p.json", '{"schema": 2}'),
    ),
    (
        "profile-list",
        ["calibrate", GOOD, "--start", "p.json", "--dry-run"],
        "holds no JSON object",
        _file("p.json", "[]"),
    ),
    (
        "profile-unreadable",
        [*R, "--profile", "p.json"],
        "--profile p.json cannot be read: check its permissions",
        _unreadable("p.json"),
    ),
]


def test_the_audit_has_its_cases() -> None:
    assert len(AUDIT_CASES) >= 45
    assert len({c[0] for c in AUDIT_CASES} | {c[0] for c in CASES}) == len(AUDIT_CASES) + len(CASES)


@pytest.mark.parametrize(
    ("argv", "fragment", "setup"), [c[1:] for c in AUDIT_CASES], ids=[c[0] for c in AUDIT_CASES]
)
def test_audit_case(
    argv: list[str],
    fragment: str,
    setup: Setup,
    leaderboards: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _assert_refused(argv, fragment, setup, leaderboards, workdir, monkeypatch, capsys)


LEADERBOARD_INPUTS: list[tuple[str, list[str]]] = [
    ("show", ["show", "{}"]),
    ("export", ["export", "{}"]),
    ("plot", ["plot", "{}"]),
    ("report", ["report", "{}"]),
    ("calibrate", ["calibrate", "{}", "--dry-run"]),
    ("report --reference", ["report", GOOD, "--reference", "{}", "-o", "r.html"]),
    ("run --candidates-from", [*R, "--candidates-from", "{}"]),
]
"""Every argument that names a leaderboard a command reads."""
DAMAGE: list[tuple[str, str]] = [
    ("cut", "the file ends in the middle of it (cut short?)"),
    ("short", "line 3 has 5 fields, the header {n}: the row is damaged"),
    ("long", "line 3 has {m} fields, the header {n}: the row is damaged"),
    ("latin1", "line 3 is not UTF-8 text (byte 0xf6): save the file as UTF-8"),
    ("huge-cell", "line 2: field larger than field limit"),
]
"""How a copy or an editor damages a leaderboard (`_damaged`), and what the refusal says."""


@pytest.mark.parametrize(
    ("argv", "how", "fragment"),
    [(a, h, f) for _, a in LEADERBOARD_INPUTS for h, f in DAMAGE],
    ids=[f"{w}-{h}" for w, _ in LEADERBOARD_INPUTS for h, _ in DAMAGE],
)
def test_every_damaged_leaderboard_is_refused(
    argv: list[str],
    how: str,
    fragment: str,
    leaderboards: Path,
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A leaderboard cut short in the middle of its last row (a copy interrupted), a row that
    lost or gained cells, and a file that is not UTF-8 were read by csv.DictReader as rows of
    empty measures (show, plot, report and --candidates-from went on; export wrote a recipe):
    every argument that names a leaderboard refuses it, naming the line."""
    with open(leaderboards / GOOD, newline="") as f:
        n = len(next(csv.reader(f)))
    args = [a.replace("{}", "bad.csv") for a in argv]
    expected = fragment.format(n=n, m=n + 2)
    setup = _damaged("bad.csv", how)
    line = _assert_refused(args, expected, setup, leaderboards, workdir, monkeypatch, capsys)
    assert line.startswith("tune: error: bad.csv line "), line


def test_what_the_new_checks_let_through(
    leaderboards: Path, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checks above refuse only what they name: a config.json whose head width is given
    (head_dim, as Qwen3's), a profile `tune calibrate` wrote and one of an earlier version
    (constants since retired), a storage URL with a driver, a leaderboard without its last
    newline, and --candidates-from of the same model."""
    from tuner.cli_args import check_storage_url
    from tuner.estimate import Profile, save_profile

    (workdir / "config.json").write_text(_config(hidden_size=250, head_dim=32))
    assert main(EC) == 0
    save_profile(Profile(), workdir / "p.json")
    assert main([*E, "--layout", "tp2", "--profile", "p.json"]) == 0
    old = {"schema": 2, "constants": {"context_gib": 3.0, "fragmentation": 0.1}}  # retired
    (workdir / "old.json").write_text(json.dumps(old))
    assert main([*E, "--layout", "tp2", "--profile", "old.json"]) == 0
    assert check_storage_url("postgresql+psycopg2://u@h/db") is None
    assert check_storage_url("sqlite:////abs/x.db") == Path("/abs/x.db")
    assert check_storage_url("x.log") == Path("x.log")
    (workdir / "nl.csv").write_bytes((leaderboards / GOOD).read_bytes().rstrip(b"\r\n"))
    assert main(["show", "nl.csv"]) == 0
    shutil.copy(leaderboards / GOOD, workdir / GOOD)
    argv = [*R, "--candidates-from", GOOD, "--runner", "estimate", "--no-warm-start"]
    assert main(argv) == 0, capsys.readouterr().err
