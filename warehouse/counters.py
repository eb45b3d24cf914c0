"""What a view's maintenance counts: running aggregates only, so a manager that runs for
months holds the same few numbers per view and source as one that just started.

Observations (subquery latencies, commit group sizes, how long a ready effect waited for its
commit) go into ``Histogram``s, bucket counts plus a sum, updated when observed; the Prometheus
endpoint reads them as they are (``api/metrics.py``).

>>> h = Histogram((1, 10))
>>> for value in (0.5, 2, 3, 50):
...     h.observe(value)
>>> h.buckets(), h.count, h.total
([('1', 1), ('10', 3), ('+Inf', 4)], 4, 55.5)
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
GROUP_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)


class Histogram:
    """Counts of observations per bucket (the upper bounds ``bounds``, then +Inf), their
    number and their sum."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative counts by upper bound, as Prometheus exposes them."""
        out, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            running += count
            out.append((bound, running))
        return out


@dataclass
class ViewCounters:
    """Since the manager started (counters restart with it, as Prometheus counters do)."""

    updates_received: int = 0
    units_started: int = 0
    units_maintained: int = 0
    units_committed: int = 0
    subqueries: int = 0
    compensations: int = 0
    compensations_from_log: int = 0  # of them, spilled updates read from the update log
    updates_read_back: int = 0  # spilled updates queued in memory again
    unit_parts: int = 0  # parts of large units swept and stored one at a time (warehouse.unit_parts)
    commit_groups: int = 0
    peak_running: int = 0
    retries: int = 0  # attempts repeated after a transient fault
    group_sizes: Histogram = field(default_factory=lambda: Histogram(GROUP_BUCKETS))  # effects per store write
    commit_wait: Histogram = field(default_factory=lambda: Histogram(SECONDS_BUCKETS))  # effect ready -> committed
    subquery_seconds: dict[str, Histogram] = field(default_factory=dict)  # by source

    def subquery(self, source: str, seconds: float) -> None:
        histogram = self.subquery_seconds.get(source)
        if histogram is None:
            histogram = self.subquery_seconds[source] = Histogram(SECONDS_BUCKETS)
        histogram.observe(seconds)
