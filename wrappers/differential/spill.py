"""Spilling to disk: record files, spill lists, external sort and hash partitioning.

Every structure here holds at most a *capacity* of records in memory and writes the rest to
files in a temporary directory, so a differential over snapshots larger than its memory
budget runs slower instead of failing. The algorithms size their capacity from a
``MemoryBudget``: a number of records, a number of bytes, or both (the smaller wins). Bytes
are *nominal* bytes, the size the records have in a dump (see
``record_sizes.record_bytes``), not Python's object overhead, which is a few times larger.

A ``RecordFile`` is written once and then read any number of times; it stores chunks of
records with ``marshal`` (``pickle`` for chunks with values marshal cannot store). The file
is deleted when the object is garbage collected unless ``keep=True``. All reads and writes
are counted in an ``IOStats``, which is how the benchmark reports bytes read.

>>> budget = MemoryBudget(records=2)
>>> runs = IOStats()
>>> list(external_sort([(3,), (1,), (2,), (0,)], capacity=budget.capacity(10), stats=runs))
[(0,), (1,), (2,), (3,)]
>>> runs.files_created > 0
True
"""

from __future__ import annotations

import functools
import gc
import heapq
import marshal
import os
import pickle
import struct
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain, islice
from typing import Any, BinaryIO

from wrappers.differential.errors import SpillError

__all__ = [
    "DEFAULT_BUDGET",
    "IOStats",
    "MemoryBudget",
    "RecordFile",
    "SpillError",
    "SpillList",
    "external_sort",
    "partition_records",
    "paused_gc",
    "without_gc",
]

_END = object()
_HEADER = struct.Struct("<cIQ")  # tag (b"m" marshal, b"p" pickle), records, payload length
_MAX_FAN_IN = 64


@dataclass
class IOStats:
    """Bytes and files counted while a differential runs.

    >>> s = IOStats()
    >>> s.read(100); s.write(40)
    >>> (s.bytes_read, s.bytes_written)
    (100, 40)
    """

    bytes_read: int = 0
    bytes_written: int = 0
    files_created: int = 0
    records_spilled: int = 0

    def read(self, n: int) -> None:
        """Count ``n`` bytes read."""
        self.bytes_read += n

    def write(self, n: int) -> None:
        """Count ``n`` bytes written."""
        self.bytes_written += n

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict (for JSON).

        >>> IOStats(bytes_read=1).as_dict()["bytes_read"]
        1
        """
        return {
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "files_created": self.files_created,
            "records_spilled": self.records_spilled,
        }


@dataclass(frozen=True)
class MemoryBudget:
    """How much a differential may hold in memory: ``records``, nominal ``bytes``, or both.

    ``None`` for both means unbounded. ``capacity(record_bytes)`` turns the budget into a
    number of records of the given nominal size.

    >>> MemoryBudget(records=1000, bytes=10_000).capacity(100)
    100
    >>> MemoryBudget(records=None, bytes=None).capacity(100) is None
    True
    """

    records: int | None = None
    bytes: int | None = 64 * 2**20

    def __post_init__(self) -> None:
        for name in ("records", "bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"MemoryBudget.{name} must be a positive integer or None, got {value!r}")

    def capacity(self, record_bytes: float) -> int | None:
        """The number of records of ``record_bytes`` nominal bytes that fit; ``None`` if unbounded."""
        caps = []
        if self.records is not None:
            caps.append(self.records)
        if self.bytes is not None:
            caps.append(max(1, int(self.bytes // max(float(record_bytes), 1.0))))
        return min(caps) if caps else None


DEFAULT_BUDGET = MemoryBudget()


_gc_lock = threading.Lock()
_gc_depth = 0
_gc_was_enabled = False


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a differential runs (nestable, and
    safe across threads: the collector is restored when the last one leaves).

    The algorithms build tables of millions of acyclic tuples; the collector would
    traverse them over and over as they grow (about a third of the run time of the
    in-memory hash differential) and could never free any of them. Reference counting
    still frees everything as usual.

    >>> import gc
    >>> with paused_gc():
    ...     gc.isenabled()
    False
    """
    global _gc_depth, _gc_was_enabled
    with _gc_lock:
        if _gc_depth == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_depth += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_was_enabled:
                gc.enable()


