"""A cost term's memo keyed by the candidate fields the term reads, found by watching it read.

A term of the cost model (a layout's per-token coefficients, the micro-batches of a pass) is
computed once per distinct input and looked up after. Its key used to be a hand-written list of
Candidate fields: a knob a term came to read but the list left out returned the cost of the
first candidate that differed only in that knob. Here there is no list. The first computation
runs on a `Reading` of the candidate, which records each field (and layout degree) the term
reads and the value it got; the result is stored under that path of (field, value) pairs. A
later candidate walks the same path: at each step it is asked the field the term read next there
(the term is deterministic, so a candidate agreeing on every value read so far makes the term
read the same next field) and follows its own value; where no branch has its value the term is
computed again, on a Reading, and the new branch stored. A term that reads a field only on one
branch (masked_softmax_fusion under the unfused attention backends) keys only that branch by it.

So adding a knob to a memoized term is reading it in the term: the memo follows.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

T = TypeVar("T")
C = TypeVar("C")


class Reading:
    """A candidate (or its layout) that records what is read of it: each field or property, as
    (dotted path, value), in the order first read. A nested dataclass (the layout) is read
    through a Reading of its own, so its degrees are recorded one by one (`layout.tp`); a method
    is refused (its reads of the real object would not be seen)."""

    __slots__ = ("_obj", "_prefix", "_log", "_seen")

    def __init__(
        self,
        obj: object,
        log: list[tuple[str, Hashable]],
        prefix: str = "",
        seen: set[str] | None = None,
    ) -> None:
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_prefix", prefix)
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_seen", set() if seen is None else seen)

    def __getattr__(self, name: str) -> Any:
        obj, prefix, log, seen = self._obj, self._prefix, self._log, self._seen
        v = getattr(obj, name)
        path = prefix + name
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return Reading(v, log, path + ".", seen)
        if callable(v):
            raise TypeError(
                f"a memoized cost term called {path}(): read fields and properties only, so "
                "that the memo sees what the result depends on"
            )
        if path not in seen:
            seen.add(path)
            log.append((path, v))
        return v

    def __setattr__(self, name: str, value: object) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


@dataclasses.dataclass(slots=True)
class _Node:
    """One step of a term's memo: the field the term reads next here, and a branch per value."""

    path: str
    branches: dict[Hashable, _Node | _Leaf] = dataclasses.field(default_factory=dict)
    read: Callable[[Any], Any] = dataclasses.field(init=False, repr=False, compare=False)
    """Reads `path` of a candidate (`layout.tp`: operator.attrgetter takes a dotted path), made
    once: a lookup walks one node per field the term read, for every candidate scored (a
    string split per node took a quarter of a warm phase_times call)."""

    def __post_init__(self) -> None:
        self.read = operator.attrgetter(self.path)


@dataclasses.dataclass(frozen=True, slots=True)
class _Leaf:
    value: object


def memoized(cache: dict[Any, Any], name: Hashable, candidate: C, compute: Callable[[C], T]) -> T:
    """`compute(candidate)`, looked up in `cache` (under `name`: the term and any argument
    besides the candidate) by the values of the fields `compute` reads of `candidate`; computed
    on a `Reading` of it and stored where not found. `compute` must depend on nothing else that
    varies within the cache's life (the cache is the context's: one model, cluster, workload
    and profile)."""
    root = cache.get(name)
    node: _Node | _Leaf | None = root
    parent: _Node | None = None
    value: Hashable = None
    while isinstance(node, _Node):
        parent, value = node, node.read(candidate)
        node = node.branches.get(value)
    if isinstance(node, _Leaf):
        return cast(T, node.value)
    log: list[tuple[str, Hashable]] = []
    out = compute(cast(C, Reading(candidate, log)))
    leaf = _Leaf(out)
    if parent is None:
        cache[name] = _grow(log, 0, leaf)
        return out
    # the term read the fields on the path so far, then (being deterministic) the parent's
    # field: log holds them in that order; what it read after starts the new branch
    at = next(i for i, (p, _) in enumerate(log) if p == parent.path) + 1
    parent.branches[value] = _grow(log, at, leaf)
    return out


def _grow(log: list[tuple[str, Hashable]], start: int, leaf: _Leaf) -> _Node | _Leaf:
    """The chain of nodes for `log[start:]`, ending at `leaf`."""
    node: _Node | _Leaf = leaf
    for path, v in reversed(log[start:]):
        node = _Node(path, {v: node})
    return node
