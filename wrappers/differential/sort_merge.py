"""Sort-merge outer join as a snapshot differential (Labio & Garcia-Molina, Fig. 1, 3, 4).

The previous snapshot is kept *sorted by key* (``SortedState``) from the last differential,
so only the new snapshot is sorted: into runs of at most the memory budget (an external
sort through temporary files when it does not fit), which are merged while they are
matched against the kept file, and written out sorted as the state for next time.

Three variants, chosen by ``compression``:

* ``None`` (SM): full records everywhere; deletes and updates carry the old values.
* ``Compression(bits, pointer=False)`` (SMC1, ``<K,b>``): the kept file holds ``<K,b>``;
  the new snapshot is sorted as full records and compressed while merging.
* ``Compression(bits, pointer=True)`` (SMC2, ``<K,b,p>``): the new snapshot is compressed
  *before* sorting, with a pointer to each record in the dump; after matching, the new
  values of inserts and updates are fetched by pointer, in pointer order.

Keys must be mutually comparable. A key that repeats in either snapshot raises
``SnapshotError``.

>>> old = [((1,), ("a",)), ((3,), ("c",)), ((2,), ("b",))]
>>> new = [((3,), ("C",)), ((4,), ("d",)), ((1,), ("a",))]
>>> r = sort_merge_diff(old, new)
>>> for change in r.changes: print(change)
Change(kind='delete', key=(2,), old=('b',), new=None)
Change(kind='update', key=(3,), old=('c',), new=('C',))
Change(kind='insert', key=(4,), old=None, new=('d',))
>>> newer = [((4,), ("d",)), ((1,), ("a",))]
>>> sort_merge_diff(r.state, newer).changes.to_list()
[Change(kind='delete', key=(3,), old=('C',), new=None)]
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from wrappers.differential.compression import Compression, compress_entries
from wrappers.differential.errors import SnapshotError
from wrappers.differential.memory_snapshots import as_snapshot
from wrappers.differential.messages import DELETE, INSERT, UPDATE, Change, ChangeList, DiffResult, DiffStats
from wrappers.differential.record_schema import Record, Schema, check_compatible
from wrappers.differential.record_sizes import estimate_record_bytes, key_bytes, peek
from wrappers.differential.snapshot import Snapshot
from wrappers.differential.spill import (
    DEFAULT_BUDGET,
    IOStats,
    MemoryBudget,
    RecordFile,
    SpillList,
    external_sort,
    without_gc,
)

__all__ = ["SortedState", "sort_merge_diff", "sorted_state"]

_SAMPLE = 256
_first = itemgetter(0)


@dataclass
class SortedState:
    """A snapshot sorted by key, kept for the next differential: ``(key, rest)`` entries, or
    ``(key, b)`` / ``(key, b, p)`` when ``compression`` is set. Its file is deleted when the
    state is garbage collected."""

    schema: Schema | None
    compression: Compression | None
    file: RecordFile

    @property
    def count(self) -> int:
        """Number of records."""
        return len(self.file)

    @property
    def nbytes(self) -> int:
        """Size of the kept file."""
        return self.file.nbytes

    def entries(self, stats: IOStats | None = None) -> Iterator[tuple[Any, ...]]:
        """The kept entries in key order."""
        return self.file.read(stats)


def _check_state(state_comp: Compression | None, wanted: Compression | None, what: str) -> None:
    if state_comp is not None and wanted is None:
        raise SnapshotError(f"{what} holds {state_comp.format} checksums; it cannot be differenced without compression")
    if state_comp is not None and wanted is not None and not wanted.same_b(state_comp):
        raise SnapshotError(
            f"{what} holds {state_comp.describe()} checksums but {wanted.describe()} was requested; "
            "rebuild the state with the new setting"
        )


def _dup(key: Any, where: str) -> SnapshotError:
    return SnapshotError(f"duplicate key {key!r} in the {where}")


def _sorted_entries(
    snap: Snapshot, compression: Compression | None, budget: MemoryBudget, spill_dir: Any, stats: IOStats
) -> tuple[Iterator[tuple[Any, ...]], int | None]:
    """The snapshot's entries sorted by key: ``(k, rest)``, ``(k, b)`` or ``(k, b, p)``."""
    if compression is not None and compression.pointer:
        head, it = peek(snap.scan_with_pointers(stats), _SAMPLE)
        kb = sum(key_bytes(k) for k, _, _ in head) / len(head) if head else 8
        cap = budget.capacity(compression.entry_bytes(kb))
        entries: Iterable[tuple[Any, ...]] = compress_entries(it, compression)
    elif compression is not None:
        head, it = peek(snap.scan(stats), _SAMPLE)
        kb = sum(key_bytes(k) for k, _ in head) / len(head) if head else 8
        cap = budget.capacity(compression.entry_bytes(kb))
        entries = compress_entries(it, compression)
    else:
        head, it = peek(snap.scan(stats), _SAMPLE)
        cap = budget.capacity(estimate_record_bytes(head))
        entries = it
    try:
        return external_sort(entries, capacity=cap, key=_first, directory=spill_dir, stats=stats), cap
    except TypeError as exc:
        raise SnapshotError(f"{snap.name}: keys cannot be ordered ({exc})") from None


