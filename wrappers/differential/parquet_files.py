"""Parquet files: reading one as a snapshot (``ParquetSnapshot``) and writing one.

Pointers are row numbers. pyarrow is imported only when a file is opened or written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from wrappers.differential.errors import SnapshotError
from wrappers.differential.record_schema import Key, Record, Rest, Schema, key_columns
from wrappers.differential.snapshot import Snapshot
from wrappers.differential.spill import IOStats

__all__ = ["ParquetSnapshot", "write_parquet"]


def _arrow() -> tuple[Any, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


class ParquetSnapshot(Snapshot):
    """A Parquet file; pointers are row numbers.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "s.parquet")
    >>> write_parquet(p, Schema(("id", "v"), ("id",)), [((1,), ("a",)), ((2,), ("b",))])
    2
    >>> snap = ParquetSnapshot(p, key="id")
    >>> list(snap), snap.schema.types
    ([((1,), ('a',)), ((2,), ('b',))], ('int64', 'string'))
    """

    supports_pointers = True
    schema: Schema  # read from the file's metadata, so always known

    def __init__(self, path: str | os.PathLike[str], key: Sequence[str] | str, *, batch_rows: int = 65536) -> None:
        self.path = os.fspath(path)
        self.name = self.path
        self.batch_rows = batch_rows
        _pa, _ = _arrow()
        pf = self._open()
        try:
            arrow_schema = pf.schema_arrow
            self._row_groups = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
        finally:
            pf.close()
        columns = tuple(arrow_schema.names)
        self.schema = Schema(columns, key_columns(key), tuple(str(t) for t in arrow_schema.types))
        self._ordered = [columns[i] for i in self.schema.key_index] + list(self.schema.rest_columns)
        try:
            self.nbytes = os.path.getsize(self.path)
        except OSError:
            self.nbytes = None

    def _open(self) -> Any:
        pa, pq = _arrow()
        try:
            return pq.ParquetFile(self.path)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise SnapshotError(f"{self.path}: unreadable or truncated Parquet file ({exc})") from None

    def _batches(self, stats: IOStats | None) -> Iterator[list[list[Any]]]:
        pa, _ = _arrow()
        pf = self._open()
        try:
            for batch in pf.iter_batches(batch_size=self.batch_rows, columns=self._ordered):
                yield [col.to_pylist() for col in batch.columns]
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise SnapshotError(f"{self.path}: unreadable or truncated Parquet file ({exc})") from None
        finally:
            pf.close()
            if stats is not None and self.nbytes:
                stats.read(self.nbytes)

    def scan(self, stats: IOStats | None = None) -> Iterator[Record]:
        nk = len(self.schema.key)
        nr = len(self.schema.columns) - nk
        for cols in self._batches(stats):
            n = len(cols[0]) if cols else 0
            keys = zip(*cols[:nk], strict=True)
            rests = zip(*cols[nk:], strict=True) if nr else (() for _ in range(n))
            yield from zip(keys, rests)

    def scan_with_pointers(self, stats: IOStats | None = None) -> Iterator[tuple[Key, Rest, int]]:
        for i, (key, rest) in enumerate(self.scan(stats)):
            yield key, rest, i

    def fetch(self, pointers: Iterable[int], stats: IOStats | None = None) -> Iterator[tuple[int, Record]]:
        pa, _ = _arrow()
        wanted = sorted(set(pointers))
        total = sum(self._row_groups)
        if wanted and not (wanted[0] >= 0 and wanted[-1] < total):
            raise SnapshotError(f"{self.path}: pointer outside the file's {total} rows (the file changed?)")
        nk = len(self.schema.key)
        pf = self._open()
        try:
            start = 0
            i = 0
            for g, rows in enumerate(self._row_groups):
                end = start + rows
                local = []
                while i < len(wanted) and wanted[i] < end:
                    local.append(wanted[i] - start)
                    i += 1
                if local:
                    table = pf.read_row_group(g, columns=self._ordered).take(local)
                    if stats is not None:
                        stats.read(pf.metadata.row_group(g).total_byte_size)
                    cols = [c.to_pylist() for c in table.columns]
                    for j, p in enumerate(local):
                        row = [c[j] for c in cols]
                        yield p + start, (tuple(row[:nk]), tuple(row[nk:]))
                start = end
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise SnapshotError(f"{self.path}: unreadable or truncated Parquet file ({exc})") from None
        finally:
            pf.close()


def write_parquet(
    path: str | os.PathLike[str], schema: Schema, records: Iterable[Record], *, row_group_rows: int = 65536
) -> int:
    """Write records to a Parquet file (types inferred by pyarrow); returns the count."""
    pa, pq = _arrow()
    rows = [schema.join(k, r) for k, r in records]
    columns: list[Sequence[Any]] = list(zip(*rows, strict=True)) if rows else [[] for _ in schema.columns]
    table = pa.table({name: list(col) for name, col in zip(schema.columns, columns, strict=True)})
    pq.write_table(table, path, row_group_size=row_group_rows)
    return len(rows)
