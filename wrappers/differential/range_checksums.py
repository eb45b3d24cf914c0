"""Range checksums: Carnes's remote-site incremental differencing (ID/RCS, chapter 4).

For a large table that can be queried by key ranges but not modified (no triggers, no
timestamp column, no room for a second copy at the source), a *remote copy* of the table
is kept elsewhere together with an *auxiliary table*: the key ranges, each with one
checksum over its rows. A refresh walks the ranges:

* round 1/2: the source computes the checksum of a range from a range query and compares
  it with the remote's; equal checksums mean nothing is shipped;
* round 3: for a range whose checksum differs, its rows are shipped to the remote site and
  differenced with the copy of that range, which is then replaced.

So only changed ranges cross the network and are differenced, and the source is queried
range by range (short transactions, no table-wide locks). Ranges are half-open key
intervals ``[lo, hi)``; the first is unbounded below and the last above, so new keys at
either end are always covered (Carnes's open-ended final range). The initialization step
(``plan_ranges``, or ``RangePlanner`` as the rows stream by) cuts the key-ordered table
every ``rows_per_range`` rows; a range that grew past twice that is cut the same way
(``split_range``), and ``replan`` re-runs it over the copy when the distribution has
drifted. Range-checksum capture (``wrappers.capture.ranges``) plans and splits its ranges
with the same functions.

The interface is two callables, so it works over SQL later: ``fetch_rows(range)`` returns
the rows of a key range (a ``SELECT ... WHERE key >= lo AND key < hi``, see
``KeyRange.sql_predicate``), and ``source_sum(range)`` the range's checksum computed at the
source (``source_checksums(fetch_rows)`` builds one by reading the range locally).

A range checksum is the row count and the sum modulo ``2**64`` of a 64-bit BLAKE2b hash of
each row (key and rest). It does not depend on the order the query returns rows in; a
changed range goes unnoticed with probability about ``2**-64``.

>>> table = {(i,): (f"v{i}",) for i in range(10)}
>>> local = lambda r: [(k, v) for k, v in table.items() if k in r]
>>> calls = []
>>> ship = lambda r: calls.append(r) or local(r)
>>> copy = RangeChecksumCopy(sorted(table.items()), rows_per_range=3)
>>> table[(4,)] = ("changed",); table[(11,)] = ("new",)
>>> result = copy.refresh(source_checksums(local), ship)
>>> [(c.kind, c.key) for c in result.changes], len(calls), len(copy.ranges)
([('update', (4,)), ('insert', (11,))], 2, 4)
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from wrappers.differential.compression import canonical
from wrappers.differential.errors import SnapshotError
from wrappers.differential.messages import Change, ChangeList
from wrappers.differential.partitioned_hash import diff_in_memory
from wrappers.differential.record_schema import Key, Record

__all__ = [
    "KeyRange",
    "RangeChecksumCopy",
    "RangePlanner",
    "RangeSum",
    "RefreshResult",
    "plan_ranges",
    "range_sum",
    "ranges_between",
    "row_hash",
    "source_checksums",
    "split_range",
]

_MOD = 1 << 64


@dataclass(frozen=True)
class KeyRange:
    """Keys ``k`` with ``lo <= k < hi``; ``None`` is unbounded.

    >>> r = KeyRange((3,), (7,))
    >>> (3,) in r, (7,) in r, (1,) in KeyRange(None, (2,))
    (True, False, True)
    """

    lo: Key | None
    hi: Key | None

    def __contains__(self, key: object) -> bool:
        return (self.lo is None or key >= self.lo) and (self.hi is None or key < self.hi)  # type: ignore[operator]

    def sql_predicate(self, columns: Sequence[str]) -> tuple[str, dict[str, Any]]:
        """A SQL ``WHERE`` predicate (row-value comparison) and bind parameters.

        >>> KeyRange((3,), (7,)).sql_predicate(["id"])
        ('(id) >= (:lo0) AND (id) < (:hi0)', {'lo0': 3, 'hi0': 7})
        >>> KeyRange(None, None).sql_predicate(["id"])
        ('1 = 1', {})
        """
        cols = ", ".join(columns)
        parts: list[str] = []
        params: dict[str, Any] = {}
        for name, bound, op in (("lo", self.lo, ">="), ("hi", self.hi, "<")):
            if bound is None:
                continue
            if len(bound) != len(columns):
                raise ValueError(f"range bound {bound!r} does not match key columns {list(columns)}")
            names = [f"{name}{i}" for i in range(len(bound))]
            params.update(zip(names, bound, strict=True))
            parts.append(f"({cols}) {op} ({', '.join(':' + n for n in names)})")
        return (" AND ".join(parts) or "1 = 1"), params


@dataclass(frozen=True)
class RangeSum:
    """A range's checksum: row count and the sum of row hashes modulo ``2**64``."""

    count: int = 0
    checksum: int = 0


