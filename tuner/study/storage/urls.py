"""A storage's names: the file a `--storage` path or `sqlite:///` URL is (and whether it is a
journal), the label a leaderboard records for a storage (a file inside the results folder by its
relative path, so a moved folder resumes) and the URL read back from it, and the URL SQLAlchemy
opens for a server."""

from __future__ import annotations

from pathlib import Path

JOURNAL_SUFFIXES = (".log", ".jsonl", ".journal")
"""A --storage path with one of these suffixes is an Optuna journal file (several workers)."""


def normal_url(url: str) -> str:
    """`url` with its scheme in lower case, as SQLAlchemy reads it (`SQLITE:///x.db` passed the
    CLI's check, which reads schemes in any case, and then SQLAlchemy took it for a server's
    URL: issue 38); a path as it is."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.lower()}{sep}{rest}" if sep else url


def file_of(url: str) -> tuple[Path | None, bool]:
    """(the storage file, is it a journal) for a path or sqlite:/// URL; (None, False) else."""
    if "://" not in url:
        path = Path(url)
        return path, path.suffix in JOURNAL_SUFFIXES
    url = normal_url(url)
    if url.startswith("sqlite:///"):
        return Path(url.removeprefix("sqlite:///")), False
    return None, False


def storage_label(url: str, results_dir: Path | None = None) -> str:
    """The storage's name as leaderboards record it: a file storage inside `results_dir` by its
    path relative to that folder (`sqlite:studies.sqlite3`), so the folder resumes wherever it
    is moved, renamed, copied or mounted; any other file by its absolute path
    (`journal:/shared/x.log`); a server's URL without its password. `label_url` reads it
    back."""
    path, journal = file_of(url)
    if path is not None:
        full = path.resolve()
        if results_dir is not None and full.is_relative_to(folder := results_dir.resolve()):
            full = full.relative_to(folder)
        return f"{'journal' if journal else 'sqlite'}:{full}"
    scheme, _, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if at:
        user = creds.partition(":")[0]
        return f"{scheme}://{user}@{host}"
    return url


def label_file(label: str, results_dir: Path) -> tuple[str, Path | None]:
    """(`sqlite` or `journal`, its file) of a file storage's `storage_label`, a relative one
    taken from `results_dir` (the folder of the leaderboard that records it); ("", None) for
    a server's URL."""
    kind, colon, rest = label.partition(":")
    if kind not in ("sqlite", "journal") or not colon or not rest or rest.startswith("//"):
        return "", None
    path = Path(rest)
    return kind, path if path.is_absolute() else results_dir / path


def label_url(label: str, results_dir: Path) -> str:
    """The URL or path `open_storage` takes for a leaderboard's `storage` cell (`storage_label`;
    relative to `results_dir`, the leaderboard's folder); a server's URL as it is."""
    kind, path = label_file(label, results_dir)
    if path is None:
        return label
    return f"sqlite:///{path}" if kind == "sqlite" else str(path)


def same_storage(recorded: str, label: str, results_dir: Path) -> bool:
    """Whether a leaderboard row's `storage` cell (`recorded`) names the storage `label` of a
    study writing that leaderboard in `results_dir`: the same name, or the same file; or, as
    versions before relative names recorded it, an absolute path that is no longer there
    ending in `label`'s path inside the results folder (the folder was moved or renamed with
    its storage in it)."""
    if recorded == label:
        return True
    kind, was = label_file(recorded, results_dir)
    kind_now, now = label_file(label, results_dir)
    if was is None or now is None or kind != kind_now:
        return False
    if was.resolve() == now.resolve():
        return True
    inside = Path(label.partition(":")[2])
    if inside.is_absolute() or not Path(recorded.partition(":")[2]).is_absolute():
        return False
    return not was.exists() and was.parts[-len(inside.parts) :] == inside.parts


def driver_url(url: str) -> str:
    """The URL SQLAlchemy opens for `url`: `postgresql://` with psycopg 3 where psycopg2 (its
    default) is not installed (the `postgres` extra installs psycopg 3); any other as it is."""
    import importlib.util

    url = normal_url(url)
    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg2") is None:
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return url


def is_postgres(url: str) -> bool:
    return url.partition("://")[0].partition("+")[0].lower() == "postgresql"
