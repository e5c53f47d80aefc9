"""Issue 38 (hardening 4), items 1, 2, 3 and 5: inputs that hung, tracebacks, files written
outside their folder, and messages that named the wrong cause. One test per class; each fails
on the code before the fix (a hang is caught by `_within` and fails the test)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_bad_input import (
    EC,
    SECONDS,
    Setup,
    _assert_refused,
    _config,
    _config_json,
    _file,
    _within,
    leaderboards,  # noqa: F401  (a fixture of that module, used here by name)
)
from tuner.cli import main

R = ["--model", "qwen2.5-7b", "--gpus", "8", "--no-progress"]
STUDY = "qwen2.5-7b-h100x8-estimate"


def _model_folder(name: str) -> Setup:
    """A folder `name` holding the small model's config.json."""
    return _file(f"{name}/config.json", _config())


# --------------------------------------------------------------------------------------------
# Item 1: every input ends within seconds (bounded enumeration, bounded retries, a refusal)
# --------------------------------------------------------------------------------------------


def _exhaustive_split(num_layers: int, pp: int, vpp: int) -> tuple[int, int] | None:
    """balanced_split as it was: every (first, last) pair tried (hours at 100,000 layers)."""
    from tuner.space import ParallelLayout

    if pp < 2 or num_layers % (pp * vpp) == 0:
        return None
    best = None
    for f in range(0, num_layers + 1, vpp):
        for last in range(0, num_layers + 1 - f, vpp):
            if not (f or last):
                continue
            lay = ParallelLayout(
                world=pp, pp=pp, vpp=vpp, first_stage_layers=f, last_stage_layers=last
            )
            try:
                stages = lay.stage_layers(num_layers)
            except ValueError:
                continue
            if min(stages) <= 0:
                continue
            score = (max(stages), max(f, last), -min(f or 10**9, last or 10**9))
            if best is None or score < best[0]:
                best = (score, (f, last))
    return best[1] if best else None


def test_the_pipeline_split_is_the_exhaustive_one_in_bounded_time() -> None:
    """balanced_split tried every (first, last) pair: 100,000 layers ran for over 20 minutes.
    It now finds the same split (as trying every pair, for every pp and vpp the search offers)
    in time independent of the depth."""
    from tuner.models import MAX_COUNT
    from tuner.space.choices import MAX_PP, MAX_VPP
    from tuner.space.layout import balanced_split

    for n in [*range(1, 41), 61, 94, 95]:
        for pp in range(2, MAX_PP + 1):
            for vpp in range(1, MAX_VPP + 1):
                assert balanced_split(n, pp, vpp) == _exhaustive_split(n, pp, vpp), (n, pp, vpp)

    def deep() -> int:
        for n in (100_000, 100_001, MAX_COUNT - 1, MAX_COUNT):
            for pp in range(2, MAX_PP + 1):
                for vpp in range(1, MAX_VPP + 1):
                    split = balanced_split(n, pp, vpp)
                    if split is not None:  # a split megatron-core accepts
                        from tuner.space import ParallelLayout

                        lay = ParallelLayout(
                            world=pp, pp=pp, vpp=vpp, first_stage_layers=split[0],
                            last_stage_layers=split[1],
                        )  # fmt: skip
                        assert min(lay.stage_layers(n)) > 0
        return 0

    assert _within(5, deep) == 0


