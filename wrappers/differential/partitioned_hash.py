"""Partitioned hash outer join as a snapshot differential (Labio & Garcia-Molina, section 3.1,
3.3 and appendices A and B).

The previous snapshot is kept *hash-partitioned by key* (``HashState``: bucket files) from the
last differential. Two ways to match, chosen by the memory budget:

* **In memory** (section 3.3, the case the paper's Fig. 8 shows winning for 256 MB files):
  when all of the previous snapshot's buckets fit in the budget, they are loaded into one
  hash table, the new snapshot is scanned once and probed against it, and its buckets are
  written for next time: ``|f1| + |F2| + |f2|`` IO, independent of the number of changes.
* **Partitioned** (appendix A/B): the new snapshot is split into buckets with the same hash
  function; each pair of buckets is matched in memory (a bucket still too large is
  partitioned again with an independent hash). Flags (here: a sentinel in the table) mark
  matched records; unmatched old records are deletes, unmatched new ones inserts.

Compression (``Compression``): with ``<K,b>`` the kept buckets hold only the key and a
checksum; with ``<K,b,p>`` the new snapshot is also compressed before partitioning, with a
pointer to the full record, fetched (in pointer order) for inserts and updates only.
The kept buckets hold ``<K,b>`` in both cases (a pointer into a dump that the next
differential no longer reads is of no use), so the in-memory case is the same for both
formats: the pointers matter only when the new snapshot has to be partitioned. With
compression, deletes and updates carry no old values.

Keys are bucketed by a CRC-32 of their ``repr`` (stable across processes, so kept buckets
can be reused by another process); at most 64 buckets at one level.

>>> old = [((1,), ("a",)), ((2,), ("b",)), ((3,), ("c",))]
>>> new = [((3,), ("C",)), ((1,), ("a",)), ((4,), ("d",))]
>>> r = partitioned_hash_diff(old, new)
>>> sorted((c.kind, c.key) for c in r.changes)
[('delete', (2,)), ('insert', (4,)), ('update', (3,))]
>>> r2 = partitioned_hash_diff(r.state, [((4,), ("d",))], compression=Compression(bits=64))
>>> sorted((c.kind, c.key) for c in r2.changes)
[('delete', (1,)), ('delete', (3,))]
"""

from __future__ import annotations

import hashlib
import math
import os
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from typing import Any

from wrappers.differential.compression import Compression, compress_entries
from wrappers.differential.errors import SnapshotError
from wrappers.differential.memory_snapshots import as_snapshot
from wrappers.differential.messages import DELETE, INSERT, UPDATE, Change, ChangeList, DiffResult, DiffStats
from wrappers.differential.record_schema import Record, Schema, check_compatible
from wrappers.differential.record_sizes import estimate_record_bytes, key_bytes, peek
from wrappers.differential.snapshot import Snapshot
from wrappers.differential.sort_merge import _fetch_pending
from wrappers.differential.spill import (
    DEFAULT_BUDGET,
    IOStats,
    MemoryBudget,
    RecordFile,
    SpillList,
    partition_records,
    without_gc,
)

__all__ = ["HashState", "diff_in_memory", "hash_state", "partition_of", "partitioned_hash_diff"]

_SAMPLE = 256
_MAX_LEVEL = 4
_MAX_FANOUT = 64
_FILL = 0.8  # aim buckets at 80% of the budget: hashing is not perfectly even
_MATCHED = object()
_MISSING = object()


def partition_of(key: tuple[Any, ...], parts: int, level: int = 0) -> int:
    """The bucket of ``key`` among ``parts``: stable across processes (CRC-32 of ``repr``
    at level 0; a salted BLAKE2b at deeper levels, independent of the level above).

    >>> partition_of(("a",), 1), 0 <= partition_of(("a",), 8) < 8
    (0, True)
    >>> partition_of((1,), 4) == partition_of((1,), 4)
    True
    """
    if parts <= 1:
        return 0
    data = repr(key).encode("utf-8", "surrogatepass")
    if level == 0:
        return zlib.crc32(data) % parts
    person = f"pvm-lvl{level}".encode()[:16]
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, person=person).digest(), "big") % parts


def _part_fn(parts: int, level: int) -> Callable[[list[tuple[Any, ...]]], list[int]]:
    """The buckets of a chunk of entries (``partition_of`` of their keys)."""
    if level == 0:
        crc = zlib.crc32
        return lambda chunk: [crc(repr(e[0]).encode("utf-8", "surrogatepass")) % parts for e in chunk]
    return lambda chunk: [partition_of(e[0], parts, level) for e in chunk]


