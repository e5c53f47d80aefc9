"""One knob table (issue 20): every reader of knob names (the leaderboard's columns and their
types, the text table's numbers, the report's knob groups) takes them from tuner.space, no module
outside it lists knobs again, and adding a knob is its entry in the table and its Candidate
field, nothing else."""

from __future__ import annotations

import ast
import csv
import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tuner.leaderboard.columns import FLOAT_COLUMNS, INT_COLUMNS, STRING_COLUMNS
from tuner.report.sections import KNOB_GROUPS
from tuner.results import COLUMNS, NUMERIC, TrialRecord, csv_text, read_raw
from tuner.results.files import COLOCATED_ONLY_OMITTED
from tuner.space import (
    CANDIDATE_FIELDS,
    KNOB_BY_NAME,
    KNOB_COLUMN_TYPES,
    KNOB_GROUP_OF,
    KNOBS,
    LAYOUT_DEGREES,
    UNDECLARED,
    Knob,
)

REPO = Path(__file__).resolve().parents[1]
TUNER = REPO / "tuner"
VERL = REPO / "results" / "verl4k-h100-x1.csv"
"""A committed leaderboard of the current schema (3)."""

KNOB_NAMES = frozenset(
    {k.name for k in KNOBS} | {k.old_param for k in KNOBS} | set(CANDIDATE_FIELDS)
) - {"layout", ""}
"""Knob names as the table spells them: the knobs, their sampler parameters' older names, their
columns."""

ALLOWED: dict[tuple[str, tuple[str, ...]], str] = {
    ("tuner/references.py", ("cp", "ep", "pp", "tp")): (
        "which degree a reference layout halves first: a tie-break order, not a list of knobs"
    ),
    ("tuner/runners/megatron_refusals.py", ("recompute_granularity", "recompute_method",
                                            "recompute_modules")): (
        "rule names (space.RULES names a knob's value rules after it), sorted by when refused"
    ),
    ("tuner/runners/megatron_refusals.py", ("moe_token_dispatcher_type",
                                            "recompute_num_layers")): "rule names, as above",
    ("tuner/runners/megatron_generation.py", ("rollout_dp", "rollout_ep", "rollout_tp")): (
        "rule names of space.RULES the generation runner checks"
    ),
    ("tuner/runners/vllm_gen/spec.py", ("max_num_batched_tokens", "max_num_seqs")): (
        "vLLM's engine arguments (vLLM's names)"
    ),
    ("tuner/verl_command.py", ("ppo_max_token_len_per_gpu", "ppo_micro_batch_size_per_gpu")): (
        "verl's config key suffixes the critic copies from the actor (verl's names)"
    ),
    ("tuner/study/exact.py", ("moe_grouped_gemm", "use_dynamic_bsz")): (
        "a search order (the training knobs without a fastest value a branch sets first): "
        "what each knob reaches, its fastest and alike values come from the table"
    ),
}  # fmt: skip
"""Literal lists that name knobs for another reason, each with it."""


