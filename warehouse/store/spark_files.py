"""The data files of a Spark store's table versions: listing them, reading what their
parquet footers tell, and linking or removing them.

A data file never changes once written: appends add files, compaction writes a new
directory. So a file can be linked into another version instead of copied, and what its
footer says stays right.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from warehouse.store.file_access import store_files
from warehouse.store.spark_names import ORDER

__all__ = ["Footer", "link", "part_files", "read_footer", "remove"]


def part_files(location: str) -> list[str]:
    """Data files of a table directory (Spark skips names starting with '_' or '.')."""
    path = Path(location)
    if not path.is_dir():
        return []
    return sorted(str(p) for p in path.iterdir() if p.name.startswith("part-"))


@dataclass(frozen=True)
class Footer:
    """What the compactor needs from a z-log file's parquet footer."""

    rows: int
    span: tuple[int, int] | None  # smallest and largest ``_order``; None: the footer does not tell


def read_footer(path: str) -> Footer:
    meta = pq.read_metadata(path)
    return Footer(meta.num_rows, _order_span(meta))


def _order_span(meta: pq.FileMetaData) -> tuple[int, int] | None:
    """Smallest and largest ``_order`` in a z-log file, from its parquet footer (Spark writes
    min/max statistics); None when the footer does not tell."""
    column = meta.schema.names.index(ORDER)
    low: int | None = None
    high: int | None = None
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(column).statistics
        if stats is None or not stats.has_min_max:
            return None
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    return None if low is None or high is None else (low, high)  # both are set together


def link(files: Sequence[str], location: str) -> None:
    """Put immutable data files into another table version without copying their bytes."""
    store_files().make_dir(Path(location))
    for file in files:
        target = os.path.join(location, os.path.basename(file))
        try:
            os.link(file, target)
        except OSError:  # another file system, or one without hard links
            shutil.copyfile(file, store_files().create_file(Path(target)))


def remove(*locations: str) -> None:
    for location in locations:
        shutil.rmtree(location, ignore_errors=True)
