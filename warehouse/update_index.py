"""Where the PVM protocol keeps a view's updates, so that its two frequent questions cost
what their answers cost, not what the backlog holds:

* ``UpdateQueue`` (the UMQ): *which updates start next?* Updates in arrival order, and each
  source's in a queue of its own, so that a batch of one source's queued updates is taken
  without looking at the others' (``take``).
* ``SourceRuns``: *which updates must an answer subtract?* Per source, every update that
  compensation may need (queued, or in a numbered unit still running, waiting or retained),
  sorted by seq. A source's updates are numbered in seq order (DESIGN invariant 2: per-source
  order), so along seq their order numbers never fall, and the queued ones (no number yet,
  later than every numbered one) come last. The updates an answer with watermark ``w`` must
  subtract for unit ``o`` are therefore one run of that list, seq <= w and order >= o, found
  by two bisections (``run``).

Neither decides anything: ``warehouse/protocol.py`` says what is concurrent; these only find it.

>>> from warehouse.protocol import ViewUpdate
>>> q = UpdateQueue()
>>> for log_id, source, seq in [(1, "a", 1), (2, "b", 1), (3, "a", 2), (4, "a", 3)]:
...     q.append(ViewUpdate(log_id, source, seq, {}))
>>> [u.seq for u in q.take("a", 2)], [(u.source, u.seq) for u in q]
([1, 2], [('b', 1), ('a', 3)])
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warehouse.protocol import ViewUpdate

QUEUED = math.inf
"""The order of an update not numbered yet: later than every numbered one."""


def update_changes(update: ViewUpdate) -> int:
    """How many changes (delta rows) an update holds in memory: what a queue's memory
    follows (none for one whose deltas are in the log only, ``ViewUpdate.logged``)."""
    return sum(len(delta) for delta in update.deltas.values())


class UpdateQueue:
    """Queued updates: arrival order across sources, seq order within each; ``changes``
    counts their delta rows."""

    def __init__(self) -> None:
        self._arrival: deque[ViewUpdate] = deque()
        self._by_source: dict[str, deque[ViewUpdate]] = {}
        self._taken: set[int] = set()  # log ids taken out of the middle of the arrival order
        self._size = 0
        self.changes = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[ViewUpdate]:
        """In arrival order."""
        return (u for u in self._arrival if u.log_id not in self._taken)

    def append(self, update: ViewUpdate) -> None:
        self._arrival.append(update)
        self._by_source.setdefault(update.source, deque()).append(update)
        self._size += 1
        self.changes += update_changes(update)

    def front(self) -> ViewUpdate:
        """The update that arrived first (IndexError if none)."""
        while self._arrival and self._arrival[0].log_id in self._taken:
            self._taken.discard(self._arrival.popleft().log_id)
        return self._arrival[0]

    def oldest_received(self) -> float | None:
        """When the update at the front was received (arrival order is receipt order)."""
        return self.front().received_at if self._size else None

    def first_seqs(self) -> dict[str, int]:
        """Per source, the seq of its first queued update."""
        return {source: queue[0].seq for source, queue in self._by_source.items() if queue}

    def take(self, source: str, most: int) -> list[ViewUpdate]:
        """The first ``most`` queued updates of ``source``, out of the queue."""
        queue = self._by_source.get(source)
        taken: list[ViewUpdate] = []
        while queue and len(taken) < most:
            update = queue.popleft()
            taken.append(update)
            self._taken.add(update.log_id)
            self.changes -= update_changes(update)
        if queue is not None and not queue:
            del self._by_source[source]
        self._size -= len(taken)
        if not self._size:
            self._clear_arrival()
        return taken

    def clear(self) -> None:
        self._by_source.clear()
        self._clear_arrival()
        self._size = 0
        self.changes = 0

    def _clear_arrival(self) -> None:
        self._arrival.clear()
        self._taken.clear()


class SourceRuns:
    """Per source, the updates compensation may need, sorted by seq, with their orders."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}

    def add(self, update: ViewUpdate, order: float = QUEUED) -> None:
        self._runs.setdefault(update.source, _Run()).add(update, order)

    def number(self, updates: Iterable[ViewUpdate], order: int) -> None:
        """Queued ``updates`` got order number ``order``."""
        for update in updates:
            self._runs[update.source].set_order(update, order)

    def discard(self, updates: Iterable[ViewUpdate]) -> None:
        """``updates`` can no longer be concurrent to anything (their unit left the RPU)."""
        for update in updates:
            run = self._runs.get(update.source)
            if run is not None:
                run.discard(update)
                if not run.seqs:
                    del self._runs[update.source]

    def clear(self) -> None:
        self._runs.clear()

    def run(self, source: str, from_order: int, through_seq: int) -> tuple[list[float], list[ViewUpdate]]:
        """The orders and the updates of ``source`` with seq <= ``through_seq`` and order >=
        ``from_order`` (queued ones included), in seq order."""
        run = self._runs.get(source)
        if run is None:
            return [], []
        hi = bisect.bisect_right(run.seqs, through_seq)
        lo = bisect.bisect_left(run.orders, from_order, 0, hi)
        return run.orders[lo:hi], run.updates[lo:hi]

    def __len__(self) -> int:
        return sum(len(run.seqs) for run in self._runs.values())


class _Run:
    """One source's updates: three lists kept sorted by seq (orders rise with it)."""

    __slots__ = ("orders", "seqs", "updates")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.orders: list[float] = []
        self.updates: list[ViewUpdate] = []

    def add(self, update: ViewUpdate, order: float) -> None:
        i = bisect.bisect_right(self.seqs, update.seq)
        if i and self.seqs[i - 1] == update.seq:
            return  # known already (recovery may hand an update over twice)
        self.seqs.insert(i, update.seq)
        self.orders.insert(i, order)
        self.updates.insert(i, update)

    def _index(self, update: ViewUpdate) -> int | None:
        i = bisect.bisect_left(self.seqs, update.seq)
        return i if i < len(self.seqs) and self.seqs[i] == update.seq else None

    def set_order(self, update: ViewUpdate, order: int) -> None:
        i = self._index(update)
        if i is not None:
            self.orders[i] = order

    def discard(self, update: ViewUpdate) -> None:
        i = self._index(update)
        if i is not None:
            del self.seqs[i], self.orders[i], self.updates[i]