@dataclass
class HashState:
    """A snapshot hash-partitioned by key, kept for the next differential.

    ``parts[i]`` holds the ``(key, rest)`` entries (``(key, b)`` when ``compression`` is set)
    whose key is in bucket ``i`` of ``len(parts)`` (``partition_of``). ``record_bytes`` and
    ``key_nbytes`` are the snapshot's average nominal sizes, used to size memory next time.
    """

    schema: Schema | None
    compression: Compression | None
    parts: list[RecordFile]
    record_bytes: float
    key_nbytes: float

    @property
    def count(self) -> int:
        """Number of records."""
        return sum(len(p) for p in self.parts)

    @property
    def partitions(self) -> int:
        """Number of buckets."""
        return len(self.parts)

    @property
    def nbytes(self) -> int:
        """Size of the bucket files."""
        return sum(p.nbytes for p in self.parts)

    def entry_bytes(self) -> float:
        """Nominal size of one kept entry."""
        return self.compression.entry_bytes(self.key_nbytes) if self.compression else self.record_bytes


def _sizes(sample: list[Any]) -> tuple[float, float]:
    if not sample:
        return 100.0, 8.0
    recs = [(e[0], e[1]) for e in sample]
    return estimate_record_bytes(recs), sum(key_bytes(k) for k, _ in recs) / len(recs)


def _entry_bytes(compression: Compression | None, rb: float, kb: float) -> float:
    """Nominal size of one entry of the old side's table: ``<K,b>`` even when the new
    snapshot is compressed to ``<K,b,p>`` (pointers into the old dump are of no use)."""
    return compression.without_pointer().entry_bytes(kb) if compression else rb


def _parts_for(n: float, cap: int | None) -> int:
    """Buckets for ``n`` entries so that each fits ``cap``; at most ``_MAX_FANOUT`` at one
    level (a bucket still too large is split again at the next level)."""
    if cap is None or n <= cap:
        return 1
    return min(_MAX_FANOUT, max(2, math.ceil(n / (cap * _FILL))))


