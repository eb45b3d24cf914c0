"""The output of a differential: ``Change`` messages, in sending order, and how to apply them.

A differential reports ``insert`` (a key only in the new snapshot, with its new values),
``delete`` (a key only in the old snapshot) and ``update`` (a key in both whose rest
differs). ``old`` holds the old rest where the algorithm knows it (the compressed formats
keep only a checksum of it, so there it is ``None``); ``new`` holds the new rest.

Sending order: **all deletes before any insert**. An algorithm that may report the same key
twice (the window algorithm reports a record it could not match as a delete and its partner
as an insert) then only produces *useless delete-insert pairs*, which cost a message but
leave the warehouse right. The reverse, an insert followed by a delete of the same key,
would lose the record (Labio & Garcia-Molina, section 1.1). ``ChangeList`` keeps the deletes
and the other changes in two spill lists and yields the deletes first.

>>> changes = [Change.delete((1,), ("a",)), Change.insert((1,), ("a",)), Change.update((2,), ("b",), ("c",))]
>>> sorted(apply_changes({(1,): ("a",), (2,): ("b",)}, changes).items())
[((1,), ('a',)), ((2,), ('c',))]
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, NamedTuple

from wrappers.differential.spill import IOStats, SpillList

__all__ = [
    "DELETE",
    "INSERT",
    "UPDATE",
    "Change",
    "ChangeConflict",
    "ChangeList",
    "DiffResult",
    "DiffStats",
    "apply_changes",
]

INSERT = "insert"
DELETE = "delete"
UPDATE = "update"
_KINDS = (INSERT, DELETE, UPDATE)


class Change(NamedTuple):
    """One message: ``kind`` is ``"insert"``, ``"delete"`` or ``"update"``.

    >>> Change.update((7,), None, ("x",))
    Change(kind='update', key=(7,), old=None, new=('x',))
    """

    kind: str
    key: tuple[Any, ...]
    old: tuple[Any, ...] | None = None
    new: tuple[Any, ...] | None = None

    @classmethod
    def insert(cls, key: tuple[Any, ...], new: tuple[Any, ...]) -> Change:
        """``<Insert, K, B>``."""
        return cls(INSERT, key, None, new)

    @classmethod
    def delete(cls, key: tuple[Any, ...], old: tuple[Any, ...] | None = None) -> Change:
        """``<Delete, K>`` (with the old rest if known)."""
        return cls(DELETE, key, old, None)

    @classmethod
    def update(cls, key: tuple[Any, ...], old: tuple[Any, ...] | None, new: tuple[Any, ...]) -> Change:
        """``<Update, K, B>`` (with the old rest if known)."""
        return cls(UPDATE, key, old, new)


class ChangeConflict(ValueError):
    """A change does not fit the snapshot it is applied to (see ``apply_changes``)."""


class ChangeList:
    """Changes in sending order: all deletes, then updates and inserts as produced.

    Re-iterable; both parts may live on disk (they are ``SpillList``s when built by the
    algorithms).

    >>> cl = ChangeList([Change.delete((1,))], [Change.insert((2,), ("x",))])
    >>> [c.kind for c in cl], len(cl), cl.counts()
    (['delete', 'insert'], 2, {'insert': 1, 'delete': 1, 'update': 0})
    """

    def __init__(self, deletes: Iterable[Change] = (), others: Iterable[Change] = ()) -> None:
        self._deletes = deletes if isinstance(deletes, (list, SpillList)) else list(deletes)
        self._others = others if isinstance(others, (list, SpillList)) else list(others)

    @classmethod
    def from_changes(
        cls,
        changes: Iterable[Change],
        capacity: int | None = None,
        directory: Any = None,
        stats: IOStats | None = None,
    ) -> ChangeList:
        """Sort an arbitrary change stream into sending order (deletes first)."""
        dels = SpillList(capacity, directory, stats)
        others = SpillList(capacity, directory, stats)
        for c in changes:
            if c.kind not in _KINDS:
                raise ValueError(f"unknown change kind {c.kind!r}")
            (dels if c.kind == DELETE else others).append(c)
        return cls(dels, others)

    @property
    def deletes(self) -> Iterable[Change]:
        """The deletes alone."""
        return self._deletes

    @property
    def others(self) -> Iterable[Change]:
        """Updates and inserts."""
        return self._others

    def __iter__(self) -> Iterator[Change]:
        return chain(self._deletes, self._others)

    def __len__(self) -> int:
        return len(self._deletes) + len(self._others)

    def counts(self) -> dict[str, int]:
        """How many changes of each kind."""
        c = Counter(ch.kind for ch in self._others)
        return {INSERT: c[INSERT], DELETE: len(self._deletes), UPDATE: c[UPDATE]}

    def to_list(self) -> list[Change]:
        """All changes in sending order, in memory."""
        return list(self)

    def __repr__(self) -> str:
        return f"ChangeList({self.counts()})"


def apply_changes(
    target: MutableMapping[tuple[Any, ...], tuple[Any, ...]], changes: Iterable[Change], *, strict: bool = True
) -> MutableMapping[tuple[Any, ...], tuple[Any, ...]]:
    """Apply changes in order to a ``{key: rest}`` snapshot, in place; return it.

    With ``strict`` (the default) a change that does not fit raises ``ChangeConflict``:
    deleting or updating a missing key, inserting a key that exists (what an insert-delete
    pair would do), or a known ``old`` that differs from the current value.

    >>> apply_changes({(1,): ("a",)}, [Change.insert((1,), ("b",))])
    Traceback (most recent call last):
    ...
    wrappers.differential.messages.ChangeConflict: insert of key (1,) which is present
    """
    for c in changes:
        kind, key, old, new = c
        if kind == DELETE:
            if key not in target:
                if strict:
                    raise ChangeConflict(f"delete of key {key!r} which is absent")
                continue
            if strict and old is not None and target[key] != old:
                raise ChangeConflict(f"delete of key {key!r}: old value {old!r} but the snapshot has {target[key]!r}")
            del target[key]
        elif kind == INSERT:
            if strict and key in target:
                raise ChangeConflict(f"insert of key {key!r} which is present")
            target[key] = new  # type: ignore[assignment]
        elif kind == UPDATE:
            if key not in target:
                if strict:
                    raise ChangeConflict(f"update of key {key!r} which is absent")
            elif strict and old is not None and target[key] != old:
                raise ChangeConflict(f"update of key {key!r}: old value {old!r} but the snapshot has {target[key]!r}")
            target[key] = new  # type: ignore[assignment]
        else:
            raise ChangeConflict(f"unknown change kind {kind!r}")
    return target


@dataclass
class DiffStats:
    """What a differential did: records on each side, IO, and algorithm details.

    ``io.bytes_read`` counts every byte read: the dumps, kept state, spill files and
    records fetched by pointer.
    """

    algorithm: str
    old_records: int = 0
    new_records: int = 0
    io: IOStats = field(default_factory=IOStats)
    in_memory: bool = True
    partitions: int = 1
    runs: int = 0
    fetched: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict.

        >>> DiffStats("window").as_dict()["algorithm"]
        'window'
        """
        return {
            "algorithm": self.algorithm,
            "old_records": self.old_records,
            "new_records": self.new_records,
            **self.io.as_dict(),
            "in_memory": self.in_memory,
            "partitions": self.partitions,
            "runs": self.runs,
            "fetched": self.fetched,
            **self.details,
        }


@dataclass
class DiffResult:
    """A differential's ``changes`` (sending order), the ``state`` to pass as ``old`` next
    time (``None`` for algorithms that keep none), and ``stats``."""

    changes: ChangeList
    state: Any
    stats: DiffStats

    def __iter__(self) -> Iterator[Change]:
        return iter(self.changes)

    def __len__(self) -> int:
        return len(self.changes)
