"""Snapshots of records held in Python: a list (``MemorySnapshot``) or a one-shot stream.

``as_snapshot`` turns what the algorithms are given into a ``Snapshot``; ``from_rows``
builds a ``MemorySnapshot`` from whole rows and column names.

>>> snap = from_rows([(1, "ann", 10), (2, "bob", 20)], columns=("id", "name", "bal"), key=("id",))
>>> list(snap)
[((1,), ('ann', 10)), ((2,), ('bob', 20))]
>>> snap.schema.rest_columns
('name', 'bal')
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from wrappers.differential.errors import SnapshotError
from wrappers.differential.record_schema import Key, Record, Rest, Schema, key_columns
from wrappers.differential.record_sizes import peek
from wrappers.differential.snapshot import Snapshot, validated_records
from wrappers.differential.spill import IOStats

__all__ = ["MemorySnapshot", "as_snapshot", "from_rows"]


def _infer_schema(first: Any, name: str) -> Schema:
    try:
        key, rest = first
    except (TypeError, ValueError):
        raise SnapshotError(f"{name}: record 0 is {first!r}; expected a (key, rest) pair of tuples") from None
    if not isinstance(key, tuple) or not isinstance(rest, tuple) or not key:
        raise SnapshotError(f"{name}: record 0 is {first!r}; expected a (key, rest) pair of tuples")
    return Schema.for_arity(len(key), len(rest))


class MemorySnapshot(Snapshot):
    """Records held in a list; pointers are list indexes.

    >>> s = MemorySnapshot([((1,), ("a",)), ((2,), ("b",))])
    >>> s.schema.columns
    ('k1', 'c1')
    >>> list(s.fetch([1]))
    [(1, ((2,), ('b',)))]
    """

    supports_pointers = True

    def __init__(
        self, records: Iterable[Record], schema: Schema | None = None, name: str = "in-memory snapshot"
    ) -> None:
        self._records = records if isinstance(records, list) else list(records)
        self.name = name
        if schema is None and self._records:
            schema = _infer_schema(self._records[0], name)
        self.schema = schema

    def __len__(self) -> int:
        return len(self._records)

    def scan(self, stats: IOStats | None = None) -> Iterator[Record]:
        return validated_records(self._records, self.schema, self.name)

    def scan_with_pointers(self, stats: IOStats | None = None) -> Iterator[tuple[Key, Rest, int]]:
        for i, (key, rest) in enumerate(self.scan(stats)):
            yield key, rest, i

    def fetch(self, pointers: Iterable[int], stats: IOStats | None = None) -> Iterator[tuple[int, Record]]:
        records = self._records
        for p in sorted(set(pointers)):
            if not 0 <= p < len(records):
                raise SnapshotError(f"{self.name}: pointer {p} is outside the snapshot ({len(records)} records)")
            key, rest = records[p]
            yield p, (tuple(key), tuple(rest))


class _IterSnapshot(Snapshot):
    """A one-shot iterable of records: scanned once, no pointers."""

    def __init__(self, records: Iterable[Record], name: str = "record stream") -> None:
        head, self._it = peek(records, 1)
        self.name = name
        self.schema = _infer_schema(head[0], name) if head else None
        self._used = False

    def scan(self, stats: IOStats | None = None) -> Iterator[Record]:
        if self._used:
            raise SnapshotError(f"{self.name}: a one-shot record stream can be read only once")
        self._used = True
        return validated_records(self._it, self.schema, self.name)


def as_snapshot(obj: Snapshot | Iterable[Record], name: str = "snapshot") -> Snapshot:
    """``obj`` itself if it is a ``Snapshot``; a list or tuple of records as a
    ``MemorySnapshot``; any other iterable as a one-shot stream.

    >>> as_snapshot([((1,), ())]).schema.columns
    ('k1',)
    >>> as_snapshot([]).schema is None
    True
    """
    if isinstance(obj, Snapshot):
        return obj
    if isinstance(obj, (list, tuple)):
        return MemorySnapshot(list(obj), name=name)
    if isinstance(obj, (str, bytes, os.PathLike)):
        raise TypeError(f"{name}: a path is not a snapshot; open it with open_snapshot(path, key=...)")
    return _IterSnapshot(obj, name=name)


def from_rows(
    rows: Iterable[Sequence[Any]], columns: Sequence[str], key: Sequence[str] | str, name: str = "in-memory snapshot"
) -> MemorySnapshot:
    """A ``MemorySnapshot`` from whole rows in column order.

    >>> from_rows([("x", 1)], columns=("name", "id"), key="id").scan().__next__()
    ((1,), ('x',))
    """
    schema = Schema(tuple(columns), key_columns(key))
    n = len(schema.columns)
    kidx, ridx = schema.key_index, schema.rest_index
    records = []
    for i, row in enumerate(rows):
        if len(row) != n:
            raise SnapshotError(f"{name}: row {i} has {len(row)} values; expected {n} ({list(schema.columns)})")
        records.append((tuple(row[j] for j in kidx), tuple(row[j] for j in ridx)))
    return MemorySnapshot(records, schema, name)
