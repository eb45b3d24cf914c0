"""The data files of a Spark store's table versions: writing a commit's file, listing
them, reading what their parquet footers tell, and linking or removing them.

A data file never changes once written: appends add files, compaction writes a new
directory. So a file can be linked into another version instead of copied, and what its
footer says stays right.

A commit's file is written here, by the manager's process, not by a Spark job: Spark reads a
table version's directory afresh for every query (the sessions keep no listing cache), so a
file that appears in it is read by the next query of every session, whoever wrote it.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from warehouse.store.file_access import store_files
from warehouse.store.spark_names import ORDER

__all__ = [
    "Footer",
    "append_file",
    "link",
    "part_files",
    "read_footer",
    "remove",
    "remove_unfinished",
    "unit_part",
    "unit_part_file",
]

UNFINISHED = ".pvm-append-"
"""The name prefix of a file being written: hidden, so Spark's listing skips it (Spark skips
names starting with '.' or '_'), and ours, so that a restart can tell what a crash left."""

# How Spark itself lays out what it writes, where pyarrow's defaults differ: decimals of up
# to 18 digits as INT32 or INT64, not as fixed-length byte arrays. Every other type of the
# codec (``spark_rows.STORED_TYPES``) comes out of its Arrow type as Spark's does, except
# timestamps: INT64 microseconds (what Spark writes with ``outputTimestampType``
# TIMESTAMP_MICROS) where Spark's default is INT96; Spark reads both into the same values.
# Statistics are on (pyarrow's default): the compactor reads ``_order``'s min and max.
_PARQUET_OPTIONS = {"compression": "snappy", "store_decimal_as_integer": True, "coerce_timestamps": "us"}


_UNIT_PART = re.compile(r"part-o([0-9]+)-(.+)\.snappy\.parquet\Z")


def unit_part_file(order: int, part: str) -> str:
    """The name of the file that holds part ``part`` of unit ``order`` (``PartStore``):
    the same every time the part is written, so a part written again replaces itself. A
    commit's own files are ``part-<hex>``, which never start with ``part-o``.

    >>> unit_part_file(12, "t0.3of9"), unit_part(unit_part_file(12, "t0.3of9"))
    ('part-o12-t0.3of9.snappy.parquet', (12, 't0.3of9'))
    >>> unit_part("part-3f2a.snappy.parquet") is None
    True
    """
    return f"part-o{order}-{part}.snappy.parquet"


def unit_part(name: str) -> tuple[int, str] | None:
    """The order and part a file holds, if it is a unit's part (``unit_part_file``)."""
    match = _UNIT_PART.match(os.path.basename(name))
    return None if match is None else (int(match.group(1)), match.group(2))


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


def append_file(table: pa.Table, location: str, name: str | None = None) -> str:
    """Add ``table`` to the table version at ``location`` as one new Parquet file; returns
    its path. The file is written under a hidden name, flushed to disk, then renamed to a
    ``part-`` name no file had before (or to ``name``, replacing a file of that name at
    once): a reader lists the whole file or nothing of it, and a crash leaves at most a
    hidden file (``remove_unfinished``). The directory is flushed after the rename, so the
    file is there after a crash of the machine once this returns (the caller records the
    commit next). Its modes are the store's (``store_files``)."""
    directory = Path(location)
    name = name or f"part-{uuid.uuid4().hex}.snappy.parquet"
    unfinished = directory / f"{UNFINISHED}{name}"
    try:
        with open(store_files().create_file(unfinished), "wb") as out:
            pq.write_table(table, out, **_PARQUET_OPTIONS)
            out.flush()
            os.fsync(out.fileno())
        os.rename(unfinished, directory / name)
    except BaseException:
        unfinished.unlink(missing_ok=True)
        raise
    _sync(directory)
    return str(directory / name)


def _sync(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_unfinished(location: str) -> int:
    """Delete what writes that never finished left in a table version (a crash of the
    process between ``append_file``'s write and its rename); returns how many."""
    path = Path(location)
    if not path.is_dir():
        return 0
    unfinished = [p for p in path.iterdir() if p.name.startswith(UNFINISHED)]
    for file in unfinished:
        file.unlink(missing_ok=True)
    return len(unfinished)


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