@pytest.mark.parametrize("layers", [513, 100_000, 1 << 24])
def test_a_model_deeper_than_any_is_refused_at_once(
    layers: int,
    leaderboards: Path,  # noqa: F811
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """num_hidden_layers 100000 (or the allowed maximum, 16.7M) ran for over 20 minutes."""
    setup = _config_json(_config(num_hidden_layers=layers))
    fragment = f"num_hidden_layers is {layers}, outside 1..512"
    _assert_refused(EC, fragment, setup, leaderboards, workdir, monkeypatch, capsys)
    argv = ["--model", "config.json", "--gpus", "8", "--no-progress"]
    _assert_refused(argv, fragment, setup, leaderboards, workdir, monkeypatch, capsys)


LONG = "m" * 240
"""A model folder name that makes every recipe name (and the default study's lock) too long."""


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--model", LONG, "--gpus", "8", "--no-progress", "--study", "s"], "more than the 255"),
        (["--model", LONG, "--gpus", "8", "--no-progress"], "bytes, more than the 255"),
        (["--model", "m" * 120, "--gpus", "8", "--no-progress"], "more than the 255 a file"),
    ],
    ids=["recipes", "default-study", "recipe-suffix"],
)
def test_a_name_too_long_for_a_file_is_refused_before_anything_is_written(
    argv: list[str],
    fragment: str,
    leaderboards: Path,  # noqa: F811
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """recipes.write looped for ever on `-2`, `-3`, ... when every name was too long (any
    OSError read as 'keep that file'); with the default study the study lock failed after
    the storage was written."""
    setup = _model_folder(argv[1])
    _assert_refused(argv, fragment, setup, leaderboards, workdir, monkeypatch, capsys)


def test_write_tries_a_bounded_number_of_names(workdir: Path) -> None:
    """Where every numbered name holds another row's recipe, write stops with a UserError."""
    from tuner import recipes
    from tuner.errors import UserError

    recipe = recipes.Recipe(name="m_tp2-rtp1_h100x8.sh", text="#!/usr/bin/env bash\n")
    folder = workdir / "r"
    folder.mkdir()
    names = [recipe.name, "m_tp2-rtp1_h100x8-s-t1.sh"]
    names += [f"m_tp2-rtp1_h100x8-s-t1-{i}.sh" for i in range(2, recipes.MAX_NUMBERED + 1)]
    for n in names:
        (folder / n).write_text("# origin: another row (x)\n")
    with pytest.raises(UserError, match="numbered names are each another row's recipe"):
        _within(SECONDS, lambda: recipes.write(recipe, folder, suffix="s-t1", owner="lb.csv t1"))


# --------------------------------------------------------------------------------------------
# Item 2: tracebacks
# --------------------------------------------------------------------------------------------

INTERRUPT_AT_IMPORT = """
import os, signal, sys
target = sys.argv[1]
class Interrupt:
    def find_spec(self, name, path=None, target_=None):
        if name == target:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while this module loads
        return None
sys.meta_path.insert(0, Interrupt())
from tuner.cli import main
sys.exit(main(sys.argv[2:]))
"""
"""`tune`'s console script (`from tuner.cli import main; sys.exit(main())`) with a Ctrl-C
delivered the moment module `argv[1]` starts to load."""


@pytest.mark.parametrize("module", ["tuner.cli_args", "tuner.cli_parser", "argparse"])
def test_ctrl_c_while_tune_starts_is_one_line(module: str, workdir: Path) -> None:
    """A Ctrl-C in the first 0.3 s was a KeyboardInterrupt traceback: the parser was built,
    and its modules loaded, before main's handler was in place."""
    out = subprocess.run(
        [sys.executable, "-c", INTERRUPT_AT_IMPORT, module, *R, "--trials", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=workdir,
    )
    assert out.returncode == 130, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "tune: interrupted; run the same command again to resume"
    ]
    assert not (workdir / "results").exists()


@pytest.fixture(scope="module")
def stored_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with results/ of a 3-trial estimator study (its storage and leaderboard)."""
    d = tmp_path_factory.mktemp("stored")
    cwd = os.getcwd()
    os.chdir(d)
    try:
        assert main([*R, "--trials", "3", "--recipes", "0"]) == 0
    finally:
        os.chdir(cwd)
    return d


DAMAGE = {
    "record-not-json": (
        "UPDATE trial_user_attributes SET value_json = 'not json{' WHERE key = 'record' AND "
        "trial_id = (SELECT MIN(trial_id) FROM trial_user_attributes)",
        "keeps a value that is not JSON",
    ),
    "record-trial-text": (
        "UPDATE trial_user_attributes SET value_json = replace(value_json, '\"trial\": 0,', "
        "'\"trial\": \"x\",') WHERE key = 'record'",
        'keeps a damaged record (its trial is "x", not a whole number)',
    ),
    "space-number": (
        "UPDATE study_user_attributes SET value_json = '5' WHERE key = 'space'",
        "has a `space` attribute of int '5'",
    ),
}
"""A study's storage edited by hand or by another tool: the SQL, and what `tune` says."""
COMMANDS = {
    "run": [*R, "--trials", "4", "--recipes", "0"],
    "report": ["report", f"results/{STUDY}.csv", "--storage", "results/studies.sqlite3"],
    "reread": ["reread", "--study", STUDY],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_storage_is_one_line_in_every_command(
    command: str,
    damage: str,
    stored_study: Path,
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A trial's `record` attr that is not JSON or whose trial is not a number, and a study's
    `space` attr of the wrong type, were tracebacks (tune run, report, reread). Each command
    ends with exit 0 (it does not read the damaged value) or 2 and one line; a command that
    reads it names what is damaged."""
    shutil.copytree(stored_study / "results", workdir / "results")
    sql, fragment = DAMAGE[damage]
    with contextlib.closing(sqlite3.connect(workdir / "results" / "studies.sqlite3")) as c:
        c.execute(sql)
        c.commit()
    argv = COMMANDS[command]
    if command == "report":
        argv = [*argv, "-o", "r.html"]
    capsys.readouterr()
    code = _within(120, main, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code in (0, 2), err
    if code == 2:
        assert len(err) == 1 and err[0].startswith("tune: error: "), err
    reads_it = command == "run" or (command == "reread" and damage != "space-number")
    if reads_it:
        assert code == 2 and fragment in err[0], err


def test_a_name_the_terminal_cannot_show_is_escaped(workdir: Path) -> None:
    """PYTHONIOENCODING=ascii with a non-ASCII model folder: a UnicodeEncodeError traceback."""
    (workdir / "模型").mkdir()
    (workdir / "模型" / "config.json").write_text(_config())
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    argv = ["estimate", "--model", "模型", "--gpus", "8", "--layout", "tp2"]
    out = subprocess.run(
        [sys.executable, "-m", "tuner", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=workdir,
        env=env,
        errors="replace",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "\\u6a21\\u578b on 8x h100" in out.stdout


# --------------------------------------------------------------------------------------------
# Item 3: written where it does not belong
# --------------------------------------------------------------------------------------------


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_a_model_path_through_dotdot_writes_inside_recipes(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tune --model ../config.json` named the model `..` and wrote its recipes into the folder
    above recipes/; `tune export` of a row whose model is `in/../config.json` did the same."""
    (workdir / "config.json").write_text(_config())
    inner = workdir / "in"
    inner.mkdir()
    monkeypatch.chdir(inner)
    argv = ["--model", "../config.json", "--gpus", "8", "--trials", "2", "--no-progress"]
    assert main(argv) == 0
    written = _files(workdir) - {"config.json"}
    name = workdir.name.lower()
    outside = [p for p in written if not p.startswith(("in/results/", f"in/recipes/{name}/"))]
    assert not outside, outside
    assert any(p.startswith(f"in/recipes/{name}/{name}_") for p in written), written
    # export of a row naming the model through `..`
    monkeypatch.chdir(workdir)
    csv_path = next((inner / "results").glob("*.csv"))
    text = csv_path.read_text().replace("../config.json", "in/../config.json")
    (workdir / "lb.csv").write_text(text)
    shutil.rmtree(inner / "recipes")
    capsys.readouterr()
    assert main(["export", "lb.csv"]) == 0, capsys.readouterr().err
    printed = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed.parent == Path("recipes") / name and printed.is_file(), printed


def test_a_folder_that_takes_no_file_is_refused_before_the_study(workdir: Path) -> None:
    """A recipes folder that passes os.access but cannot be written (here a full file system,
    a tmpfs of 64 KiB mounted in a mount namespace of the test's own): the study ran and wrote
    its results, then failed to write its recipes."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    probe = subprocess.run(
        ["unshare", "-m", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(workdir)],
        capture_output=True,
    )
    if probe.returncode != 0:
        pytest.skip("a mount namespace cannot be made here (needs root or a user namespace)")
    (workdir / "recipes").mkdir()
    script = (
        "mount -t tmpfs -o size=64k tmpfs recipes && "
        "(dd if=/dev/zero of=recipes/fill bs=4k >/dev/null 2>&1; true) && "
        f'exec "{sys.executable}" -m tuner "$@"'
    )
    argv = [*R, "--trials", "2"]
    out = subprocess.run(
        ["unshare", "-m", "bash", "-c", script, "tune", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=workdir,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "recipe folder of model qwen2.5-7b" in lines[0], lines
    assert "No space left on device" in lines[0], lines
    assert sorted(p.name for p in workdir.iterdir()) == ["recipes"]  # no results/


def _made_by_optuna(path: Path, sql: str = "", trials: int = 0) -> None:
    """An Optuna SQLite storage at `path` holding study `s` (with `trials` enqueued trials of
    a 400-byte attr each), then `sql` run on it; made in a process of its own, so that no
    connection of this one is left open on it (this process's engines are in WAL mode)."""
    code = f"""
import contextlib, sqlite3, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.create_study(study_name="s", storage="sqlite:///{path}")
for i in range({trials}):
    study.enqueue_trial({{"x": i}}, user_attrs={{"pad": "p" * 400}})
del study
with contextlib.closing(sqlite3.connect("{path}")) as c:
    for statement in {sql!r}.split(";"):
        if statement.strip():
            c.execute(statement)
    c.commit()
    c.execute("PRAGMA journal_mode=DELETE")
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _old_schema(name: str) -> Setup:
    """An Optuna storage of an older schema revision whose version row is missing: Optuna
    wrote its own version row into it, then refused it."""

    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        sql = "UPDATE alembic_version SET version_num = 'v3.0.0.a'; DELETE FROM version_info"
        _made_by_optuna(d / name, sql)

    return setup


@pytest.mark.parametrize(
    "argv",
    [[*R, "--storage", "old.db"], [*R, "--storage", "SQLITE:///old.db"]],
    ids=["path", "url-upper"],
)
def test_a_storage_of_an_older_schema_stays_as_it_was(
    argv: list[str],
    leaderboards: Path,  # noqa: F811
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fragment = "Please execute `$ optuna storage upgrade --storage $STORAGE_URL`"
    setup = _old_schema("old.db")
    _assert_refused(argv, fragment, setup, leaderboards, workdir, monkeypatch, capsys)


# --------------------------------------------------------------------------------------------
# Item 5: messages that name the real cause
# --------------------------------------------------------------------------------------------


def _damaged_pages(name: str) -> Setup:
    """An Optuna storage whose pages past the first few were overwritten."""

    def setup(d: Path, _mp: pytest.MonkeyPatch) -> None:
        _made_by_optuna(d / name, trials=30)
        with open(d / name, "r+b") as f:
            f.seek(4096 * 3)
            f.write(b"\xde\xad\xbe\xef" * 1024)

    return setup


MESSAGE_CASES: list[tuple[str, list[str], str, Setup]] = [
    (
        "config-null-field",
        EC,
        "config.json: num_attention_heads is null, not a whole number",
        _config_json(_config().replace('"num_attention_heads": 8', '"num_attention_heads": null')),
    ),
    (
        "config-null-fields",
        EC,
        "config.json: hidden_size, vocab_size are null",
        _config_json(
            json.dumps({**json.loads(_config()), "hidden_size": None, "vocab_size": None})
        ),
    ),
]


@pytest.mark.parametrize(
    ("argv", "fragment", "setup"),
    [c[1:] for c in MESSAGE_CASES],
    ids=[c[0] for c in MESSAGE_CASES],
)
def test_the_message_names_the_cause(
    argv: list[str],
    fragment: str,
    setup: Setup,
    leaderboards: Path,  # noqa: F811
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A storage with corrupt pages was blamed on 'invalid data in the commit'; a null
    architecture field was 'a non-numeric architecture field' naming no field."""
    _assert_refused(argv, fragment, setup, leaderboards, workdir, monkeypatch, capsys)


def test_a_damaged_storage_is_said_to_be_damaged(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A storage with corrupt pages was blamed on 'invalid data in the commit' (Optuna's word
    for any failed commit). (SQLite itself marks the file on opening it: no snapshot here.)"""
    _damaged_pages("c.db")(workdir, pytest.MonkeyPatch())
    assert _within(120, main, [*R, "--trials", "2", "--storage", "c.db"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert (
        "storage c.db: the file is damaged (SQLite: database disk image is malformed)" in (lines[0])
    )
    assert "invalid data in the commit" not in lines[0]


def test_an_upper_case_storage_url_is_the_file_it_names(workdir: Path) -> None:
    """`SQLITE:///x.db` passed the check and then failed in SQLAlchemy with advice about
    servers."""
    assert main([*R, "--trials", "2", "--recipes", "0", "--storage", "SQLITE:///up.db"]) == 0
    assert (workdir / "up.db").is_file()


def test_a_locked_storage_is_said_to_be_locked(workdir: Path) -> None:
    """SQLite's 'database is locked' (another process holding the file) read 'invalid data in
    the commit', Optuna's word for any failed commit. A real lock from another connection."""
    from tuner.cli_args import storage_failure_line

    db = workdir / "x.db"
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("CREATE TABLE t (x)")
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(sqlite3.OperationalError) as e:
            sqlite3.connect(db, timeout=0).execute("SELECT * FROM t")
    finally:
        holder.close()
    line = storage_failure_line(e.value, f"sqlite:///{db}")
    assert line is not None and "locked" in line and "stop the program holding it" in line


def test_a_prompt_too_long_for_vllm_is_not_blamed_on_memory(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--prompt-len 1048576` said the smallest candidate was 63 GiB of an 80 GiB GPU as the
    reason nothing fits: the reason is vLLM's KV cache, which cannot hold one sequence."""
    argv = [*R, "--prompt-len", "1048576"]
    assert _within(300, main, argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "still cannot run (vLLM has" in lines[0], lines
    assert "for KV cache, less than one" in lines[0]
    assert not list(workdir.iterdir())


def test_a_file_size_limit_is_named(leaderboards: Path, workdir: Path) -> None:  # noqa: F811
    """A file-size limit (ulimit -f) read 'check the path and its permissions'."""
    import resource

    shutil.copy(leaderboards / "lb.csv", workdir / "lb.csv")

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    out = subprocess.run(
        [sys.executable, "-B", "-m", "tuner", "export", "lb.csv"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=workdir,
        preexec_fn=cap,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "File too large" in lines[0], lines
    assert "file-size limit: raise it (ulimit -f)" in lines[0] and "1024 bytes" in lines[0]
    assert "check the path and its permissions" not in lines[0]
