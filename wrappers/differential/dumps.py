"""Opening a dump file as a snapshot, by its format (CSV or Parquet)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from wrappers.differential.csv_dumps import CsvSnapshot
from wrappers.differential.errors import SnapshotError
from wrappers.differential.parquet_files import ParquetSnapshot
from wrappers.differential.snapshot import Snapshot

__all__ = ["open_snapshot"]


def open_snapshot(
    path: str | os.PathLike[str],
    key: Sequence[str] | str,
    *,
    format: str | None = None,
    types: Mapping[str, Callable[[str], Any]] | None = None,
) -> Snapshot:
    """Open a dump by extension (``.csv``, ``.parquet``/``.pq``) or explicit ``format``.

    >>> open_snapshot("x.txt", key="id")
    Traceback (most recent call last):
    ...
    wrappers.differential.errors.SnapshotError: x.txt: unknown dump format (use format='csv' or 'parquet')
    """
    p = os.fspath(path)
    fmt = format or {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}.get(os.path.splitext(p)[1].lower())
    if fmt == "csv":
        return CsvSnapshot(p, key, types=types)
    if fmt == "parquet":
        if types:
            raise SnapshotError(f"{p}: types= applies only to CSV dumps (Parquet files carry their types)")
        return ParquetSnapshot(p, key)
    raise SnapshotError(f"{p}: unknown dump format (use format='csv' or 'parquet')")
