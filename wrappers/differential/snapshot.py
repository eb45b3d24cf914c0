"""The snapshot reader interface, ``Snapshot``, and the check of records given in Python.

A *snapshot* is a set of records ``(key, rest)``: ``key`` is a tuple of the key columns'
values, ``rest`` a tuple of the other columns' values, both in the order the ``Schema``
gives. The physical order of records is whatever the dump has; the algorithms do not
assume any order (the window algorithm only works *better* when matching records are
near each other).

Readers:

* ``MemorySnapshot`` over a list of ``(key, rest)`` pairs (``from_rows`` builds one from
  whole rows and column names);
* ``CsvSnapshot`` over a CSV dump with a header line;
* ``ParquetSnapshot`` over a Parquet file (pyarrow is imported only when one is opened);
* ``RecordSnapshot`` over a ``spill.RecordFile`` of records (how a wrapper keeps a
  snapshot it read from a database: Python values exactly, no text round trip).

Each reader can ``scan`` its records, ``scan_with_pointers`` (a pointer is a byte offset
in a CSV dump, a row number in a Parquet file, an index in memory) and ``fetch`` records by
pointer, which is what the ``<K,b,p>`` compression format needs.

Bad input raises ``SnapshotError`` with the file and line: a record whose arity does not
match the schema, a file that is missing, truncated (no final line terminator, an
unterminated quoted field, a cut Parquet footer) or not decodable. Schema and key changes
between two snapshots are caught by ``check_compatible``; duplicate keys by the
algorithms (they are the ones who see keys meet).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from wrappers.differential.errors import SnapshotError
from wrappers.differential.record_schema import Key, Record, Rest, Schema
from wrappers.differential.spill import IOStats

__all__ = ["Snapshot", "validated_records"]


class Snapshot:
    """A re-readable source of ``(key, rest)`` records with a ``schema``.

    Subclasses implement ``scan``; those that can fetch by pointer also implement
    ``scan_with_pointers`` and ``fetch``.
    """

    schema: Schema | None  # None only for an empty in-memory snapshot given without one
    name: str = "snapshot"
    nbytes: int | None = None  # size of the dump in bytes, if it is a file
    supports_pointers: bool = False

    def scan(self, stats: IOStats | None = None) -> Iterator[Record]:
        """The records in physical order (bytes read are added to ``stats``)."""
        raise NotImplementedError

    def scan_with_pointers(self, stats: IOStats | None = None) -> Iterator[tuple[Key, Rest, int]]:
        """``(key, rest, pointer)`` in physical order; ``fetch`` accepts the pointers."""
        raise SnapshotError(
            f"{self.name}: records cannot be fetched by pointer (the <K,b,p> format needs a file or a list)"
        )

    def fetch(self, pointers: Iterable[int], stats: IOStats | None = None) -> Iterator[tuple[int, Record]]:
        """``(pointer, record)`` for each distinct pointer, in pointer order."""
        raise SnapshotError(
            f"{self.name}: records cannot be fetched by pointer (the <K,b,p> format needs a file or a list)"
        )

    def __iter__(self) -> Iterator[Record]:
        return self.scan()


def _bad_record(name: str, i: int, rec: Any, schema: Schema) -> SnapshotError:
    return SnapshotError(
        f"{name}: record {i} is {rec!r}; expected (key, rest) tuples of "
        f"{len(schema.key)} and {len(schema.columns) - len(schema.key)} values"
    )


def validated_records(records: Iterable[Any], schema: Schema | None, name: str) -> Iterator[Record]:
    if schema is None:
        return
    nk = len(schema.key)
    nr = len(schema.columns) - nk
    for i, rec in enumerate(records):
        try:
            key, rest = rec
        except (TypeError, ValueError):
            raise _bad_record(name, i, rec, schema) from None
        if type(key) is not tuple or type(rest) is not tuple:
            if not (isinstance(key, tuple) and isinstance(rest, tuple)):
                raise _bad_record(name, i, rec, schema)
            key, rest = tuple(key), tuple(rest)
        if len(key) != nk or len(rest) != nr:
            raise _bad_record(name, i, rec, schema)
        yield key, rest
