"""The distance of two snapshots (Labio & Garcia-Molina, eq. 3) and record displacements.

``distance = sum(|pos(R1) - pos(R2)| for matching R1, R2) / (max(records(F1), records(F2))**2 / 2)``

It is symmetric and does not grow with the size of the files: 0 when matching records sit
at the same positions, 1 when the second snapshot is the first one reversed (for an even
number of records). The window algorithm produces no extra messages as long as its aging
buffer holds more records than the largest displacement (plus two input buffers); the
average displacement is ``distance * max(records) / 2`` when every record matches (eq. 5),
and ``critical_displacement_bytes`` turns a critical distance into bytes (eq. 6).

Positions are record numbers in physical order. The first snapshot's keys are held in
memory (a dict from key to position).

>>> snapshot_distance([1, 2, 3, 4], [4, 3, 2, 1])
1.0
>>> snapshot_distance(["a", "b"], ["a", "b"])
0.0
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["DisplacementStats", "critical_displacement_bytes", "displacement_stats", "keys_of", "snapshot_distance"]


@dataclass(frozen=True)
class DisplacementStats:
    """Matching records, and how far they moved (in records)."""

    records_old: int
    records_new: int
    matched: int
    total: int
    maximum: int
    distance: float

    @property
    def average(self) -> float:
        """Mean displacement of the matching records."""
        return self.total / self.matched if self.matched else 0.0


def keys_of(records: Iterable[tuple[Any, Any]]) -> Iterator[Any]:
    """The keys of ``(key, rest)`` records, for the functions here.

    >>> list(keys_of([((1,), ("a",))]))
    [(1,)]
    """
    return (k for k, _ in records)


def displacement_stats(keys1: Iterable[Any], keys2: Iterable[Any]) -> DisplacementStats:
    """Displacements of matching keys between two key sequences, and the distance (eq. 3).

    >>> s = displacement_stats([1, 2, 3], [2, 1, 4])
    >>> s.matched, s.total, s.maximum, round(s.distance, 4)
    (2, 2, 1, 0.4444)
    """
    pos1: dict[Any, int] = {}
    n1 = 0
    for i, k in enumerate(keys1):
        pos1[k] = i
        n1 = i + 1
    total = matched = maximum = 0
    n2 = 0
    get = pos1.get
    for j, k in enumerate(keys2):
        n2 = j + 1
        old_pos = get(k)
        if old_pos is not None:
            d = old_pos - j if old_pos > j else j - old_pos
            total += d
            matched += 1
            if d > maximum:
                maximum = d
    m = max(n1, n2)
    distance = total / (m * m / 2) if m else 0.0
    return DisplacementStats(n1, n2, matched, total, maximum, distance)


def snapshot_distance(keys1: Iterable[Any], keys2: Iterable[Any]) -> float:
    """Equation 3: the normalised sum of displacements of matching records.

    >>> round(snapshot_distance([1, 2, 3], [3, 2, 1]), 4)
    0.8889
    """
    return displacement_stats(keys1, keys2).distance


def critical_displacement_bytes(distance: float, records: int, record_bytes: float) -> float:
    """Equation 6: the average physical displacement (bytes) a distance amounts to.

    The paper's 100 MB example: a critical distance of 0.24 over 650,000 records of 150
    bytes is about 11.2 MB.

    >>> round(critical_displacement_bytes(0.24, 650_000, 150) / 2**20, 1)
    11.2
    """
    return distance * (records / 2) * record_bytes