def row_hash(key: Key, rest: tuple[Any, ...]) -> int:
    """64-bit hash of one row (key and rest), stable across processes.

    >>> row_hash((1,), ("a",)) == row_hash((1,), ("a",)) != row_hash((1,), ("b",))
    True
    """
    return int.from_bytes(hashlib.blake2b(canonical(key + rest), digest_size=8).digest(), "big")


def range_sum(records: Iterable[Record]) -> RangeSum:
    """The checksum of a set of rows, independent of their order.

    >>> range_sum([((1,), ("a",)), ((2,), ("b",))]) == range_sum([((2,), ("b",)), ((1,), ("a",))])
    True
    """
    n = 0
    total = 0
    blake = hashlib.blake2b
    for key, rest in records:
        total += int.from_bytes(blake(canonical(key + rest), digest_size=8).digest(), "big")
        n += 1
    return RangeSum(n, total % _MOD)


def source_checksums(fetch_rows: Callable[[KeyRange], Iterable[Record]]) -> Callable[[KeyRange], RangeSum]:
    """A ``source_sum`` for ``refresh`` that reads each range at the source and ships only
    its checksum (Carnes's round 2)."""

    def source_sum(r: KeyRange) -> RangeSum:
        return range_sum(fetch_rows(r))

    return source_sum


def ranges_between(bounds: Sequence[Key], lo: Key | None = None, hi: Key | None = None) -> list[KeyRange]:
    """The ranges from ``lo`` to ``hi`` cut at the ascending ``bounds``: ``[lo, b1), [b1,
    b2), …, [bn, hi)`` (a plan is its bounds, which is what range-checksum capture stores).

    >>> ranges_between([(3,)])
    [KeyRange(lo=None, hi=(3,)), KeyRange(lo=(3,), hi=None)]
    """
    los: list[Key | None] = [lo, *bounds]
    his: list[Key | None] = [*bounds, hi]
    return [KeyRange(a, b) for a, b in zip(los, his, strict=True)]


class RangePlanner:
    """The initialization step fed one key at a time, in key order, so that it can run while
    the rows stream elsewhere (into a replica): every ``rows_per_range``-th key starts a range."""

    def __init__(self, rows_per_range: int) -> None:
        if not isinstance(rows_per_range, int) or rows_per_range < 1:
            raise ValueError(f"rows_per_range must be a positive integer, got {rows_per_range!r}")
        self.rows_per_range = rows_per_range
        self.bounds: list[Key] = []
        self._seen = 0
        self._prev: Any = None

    def add(self, key: Key) -> None:
        """The next key; SnapshotError if it is not above the previous one."""
        if self._prev is not None and not self._prev < key:
            raise SnapshotError(
                f"keys are not strictly increasing at {key!r} (after {self._prev!r}): unsorted or duplicate"
            )
        if self._seen and self._seen % self.rows_per_range == 0:
            self.bounds.append(key)
        self._prev = key
        self._seen += 1

    def ranges(self) -> list[KeyRange]:
        return ranges_between(self.bounds)


def plan_ranges(sorted_keys: Iterable[Key], rows_per_range: int) -> list[KeyRange]:
    """Cut key-ordered keys into ranges of ``rows_per_range`` rows (the initialization step).

    >>> plan_ranges([(1,), (2,), (3,), (4,), (5,)], 2)
    [KeyRange(lo=None, hi=(3,)), KeyRange(lo=(3,), hi=(5,)), KeyRange(lo=(5,), hi=None)]
    """
    planner = RangePlanner(rows_per_range)
    for key in sorted_keys:
        planner.add(key)
    return planner.ranges()


def split_range(r: KeyRange, rows: Sequence[Record], rows_per_range: int) -> list[KeyRange]:
    """``r`` as it is, or, once its ``rows`` (in key order) are more than twice
    ``rows_per_range``, ``r`` cut every ``rows_per_range`` rows (the last piece takes the rest).

    >>> split_range(KeyRange((0,), None), [((k,), ()) for k in range(5)], 2)
    [KeyRange(lo=(0,), hi=(2,)), KeyRange(lo=(2,), hi=(4,)), KeyRange(lo=(4,), hi=None)]
    """
    n = rows_per_range
    if len(rows) <= 2 * n:
        return [r]
    return ranges_between([rows[j][0] for j in range(n, len(rows), n)], r.lo, r.hi)