@without_gc
def sorted_state(
    snapshot: Snapshot | Iterable[Record],
    *,
    compression: Compression | None = None,
    budget: MemoryBudget | None = None,
    spill_dir: str | os.PathLike[str] | None = None,
    stats: IOStats | None = None,
) -> SortedState:
    """Sort a snapshot into the state a first differential would have left (``F sorted``).

    >>> s = sorted_state([((2,), ("b",)), ((1,), ("a",))])
    >>> list(s.entries()), s.count
    ([((1,), ('a',)), ((2,), ('b',))], 2)
    """
    stats = stats if stats is not None else IOStats()
    budget = budget or DEFAULT_BUDGET
    snap = as_snapshot(snapshot, "snapshot")
    entries, _ = _sorted_entries(snap, compression, budget, spill_dir, stats)
    out = RecordFile(spill_dir, stats=stats)
    last: Any = _SENTINEL
    put = out.append
    try:
        for e in entries:
            k = e[0]
            if k == last:
                raise _dup(k, snap.name)
            last = k
            put(e if compression is None or compression.pointer is False else (k, e[1]))
    except TypeError as exc:
        raise SnapshotError(f"{snap.name}: keys cannot be ordered ({exc})") from None
    state_comp = None if compression is None else compression.without_pointer()
    return SortedState(snap.schema, state_comp, out.seal())


_SENTINEL = object()