def without_gc(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: run ``fn`` inside ``paused_gc()``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with paused_gc():
            return fn(*args, **kwargs)

    return wrapper


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class RecordFile:
    """A file of records: append them all, then iterate any number of times.

    >>> f = RecordFile(chunk_records=2)
    >>> f.extend([(1, "a"), (2, "b"), (3, "c")])
    >>> list(f), len(f)
    ([(1, 'a'), (2, 'b'), (3, 'c')], 3)
    >>> f.delete()
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        stats: IOStats | None = None,
        chunk_records: int = 4096,
        path: str | os.PathLike[str] | None = None,
        keep: bool = False,
    ) -> None:
        self.stats = stats if stats is not None else IOStats()
        self._chunk = max(1, int(chunk_records))
        self._buf: list[Any] = []
        self._count = 0
        self._writer: BinaryIO | None  # None once sealed
        if path is None:
            fd, name = tempfile.mkstemp(prefix="pvm-diff-", suffix=".rec", dir=directory)
            self._writer = os.fdopen(fd, "wb", buffering=1 << 20)
        else:
            name = os.fspath(path)
            self._writer = open(name, "wb", buffering=1 << 20)
        self.path = name
        self.nbytes = 0
        self.stats.files_created += 1
        self._finalizer = None if keep else weakref.finalize(self, _unlink, name)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, stats: IOStats | None = None) -> RecordFile:
        """Reopen a sealed record file written earlier (for example a kept state file).

        The record count is read from the chunk headers.
        """
        self = cls.__new__(cls)
        self.stats = stats if stats is not None else IOStats()
        self._chunk = 4096
        self._buf = []
        self._writer = None
        self.path = os.fspath(path)
        self._finalizer = None
        try:
            self.nbytes = os.path.getsize(self.path)
        except OSError as exc:
            raise SpillError(f"{self.path}: cannot open record file ({exc.strerror or exc})") from None
        self._count = self._count_records()
        return self

    def _count_records(self) -> int:
        """The record count from the chunk headers alone."""
        n = 0
        with open(self.path, "rb") as f:
            while True:
                header = f.read(_HEADER.size)
                if not header:
                    return n
                if len(header) < _HEADER.size:
                    raise SpillError(f"{self.path}: record file is truncated (partial chunk header)")
                _, count, length = _HEADER.unpack(header)
                n += count
                f.seek(length, os.SEEK_CUR)

    # -- writing ----------------------------------------------------------------------------
    def append(self, record: Any) -> None:
        """Append one record (only before the file is read)."""
        buf = self._buf
        buf.append(record)
        if len(buf) >= self._chunk:
            self._flush()

    def extend(self, records: Iterable[Any]) -> None:
        """Append many records."""
        it = iter(records)
        while True:
            room = self._chunk - len(self._buf)
            block = list(islice(it, room))
            if not block:
                return
            if self._buf:
                self._buf.extend(block)
            else:
                self._buf = block
            if len(self._buf) < self._chunk:
                return
            self._flush()

    def _flush(self) -> None:
        buf = self._buf
        if not buf:
            return
        if self._writer is None:
            raise SpillError(f"{self.path}: record file is sealed; cannot append")
        try:
            payload = marshal.dumps(buf)
            tag = b"m"
        except ValueError:
            payload = pickle.dumps(buf, protocol=pickle.HIGHEST_PROTOCOL)
            tag = b"p"
        header = _HEADER.pack(tag, len(buf), len(payload))
        self._writer.write(header)
        self._writer.write(payload)
        n = len(header) + len(payload)
        self.nbytes += n
        self.stats.write(n)
        self._count += len(buf)
        self._buf = []

    def seal(self) -> RecordFile:
        """Finish writing; further appends fail. Reading seals automatically."""
        if self._writer is not None:
            self._flush()
            self._writer.close()
            self._writer = None
        return self

    # -- reading ----------------------------------------------------------------------------
    def _chunks(self, stats: IOStats | None) -> Iterator[list[Any]]:
        self.seal()
        try:
            f = open(self.path, "rb", buffering=1 << 20)
        except OSError as exc:
            raise SpillError(f"{self.path}: cannot read record file ({exc.strerror or exc})") from None
        with f:
            size = _HEADER.size
            while True:
                header = f.read(size)
                if not header:
                    return
                if len(header) < size:
                    raise SpillError(f"{self.path}: record file is truncated (partial chunk header)")
                tag, _, length = _HEADER.unpack(header)
                payload = f.read(length)
                if len(payload) < length:
                    raise SpillError(f"{self.path}: record file is truncated (chunk of {length} bytes cut short)")
                if stats is not None:
                    stats.read(size + length)
                try:
                    if tag == b"m":
                        yield marshal.loads(payload)
                    elif tag == b"p":
                        yield pickle.loads(payload)
                    else:
                        raise ValueError(f"unknown chunk tag {tag!r}")
                except (ValueError, EOFError, TypeError, pickle.UnpicklingError) as exc:
                    raise SpillError(f"{self.path}: record file is corrupt ({exc})") from None

    def __iter__(self) -> Iterator[Any]:
        for chunk in self._chunks(self.stats):
            yield from chunk

    def read(self, stats: IOStats | None = None) -> Iterator[Any]:
        """Iterate the records, counting the bytes in ``stats`` (default: the file's own)."""
        for chunk in self._chunks(stats if stats is not None else self.stats):
            yield from chunk

    def read_chunks(self, stats: IOStats | None = None) -> Iterator[list[Any]]:
        """The records chunk by chunk (lists), counting bytes like ``read``."""
        return self._chunks(stats if stats is not None else self.stats)

    def __len__(self) -> int:
        return self._count + len(self._buf)

    def delete(self) -> None:
        """Remove the file now."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._finalizer is not None:
            self._finalizer()
        else:
            _unlink(self.path)


class SpillList:
    """An append-only list that moves to a ``RecordFile`` once it exceeds ``capacity``.

    >>> s = SpillList(capacity=2)
    >>> for i in range(5): s.append(i)
    >>> list(s), len(s), s.spilled
    ([0, 1, 2, 3, 4], 5, True)
    """

    def __init__(
        self,
        capacity: int | None = None,
        directory: str | os.PathLike[str] | None = None,
        stats: IOStats | None = None,
    ) -> None:
        self.capacity = capacity
        self.directory = directory
        self.stats = stats if stats is not None else IOStats()
        self._mem: list[Any] = []
        self._file: RecordFile | None = None

    @property
    def spilled(self) -> bool:
        """Whether the records are on disk."""
        return self._file is not None

    def append(self, item: Any) -> None:
        """Append one item."""
        if self._file is not None:
            self._file.append(item)
            return
        mem = self._mem
        mem.append(item)
        if self.capacity is not None and len(mem) > self.capacity:
            self._spill()

    def extend(self, items: Iterable[Any]) -> None:
        """Append many items."""
        if self._file is not None:
            self._file.extend(items)
            return
        for item in items:
            self.append(item)

    def _spill(self) -> None:
        self._file = RecordFile(self.directory, stats=self.stats)
        self.stats.records_spilled += len(self._mem)
        self._file.extend(self._mem)
        self._mem = []

    def __iter__(self) -> Iterator[Any]:
        if self._file is not None:
            return iter(self._file)
        return iter(self._mem)

    def __len__(self) -> int:
        return len(self._file) if self._file is not None else len(self._mem)


def _write_run(records: list[Any], directory: Any, stats: IOStats, chunk: int) -> RecordFile:
    run = RecordFile(directory, stats=stats, chunk_records=chunk)
    stats.records_spilled += len(records)
    run.extend(records)
    return run.seal()


def external_sort(
    records: Iterable[Any],
    *,
    capacity: int | None,
    key: Callable[[Any], Any] | None = None,
    directory: str | os.PathLike[str] | None = None,
    stats: IOStats | None = None,
    fan_in: int = _MAX_FAN_IN,
) -> Iterator[Any]:
    """Sort ``records`` holding at most about ``capacity`` of them in memory.

    Sorted runs of ``capacity`` records are written to temporary files and merged (in
    several passes if there are more than ``fan_in`` runs). With ``capacity=None`` or a
    small input, this is ``sorted``. ``TypeError`` from comparing records propagates.

    >>> list(external_sort([5, 3, 4, 1, 2], capacity=2))
    [1, 2, 3, 4, 5]
    """
    stats = stats if stats is not None else IOStats()
    it = iter(records)
    if capacity is None:
        return iter(sorted(it, key=key))
    capacity = max(2, capacity)
    first = list(islice(it, capacity))
    more = next(it, _END)
    if more is _END:
        first.sort(key=key)
        return iter(first)
    # Read buffers of all runs together must stay within the budget.
    chunk = max(16, min(4096, capacity // (2 * fan_in)))
    runs: list[RecordFile] = []
    block = first
    del first
    it = chain([more], it)
    while block:
        block.sort(key=key)
        runs.append(_write_run(block, directory, stats, chunk))
        del block  # let the sorted run go before reading the next one
        block = list(islice(it, capacity))
    while len(runs) > fan_in:
        merged = []
        for i in range(0, len(runs), fan_in):
            group = runs[i : i + fan_in]
            out = RecordFile(directory, stats=stats, chunk_records=chunk)
            out.extend(heapq.merge(*group, key=key))
            merged.append(out.seal())
            for run in group:
                run.delete()
        runs = merged
    return _merge_runs(runs, key)


def _merge_runs(runs: list[RecordFile], key: Callable[[Any], Any] | None) -> Iterator[Any]:
    try:
        yield from heapq.merge(*runs, key=key)
    finally:
        for run in runs:
            run.delete()


def partition_records(
    records: Iterable[Any],
    parts: int,
    part_of: Callable[[Any], int] | None = None,
    *,
    parts_of: Callable[[list[Any]], list[int]] | None = None,
    directory: str | os.PathLike[str] | None = None,
    stats: IOStats | None = None,
    chunk_records: int = 4096,
) -> list[RecordFile]:
    """Write ``records`` into ``parts`` sealed record files by ``part_of(record)`` (or
    ``parts_of(list_of_records)``, which gives the parts of a whole chunk at once).

    >>> files = partition_records(range(6), 2, lambda r: r % 2)
    >>> [list(f) for f in files]
    [[0, 2, 4], [1, 3, 5]]
    """
    if (part_of is None) == (parts_of is None):
        raise ValueError("give part_of or parts_of")
    stats = stats if stats is not None else IOStats()
    files = [RecordFile(directory, stats=stats, chunk_records=chunk_records) for _ in range(parts)]
    bufs: list[list[Any]] = [[] for _ in range(parts)]
    appends = [b.append for b in bufs]
    it = iter(records)
    n = 0
    while True:
        chunk = list(islice(it, 4096))
        if not chunk:
            break
        n += len(chunk)
        idx = parts_of(chunk) if parts_of is not None else [part_of(r) for r in chunk]  # type: ignore[misc]
        for r, i in zip(chunk, idx):
            appends[i](r)
        for f, b in zip(files, bufs):
            if b:
                f.extend(b)
                b.clear()
    stats.records_spilled += n
    return [f.seal() for f in files]