def _chunk_for(parts: int, cap: int | None) -> int:
    """Records each open bucket file buffers: all of them together stay within ``cap``."""
    return 4096 if cap is None else max(16, min(4096, cap // max(1, parts)))


def _find_dup(entries: Iterable[tuple[Any, ...]], where: str) -> SnapshotError:
    seen = set()
    for e in entries:
        if e[0] in seen:
            return SnapshotError(f"duplicate key {e[0]!r} in the {where}")
        seen.add(e[0])
    return SnapshotError(f"duplicate key in the {where}")


def _load(entries: list[tuple[Any, ...]] | RecordFile, stats: IOStats | None, where: str) -> dict[Any, Any]:
    if isinstance(entries, RecordFile):
        table: dict[Any, Any] = {}
        n = 0
        for chunk in entries.read_chunks(stats):
            table.update(chunk)
            n += len(chunk)
        if len(table) != n:
            raise _find_dup(entries.read(None), where)
        return table
    table = dict(entries)
    if len(table) != len(entries):
        raise _find_dup(entries, where)
    return table


@without_gc
def hash_state(
    snapshot: Snapshot | Iterable[Record],
    *,
    compression: Compression | None = None,
    budget: MemoryBudget | None = None,
    spill_dir: str | os.PathLike[str] | None = None,
    stats: IOStats | None = None,
) -> HashState:
    """Partition a snapshot into the state a first differential would have left: one
    bucket if it fits the budget, else enough buckets that each does.

    >>> s = hash_state([((1,), ("a",)), ((2,), ("b",))], compression=Compression(bits=16))
    >>> s.count, s.partitions, s.compression.format
    (2, 1, '<K,b>')
    """
    stats = stats if stats is not None else IOStats()
    budget = budget or DEFAULT_BUDGET
    snap = as_snapshot(snapshot, "snapshot")
    head, it = peek(snap.scan(stats), _SAMPLE)
    rb, kb = _sizes(head)
    cap = budget.capacity(_entry_bytes(compression, rb, kb))
    if compression is not None:
        it = compress_entries(it, compression)
    state_comp = None if compression is None else compression.without_pointer()
    mem = list(islice(it, cap + 1)) if cap is not None else list(it)
    if cap is None or len(mem) <= cap:
        _load(mem, None, snap.name)  # duplicate check
        f = RecordFile(spill_dir, stats=stats)
        f.extend(mem)
        return HashState(snap.schema, state_comp, [f.seal()], rb, kb)
    est = (snap.nbytes / rb) if snap.nbytes else 2.0 * len(mem)
    parts = _parts_for(max(est, len(mem)), cap)
    files = partition_records(
        chain(mem, it),
        parts,
        parts_of=_part_fn(parts, 0),
        directory=spill_dir,
        stats=stats,
        chunk_records=_chunk_for(parts, cap),
    )
    return HashState(snap.schema, state_comp, files, rb, kb)


_CHUNK = 4096


class _Matcher:
    """Probes new entries against an in-memory table of old entries and emits changes.

    ``mode`` 0: both sides ``(k, rest)``; 1: new ``(k, rest)`` compressed here against old
    ``b``; 2: new ``(k, b, p)`` against old ``b`` (inserts and updates fetched later).
    """

    def __init__(
        self,
        mode: int,
        compression: Compression | None,
        old_values: bool,
        dels: Any,
        others: Any,
        pending: Any,
        where: str,
    ) -> None:
        self.mode = mode
        self.many = compression.compress_many if compression is not None else None
        self.old_values = old_values
        self.dels = dels
        self.others = others
        self.pending = pending
        self.where = where
        self.n_old = 0
        self.n_new = 0

    def probe(self, table: dict[Any, Any], new_entries: Iterable[tuple[Any, ...]]) -> Iterator[list[tuple[Any, Any]]]:
        """Probe ``new_entries`` against ``table``, emitting inserts and updates, and yield
        the new ``(key, v)`` entries for the next state chunk by chunk; then emit the
        deletes. Must be consumed to the end."""
        mode, many = self.mode, self.many
        add_other = self.others.append
        add_pending = self.pending.append
        get = table.get
        matched = _MATCHED
        missing = _MISSING
        old_values = self.old_values
        where = self.where
        self.n_old += len(table)
        it = iter(new_entries)
        while True:
            chunk = list(islice(it, _CHUNK))
            if not chunk:
                break
            self.n_new += len(chunk)
            if mode == 1:
                keys, rests = zip(*chunk)
                bs = many(rests)  # type: ignore[misc]
                out = list(zip(keys, bs))
                for k, v, rest in zip(keys, bs, rests):
                    ov = get(k, missing)
                    if ov is missing:
                        table[k] = matched
                        add_other(Change(INSERT, k, None, rest))
                    elif ov is matched:
                        raise SnapshotError(f"duplicate key {k!r} in the {where}")
                    else:
                        table[k] = matched
                        if ov != v:
                            add_other(Change(UPDATE, k, None, rest))
            elif mode == 0:
                out = chunk
                for k, v in chunk:
                    ov = get(k, missing)
                    if ov is missing:
                        table[k] = matched
                        add_other(Change(INSERT, k, None, v))
                    elif ov is matched:
                        raise SnapshotError(f"duplicate key {k!r} in the {where}")
                    else:
                        table[k] = matched
                        if ov != v:
                            add_other(Change(UPDATE, k, ov if old_values else None, v))
            else:
                out = [(e[0], e[1]) for e in chunk]
                for k, v, p in chunk:
                    ov = get(k, missing)
                    if ov is missing:
                        table[k] = matched
                        add_pending((p, INSERT, k))
                    elif ov is matched:
                        raise SnapshotError(f"duplicate key {k!r} in the {where}")
                    else:
                        table[k] = matched
                        if ov != v:
                            add_pending((p, UPDATE, k))
            yield out
        add_del = self.dels.append
        for k, v in table.items():
            if v is not matched:
                add_del(Change(DELETE, k, v if old_values else None, None))

    def match(self, table: dict[Any, Any], new_entries: Iterable[tuple[Any, ...]]) -> None:
        """``probe`` without keeping the new entries."""
        deque(self.probe(table, new_entries), maxlen=0)

    def match_into(self, table: dict[Any, Any], new_entries: Iterable[tuple[Any, ...]], state: RecordFile) -> None:
        """``probe``, appending the new entries to ``state``."""
        for out in self.probe(table, new_entries):
            state.extend(out)


@without_gc
def partitioned_hash_diff(
    old: HashState | Snapshot | Iterable[Record],
    new: Snapshot | Iterable[Record],
    *,
    compression: Compression | None = None,
    budget: MemoryBudget | None = None,
    spill_dir: str | os.PathLike[str] | None = None,
    stats: IOStats | None = None,
) -> DiffResult:
    """Difference ``old`` and ``new`` by partitioned hash outer join; see the module docstring.

    ``old`` is the ``state`` of the previous result (the kept buckets) or, for a first
    differential, a snapshot. The result's ``state`` holds the new snapshot's buckets.
    """
    stats = stats if stats is not None else IOStats()
    files_before = stats.files_created
    budget = budget or DEFAULT_BUDGET
    new_snap = as_snapshot(new, "new snapshot")
    state_comp = None if compression is None else compression.without_pointer()
    comp = compression.compress if compression is not None else None
    old_values = compression is None
    label = "partitioned hash" + ("" if compression is None else f" {compression.format}")

    # -- the old side: a table in memory, or bucket files -------------------------------
    table: dict[Any, Any] | None = None
    old_parts: list[RecordFile] = []
    temp_old = False
    if isinstance(old, HashState):
        schema = check_compatible(old.schema, new_snap.schema, "the kept buckets", new_snap.name)
        if old.compression is not None and compression is None:
            raise SnapshotError(
                f"the kept buckets hold {old.compression.format} checksums; they cannot be differenced without compression"
            )
        if old.compression is not None and compression is not None and not compression.same_b(old.compression):
            raise SnapshotError(
                f"the kept buckets hold {old.compression.describe()} checksums but {compression.describe()} was requested"
            )
        rb, kb = old.record_bytes, old.key_nbytes
        cap = budget.capacity(_entry_bytes(compression, rb, kb))
        recompress = compression is not None and old.compression is None
        where = "kept buckets"
        if cap is None or old.count <= cap:
            table = {}
            for part in old.parts:
                part_table = _load(part, stats, where)
                if recompress:
                    part_table = {k: comp(v) for k, v in part_table.items()}  # type: ignore[misc]
                table.update(part_table)
        else:
            wanted = _parts_for(old.count, cap)
            if recompress or wanted > old.partitions:
                # Re-bucket (and/or compress) the kept buckets so that each fits.
                n = max(wanted, old.partitions)
                kept: Iterable[tuple[Any, ...]] = chain.from_iterable(p.read(stats) for p in old.parts)
                if recompress:
                    kept = compress_entries(kept, compression)  # type: ignore[arg-type]
                old_parts = partition_records(
                    kept, n, parts_of=_part_fn(n, 0), directory=spill_dir, stats=stats, chunk_records=_chunk_for(n, cap)
                )
                temp_old = True
            else:
                old_parts = list(old.parts)
    else:
        old_snap = as_snapshot(old, "old snapshot")
        schema = check_compatible(old_snap.schema, new_snap.schema, old_snap.name, new_snap.name)
        where = old_snap.name
        head, it = peek(old_snap.scan(stats), _SAMPLE)
        rb, kb = _sizes(head)
        cap = budget.capacity(_entry_bytes(compression, rb, kb))
        entries: Iterator[tuple[Any, ...]] = compress_entries(it, compression) if compression is not None else it
        mem = list(islice(entries, cap + 1)) if cap is not None else list(entries)
        if cap is None or len(mem) <= cap:
            table = _load(mem, None, where)
        else:
            est = (old_snap.nbytes / rb) if old_snap.nbytes else 2.0 * len(mem)
            parts = _parts_for(max(est, len(mem)), cap)
            old_parts = partition_records(
                chain(mem, entries),
                parts,
                parts_of=_part_fn(parts, 0),
                directory=spill_dir,
                stats=stats,
                chunk_records=_chunk_for(parts, cap),
            )
            temp_old = True
        del mem

    dels = SpillList(cap, spill_dir, stats)
    others = SpillList(cap, spill_dir, stats)
    pending = SpillList(cap, spill_dir, stats)

    if table is not None:
        # -- all of the old buckets fit: one scan of the new snapshot ---------------------
        matcher = _Matcher(0 if comp is None else 1, compression, old_values, dels, others, pending, new_snap.name)
        head, new_it = peek(new_snap.scan(stats), _SAMPLE)
        nrb, nkb = _sizes(head) if head else (rb, kb)
        n_parts = _parts_for(len(table), cap)
        if n_parts == 1:
            state_file = RecordFile(spill_dir, stats=stats)
            matcher.match_into(table, new_it, state_file)
            state_files = [state_file]
        else:
            entries = chain.from_iterable(matcher.probe(table, new_it))
            state_files = partition_records(
                entries,
                n_parts,
                parts_of=_part_fn(n_parts, 0),
                directory=spill_dir,
                stats=stats,
                chunk_records=_chunk_for(n_parts, cap),
            )
        del table
        new_parts = [f.seal() for f in state_files]
        in_memory = True
    else:
        # -- partition the new snapshot like the old one, match bucket by bucket ---------
        n_parts = len(old_parts)
        if compression is not None and compression.pointer:
            head, new_it = peek(new_snap.scan_with_pointers(stats), _SAMPLE)
            nrb, nkb = _sizes(head) if head else (rb, kb)
            new_entries: Iterator[tuple[Any, ...]] = compress_entries(new_it, compression)
            mode = 2
        else:
            head, new_it = peek(new_snap.scan(stats), _SAMPLE)
            nrb, nkb = _sizes(head) if head else (rb, kb)
            new_entries = new_it
            mode = 0 if comp is None else 1
        buckets = partition_records(
            new_entries,
            n_parts,
            parts_of=_part_fn(n_parts, 0),
            directory=spill_dir,
            stats=stats,
            chunk_records=_chunk_for(n_parts, cap),
        )
        matcher = _Matcher(mode, compression, old_values, dels, others, pending, new_snap.name)
        new_parts = []
        for i in range(n_parts):
            if mode == 0:
                state_part = buckets[i]  # the new buckets are the next state as they are
            else:
                state_part = RecordFile(spill_dir, stats=stats)
            keep = None if mode == 0 else state_part
            _match_bucket(matcher, old_parts[i], buckets[i], 0, cap, keep, spill_dir, stats, where)
            new_parts.append(state_part.seal())
            if mode != 0:
                buckets[i].delete()
            if temp_old:
                old_parts[i].delete()
        in_memory = False

    fetched = 0
    if len(pending):
        fetched = _fetch_pending(pending, new_snap, cap, spill_dir, stats, others.append)

    state = HashState(schema, state_comp, new_parts, nrb, nkb)
    spill_files = stats.files_created - files_before - len(new_parts)
    st = DiffStats(
        label,
        old_records=matcher.n_old,
        new_records=matcher.n_new,
        io=stats,
        in_memory=in_memory,
        partitions=n_parts,
        runs=spill_files,
        fetched=fetched,
        details={"state_bytes": state.nbytes},
    )
    return DiffResult(ChangeList(dels, others), state, st)


def _match_bucket(
    matcher: _Matcher,
    old_part: RecordFile,
    new_part: RecordFile,
    level: int,
    cap: int | None,
    state: RecordFile | None,
    spill_dir: Any,
    stats: IOStats,
    where: str,
) -> None:
    """Match one pair of buckets, appending new entries to ``state`` if given; a bucket over
    the budget is split again with the next level's hash."""
    n_old = len(old_part)
    if cap is not None and n_old > cap and level < _MAX_LEVEL:
        parts = _parts_for(n_old, cap)
        fn = _part_fn(parts, level + 1)
        chunk = _chunk_for(parts, cap)
        olds = partition_records(
            old_part.read(stats), parts, parts_of=fn, directory=spill_dir, stats=stats, chunk_records=chunk
        )
        news = partition_records(
            new_part.read(stats), parts, parts_of=fn, directory=spill_dir, stats=stats, chunk_records=chunk
        )
        for o, n in zip(olds, news, strict=True):
            _match_bucket(matcher, o, n, level + 1, cap, state, spill_dir, stats, where)
            o.delete()
            n.delete()
        return
    table = _load(old_part, stats, where)
    if state is None:
        matcher.match(table, new_part.read(stats))
    else:
        matcher.match_into(table, new_part.read(stats), state)


def diff_in_memory(old: Iterable[Record], new: Iterable[Record], where: str = "snapshot") -> ChangeList:
    """The exact differential of two small record sets, in memory (deletes first).

    Used for the ranges of the range-checksum differencing; raises ``SnapshotError`` on a
    duplicate key.

    >>> diff_in_memory([((1,), ("a",))], [((1,), ("b",)), ((2,), ("c",))]).to_list()
    [Change(kind='update', key=(1,), old=('a',), new=('b',)), Change(kind='insert', key=(2,), old=None, new=('c',))]
    """
    old_list = list(old)
    table = _load(old_list, None, f"old {where}")
    dels: list[Change] = []
    others: list[Change] = []
    matcher = _Matcher(0, None, True, dels, others, [], f"new {where}")
    matcher.match(table, new)
    return ChangeList(dels, others)