def knob_lists(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """The literal tuples, lists and sets of `path` that name two knobs or more: (line, the knob
    names sorted). A dict of knob values (a recipe, pinned values) is a value, not a list."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            names = {e.value for e in node.elts if isinstance(e, ast.Constant)} & KNOB_NAMES
            if len(names) >= 2:
                out.append((node.lineno, tuple(sorted(names))))  # type: ignore[arg-type]
    return out


def test_no_module_outside_the_space_lists_knobs() -> None:
    found = [
        f"{rel}:{line}: {names}"
        for p in sorted(TUNER.rglob("*.py"))
        if (rel := str(p.relative_to(REPO))) and not rel.startswith("tuner/space/")
        for line, names in knob_lists(p)
        if (rel, names) not in ALLOWED
    ]
    assert not found, "derive these from tuner.space's knob table: " + "; ".join(found)


def test_the_scan_sees_a_knob_list(tmp_path: Path) -> None:
    """The check itself: the forms seen in this project's history are caught, values are not."""
    f = tmp_path / "m.py"
    for code in (
        'INT = frozenset({"trial", "rollout_tp", "max_num_seqs"})',
        'GROUPS = (("memory", ("param_offload", "optimizer_offload")),)',
        'def f(c):\n    return c in ["tp", "pp"]',
        'PINS = ("rollout_dp_log2", "max_num_batched_tokens_factor")',  # sampler parameters
    ):
        f.write_text(code + "\n")
        assert knob_lists(f), code
    f.write_text('R = {"use_dynamic_bsz": False, "rollout_tp": 2}\nX = ("tp", "study")\n')
    assert not knob_lists(f)


def test_the_leaderboard_takes_its_knob_columns_and_types_from_the_table() -> None:
    knob_columns = [c for c in COLUMNS if c in KNOB_BY_NAME]
    assert knob_columns == [*LAYOUT_DEGREES, *CANDIDATE_FIELDS]
    assert set(knob_columns) == set(KNOB_BY_NAME) - {"layout"}  # every knob has its column
    # the committed header: these columns in order, less the placement's, which a leaderboard
    # of colocated rows leaves out (files.COLOCATED_ONLY_OMITTED, issue 29), and less the knob
    # columns added since it was written (they load at the field's default: no rewrite needed)
    header = list(read_raw(VERL)[0])
    assert header == [c for c in COLUMNS if c in header]
    later = set(COLUMNS) - set(header) - set(COLOCATED_ONLY_OMITTED)
    from dataclasses import fields as record_fields

    from tuner.results.record import TrialRecord

    empty = {f.name for f in record_fields(TrialRecord) if f.default is None}  # pred_host_mem_gib
    assert later <= set(CANDIDATE_FIELDS) | empty, later
    for c in knob_columns:
        kind = KNOB_COLUMN_TYPES.get(c, int)  # the layout degrees are counts
        assert (c in INT_COLUMNS, c in FLOAT_COLUMNS, c in STRING_COLUMNS) == (
            kind is int,
            kind is float,
            kind is str,
        ), c
        assert (c in NUMERIC) == (kind in (int, float)), c


def test_the_report_groups_every_knob_by_the_table() -> None:
    groups = dict(KNOB_GROUPS)
    shown = [c for cols in groups.values() for c in cols]
    assert len(shown) == len(set(shown))
    for c, group in KNOB_GROUP_OF.items():
        assert c in groups[group], (c, group)


def in_columns(text: str, header: list[str]) -> str:
    """A leaderboard's text with only the columns of `header`, in its order."""
    rows = list(csv.DictReader(io.StringIO(text)))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=header, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def test_a_committed_leaderboard_reads_and_writes_back_byte_identically() -> None:
    """Read and written back, a committed leaderboard is what it was, in its own columns; a knob
    column added since it was written comes back empty (the field's default)."""
    text = VERL.read_text()
    header = list(read_raw(VERL)[0])
    back = csv_text(TrialRecord.from_row(r).to_row() for r in read_raw(VERL))
    assert in_columns(back, header) == text
    later = [c for c in next(csv.reader(io.StringIO(back))) if c not in header]
    assert all(r[c] == "" for r in csv.DictReader(io.StringIO(back)) for c in later)


def test_an_old_leaderboard_is_written_once_in_the_current_schema(tmp_path: Path) -> None:
    """A schema-1 file is read in the current meaning; written once, it reads and writes back
    the same, under the current columns."""
    once = tmp_path / "once.csv"
    old = read_raw(REPO / "results" / "dense-h200-x2.csv")
    assert old[0]["schema_version"] == "1"
    once.write_text(csv_text(TrialRecord.from_row(r).to_row() for r in old))
    again = csv_text(TrialRecord.from_row(r).to_row() for r in read_raw(once))
    assert again == once.read_text()
    assert again.splitlines()[0].split(",") == [
        c for c in COLUMNS if c not in COLOCATED_ONLY_OMITTED
    ]


def _knob_table(page: str) -> dict[str, dict[str, str]]:
    """The answer's knob table: group -> {knob column: value}."""
    answer = re.search(r'<section id="answer">(.*?)</section>', page, flags=re.S)
    assert answer
    rows = re.findall(r"<td>(\w+)</td>\s*<td>([^<]*)</td>", answer.group(1))
    out = {}
    for group, cells in rows:
        pairs = (c.partition(" ") for c in html.unescape(cells).split(" · "))
        out[group] = {k: v for k, _, v in pairs}
    return out


def test_the_report_of_a_committed_leaderboard_shows_the_knobs_it_showed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """results/verl4k-h100-x1.html was rendered with the report's own hand-written knob list:
    the knob groups read from the table show the same knobs with the same values."""
    pytest.importorskip("matplotlib")
    from tuner.cli import main

    csv_path = tmp_path / VERL.name
    shutil.copy(VERL, csv_path)
    out = tmp_path / "r.html"
    assert main(["report", str(csv_path), "-o", str(out)]) == 0
    capsys.readouterr()
    committed = _knob_table(VERL.with_suffix(".html").read_text())
    assert len(committed) >= 5 and "kernels" in committed
    assert _knob_table(out.read_text()) == committed


def test_adding_a_knob_is_its_table_entry_and_its_field(tmp_path: Path) -> None:
    """The walk of a new knob: a copy of the package with one more Candidate field and one more
    entry in KNOBS (and nothing else) has its CSV column, its column type, its text-table number
    format, its report group, its verl key (a `+` key verl leaves open: no verl default), a
    record keeps its value through the CSV, and the megatron runner's worker spec carries it
    under its worker key, typed as the table says. A second new knob, a kernel the megatron
    worker always runs one way (`worker_runs`), is pinned by that runner at that value, after
    the kernel pins before it, with no edit of the runner."""
    pkg = tmp_path / "tuner"
    shutil.copytree(TUNER, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    cand = pkg / "space" / "candidate.py"
    src = cand.read_text()
    anchor = "    def to_record(self) -> dict[str, Any]:"
    assert src.count(anchor) == 1
    fields = (
        '    pad_depth: int = 1\n    """A new knob."""\n\n'
        '    cross_entropy_fusion: bool = True\n    """A new kernel knob."""\n\n'
    )
    cand.write_text(src.replace(anchor, fields + anchor))
    knobs = pkg / "space" / "knobs.py"
    src = knobs.read_text()
    anchor = "\n)\nKNOB_BY_NAME"
    assert src.count(anchor) == 1
    entry = (
        '    Knob(name="pad_depth", group="memory", help="a new knob",'
        ' verl_keys=("+actor_rollout_ref.actor.pad_depth",), cost="neutral prior: test",'
        ' worker=WorkerKey("recompute.pad_depth", int)),\n'
        '    Knob(name="cross_entropy_fusion", group="kernels", help="a new kernel knob",'
        ' verl_keys=_tf("cross_entropy_loss_fusion"), cost="neutral prior: test",'
        " choices=lambda s, d: list(BOOLS), worker_runs=False),"
    )
    knobs.write_text(src.replace(anchor, "\n" + entry + anchor))
    check = textwrap.dedent(
        """
        import tuner
        from tuner.leaderboard.columns import INT_COLUMNS
        from tuner.report.sections import KNOB_GROUPS
        from tuner.results import COLUMNS, NUMERIC, Status, TrialRecord
        from tuner.space import Candidate, ParallelLayout, knob_overrides
        from tuner.study.objective import candidate_fields

        assert tuner.__file__.startswith(TMP), tuner.__file__  # the copy, not the repository's
        from tuner.space import CANDIDATE_FIELDS, KNOB_BY_NAME, UNDECLARED

        before = CANDIDATE_FIELDS[CANDIDATE_FIELDS.index("pad_depth") - 1]  # the field before
        assert COLUMNS[COLUMNS.index(before) + 1] == "pad_depth", COLUMNS

        assert KNOB_BY_NAME["pad_depth"].verl_default is UNDECLARED  # verl declares no such key
        assert "pad_depth" in INT_COLUMNS and "pad_depth" in NUMERIC
        assert "pad_depth" in dict(KNOB_GROUPS)["memory"]
        c = Candidate(layout=ParallelLayout(world=2, tp=2), pad_depth=3)
        assert knob_overrides(c)["+actor_rollout_ref.actor.pad_depth"] == 3
        fields = candidate_fields(c)  # what a study writes of a candidate
        row = TrialRecord(study="s", trial=0, status=Status.OK, **fields).to_row()
        assert row["pad_depth"] == "3"
        assert TrialRecord.from_row(row).knobs["pad_depth"] == 3
        assert Candidate.from_record(row, 2).pad_depth == 3

        from tuner.hardware import Cluster, get_gpu
        from tuner.models import get_model
        from tuner.runners.megatron import worker_spec
        from tuner.runners.megatron_worker import WorkerSpec
        from tuner.workload import get_workload

        budgets = dict(ppo_max_token_len_per_gpu=3072, log_prob_max_token_len_per_gpu=3072)
        c = Candidate(layout=ParallelLayout(world=2, tp=2), pad_depth=3, **budgets)
        cl = Cluster(gpu=get_gpu("h100"), num_gpus=2)
        spec = worker_spec(c, get_model("qwen2.5-7b"), cl, get_workload("grpo-short"))
        assert spec["recompute"]["pad_depth"] == 3, spec["recompute"]
        spec["recompute"]["pad_depth"] = "deep"  # a hand-written spec: typed by the table
        try:
            WorkerSpec.from_dict(spec)
        except ValueError as e:
            assert "spec recompute.pad_depth must be an integer" in str(e), e
        else:
            raise AssertionError("a pad_depth of the wrong type was read")

        from tuner.megatron_layers import layer_spec_pins
        from tuner.runners.megatron import MEGATRON_PINNED

        assert MEGATRON_PINNED[-1] == ("cross_entropy_fusion", False), MEGATRON_PINNED
        assert ("cross_entropy_fusion", False) in layer_spec_pins(MEGATRON_PINNED, "te")
        assert "pad_depth" not in dict(MEGATRON_PINNED)  # the worker runs it: measured
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", f"TMP = {str(tmp_path)!r}\n" + check],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]


ROLLOUT_KNOB_FIELD = (
    "    enable_prefix_caching: bool = True\n"
    '    """vLLM reuses the KV cache of a shared prompt prefix (verl 0.9.1 default True)."""\n\n'
)
ROLLOUT_KNOB_ENTRY = (
    '    Knob(name="enable_prefix_caching", group="rollout", help="vLLM prefix caching",'
    ' verl_keys=(f"{ROLLOUT}.enable_prefix_caching",), verl_default=True,'
    ' cost="neutral prior: test", choices=lambda s, d: list(BOOLS)),'
)
"""A rollout knob verl 0.9.1 declares (rollout.yaml: `enable_prefix_caching: True`), as a real
addition would spell its Candidate field and its table entry (verl's default beside its key)."""


def test_a_new_rollout_knob_is_sampled_pinned_written_and_exported(tmp_path: Path) -> None:
    """Issue 31 item 1: a copy of the package with one more Candidate field and one more entry
    in KNOBS (a rollout setting of verl's, `enable_prefix_caching`), nothing else, samples it
    under its name (random and Optuna draws, params_for), takes a pin of it by its name and
    value (never suggested, named in the recipe's pinned block), writes and reads it as a CSV
    column of its type, still loads a committed leaderboard of the older header (the knob at
    its field's default), and exports it as its verl key in the recipe. Its verl default is
    the one verl 0.9.1 composes; the megatron runner pins it at its field's default (after the
    rollout knobs before it), keeps the pin where it measures generation (its vLLM engine
    takes no such argument: the entry has no `vllm`), and a megatron study made before the
    knob existed resumes (the new pin is at the default).

    What a real new knob still needs beyond these two edits: its cost-model term in
    tuner/estimate (the entry's `cost` names it; a `neutral prior` scores every value alike;
    the next test adds one); a runner file only where the runner must do something new with it
    (measured generation searches it once vllm_gen.EngineCfg takes it and the entry names that
    argument, `vllm`). The committed leaderboards under results/ lack its column and stay as
    they are: they load with the knob at its default (an older file is written back with the
    new column only where a study writes it)."""
    pkg = tmp_path / "tuner"
    shutil.copytree(TUNER, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    field_at = "    def to_record(self) -> dict[str, Any]:"
    entry_at = "\n)\nKNOB_BY_NAME"
    for path, anchor, new in (
        (pkg / "space" / "candidate.py", field_at, ROLLOUT_KNOB_FIELD + field_at),
        (pkg / "space" / "knobs.py", entry_at, "\n" + ROLLOUT_KNOB_ENTRY + entry_at),
    ):
        src = path.read_text()
        assert src.count(anchor) == 1, (path, anchor)
        path.write_text(src.replace(anchor, new))
    check = textwrap.dedent(
        """
        import dataclasses
        import json
        import random
        from pathlib import Path

        import optuna

        import tuner
        from tuner import recipes
        from tuner.hardware import Cluster, get_gpu
        from tuner.models import get_model
        from tuner.results import COLUMNS, NUMERIC, Status, TrialRecord, csv_text, read_raw
        from tuner.space import (
            KNOBS, SAMPLER_PARAMS, Candidate, FollowSuggester, RandomSuggester, SearchSpace,
            SpaceLimits, params_for, sample,
        )
        from tuner.study.objective import candidate_fields
        from tuner.workload import get_workload

        assert tuner.__file__.startswith(TMP), tuner.__file__  # the copy, not the repository's
        NAME, KEY = "enable_prefix_caching", "actor_rollout_ref.rollout.enable_prefix_caching"
        m, w = get_model("qwen2.5-7b"), get_workload("grpo-short")
        cl = Cluster(gpu=get_gpu("h100"), num_gpus=2)

        # sampling: drawn under its name, both values, and params_for gives it back
        assert NAME in SAMPLER_PARAMS
        space = SearchSpace(model=m, cluster=cl, workload=w)
        rng = random.Random(0)
        drawn = [sample(RandomSuggester(rng), space) for _ in range(40)]
        assert {c.enable_prefix_caching for c in drawn} == {False, True}
        for c in drawn[:8]:
            p = params_for(c, space)
            assert p[NAME] is c.enable_prefix_caching, p
            again = sample(FollowSuggester(p), space)
            assert again.enable_prefix_caching is c.enable_prefix_caching
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        trial = study.ask()
        assert sample(trial, space).enable_prefix_caching is trial.params[NAME]

        # a pin of it, by its name and value: never suggested, every draw has it
        pins = ((NAME, False),)
        pinned = SearchSpace(model=m, cluster=cl, workload=w, limits=SpaceLimits(pinned=pins))
        s = RandomSuggester(rng)
        assert {sample(s, pinned).enable_prefix_caching for _ in range(20)} == {False}
        assert NAME not in s.params and NAME not in params_for(drawn[0], pinned)
        assert f"{NAME}=False" in pinned.limits.summary

        # the recipe: its verl key with the candidate's value; the pin named in its block
        c = dataclasses.replace(drawn[0], enable_prefix_caching=False)
        text = recipes.render(c, m, cl, w, pinned=pins, runner="megatron").text
        assert f"    {KEY}=False \\\\" in text.splitlines(), text
        assert f"#   {NAME}=False  (pinned, not measured)" in text.splitlines()

        # the CSV: its column after the knobs before it, typed bool, through a file and back
        from tuner.space import CANDIDATE_FIELDS

        before = CANDIDATE_FIELDS[CANDIDATE_FIELDS.index(NAME) - 1]  # the field before it
        assert COLUMNS[COLUMNS.index(before) + 1] == NAME and NAME not in NUMERIC
        row = TrialRecord(study="s", trial=0, status=Status.OK, **candidate_fields(c)).to_row()
        f = Path(TMP) / "new.csv"
        f.write_text(csv_text([row]))
        back = read_raw(f)[0]
        assert back[NAME] == "False" and TrialRecord.from_row(back).knobs[NAME] is False
        assert Candidate.from_record(back, 2) == c

        # a committed leaderboard of the older header loads: the knob at its default
        old = read_raw(Path(VERL))
        assert NAME not in old[0]
        for r in old:
            assert NAME not in TrialRecord.from_row(r).knobs
            assert Candidate.from_record(r, int(r["num_gpus"])).enable_prefix_caching is True
        header = csv_text(TrialRecord.from_row(r).to_row() for r in old).splitlines()[0]
        assert NAME in header.split(",")  # written back once, with the new column

        # the megatron runner's pins: at the field's default, after the rollout knobs before it,
        # kept where generation is measured; an older megatron study resumes
        from tuner.runners import pinned_knobs
        from tuner.runners.megatron import MEGATRON_PINNED, MegatronRunner
        from tuner.runners.megatron_generation import ROLLOUT_SEARCHED, measured_pins
        from tuner.space import KNOB_BY_NAME

        names = [n for n, _ in MEGATRON_PINNED]
        rollout = [k.name for k in KNOBS if k.group == "rollout" and k.choices is not None]
        assert names[names.index(rollout[rollout.index(NAME) - 1]) + 1] == NAME, names
        assert dict(MEGATRON_PINNED)[NAME] is True and KNOB_BY_NAME[NAME].field_default is True
        assert NAME not in ROLLOUT_SEARCHED and (NAME, True) in measured_pins(MEGATRON_PINNED)
        assert (NAME, True) in pinned_knobs("megatron")
        limits = MegatronRunner(generation=False).space_limits(m)
        space = SearchSpace(model=m, cluster=cl, workload=w, limits=limits)
        before = space.fingerprint().replace(f",{NAME}=True", "")
        assert before != space.fingerprint() and space.added_since(before) == [NAME]

        # its keys and verl default, for the caller to compose against verl's config
        knob = KNOB_BY_NAME[NAME]
        print(json.dumps({"keys": knob.verl_keys, "verl_default": knob.verl_default}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", f"TMP = {str(tmp_path)!r}\nVERL = {str(VERL)!r}\n" + check],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    new = json.loads(done.stdout.splitlines()[-1])
    assert new["verl_default"] is True
    name = "enable_prefix_caching"
    assert not verl_default_problems(verl_config(), name, new["keys"], new["verl_default"])


PRICED_KNOB = {
    "space/candidate.py": (
        "    def to_record(self) -> dict[str, Any]:",
        "    cross_entropy_loss_fusion: bool = True\n"
        '    """megatron-core fused cross entropy of the output layer."""\n\n',
    ),
    "space/knobs.py": (
        "\n)\nKNOB_BY_NAME",
        '\n    Knob(name="cross_entropy_loss_fusion", group="kernels", help="fused cross entropy",'
        ' verl_keys=_tf("cross_entropy_loss_fusion"), cost="time: _layout_lin output layer",'
        " choices=lambda s, d: list(BOOLS)),",
    ),
    "estimate/time.py": (
        "    head_b = 2 * head_f\n",
        "    if not candidate.cross_entropy_loss_fusion:\n        head_f *= 1.5\n",
    ),
}
"""A searched kernel knob with a cost term, as its three files spell it: its Candidate field, its
table entry, and its term in the cost model (the output layer's time, read inside the layout's
memoized coefficients: estimate/time.py `_layout_lin`). Each edit goes before its anchor."""

PRICED_KNOB_TESTS = (
    "tests/estimate/test_golden.py",
    "tests/estimate/test_memo.py",
    "tests/test_pins.py",
    "tests/test_knob_table.py::test_the_leaderboard_takes_its_knob_columns_and_types_from_the_table",
    "tests/test_knob_table.py::test_a_committed_leaderboard_reads_and_writes_back_byte_identically",
    "tests/test_knob_table.py::test_the_report_groups_every_knob_by_the_table",
    "tests/test_verl_command.py::test_no_verl_key_is_set_twice_by_the_command",
)
"""The tests that froze the table (its order, the pins by hand, the committed headers) or that a
knob could make stale (the cost model's memo), run against the copy with the knob unedited."""


def test_a_new_priced_knob_is_three_files(tmp_path: Path) -> None:
    """Issue 39 item 1: a copy of the package with a new searched knob in three files (its
    Candidate field, its table entry, its cost term; PRICED_KNOB) and nothing else: the cost
    model prices each value (one shared context, so the memo keys the term by the knob it reads,
    with no list to extend), the sampler draws both, the committed leaderboards load with the
    knob at its default and are not rewritten, and the tests that once froze the table pass on
    the copy unedited."""
    pkg = tmp_path / "tuner"
    shutil.copytree(TUNER, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, (anchor, new) in PRICED_KNOB.items():
        path = pkg / rel
        src = path.read_text()
        assert src.count(anchor) == 1, (rel, anchor)
        path.write_text(src.replace(anchor, new + anchor))
    (tmp_path / "scripts").symlink_to(REPO / "scripts")  # model paths relative to the checkout
    committed = {p: p.read_bytes() for p in sorted((REPO / "results").glob("*.csv"))}
    check = textwrap.dedent(
        """
        import dataclasses
        import random
        from pathlib import Path

        import tuner
        from tuner.estimate import estimate
        from tuner.hardware import Cluster, get_gpu
        from tuner.models import get_model
        from tuner.results import read_rows
        from tuner.space import Candidate, ParallelLayout, RandomSuggester, SearchSpace, sample
        from tuner.workload import get_workload

        assert tuner.__file__.startswith(TMP), tuner.__file__  # the copy, not the repository's
        m, w = get_model("qwen2.5-7b"), get_workload("grpo-short")
        cl = Cluster(gpu=get_gpu("h100"), num_gpus=2)
        fused = Candidate(layout=ParallelLayout(world=2, tp=2))
        assert fused.cross_entropy_loss_fusion is True
        slow = dataclasses.replace(fused, cross_entropy_loss_fusion=False)
        a, b = estimate(fused, m, cl, w), estimate(slow, m, cl, w)  # one context: the memo's
        assert b.update_actor_s > a.update_actor_s, (a.update_actor_s, b.update_actor_s)
        assert estimate(fused, m, cl, w).update_actor_s == a.update_actor_s
        space = SearchSpace(model=m, cluster=cl, workload=w)
        rng = random.Random(0)
        drawn = {sample(RandomSuggester(rng), space).cross_entropy_loss_fusion for _ in range(30)}
        assert drawn == {False, True}, drawn
        for path in sorted(Path(RESULTS).glob("*.csv")):
            for r in read_rows(path):
                if r.get("tp"):
                    c = Candidate.from_record(r, int(r["num_gpus"]))
                    assert c.cross_entropy_loss_fusion is True, path
        """
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"TMP = {str(tmp_path)!r}\nRESULTS = {str(REPO / 'results')!r}\n" + check,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tests = [str(REPO / t) for t in PRICED_KNOB_TESTS]
    run = (
        "import sys, pytest, tuner\n"
        f"assert tuner.__file__.startswith({str(tmp_path)!r}), tuner.__file__\n"
        # in this process (-n 0): the workers pyproject's addopts start would import the
        # repository's tuner, not the copy's
        f"sys.exit(pytest.main(['-x', '-q', '-p', 'no:cacheprovider', '-n', '0', *{tests!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", run],
        cwd=tmp_path,  # the copy first on the path
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert {p: p.read_bytes() for p in sorted((REPO / "results").glob("*.csv"))} == committed


def test_the_new_rollout_knobs_key_is_one_verl_declares() -> None:
    """The key the test above adds is verl 0.9.1's own (no `+`), at the field's default."""
    import verl
    from hydra import compose, initialize_config_dir

    from tuner import verl_command

    config = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config), version_base=None):
        base = compose(config_name=verl_command.CONFIG_NAME)
        assert base.actor_rollout_ref.rollout.enable_prefix_caching is True
        cfg = compose(
            config_name=verl_command.CONFIG_NAME,
            overrides=["actor_rollout_ref.rollout.enable_prefix_caching=False"],
        )
    assert cfg.actor_rollout_ref.rollout.enable_prefix_caching is False
    assert "enable_prefix_caching: bool = True" in ROLLOUT_KNOB_FIELD  # verl's default


# --- verl's defaults (issue 31 item 1) --------------------------------------------------------

ABSENT = object()
"""What `verl_value` gives for a key verl's config does not declare."""


def verl_config() -> object:
    """verl 0.9.1's ppo_megatron_trainer as Hydra composes it with no override."""
    import verl
    from hydra import compose, initialize_config_dir

    from tuner import verl_command

    config = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config), version_base=None):
        return compose(config_name=verl_command.CONFIG_NAME)


def verl_value(cfg: object, key: str) -> object:
    """The composed value at `key` (its `+` dropped) as `Knob.verl_default` spells it (a list as
    a tuple), ABSENT where verl declares no such key."""
    from omegaconf import OmegaConf

    v = OmegaConf.select(cfg, key.lstrip("+"), default=ABSENT)  # type: ignore[arg-type]
    if OmegaConf.is_config(v):
        v = OmegaConf.to_container(v, resolve=True)  # type: ignore[arg-type]
    return tuple(v) if isinstance(v, list) else v


def verl_default_problems(cfg: object, name: str, keys: list[str], default: object) -> list[str]:
    """Where a knob's `verl_default` (the table's) is not what verl's composed config holds at
    each of its keys, or a `+` key is one verl declares: one line each."""
    out = []
    for key in keys:
        got = verl_value(cfg, key)
        if key.startswith("+"):
            if got is not ABSENT:
                out.append(f"{name}: verl declares {key[1:]} ({got!r}): drop the + and say so")
        elif got is ABSENT:
            out.append(f"{name}: verl 0.9.1 declares no {key}")
        elif (type(got), got) != (type(default), default):
            out.append(f"{name}: verl 0.9.1 has {key}={got!r}, the table {default!r}")
    return out


def test_each_knobs_verl_default_is_what_verl_091_composes() -> None:
    """Every knob with a key verl declares holds verl 0.9.1's value there (at each of its keys:
    the ref's and the rollout's follow the actor's), and a `+` key is one verl leaves open, its
    knob without a default (UNDECLARED): a verl whose defaults move fails here."""
    cfg = verl_config()
    problems = [
        p for k in KNOBS for p in verl_default_problems(cfg, k.name, [*k.verl_keys], k.verl_default)
    ]
    assert not problems, problems
    declared = [k.name for k in KNOBS if k.verl_default is not UNDECLARED]
    assert all(KNOB_BY_NAME[n].verl_keys[0][0] != "+" for n in declared)
    assert {k.name for k in KNOBS if k.verl_keys and k.verl_keys[0][0] != "+"} == set(declared)
    # the one the issue names: verl's 0.5, while ours (the Candidate's, the megatron runner's
    # pin, in stored fingerprints) stays 0.6, its reason beside it
    gmu = KNOB_BY_NAME["gpu_memory_utilization"]
    assert (gmu.verl_default, gmu.field_default) == (0.5, 0.6) and "fingerprints" in (
        gmu.default_differs
    )


def test_a_default_of_ours_unlike_verls_says_why() -> None:
    """Where the Candidate's default (as verl takes it) is not verl's, the entry says why; where
    it is, the entry says nothing."""
    from dataclasses import MISSING

    checked = 0
    for k in KNOBS:
        if k.verl_default is UNDECLARED or k.field_default is MISSING:
            continue
        ours = k.to_verl(k.field_default)
        ours = tuple(ours) if isinstance(ours, list) else ours
        same = (type(ours), ours) == (type(k.verl_default), k.verl_default)
        assert same != bool(k.default_differs), (k.name, ours, k.verl_default, k.default_differs)
        checked += 1
    assert checked == len([k for k in KNOBS if k.verl_default is not UNDECLARED])


def test_a_verl_default_where_verl_has_none_is_refused() -> None:
    with pytest.raises(ValueError, match="verl declares no key of it"):
        Knob(name="x", help="", group="kernels", cost="", verl_keys=("+a.b",), verl_default=1)
    with pytest.raises(ValueError, match="the knob has none"):
        Knob(name="x", help="", group="kernels", cost="", verl_keys=("a.b",), default_differs="y")


def test_the_vllm_keys_are_the_engines_arguments() -> None:
    """`Knob.vllm` names an argument of the measured generation's engine, and those knobs are
    what that generation searches."""
    from dataclasses import fields

    from tuner.runners.megatron_generation import ROLLOUT_SEARCHED
    from tuner.runners.vllm_gen import EngineCfg

    engine = {f.name for f in fields(EngineCfg)}
    vllm = [k for k in KNOBS if k.vllm]
    assert vllm and all(k.vllm in engine and k.group == "rollout" for k in vllm)
    assert tuple(k.name for k in vllm) == ROLLOUT_SEARCHED
