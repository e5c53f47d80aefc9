"""Issue 38 (hardening 4), item 4: nonsense that was accepted. One test (or a parametrized
family) per class, each refused where the class is decided, with exit code 2, one line that
says what to change, and no file written; each fails on the code before the fix."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_bad_input import (
    GOOD,
    Setup,
    _assert_refused,
    _cell,
    _config,
    _config_json,
    _file,
    _none,
    leaderboards,  # noqa: F401  (a fixture of that module, used here by name)
)

R = ["--model", "qwen2.5-7b", "--gpus", "8", "--no-progress", "--trials", "2"]
"""A search that would run (and write results/) if the case's bad argument were accepted."""
E = ["estimate", "--model", "qwen2.5-7b", "--gpus", "8", "--layout", "tp2"]
"""An estimate that would print if the bad argument were accepted."""
EC = ["estimate", "--model", "config.json", "--gpus", "8"]
"""An estimate of the model in ./config.json (its --layout added by the case)."""
RC = ["--model", "config.json", "--gpus", "8", "--no-progress", "--trials", "2"]
"""A search of the model in ./config.json."""


# --------------------------------------------------------------------------------------------
# The model's numbers and the parallel layout's rules (tuner.models, tuner.space.rules)
# --------------------------------------------------------------------------------------------

MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=96)
"""A small MoE's routed experts (each expert's width 96: 3 x 32)."""

