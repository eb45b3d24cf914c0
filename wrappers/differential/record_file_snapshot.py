"""Snapshots kept in a wrapper's own record files (``spill.RecordFile``).

This is how a wrapper keeps a snapshot it read from a database: Python values exactly, no
text round trip. ``write_records`` writes one; ``RecordSnapshot`` reads it back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from wrappers.differential.errors import SnapshotError
from wrappers.differential.record_schema import Record, Schema
from wrappers.differential.snapshot import Snapshot, validated_records
from wrappers.differential.spill import IOStats, RecordFile, SpillError

__all__ = ["RecordSnapshot", "write_records"]


class RecordSnapshot(Snapshot):
    """Records kept in a sealed ``RecordFile`` (written with ``write_records``); no pointers.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "t.rec")
    >>> write_records(p, [((1,), ("a",)), ((2,), ("b",))])
    2
    >>> list(RecordSnapshot(p, Schema(("id", "v"), ("id",))))
    [((1,), ('a',)), ((2,), ('b',))]
    """

    def __init__(self, path: str | os.PathLike[str], schema: Schema) -> None:
        self.path = os.fspath(path)
        self.name = self.path
        self.schema = schema
        try:
            self._file = RecordFile.open(self.path)
        except SpillError as exc:
            raise SnapshotError(str(exc)) from None
        self.nbytes = self._file.nbytes

    def __len__(self) -> int:
        return len(self._file)

    def scan(self, stats: IOStats | None = None) -> Iterator[Record]:
        try:
            yield from validated_records(self._file.read(stats), self.schema, self.name)
        except SpillError as exc:
            raise SnapshotError(str(exc)) from None


def write_records(path: str | os.PathLike[str], records: Iterable[Record]) -> int:
    """Write records to a ``RecordFile`` at ``path`` (kept); returns the count."""
    out = RecordFile(path=path, keep=True)
    try:
        out.extend((tuple(k), tuple(r)) for k, r in records)
        out.seal()
    except BaseException:
        out.delete()
        raise
    return len(out)
