"""The shape of a snapshot's records: ``(key, rest)`` tuples and the ``Schema`` naming them.

``key`` is a tuple of the key columns' values, ``rest`` a tuple of the other columns'
values, both in the order the ``Schema`` gives. Two snapshots can be differenced only if
their schemas agree (``check_compatible``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wrappers.differential.errors import SnapshotError

__all__ = ["Key", "Record", "Rest", "Schema", "check_compatible", "key_columns"]

Key = tuple[Any, ...]
Rest = tuple[Any, ...]
Record = tuple[Key, Rest]


@dataclass(frozen=True)
class Schema:
    """Column names, key columns and (optionally) column type names of a snapshot.

    >>> s = Schema(("id", "name"), key=("id",))
    >>> s.key_index, s.rest_index, s.rest_columns
    ((0,), (1,), ('name',))
    >>> s.split((7, "x")), s.join((7,), ("x",))
    (((7,), ('x',)), (7, 'x'))
    """

    columns: tuple[str, ...]
    key: tuple[str, ...]
    types: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        columns = tuple(self.columns)
        key = (self.key,) if isinstance(self.key, str) else tuple(self.key)
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "key", key)
        if self.types is not None:
            object.__setattr__(self, "types", tuple(self.types))
            if len(self.types) != len(columns):
                raise SnapshotError(f"schema has {len(columns)} columns but {len(self.types)} types")
        if len(set(columns)) != len(columns):
            dups = sorted({c for c in columns if columns.count(c) > 1})
            raise SnapshotError(f"duplicate column name(s) {dups}")
        if not key:
            raise SnapshotError("a snapshot needs at least one key column")
        missing = [k for k in key if k not in columns]
        if missing:
            raise SnapshotError(f"key column(s) {missing} not among the columns {list(columns)}")
        if len(set(key)) != len(key):
            raise SnapshotError(f"key column listed twice in {list(key)}")

    @classmethod
    def for_arity(cls, key_arity: int, rest_arity: int) -> Schema:
        """A schema with generated names ``k1..``, ``c1..`` for unnamed in-memory records.

        >>> Schema.for_arity(1, 2).columns
        ('k1', 'c1', 'c2')
        """
        keys = tuple(f"k{i + 1}" for i in range(key_arity))
        return cls(keys + tuple(f"c{i + 1}" for i in range(rest_arity)), keys)

    @property
    def key_index(self) -> tuple[int, ...]:
        """Positions of the key columns, in key order."""
        return tuple(self.columns.index(k) for k in self.key)

    @property
    def rest_index(self) -> tuple[int, ...]:
        """Positions of the other columns, in column order."""
        keys = set(self.key)
        return tuple(i for i, c in enumerate(self.columns) if c not in keys)

    @property
    def rest_columns(self) -> tuple[str, ...]:
        """Names of the non-key columns, in ``rest`` order."""
        return tuple(self.columns[i] for i in self.rest_index)

    @property
    def key_is_prefix(self) -> bool:
        """Whether the key columns are the first columns, in order (the fast path)."""
        return self.key_index == tuple(range(len(self.key)))

    def split(self, row: Sequence[Any]) -> Record:
        """A whole row (values in column order) as ``(key, rest)``."""
        return tuple(row[i] for i in self.key_index), tuple(row[i] for i in self.rest_index)

    def join(self, key: Key, rest: Rest) -> tuple[Any, ...]:
        """``(key, rest)`` back to a whole row in column order."""
        row: list[Any] = [None] * len(self.columns)
        for i, v in zip(self.key_index, key, strict=True):
            row[i] = v
        for i, v in zip(self.rest_index, rest, strict=True):
            row[i] = v
        return tuple(row)


def key_columns(key: Sequence[str] | str) -> tuple[str, ...]:
    """``key`` as a tuple of column names; a single name may be given as a string.

    >>> key_columns("id"), key_columns(["a", "b"])
    (('id',), ('a', 'b'))
    """
    return (key,) if isinstance(key, str) else tuple(key)


def check_compatible(
    old: Schema | None, new: Schema | None, old_name: str = "old snapshot", new_name: str = "new snapshot"
) -> Schema | None:
    """Raise ``SnapshotError`` if two snapshots cannot be differenced: key or schema changed.

    Types are compared only when both sides know them. ``None`` (an empty in-memory
    snapshot given without a schema) is compatible with anything. Returns the schema the
    result has (the new one if known).

    >>> a = Schema(("id", "x"), ("id",))
    >>> check_compatible(a, Schema(("id", "x"), ("id",))) == a
    True
    >>> check_compatible(a, Schema(("id", "x", "y"), ("id",)))
    Traceback (most recent call last):
    ...
    wrappers.differential.errors.SnapshotError: schema changed: old snapshot has columns ['id', 'x'] but new snapshot has ['id', 'x', 'y']
    """
    if old is None or new is None:
        return new if new is not None else old
    if old.key != new.key:
        raise SnapshotError(f"key changed: {old_name} has key {list(old.key)} but {new_name} has {list(new.key)}")
    if old.columns != new.columns:
        raise SnapshotError(
            f"schema changed: {old_name} has columns {list(old.columns)} but {new_name} has {list(new.columns)}"
        )
    if old.types is not None and new.types is not None and old.types != new.types:
        diffs = [f"{c}: {a} -> {b}" for c, a, b in zip(old.columns, old.types, new.types, strict=True) if a != b]
        raise SnapshotError(
            f"schema changed: column types differ between {old_name} and {new_name} ({', '.join(diffs)})"
        )
    return new