MODEL_CASES: list[tuple[str, list[str], str, Setup]] = [
    # an FFN width (intermediate_size) that no tp > 1 divides: megatron-core's `divide` asserts
    (
        "ffn-odd-tp2",
        [*EC, "--layout", "tp2"],
        "tp(2) does not divide the MLP width (intermediate_size), 513",
        _config_json(_config(intermediate_size=513)),
    ),
    (
        "ffn-odd-rollout-tp2",
        [*EC, "--layout", "dp8", "--rollout-tp", "2"],
        "rollout tp(2) does not divide the MLP width (intermediate_size), 513",
        _config_json(_config(intermediate_size=513)),
    ),
    # the experts' width over etp, and over vLLM's tp where the rollout is not expert-parallel
    (
        "moe-ffn-etp",
        [*EC, "--layout", "tp2ep2etp2"],
        "etp(2) does not divide the experts' width (moe_intermediate_size), 97",
        _config_json(_config(**{**MOE, "moe_intermediate_size": 97})),
    ),
    (
        "moe-ffn-rollout-tp",
        [*EC, "--layout", "ep8", "--rollout-tp", "2"],
        "rollout tp(2) does not divide the experts' width (moe_intermediate_size), 97",
        _config_json(_config(**{**MOE, "moe_intermediate_size": 97})),
    ),
    # the shared experts are split over tp like a dense MLP
    (
        "shared-experts-tp",
        [*EC, "--layout", "tp2ep2"],
        "tp(2) does not divide the shared experts' width, 97",
        _config_json(_config(**MOE, shared_expert_intermediate_size=97)),
    ),
    # a dense model's etp shards nothing: tp2etp2 is tp2 under another name
    ("dense-etp", [*E[:-1], "tp2etp2"], "etp(2) > 1 on a dense model", _none),
    # a vocabulary below the 256 byte values any tokenizer holds
    ("vocab-1", [*EC, "--layout", "tp2"], "vocab_size is 1, outside 256..",
     _config_json(_config(vocab_size=1))),
    ("vocab-255", RC, "vocab_size is 255, outside 256..", _config_json(_config(vocab_size=255))),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "fragment", "setup"), [c[1:] for c in MODEL_CASES], ids=[c[0] for c in MODEL_CASES]
)
def test_a_model_the_layout_cannot_split_is_refused(
    argv: list[str],
    fragment: str,
    setup: Setup,
    leaderboards: Path,  # noqa: F811
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """intermediate_size 513 got tp2 rows (megatron-core and vLLM split an MLP's width over tp
    with an assert); tp2etp2 of a dense model was scored as a layout of its own; vocab_size 1
    was read."""
    _assert_refused(argv, fragment, setup, leaderboards, workdir, monkeypatch, capsys)


def test_the_search_offers_no_tp_the_ffn_width_refuses() -> None:
    """The space's layouts and rollout tps are those the rules allow: a model whose MLP width
    is odd is searched at tp 1 only (its rows were tp2, tp4, tp8)."""
    from tuner.hardware import Cluster, get_gpu
    from tuner.models import get_model
    from tuner.space import SearchSpace
    from tuner.workload import get_workload

    odd = dataclasses.replace(get_model("qwen2.5-7b"), ffn_hidden_size=18945)
    cl = Cluster(gpu=get_gpu("h100"), num_gpus=8)
    space = SearchSpace(model=odd, cluster=cl, workload=get_workload("dapo-math"))
    assert {lay.tp for lay in space.layouts.values()} == {1}
    assert space.rollout_tps == [1]
    even = SearchSpace(model=get_model("qwen2.5-7b"), cluster=cl, workload=space.workload)
    assert {lay.tp for lay in even.layouts.values()} == {1, 2, 4}  # 28 heads: not 8
    assert all(lay.etp == 1 for lay in even.layouts.values())


def test_the_rules_are_the_search_spaces_and_the_megatron_runner_has_no_copy() -> None:
    """dense_no_etp was the megatron runner's own rule: the estimator and `tune estimate`
    scored tp2etp2 of a dense model. It is one shared rule now, and megatron-core's refusals
    of an FFN width are shared too (the worker's spec check refuses them: layout_model_rules)."""
    from tuner.runners.megatron_refusals import MEGATRON_RULES
    from tuner.space import RULES, ParallelLayout, layout_model_rules

    shared = {r.name for r in RULES}
    assert {"dense_no_etp", "tp_ffn", "etp_ffn"} <= shared
    assert shared.isdisjoint(r.name for r in MEGATRON_RULES)
    from tuner.models import get_model

    odd = dataclasses.replace(get_model("qwen2.5-7b"), ffn_hidden_size=18945)
    names = {n for n, _ in layout_model_rules(ParallelLayout(world=2, tp=2), odd)}
    assert names == {"tp_ffn"}
    # etp > 1 on a dense model: megatron-core runs it, so the worker's spec check allows it
    assert not layout_model_rules(ParallelLayout(world=2, tp=2, etp=2), get_model("qwen2.5-7b"))


def test_every_spec_holds_a_vocabulary_of_the_byte_values() -> None:
    """ModelSpec itself refuses a vocabulary below MIN_VOCAB (a megatron worker spec, a
    registry entry), not only the config.json reader."""
    from tuner.errors import UserError
    from tuner.models import MIN_VOCAB, get_model

    m = get_model("qwen2.5-7b")
    with pytest.raises(UserError, match=f"vocab_size 255 is below {MIN_VOCAB}"):
        dataclasses.replace(m, vocab_size=255)
    assert dataclasses.replace(m, vocab_size=MIN_VOCAB).vocab_size == MIN_VOCAB


# --------------------------------------------------------------------------------------------
# Options that do nothing with the chosen runner or the other options (tuner.cli_args)
# --------------------------------------------------------------------------------------------

OPTION_CASES: list[tuple[str, list[str], str]] = [
    (
        "confirm-top-estimate",
        [*R, "--runner", "estimate", "--confirm-top", "5"],
        "--confirm-top applies to --runner ladder only, not --runner estimate",
    ),
    (
        "confirm-top-verl",
        [*R, "--runner", "verl", "--confirm-top", "5"],
        "--confirm-top applies to --runner ladder only, not --runner verl",
    ),
    (
        "confirm-top-megatron",
        [*R, "--runner", "megatron", "--confirm-top", "1"],
        "--confirm-top applies to --runner ladder only, not --runner megatron",
    ),
    (
        "trial-timeout-estimate",
        [*R, "--runner", "estimate", "--trial-timeout", "60"],
        "--trial-timeout applies to the runners that launch trials",
    ),
    (
        "estimate-token-budget-micro-batch",
        [*E, "--micro-batch", "2", "--max-token-len", "20000"],
        "--max-token-len 20000 is a dynamic-batching token budget, and --micro-batch 2 turns",
    ),
    (
        "estimate-logprob-budget-micro-batch",
        [*E, "--micro-batch", "2", "--logprob-max-token-len", "20000"],
        "--logprob-max-token-len 20000 is a dynamic-batching token budget",
    ),
    (
        "estimate-no-sp-at-tp1",
        [*E[:-1], "dp8", "--no-sequence-parallel"],
        "--no-sequence-parallel with layout dp8 (tp 1): sequence parallelism needs tp > 1",
    ),
    (
        "calibrate-out-dry-run",
        ["calibrate", GOOD, "--dry-run", "--out", "p.json"],
        "--out p.json names where the profile is written, and --dry-run writes none",
    ),
]


@pytest.mark.parametrize(
    ("argv", "fragment"), [c[1:] for c in OPTION_CASES], ids=[c[0] for c in OPTION_CASES]
)
def test_an_option_that_would_do_nothing_is_refused(
    argv: list[str],
    fragment: str,
    leaderboards: Path,  # noqa: F811
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--confirm-top` outside the ladder, `--trial-timeout` with the estimator (it launches
    nothing), `tune estimate`'s token budgets with `--micro-batch` (dynamic batching off) and
    its `--no-sequence-parallel` at tp 1, and `tune calibrate --out` with `--dry-run` were
    ignored without a word."""
    _assert_refused(argv, fragment, _none, leaderboards, workdir, monkeypatch, capsys)


def test_the_options_are_declared_with_their_runners() -> None:
    """The refusal reads each option's declaration (cli_args.RUN_OPTIONS), and the parser takes
    its default from there."""
    from tuner.cli import build_parser
    from tuner.cli_args import RUN_OPTIONS

    assert RUN_OPTIONS["--confirm-top"].runners.names == ("ladder",)
    assert "estimate" not in RUN_OPTIONS["--trial-timeout"].runners.names
    run = build_parser().parse_args(["run", "--model", "qwen2.5-7b", "--gpus", "8"])
    assert run.confirm_top == 3 and run.trial_timeout == 1800.0


# --------------------------------------------------------------------------------------------
# Leaderboard cells (tuner.cells, results.row_problem: the check every command that takes a CSV
# runs first)
# --------------------------------------------------------------------------------------------

CELLS: list[tuple[str, str, str]] = [
    ("ppo_max_token_len_per_gpu", "15360.5", "'15360.5' is not a whole number"),
    ("use_dynamic_bsz", "maybe", "'maybe' is not true or false"),
    ("sequence_parallel", "yes", "'yes' is not true or false"),
    ("tp", "2.5", "'2.5' is not a whole number"),
    ("tokens_per_s_per_gpu", "-5", "'-5' is negative"),
    ("step_s", "-0.5", "'-0.5' is negative"),
    ("num_gpus", "0", "'0' is below 1"),
    ("n", "0", "'0' is below 1"),
    ("status", "okk", "status 'okk' is not one of ok, oom, failed"),
    ("status", "", "status '' is not one of ok"),
    ("schema_version", "9", "schema_version '9' is not one this verl-tuner reads (1, 2, 3)"),
]
"""(column, cell, what the refusal says of it): a cell of the first row of a real leaderboard."""


@pytest.mark.parametrize("command", ["show", "export", "plot", "report", "calibrate", "run"])
@pytest.mark.parametrize(
    ("column", "value", "fragment"), CELLS, ids=[f"{c}={v}" for c, v, _ in CELLS]
)
def test_an_impossible_leaderboard_cell_is_refused_by_every_command(
    command: str,
    column: str,
    value: str,
    fragment: str,
    leaderboards: Path,  # noqa: F811
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`tune show` showed a row of negative throughput, 0 GPUs, an unknown status or schema as
    if true; `--candidates-from` read `15360.5` as 15360, `maybe` as false and `yes` as true.
    Each command that takes a leaderboard refuses the row, naming its line and cell."""
    argv = {
        "calibrate": ["calibrate", "bad.csv", "--dry-run"],
        "run": [*R, "--candidates-from", "bad.csv"],
    }.get(command, [command, "bad.csv"])
    setup = _cell("bad.csv", column, value)
    said = fragment if fragment.startswith(column) else f"{column} {fragment}"
    line = _assert_refused(
        argv, f"bad.csv line 2: {said}", setup, leaderboards, workdir, monkeypatch, capsys
    )
    assert line.endswith(("delete that row", "or fix the cell")), line


def test_a_candidate_read_from_a_row_reads_each_cell_strictly() -> None:
    """Candidate.from_record (export, --candidates-from, recipes) read `15360.5` as 15360 and
    any switch but true/1/yes as false; it reads a whole number written as `4.0` as 4."""
    from tuner.cells import cell_value
    from tuner.space import Candidate, ParallelLayout

    row = {
        k: str(v) for k, v in Candidate(layout=ParallelLayout(world=8, tp=2)).to_record().items()
    }
    assert Candidate.from_record(row, 8).layout.tp == 2
    for column, cell, why in (
        ("ppo_max_token_len_per_gpu", "15360.5", "not a whole number"),
        ("use_dynamic_bsz", "maybe", "not true or false"),
        ("sequence_parallel", "yes", "not true or false"),
        ("tp", "nan", "not a finite number"),
    ):
        with pytest.raises(ValueError, match=f"column {column}: '{cell}' is {why}"):
            Candidate.from_record({**row, column: cell}, 8)
    assert (
        Candidate.from_record({**row, "tp": "2.0", "sequence_parallel": "TRUE"}, 8).layout.tp == 2
    )
    assert [cell_value(t, bool) for t in ("True", "false", "1", "0")] == [True, False, True, False]


# --------------------------------------------------------------------------------------------
# Storage URLs (cli_args.check_storage_url)
# --------------------------------------------------------------------------------------------

STORAGES: list[tuple[str, str, str]] = [
    ("sqlite-query", "sqlite:///x.db?mode=ro", "SQLAlchemy reads ?mode=ro as SQLite options"),
    ("sqlite-uri", "sqlite:///x.db?mode=ro&uri=true", "reads ?mode=ro&uri=true as SQLite"),
    ("path-query", "x.db?immutable=1", "reads ?immutable=1 as SQLite options and opens x.db"),
    ("sqlite-escape", "sqlite:///a%20b.db", "unescapes the % in it and opens a b.db"),
    ("path-escape", "a%41.db", "opens aA.db, not a%41.db"),
    ("newline-url", "sqlite:///a\nb.db", "holds the control character '\\n'"),
    ("tab-path", "a\tb.db", "holds the control character '\\t'"),
    ("escape-journal", "j\x1b[2J.log", "holds the control character '\\x1b'"),
    ("delete-server", "postgresql://u@localhost:1/d\x7fb", "holds the control character '\\x7f'"),
    (
        "pg-read-only",
        "postgresql://u:s3cret@localhost:1/db?target_session_attrs=read-only",
        "target_session_attrs=read-only opens a read-only session",
    ),
    (
        "pg-standby",
        "postgresql://u@localhost:1/db?target_session_attrs=standby",
        "target_session_attrs=standby opens a read-only session",
    ),
    (
        "pg-read-only-option",
        "postgresql://u@localhost:1/db?options=-c%20default_transaction_read_only%3Don",
        "options=-c default_transaction_read_only=on opens a read-only session",
    ),
]


@pytest.mark.parametrize(
    ("url", "fragment"), [s[1:] for s in STORAGES], ids=[s[0] for s in STORAGES]
)
def test_a_storage_tune_would_read_otherwise_is_refused(
    url: str,
    fragment: str,
    leaderboards: Path,  # noqa: F811
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`sqlite:///x.db?mode=ro` was written anyway (SQLAlchemy opened x.db) beside a lock named
    after the query; a control character made a file of that name; a PostgreSQL URL asking
    for a read-only session failed at the study's first write. Refused before anything is
    opened: not even an empty lock is left."""
    before = set(os.listdir(workdir))
    line = _assert_refused(
        [*R, "--storage", url], fragment, _none, leaderboards, workdir, monkeypatch, capsys
    )
    assert set(os.listdir(workdir)) == before | set(os.listdir(leaderboards))  # no lock either
    assert "s3cret" not in line


def test_a_storage_that_is_only_read_may_ask_for_a_read_only_session(workdir: Path) -> None:
    """`tune report` reads the storage: a read-only session is what it needs."""
    from tuner.cli_args import check_storage_url

    url = "postgresql://u@h/db?target_session_attrs=read-only"
    assert check_storage_url(url, writes=False) is None
    assert check_storage_url("sqlite:///x.db") == Path("x.db")
    assert check_storage_url("postgresql://u@h/db?sslmode=require") is None  # not read-only
    assert check_storage_url("j?.log") == Path("j?.log")  # a journal is opened as a file


def test_a_results_folder_whose_storage_sqlalchemy_reads_otherwise_is_refused(
    leaderboards: Path,  # noqa: F811
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The default storage, <results-dir>/studies.sqlite3, is opened by a sqlite:/// URL too:
    `--results-dir r%41` wrote its storage into rA/."""
    argv = [*R, "--results-dir", "r%41"]
    fragment = "--results-dir (its studies.sqlite3) r%41/studies.sqlite3: SQLAlchemy unescapes"
    _assert_refused(argv, fragment, _none, leaderboards, workdir, monkeypatch, capsys)
    assert not (workdir / "rA").exists() and not (workdir / "r%41").exists()


# --------------------------------------------------------------------------------------------
# Profile constants (estimate.profile.RANGES)
# --------------------------------------------------------------------------------------------


def _constants() -> list[str]:
    from dataclasses import fields

    from tuner.estimate.profile import Profile

    return [f.name for f in fields(Profile)]


@pytest.mark.parametrize("value", [1e300, -1.0, 0.0])
@pytest.mark.parametrize("constant", _constants())
def test_every_profile_constant_is_in_its_range(
    constant: str,
    value: float,
    leaderboards: Path,  # noqa: F811
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """collective_latency_s, the one constant `tune calibrate` does not fit, had no upper
    bound: 1e300 was printed as a 300-digit step time. Every constant has a range now, and the
    default profile file (results/calibration.json) is read by the same check."""
    text = json.dumps({"schema": 2, "constants": {constant: value}})
    setup = _file("results/calibration.json", text)
    fragment = f"results/calibration.json: {constant} {value:g} is outside"
    _assert_refused(E, fragment, setup, leaderboards, workdir, monkeypatch, capsys)


def test_each_constant_has_a_range_holding_its_default() -> None:
    from tuner.estimate.profile import RANGES, Profile

    assert set(RANGES) == set(_constants())
    assert all(lo <= getattr(Profile(), k) <= hi for k, (lo, hi) in RANGES.items())
    with pytest.raises(ValueError, match="must be finite"):
        Profile(collective_latency_s=float("inf"))


# --------------------------------------------------------------------------------------------
# tune estimate's outputs (estimate.report_text.out_of_range)
# --------------------------------------------------------------------------------------------

ESTIMATES: list[tuple[str, list[str]]] = [
    ("response-1m", ["--response-len", "1048576"]),
    ("response-1m-json", ["--response-len", "1048576", "--json"]),
    ("prompt-1m", ["--prompt-len", "1048576"]),
    ("no-kv-room", ["--response-len", "262144", "--gpu-memory-utilization", "0.1"]),
    ("rollout-tp2", ["--response-len", "1048576", "--rollout-tp", "2"]),
]


@pytest.mark.parametrize("extra", [e[1] for e in ESTIMATES], ids=[e[0] for e in ESTIMATES])
def test_an_estimate_with_no_finite_step_is_refused(
    extra: list[str],
    leaderboards: Path,  # noqa: F811
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`tune estimate --response-len 1048576` printed `inf s` and a negative KV cache with exit
    0: it does not fit, and the line says why and what to change."""
    line = _assert_refused(
        [*E, *extra], "does not fit and has no step time to print (", _none, leaderboards,
        workdir, monkeypatch, capsys,
    )  # fmt: skip
    assert "vLLM's KV cache would be" in line and "lower --response-len" in line, line
    assert "inf s" not in line


def test_every_printed_estimate_is_finite_and_not_negative() -> None:
    """out_of_range finds any value that is not a finite number of 0 or more, in the phases and
    in the memory breakdown; a configuration that only overflows the GPU is still printed."""
    from tuner.estimate import estimate
    from tuner.estimate.report_text import out_of_range
    from tuner.hardware import Cluster, get_gpu
    from tuner.models import get_model
    from tuner.space import Candidate, ParallelLayout
    from tuner.workload import get_workload

    m, cl = get_model("qwen2.5-7b"), Cluster(gpu=get_gpu("h100"), num_gpus=8)
    c = Candidate(layout=ParallelLayout(world=8, tp=2))
    for response, printed in ((8192, True), (65536, True), (1 << 20, False)):
        w = get_workload("dapo-math").with_overrides(response_len=response)
        e = estimate(c, m, cl, w)
        assert (out_of_range(e, c, m, cl, w) == "") is printed, response
    w = get_workload("dapo-math")
    e = estimate(c, m, cl, w)
    bad = dataclasses.replace(e, memory=dataclasses.replace(e.memory, logits_gib=-1.0))
    assert "logits_gib -1.0" in out_of_range(bad, c, m, cl, w)


# --------------------------------------------------------------------------------------------
# tune show's filters (leaderboard.select)
# --------------------------------------------------------------------------------------------

FILTERS: list[tuple[str, list[str], str]] = [
    ("gpu-trailing-x", ["--gpu", "h100x"], "--gpu 'h100x': write a GPU kind (h100, h200"),
    ("gpu-unknown", ["--gpu", "h300"], "--gpu 'h300': write a GPU kind (h100, h200"),
    ("gpu-zero", ["--gpu", "h100x0"], "a count of 1 or more"),
    ("gpu-typo", ["--gpu", "h10O"], "--gpu 'h10O'"),
    ("model-absent", ["--model", "qwen3"], "--model 'qwen3': no row's model holds that text"),
    ("model-blank", ["--model", " "], "models here (qwen2.5-7b)"),
    ("status-typo", ["--status", "okk"], "--status okk: use one of ok, oom"),
    ("status-empty", ["--status", ","], "--status ',': use one of ok"),
    ("source-typo", ["--source", "estimat"], "--source estimat: use one of estimate, megatron"),
    ("source-one-typo", ["--source", "verl,megatorn"], "--source megatorn: use one of"),
]


@pytest.mark.parametrize(
    ("flags", "fragment"), [f[1:] for f in FILTERS], ids=[f[0] for f in FILTERS]
)
def test_a_misspelt_show_filter_is_refused(
    flags: list[str],
    fragment: str,
    leaderboards: Path,  # noqa: F811
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`tune show --gpu h100x` (and a source, a model text that no row can match) printed an
    empty table with exit 0, where `--status okk` was refused."""
    argv = ["show", GOOD, *flags]
    _assert_refused(argv, fragment, _none, leaderboards, workdir, monkeypatch, capsys)


@pytest.mark.parametrize(
    "flags", [["--gpu", "h200"], ["--gpu", "h100x16"], ["--source", "verl"], ["--status", "oom"]]
)
def test_a_valid_filter_that_leaves_no_row_is_an_empty_table(
    flags: list[str],
    leaderboards: Path,  # noqa: F811
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tuner.cli import main

    assert main(["show", str(leaderboards / GOOD), *flags]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("trial"), out  # the header alone


# --------------------------------------------------------------------------------------------
# One case of each class through the `tune` command itself
# --------------------------------------------------------------------------------------------

PROFILE_1E300 = json.dumps({"schema": 2, "constants": {"collective_latency_s": 1e300}})
COMMANDS: list[tuple[str, list[str], dict[str, str], str]] = [
    ("ffn-width", [*EC, "--layout", "tp2"], {"config.json": _config(intermediate_size=513)},
     "tp(2) does not divide the MLP width (intermediate_size), 513"),
    ("vocab", [*EC, "--layout", "tp2"], {"config.json": _config(vocab_size=1)},
     "vocab_size is 1, outside 256.."),
    ("dense-etp", [*E[:-1], "tp2etp2"], {}, "etp(2) > 1 on a dense model"),
    ("confirm-top", [*R, "--runner", "estimate", "--confirm-top", "5"], {},
     "--confirm-top applies to --runner ladder only"),
    ("cell-negative", ["show", "bad.csv"], {"bad.csv": "tokens_per_s_per_gpu=-5"},
     "bad.csv line 2: tokens_per_s_per_gpu '-5' is negative"),
    ("cell-maybe", [*R, "--candidates-from", "bad.csv"], {"bad.csv": "use_dynamic_bsz=maybe"},
     "bad.csv line 2: use_dynamic_bsz 'maybe' is not true or false"),
    ("storage-query", [*R, "--storage", "sqlite:///x.db?mode=ro"], {},
     "SQLAlchemy reads ?mode=ro as SQLite options"),
    ("storage-control", [*R, "--storage", "a\x01b.db"], {}, "holds the control character"),
    ("profile-1e300", [*E, "--profile", "p.json"], {"p.json": PROFILE_1E300},
     "collective_latency_s 1e+300 is outside 1e-06..0.001"),
    ("estimate-inf", [*E, "--response-len", "1048576"], {},
     "does not fit and has no step time to print"),
    ("show-gpu", ["show", "lb.csv", "--gpu", "h100x"], {}, "--gpu 'h100x': write a GPU kind"),
]  # fmt: skip
"""(id, argv, files to set up, fragment): `bad.csv` is the real leaderboard with its first row's
cell set (`column=value`); every case also has lb.csv, the real leaderboard."""


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
    }


@pytest.mark.parametrize(
    ("argv", "files", "fragment"), [c[1:] for c in COMMANDS], ids=[c[0] for c in COMMANDS]
)
def test_tune_refuses_each_class_with_one_line_and_writes_nothing(
    argv: list[str],
    files: dict[str, str],
    fragment: str,
    leaderboards: Path,  # noqa: F811
    workdir: Path,
) -> None:
    """`tune` (python -m tuner, as the console script runs it) ends with exit code 2, one line on
    stderr, and leaves the folder as it was: no results/, no storage, no lock."""
    import csv

    shutil.copy(leaderboards / GOOD, workdir / "lb.csv")
    for name, text in files.items():
        if name == "bad.csv":
            column, value = text.split("=", 1)
            with open(leaderboards / GOOD, newline="") as f:
                rows = list(csv.DictReader(f))
            rows[0][column] = value
            with open(workdir / name, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
        else:
            (workdir / name).write_text(text)
    before = _tree(workdir)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run(
        [sys.executable, "-m", "tuner", *argv],
        capture_output=True, text=True, timeout=120, cwd=workdir, env=env,
    )  # fmt: skip
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("tune: error: "), lines
    assert fragment in lines[0], lines[0]
    assert _tree(workdir) == before
