"""tuner.fileio: the one atomic file writer, and that it stays the one (issue 20: a hand-written
copy with a fixed temporary name raced twice, in recipes.write and in the Ray launcher's log)."""

from __future__ import annotations

import ast
import multiprocessing
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.fileio import write_atomic

TUNER = Path(__file__).resolve().parents[1] / "tuner"
RENAMES = {"os.replace", "os.rename", "os.link", "os.symlink", "shutil.move"}
TEMP_FILES = {"mkstemp", "NamedTemporaryFile"}
ALLOWED = {
    ("tuner/study/csv_view.py", "os.replace"): "moves a damaged leaderboard aside, writes nothing",
    ("tuner/dataset.py", "os.rename"): "renames a whole folder into place, not a file",
    ("tuner/dataset.py", ".tmp"): "that folder's temporary name (the process id in it)",
}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _temp_name(value: object) -> bool:
    """A string that names a temporary file ('.<name>.tmp'), not the /tmp folder."""
    return isinstance(value, str) and ".tmp" in value and "/tmp/" not in value


def hand_written_writers(path: Path) -> set[str]:
    """What in `path` looks like an atomic writer of its own: a rename or link into place, a
    temporary file, or a temporary name ('.tmp') spelled out."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name in RENAMES:
                found.add(name)
            elif name.rpartition(".")[2] in TEMP_FILES:
                found.add(name.rpartition(".")[2])
            elif (  # Path.rename / Path.replace of a temporary file (str.replace takes 2)
                isinstance(node.func, ast.Attribute)
                and node.func.attr in ("rename", "replace")
                and len(node.args) == 1
                and "tmp" in _dotted(node.func.value).lower()
            ):
                found.add(f"<path>.{node.func.attr}")
        elif isinstance(node, ast.Constant) and _temp_name(node.value):
            found.add(".tmp")
    return found


def test_fileio_is_the_one_atomic_writer() -> None:
    """No module under tuner/ but fileio.py renames a temporary file into place itself: call
    fileio.write_atomic (exclusive=True to create only if absent)."""
    bad = sorted(
        f"{rel}: {what}"
        for p in sorted(TUNER.rglob("*.py"))
        if p != TUNER / "fileio.py"
        for rel in [p.relative_to(TUNER.parent).as_posix()]
        for what in hand_written_writers(p)
        if (rel, what) not in ALLOWED
    )
    assert not bad, "write through tuner.fileio.write_atomic instead: " + "; ".join(bad)


def test_the_scan_sees_a_hand_written_writer(tmp_path: Path) -> None:
    """The check itself: each way seen in this project's history is caught."""
    for code, what in (
        ("import os\nos.replace(tmp, path)", "os.replace"),
        ("import os\ndef f():\n    os.link(tmp, path)", "os.link"),
        ("import tempfile\nfd, tmp = tempfile.mkstemp(dir=d)", "mkstemp"),
        ("from tempfile import mkstemp\nfd, tmp = mkstemp()", "mkstemp"),
        ("tmp = p.with_name(f'.{p.name}.tmp')", ".tmp"),
        ("tmp_path.replace(final)", "<path>.replace"),
    ):
        f = tmp_path / "m.py"
        f.write_text(code + "\n")
        assert what in hand_written_writers(f), code
    f.write_text("s = name.replace('_', ' ')\nd = '/tmp/ray/x'\n")
    assert not hand_written_writers(f)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_exclusive_creates_only_if_absent(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "result.json"
    assert write_atomic(p, "first\n", exclusive=True) == p
    assert p.stat().st_mode & 0o777 == 0o666 & ~_umask()  # not mkstemp's 0600
    with pytest.raises(FileExistsError):
        write_atomic(p, "second\n", exclusive=True)
    assert p.read_text() == "first\n"
    assert [q.name for q in p.parent.iterdir()] == ["result.json"]  # no temporary file left
    write_atomic(p, "third\n")
    assert p.read_text() == "third\n"


def _save_logs_many(log: str, text: str, n: int) -> None:
    from tuner.runners.launchers.base import Job
    from tuner.runners.launchers.ray import RayLauncher

    client = SimpleNamespace(get_job_logs=lambda sid: text)
    job = Job(name="j", cmd=["true"], log_path=Path(log), timeout_s=1.0)
    for _ in range(n):
        RayLauncher._save_logs(client, "sid", job)


def test_ray_logs_saved_at_once_are_never_torn(tmp_path: Path) -> None:
    """The Ray launcher's log saver wrote through one fixed temporary name ('.<log>.tmp'), so
    writers at once wrote into each other's file: a reader could see a torn log, a writer's
    rename found nothing. Through fileio each one replaces the log whole."""
    log = tmp_path / "verl.log"
    texts = [f"{i}" * (200_000 + 50_000 * i) for i in range(4)]
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_save_logs_many, args=(str(log), t, 60)) for t in texts]
    for p in procs:
        p.start()
    torn = 0
    while any(p.is_alive() for p in procs):
        if log.exists():
            torn += log.read_text() not in texts
        time.sleep(0.001)
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    assert torn == 0
    assert log.read_text() in texts
    assert [q.name for q in tmp_path.iterdir()] == ["verl.log"]
