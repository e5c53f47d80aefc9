"""How a knob travels to the megatron worker's spec: its key there and its type (`WorkerKey`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _identity(v: Any) -> Any:
    return v


@dataclass(frozen=True, slots=True)
class WorkerKey:
    """Where the megatron worker's spec (schema 2) carries a knob, and as what: the runner writes
    it (`worker_values`), the worker reads it by this key and type
    (tuner.runners.megatron_worker.spec), into the field of that name of the key's section."""

    key: str
    """`section.name`, or `name` at the spec's top level."""
    kind: type
    """The JSON type the worker reads: bool, int, str, or list (of strings)."""
    off: Any = None
    """The value written where the knob's `when` is false (what the worker reads as unused: 0);
    None: the knob's value, whatever `when` says."""
    to_worker: Callable[[Any], Any] = _identity
    """Candidate value -> the spec's value."""

    @property
    def section(self) -> str:
        """The spec's section (`recompute`, `batch`, ...); empty at the top level."""
        return self.key.rpartition(".")[0]

    @property
    def name(self) -> str:
        return self.key.rpartition(".")[2]