def _lower_bounds(ranges: Sequence[KeyRange]) -> list[Key]:
    """The lower bounds of all ranges but the first, for bisecting a key to its range."""
    bounds: list[Key] = []
    for r in ranges[1:]:
        assert r.lo is not None  # only the first range is unbounded below
        bounds.append(r.lo)
    return bounds


@dataclass
class RefreshResult:
    """What a refresh did: the changes (deletes first), which ranges changed, how many rows
    were shipped, and how many ranges were probed."""

    changes: ChangeList
    changed: list[KeyRange]
    rows_shipped: int
    ranges_probed: int


class RangeChecksumCopy:
    """The remote site of ID/RCS: a copy of the table by key range, one checksum per range.

    ``records`` is the initial full copy (any order). ``refresh`` brings the copy up to
    date with the source and returns the changes.
    """

    def __init__(self, records: Iterable[Record], *, rows_per_range: int = 1000) -> None:
        self.rows_per_range = rows_per_range
        rows = sorted(records, key=lambda r: r[0])
        self._install(rows)

    def _install(self, rows: list[Record]) -> None:
        self.ranges = plan_ranges((k for k, _ in rows), self.rows_per_range)
        self._bounds = _lower_bounds(self.ranges)
        self._rows: list[list[Record]] = [[] for _ in self.ranges]
        for rec in rows:
            self._rows[bisect_right(self._bounds, rec[0])].append(rec)
        self.sums = [range_sum(part) for part in self._rows]

    def __len__(self) -> int:
        return sum(len(p) for p in self._rows)

    def rows(self, i: int) -> list[Record]:
        """The copy's rows of range ``i``, in key order."""
        return list(self._rows[i])

    def records(self) -> Iterator[Record]:
        """The whole copy in key order."""
        for part in self._rows:
            yield from part

    def refresh(
        self,
        source_sum: Callable[[KeyRange], RangeSum],
        fetch_rows: Callable[[KeyRange], Iterable[Record]],
    ) -> RefreshResult:
        """Probe every range's checksum at the source; ship and difference only the ranges
        whose checksum changed; update the copy and its checksums.

        Rows shipped for a range must lie in it and have distinct keys (``SnapshotError``
        otherwise). A range that grew past twice ``rows_per_range`` is split afterwards.
        """
        changes: list[Change] = []
        changed: list[KeyRange] = []
        shipped = 0
        for i, r in enumerate(self.ranges):
            if source_sum(r) == self.sums[i]:
                continue
            rows = []
            for rec in fetch_rows(r):
                key = rec[0]
                if key not in r:
                    raise SnapshotError(f"the source returned key {key!r} outside the requested range {r}")
                rows.append((tuple(key), tuple(rec[1])))
            shipped += len(rows)
            changes.extend(diff_in_memory(self._rows[i], rows, where=f"range {r}"))
            rows.sort(key=lambda x: x[0])
            self._rows[i] = rows
            self.sums[i] = range_sum(rows)
            changed.append(r)
        if any(len(p) > 2 * self.rows_per_range for p in self._rows):
            self._split_large()
        return RefreshResult(ChangeList.from_changes(changes), changed, shipped, len(self.ranges))

    def _split_large(self) -> None:
        ranges: list[KeyRange] = []
        parts: list[list[Record]] = []
        sums: list[RangeSum] = []
        n = self.rows_per_range
        for r, part, s in zip(self.ranges, self._rows, self.sums, strict=True):
            pieces = split_range(r, part, n)
            if len(pieces) == 1:
                ranges.append(r)
                parts.append(part)
                sums.append(s)
                continue
            for j, piece in enumerate(pieces):
                chunk = part[j * n : (j + 1) * n] if j < len(pieces) - 1 else part[j * n :]
                ranges.append(piece)
                parts.append(chunk)
                sums.append(range_sum(chunk))
        self.ranges, self._rows, self.sums = ranges, parts, sums
        self._bounds = _lower_bounds(ranges)

    def replan(self, rows_per_range: int | None = None) -> None:
        """Re-run the initialization over the copy (no source access): new ranges of
        ``rows_per_range`` rows and their checksums."""
        if rows_per_range is not None:
            self.rows_per_range = rows_per_range
        self._install(list(self.records()))