@without_gc
def sort_merge_diff(
    old: SortedState | Snapshot | Iterable[Record],
    new: Snapshot | Iterable[Record],
    *,
    compression: Compression | None = None,
    budget: MemoryBudget | None = None,
    spill_dir: str | os.PathLike[str] | None = None,
    stats: IOStats | None = None,
) -> DiffResult:
    """Difference ``old`` and ``new`` by sort-merge outer join; see the module docstring.

    ``old`` is the ``state`` of the previous result (the kept sorted snapshot) or, for a
    first differential, a snapshot in any order, which is sorted first. The result's
    ``state`` is the new snapshot sorted (compressed as requested), for the next call.
    """
    stats = stats if stats is not None else IOStats()
    files_before = stats.files_created
    budget = budget or DEFAULT_BUDGET
    new_snap = as_snapshot(new, "new snapshot")
    mode = 0 if compression is None else (2 if compression.pointer else 1)
    name = {0: "sort-merge", 1: "sort-merge <K,b>", 2: "sort-merge <K,b,p>"}[mode]

    if isinstance(old, SortedState):
        schema = check_compatible(old.schema, new_snap.schema, "the kept sorted snapshot", new_snap.name)
        _check_state(old.compression, compression, "the kept sorted snapshot")
        old_entries: Iterator[tuple[Any, ...]] = old.entries(stats)
        if compression is not None and old.compression is None:
            old_entries = compress_entries(old_entries, compression.without_pointer())
        old_name = "kept sorted snapshot"
    else:
        old_snap = as_snapshot(old, "old snapshot")
        schema = check_compatible(old_snap.schema, new_snap.schema, old_snap.name, new_snap.name)
        old_entries, _ = _sorted_entries(
            old_snap, None if compression is None else compression.without_pointer(), budget, spill_dir, stats
        )
        old_name = old_snap.name
    old_has_values = compression is None

    # SMC1 sorts full records and compresses them while merging; SMC2 sorts <K,b,p>.
    new_entries, cap = _sorted_entries(new_snap, compression if mode == 2 else None, budget, spill_dir, stats)
    comp = compression.compress if compression is not None else None

    dels = SpillList(cap, spill_dir, stats)
    others = SpillList(cap, spill_dir, stats)
    pending = SpillList(cap, spill_dir, stats)  # (pointer, kind, key) to fetch (mode 2)
    out = RecordFile(spill_dir, stats=stats)
    put = out.append
    add_del = dels.append
    add_other = others.append
    add_pending = pending.append

    n_old = n_new = 0
    last_old: Any = _SENTINEL
    last_new: Any = _SENTINEL
    o_it = iter(old_entries)
    try:
        o = next(o_it, None)
        for n in new_entries:
            nk = n[0]
            if nk == last_new:
                raise _dup(nk, new_snap.name)
            last_new = nk
            n_new += 1
            if mode == 0:
                nv = n[1]
                put(n)
            elif mode == 1:
                nv = comp(n[1])  # type: ignore[misc]
                put((nk, nv))
            else:
                nv = n[1]
                put((nk, nv))
            while o is not None and o[0] < nk:
                ok = o[0]
                if ok == last_old:
                    raise _dup(ok, old_name)
                last_old = ok
                n_old += 1
                add_del(Change(DELETE, ok, o[1] if old_has_values else None, None))
                o = next(o_it, None)
            if o is not None and o[0] == nk:
                if nk == last_old:
                    raise _dup(nk, old_name)
                last_old = nk
                n_old += 1
                if o[1] != nv:
                    if mode == 2:
                        add_pending((n[2], UPDATE, nk))
                    else:
                        add_other(Change(UPDATE, nk, o[1] if old_has_values else None, n[1]))
                o = next(o_it, None)
            elif mode == 2:
                add_pending((n[2], INSERT, nk))
            else:
                add_other(Change(INSERT, nk, None, n[1]))
        while o is not None:
            ok = o[0]
            if ok == last_old:
                raise _dup(ok, old_name)
            last_old = ok
            n_old += 1
            add_del(Change(DELETE, ok, o[1] if old_has_values else None, None))
            o = next(o_it, None)
    except TypeError as exc:
        raise SnapshotError(f"keys of the two snapshots cannot be compared ({exc})") from None

    fetched = 0
    if mode == 2 and len(pending):
        fetched = _fetch_pending(pending, new_snap, cap, spill_dir, stats, add_other)

    state_comp = None if compression is None else compression.without_pointer()
    state = SortedState(schema, state_comp, out.seal())
    spill_files = stats.files_created - files_before - 1  # all but the new sorted state
    st = DiffStats(
        name,
        old_records=n_old,
        new_records=n_new,
        io=stats,
        in_memory=spill_files == 0,
        runs=spill_files,
        fetched=fetched,
        details={"state_bytes": state.nbytes},
    )
    return DiffResult(ChangeList(dels, others), state, st)


def _fetch_pending(
    pending: Iterable[tuple[int, str, Any]],
    snap: Snapshot,
    cap: int | None,
    spill_dir: Any,
    stats: IOStats,
    emit: Any,
) -> int:
    """Fetch the full records of ``(pointer, kind, key)`` in pointer order; emit changes.

    Shared with the partitioned hash differential.
    """
    ordered = SpillList(cap, spill_dir, stats)
    ordered.extend(external_sort(pending, capacity=cap, key=_first, directory=spill_dir, stats=stats))
    fetched = 0
    pairs = zip(ordered, snap.fetch((p for p, _, _ in ordered), stats), strict=True)
    for (p, kind, key), (q, (k2, rest)) in pairs:
        if p != q or k2 != key:
            raise SnapshotError(f"{snap.name}: the record at pointer {p} changed during the differential")
        emit(Change(kind, key, None, rest))
        fetched += 1
    return fetched
