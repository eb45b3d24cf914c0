"""The PVM protocol of one view: order numbers, UMQ/PPU/RPU, compensation, retention, W.

This module is the paper's DataWarehouse module (Zhang, Ding, Rundensteiner, Fig. 14),
restated with order numbers and source watermarks instead of arrival timestamps and a FIFO
network. It does no I/O and never awaits: the caller (``ViewChange``) asks it what to
compensate when an answer arrives, and the answer is decided by the state at that instant.

* **UMQ** (update message queue): updates received for the view, not yet maintained. They
  have no order number and count as later than every numbered unit.
* **PPU** (parallel processing updates): units being maintained, at most ``parallelism``.
  ``start`` moves the front of the UMQ into the PPU and gives it the next order number; a
  unit is one update, or a batch of queued updates of one source (Park's token sets), as
  many as ``warehouse.batching`` decides from the backlog and the measured unit costs.
* **RPU** (related processed updates): maintained units kept while a unit with a smaller
  order number is still in the PPU, because that unit may still receive answers reflecting
  them (the paper's Definition 1 and 2, Lemma 3).
* **Waiting** units: numbered but not running, because they were started before a restart
  (``recover``) or stopped by a fault (``set_aside``). They keep their order numbers, count
  as numbered for compensation and as running for retention, and re-enter the PPU before
  any queued update, oldest first, as slots free (``restart``): the PPU never holds more
  than ``parallelism`` units, a restart included.
* **Shelf** (the spilled tail of the UMQ): queued updates kept in the durable update log
  only, in memory just where they start. Arrivals go there once the UMQ holds
  ``queue_budget`` changes, and the whole UMQ of a view that is paused or failed while
  nothing of it runs (``shelve``). They are read back a chunk at a time, in arrival order,
  whenever the UMQ runs low (``take_back``), so a backlog costs memory by the budget, not by
  its length. They are still queued: an answer that reflects some of them subtracts them
  like any other queued update, read from the log (``spilled_range``).
* **Compensation** (isConcurrent): an answer from source ``s`` with watermark ``w`` to a
  subquery on relation position ``j``, issued by term ``k`` of unit ``u``, reflects every
  update of ``s`` with ``seq <= w``. Subtract ``partial ⋈ ΔR_j`` for each such update whose
  delta is ordered after the term: ``(order, j) > (u.order, k)``, or still queued (in the
  UMQ: ``concurrent_deltas``; spilled: ``spilled_range``).
  Comparing (order, position) pairs is Garg's chain rule for a unit that changes several
  relations: its own later relations are subtracted, its earlier ones kept.
* **Watermark W**: the largest order such that every order <= W is committed.

>>> from contract.zset import ZSet
>>> p = ViewProtocol(parallelism=2)
>>> p.receive(ViewUpdate(1, "s1", 1, {0: ZSet({(1,): 1})}))
>>> p.receive(ViewUpdate(2, "s2", 1, {1: ZSet({(2,): 1})}))
>>> u1, u2 = p.start(), p.start()
>>> (u1.order, u2.order)
(1, 2)
>>> len(p.concurrent_deltas(u1, 0, position=1, source="s2", watermark=1))  # u2 is later
1
>>> len(p.concurrent_deltas(u2, 1, position=0, source="s1", watermark=1))  # u1 is earlier
0
>>> p.finish(u2); sorted(p.rpu)  # kept: u1 (earlier) still running
[2]
>>> p.finish(u1); sorted(p.rpu)  # nothing earlier runs any more
[]
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from contract.zset import ZSet
from warehouse.batching import SourceCosts, unit_size
from warehouse.update_index import SourceRuns, UpdateQueue, update_changes

DEFAULT_BATCH_SIZE = 1000
"""A view's ``batch_size`` unless defined with one: the most updates a unit takes when a
backlog is maintained set-oriented (``warehouse.batching`` decides how many)."""

DEFAULT_QUEUE_BUDGET = 100_000
"""The most changes a view's UMQ holds in memory unless the manager is given another bound
(``pvm serve --max-queued-changes``); past it the queue's tail is spilled (the shelf)."""

INITIAL_TERM = -1
"""The term of the initial load: it reads every relation, so every update ordered after
the load is subtracted from its answers."""


@dataclass(frozen=True)
class ViewUpdate:
    """A source update as one view sees it: its non-empty deltas by relation position,
    already filtered by the local predicates and projected to the columns the view needs.

    ``logged``: an update logged from parts whose deltas are too large to hold (past the
    bound a unit sweeps at once) keeps them in the update log only; ``deltas`` is empty
    and ``logged`` counts their rows by position. Whoever needs them reads them from the
    log a part at a time (``warehouse.logged_deltas``)."""

    log_id: int
    source: str
    seq: int
    deltas: dict[int, ZSet]
    captured_at: float | None = None
    received_at: float | None = None
    logged: dict[int, int] | None = None

    def positions(self) -> set[int]:
        """The relation positions the update changes, held or logged."""
        return set(self.logged) if self.logged is not None else {p for p, d in self.deltas.items() if d}

    def rows(self) -> int:
        """How many delta rows the update holds or keeps in the log (a bound: not merged)."""
        if self.logged is not None:
            return sum(self.logged.values())
        return sum(len(d) for d in self.deltas.values())


@dataclass
class Unit:
    """What one ViewChange maintains: one update, a batch of one source's updates, or the
    initial load (no updates; every relation is queried)."""

    order: int
    updates: tuple[ViewUpdate, ...]
    initial: bool = False

    def delta(self, position: int) -> ZSet:
        """The sum of the updates' deltas of ``position``; only for a unit that holds them
        all (none ``logged``)."""
        out = ZSet()
        for u in self.updates:
            assert u.logged is None, "a logged update's delta is read from the log"
            if position in u.deltas:
                out.add_all(u.deltas[position])
        return out

    @property
    def logged(self) -> bool:
        """Whether some update of the unit keeps its deltas in the update log only."""
        return any(u.logged is not None for u in self.updates)

    def terms(self) -> list[int]:
        """The chain-rule terms: the initial load, or each changed relation in plan order."""
        if self.initial:
            return [INITIAL_TERM]
        return sorted({p for u in self.updates for p in u.positions()})


@dataclass
class Shelf:
    """What stays in memory of the UMQ's spilled tail: per source, the seq after which its
    queued updates start in the update log, and how many there are and since when (for the
    lag). ``added`` counts every update ever shelved: a read of the log that finds nothing
    more, with nothing shelved since it began, has read the shelf empty."""

    after: dict[str, int] = field(default_factory=dict)
    count: int = 0
    oldest: float | None = None  # when the oldest of them arrived (a lower bound)
    added: int = 0

    def add(self, source: str, seq: int, received_at: float | None) -> None:
        self.after[source] = min(self.after.get(source, seq - 1), seq - 1)
        self.count += 1
        self.added += 1
        if received_at is not None:
            self.oldest = received_at if self.oldest is None else min(self.oldest, received_at)


@dataclass(frozen=True)
class SpilledRange:
    """Queued updates of ``source`` with ``after < seq <= through`` that are in the update
    log only: an answer reflects them, so they are subtracted, read from the log."""

    source: str
    after: int
    through: int


@dataclass(frozen=True)
class ReadBack:
    """Where the next read of the shelf starts (per source, the seq after which to read),
    and the shelf's ``added`` when it began (``take_back``)."""

    after: dict[str, int]
    added: int


@dataclass(frozen=True)
class Progress:
    """How far behind the view is, from the protocol's state at one instant."""

    queued: int  # updates in no unit yet (UMQ or shelf)
    spilled: int  # of them, in the update log only (the shelf)
    queued_changes: int  # changes of the queued updates in memory (the UMQ)
    running: int  # units in the PPU
    waiting: int  # numbered units waiting for a PPU slot
    retained: int  # units in the RPU
    updates_pending: int  # updates queued, or in running or waiting units
    lag_updates: int  # updates queued, plus every numbered unit above W
    oldest_invisible: float | None  # when the oldest update not visible at W arrived


@dataclass
class ViewProtocol:
    parallelism: int
    batch_size: int = 1  # at most this many queued updates per unit (1: no batching)
    queue_budget: int | None = None  # the most changes the UMQ holds in memory (None: no bound)
    next_order: int = 1
    umq: UpdateQueue = field(default_factory=UpdateQueue)
    ppu: dict[int, Unit] = field(default_factory=dict)
    rpu: dict[int, Unit] = field(default_factory=dict)
    waiting: dict[int, Unit] = field(default_factory=dict)
    shelf: Shelf | None = None
    committed: set[int] = field(default_factory=set)
    watermark: int = 0
    # numbered units not visible at W yet: order -> when the oldest of their updates arrived
    arrived: dict[int, float] = field(default_factory=dict)
    # every update compensation may need (queued, running, waiting, retained), by source
    live: SourceRuns = field(default_factory=SourceRuns, repr=False)
    # what each source's units cost: running aggregates that ``batch`` decides from
    costs: dict[str, SourceCosts] = field(default_factory=dict, repr=False)

    # -- AssignTimeStamp: an update arrives ----------------------------------------------
    def receive(self, update: ViewUpdate) -> None:
        """Queue ``update``: in memory, or in the update log only (the shelf) once the UMQ
        holds ``queue_budget`` changes or a tail is shelved already (arrival order is kept:
        nothing passes the shelf). An update larger than the budget still enters an empty UMQ.

        >>> from contract.zset import ZSet
        >>> p = ViewProtocol(parallelism=1, queue_budget=2)
        >>> for seq in (1, 2, 3):
        ...     p.receive(ViewUpdate(seq, "s", seq, {0: ZSet({(seq,): 1})}))
        >>> [u.seq for u in p.umq], p.shelf.after, p.queued
        ([1, 2], {'s': 2}, 3)
        """
        if self.shelf is None and self._over_budget(update):
            self.shelf = Shelf()
        if self.shelf is not None:
            self.shelf.add(update.source, update.seq, update.received_at)
        else:
            self.umq.append(update)
            self.live.add(update)

    def receive_logged(self, source: str, seq: int, received_at: float | None) -> None:
        """Queue update ``seq`` of ``source`` in the update log only (the shelf), whatever the
        UMQ holds: one logged from parts, of any size, that the receiver hands out by name.
        It is read back when the UMQ runs low (``take_back``), as any spilled update, and
        what the view reads of it is decided then.

        >>> p = ViewProtocol(parallelism=1)
        >>> p.receive(ViewUpdate(1, "s", 1, {0: ZSet({(1,): 1})}))
        >>> p.receive_logged("s", 2, None)
        >>> [u.seq for u in p.umq], p.shelf.after, p.queued
        ([1], {'s': 1}, 2)
        """
        if self.shelf is None:
            self.shelf = Shelf()
        self.shelf.add(source, seq, received_at)

    def _over_budget(self, update: ViewUpdate) -> bool:
        return (
            self.queue_budget is not None
            and bool(self.umq)
            and self.umq.changes + update_changes(update) > self.queue_budget
        )

    def drop_queued(self, reflected: Mapping[str, int]) -> None:
        """Forget queued updates with ``seq <= reflected[source]``: a new view's initial load
        reads its sources as of those seqs, so it already holds their effects.

        >>> p = ViewProtocol(parallelism=1)
        >>> for seq in (1, 2, 3):
        ...     p.receive(ViewUpdate(seq, "s", seq, {}))
        >>> p.drop_queued({"s": 2}); [u.seq for u in p.umq]
        [3]
        """
        dropped = [u for u in self.umq if u.seq <= reflected.get(u.source, 0)]
        kept = [u for u in self.umq if u.seq > reflected.get(u.source, 0)]
        self.live.discard(dropped)
        self.umq.clear()
        for update in kept:
            self.umq.append(update)
        if self.shelf is not None:  # the log is read after them (the count is left high: read back, it ends)
            for source, after in self.shelf.after.items():
                self.shelf.after[source] = max(after, reflected.get(source, 0))

    # -- MaintenanceManager: UMQ -> PPU ----------------------------------------------------
    def can_start(self) -> bool:
        return bool(self.waiting or self.umq) and len(self.ppu) < self.parallelism

    def start(self) -> Unit:
        """Move the front of the UMQ, with more queued updates of the same source (in their
        order) as ``batch`` decides, into the PPU with the next order number."""
        source = self.umq.front().source
        batch = self.umq.take(source, self.batch(source))
        unit = self._number(Unit(self.next_order, tuple(batch)))
        self.live.number(batch, unit.order)
        return unit

    def batch(self, source: str) -> int:
        """How many queued updates of ``source`` the next unit takes (``warehouse.batching``):
        one while a free PPU slot's share of the queue is at or below the source's measured
        crossover (Park's eq. 4.3), so that at low load each update runs in a unit of its own,
        in parallel (PVM); above it the share, at most ``batch_size``, maintained
        set-oriented (Park's token sets), so that a backlog costs a few subqueries per unit
        instead of a few per update, and its length never piles up compensation.
        ``batch_size`` 1 is PVM as the paper runs it.

        >>> p = ViewProtocol(parallelism=4, batch_size=100)
        >>> for seq in range(1, 11):
        ...     p.receive(ViewUpdate(seq, "s", seq, {}))
        >>> p.batch("s"), len(p.start().updates), len(p.start().updates)  # 10 over 4 free slots, then 7 over 3
        (3, 3, 3)
        """
        free = self.parallelism - len(self.ppu)
        return unit_size(len(self.umq), free, self.costs_of(source).crossover(), self.batch_size)

    def costs_of(self, source: str) -> SourceCosts:
        """What ``source``'s units have cost so far (running aggregates)."""
        costs = self.costs.get(source)
        if costs is None:
            costs = self.costs[source] = SourceCosts()
        return costs

    def measured(self, unit: Unit, seconds: float) -> None:
        """Unit ``unit`` took ``seconds`` to maintain: what the next ``batch`` decides from.

        >>> p = ViewProtocol(parallelism=2, batch_size=100)
        >>> p.measured(Unit(1, (ViewUpdate(1, "s", 1, {}),)), 0.02)
        >>> p.costs["s"].c1
        0.02
        """
        if unit.updates:
            self.costs_of(unit.updates[0].source).observe(len(unit.updates), seconds)

    def start_initial(self) -> Unit:
        return self._number(Unit(self.next_order, (), initial=True))

    def restart(self) -> Unit | None:
        """Move the oldest waiting unit into the PPU, same order number (None: none waits).
        Waiting units are numbered, so they go before anything queued."""
        if not self.waiting:
            return None
        unit = self.waiting.pop(min(self.waiting))
        self.ppu[unit.order] = unit
        return unit

    def _number(self, unit: Unit) -> Unit:
        self.next_order += 1
        self.ppu[unit.order] = unit
        self._arrived(unit)
        return unit

    def _arrived(self, unit: Unit) -> None:
        times = [u.received_at for u in unit.updates if u.received_at is not None]
        if times and unit.order > self.watermark:
            self.arrived[unit.order] = min(times)

    # -- isConcurrent: what an answer must have subtracted ---------------------------------
    def concurrent_deltas(self, unit: Unit, term: int, position: int, source: str, watermark: int) -> list[ZSet]:
        """Deltas of relation ``position`` that an answer from ``source`` with ``watermark``
        reflects but that are ordered after term ``term`` of ``unit``."""
        deltas = (u.deltas.get(position) for u in self._concurrent(unit, term, position, source, watermark))
        return [d for d in deltas if d is not None]

    def concurrent_logged(self, unit: Unit, term: int, position: int, source: str, watermark: int) -> list[ViewUpdate]:
        """The updates ``concurrent_deltas`` names whose delta of ``position`` is in the
        update log only (``ViewUpdate.logged``): the caller reads and subtracts them too.

        >>> p = ViewProtocol(parallelism=2)
        >>> p.receive(ViewUpdate(1, "s1", 1, {0: ZSet({(1,): 1})}))
        >>> p.receive(ViewUpdate(2, "s2", 1, {}, logged={1: 70_000}))
        >>> u1 = p.start()
        >>> p.concurrent_deltas(u1, 0, 1, "s2", 1), [u.seq for u in p.concurrent_logged(u1, 0, 1, "s2", 1)]
        ([], [1])
        """
        updates = self._concurrent(unit, term, position, source, watermark)
        return [u for u in updates if u.logged is not None and position in u.logged]

    def _concurrent(self, unit: Unit, term: int, position: int, source: str, watermark: int) -> list[ViewUpdate]:
        orders, updates = self.live.run(source, unit.order, watermark)
        # the run starts at the unit's own updates: those of earlier terms are kept (the
        # chain rule); every later order, queued ones included (+inf), is subtracted
        own = bisect.bisect_right(orders, unit.order)
        return updates[own if position <= term else 0 :]

    def spilled_range(self, source: str, watermark: int) -> SpilledRange | None:
        """The spilled updates of ``source`` that an answer with ``watermark`` reflects: all
        queued, so all later than every term. Asked together with ``concurrent_deltas``,
        at the instant the answer arrives; the updates are read from the log after it (they
        do not change, and any of them read back meanwhile is numbered after every running
        unit, so subtracting it stays right).

        >>> p = ViewProtocol(parallelism=1, queue_budget=1)
        >>> for seq in (1, 2, 3):
        ...     p.receive(ViewUpdate(seq, "s", seq, {0: ZSet({(seq,): 1})}))
        >>> p.spilled_range("s", watermark=3), p.spilled_range("s", watermark=1)
        (SpilledRange(source='s', after=1, through=3), None)
        """
        after = self.shelf.after.get(source) if self.shelf is not None else None
        if after is None or watermark <= after:
            return None
        return SpilledRange(source, after, watermark)

    # -- ViewChange done: PPU -> RPU, clean up the RPU -------------------------------------
    def finish(self, unit: Unit) -> None:
        del self.ppu[unit.order]
        self.rpu[unit.order] = unit
        self._clean_rpu()

    def retain(self, unit: Unit) -> None:
        """Put a unit finished before a restart into the RPU (recovery)."""
        self.rpu[unit.order] = unit
        self._known(unit)

    def _clean_rpu(self) -> None:
        """Definition 2: a processed unit is unrelated once no unit with a smaller order
        number is still running or waiting to run again; nothing can need it for
        compensation any more."""
        oldest_running = min((*self.ppu, *self.waiting), default=None)
        for order in [o for o in self.rpu if oldest_running is None or o < oldest_running]:
            self.live.discard(self.rpu.pop(order).updates)

    # -- faults and restarts: numbered units that wait for a PPU slot ----------------------
    def recover(self, units: Iterable[Unit]) -> None:
        """Units started but not committed before a restart wait, with their order numbers,
        until ``restart`` moves them into the PPU, oldest first, as slots free.

        >>> from contract.zset import ZSet
        >>> p = ViewProtocol(parallelism=1)
        >>> def update(log_id, seq): return ViewUpdate(log_id, "s", seq, {0: ZSet({(seq,): 1})})
        >>> p.recover([Unit(3, (update(7, 3),)), Unit(2, (update(6, 2),))])
        >>> p.receive(update(8, 4))
        >>> p.restart().order, p.can_start()  # the oldest first; p = 1 is full
        (2, False)
        >>> len(p.concurrent_deltas(p.ppu[2], 0, position=0, source="s", watermark=4))  # 3 waits, 4 is queued
        2
        >>> p.next_order  # new units are numbered after the recovered ones
        4
        """
        for unit in units:
            self.waiting[unit.order] = unit
            self._known(unit)

    def _known(self, unit: Unit) -> None:
        """A unit numbered before a restart: new units are numbered after it, and its
        updates count for compensation."""
        self.next_order = max(self.next_order, unit.order + 1)
        self._arrived(unit)
        for update in unit.updates:
            self.live.add(update, unit.order)

    @staticmethod
    def held_after_restart(recorded: Mapping[int, bool]) -> set[int]:
        """Of the units recorded before a restart (order -> committed), the orders the
        protocol holds again: every uncommitted unit, and every committed one ordered after
        the oldest uncommitted one, which may still compensate with it (the RPU).

        >>> sorted(ViewProtocol.held_after_restart({1: True, 2: False, 3: True, 4: False}))
        [2, 3, 4]
        """
        oldest = min((order for order, committed in recorded.items() if not committed), default=None)
        return {o for o, committed in recorded.items() if not committed or (oldest is not None and o > oldest)}

    def restore(
        self, recorded: Mapping[int, bool], held: Iterable[Unit], queued: Iterable[ViewUpdate], folded: int = 0
    ) -> list[Unit]:
        """Rebuild the state after a restart from what was recorded: W from the committed
        orders of ``recorded`` (order -> committed) after ``folded`` (every order through it
        committed, its record pruned), new order numbers after every recorded one, the RPU from the committed units of ``held`` (those ``held_after_restart``
        names, rebuilt from the update log) and the UMQ from ``queued`` (logged updates in no
        unit, in arrival order). Returns the uncommitted units of ``held``, for ``recover``.

        >>> from contract.zset import ZSet
        >>> def update(seq): return ViewUpdate(seq, "s", seq, {0: ZSet({(seq,): 1})})
        >>> recorded = {1: True, 2: False, 3: True}
        >>> p = ViewProtocol(parallelism=2)
        >>> held = [Unit(o, (update(o),)) for o in sorted(ViewProtocol.held_after_restart(recorded))]
        >>> [u.order for u in p.restore(recorded, held, [update(4)])]  # 2 runs again; 3 is retained
        [2]
        >>> p.watermark, sorted(p.rpu), len(p.umq), p.next_order
        (1, [3], 1, 4)
        >>> q = ViewProtocol(parallelism=2)
        >>> q.restore({7: True, 8: False}, [], [], folded=6), q.watermark, q.next_order  # 1-6 were pruned
        ([], 7, 9)
        """
        self.watermark = max(self.watermark, folded)
        self.mark_committed(order for order, committed in recorded.items() if committed)
        self.next_order = max(self.next_order, folded + 1, *(order + 1 for order in recorded))
        uncommitted = []
        for unit in held:
            if recorded[unit.order]:
                self.retain(unit)
            else:
                uncommitted.append(unit)
        for update in queued:
            self.receive(update)
        return uncommitted

    def set_aside(self, unit: Unit) -> None:
        """Take a unit whose maintenance failed out of the PPU; it waits, numbered, until
        ``restart`` runs it again from scratch. Every unit ordered after it that finishes
        meanwhile stays in the RPU, so the new run finds what it must compensate."""
        del self.ppu[unit.order]
        self.waiting[unit.order] = unit

    # -- the shelf: the UMQ's tail in the update log only -------------------------------------
    def shelve(self) -> None:
        """Keep every queued update in the durable update log only, and those that arrive
        from now on, until read back (a paused or failed view's queue, once nothing runs).

        >>> from contract.zset import ZSet
        >>> p = ViewProtocol(parallelism=2)
        >>> p.receive(ViewUpdate(10, "s", 5, {0: ZSet({(1,): 1})}))
        >>> p.shelve(); p.receive(ViewUpdate(11, "s", 6, {0: ZSet({(2,): 1})}))
        >>> len(p.umq), p.queued, p.read_back().after  # read s's log after seq 4 back
        (0, 2, {'s': 4})
        """
        shelf = self.shelf if self.shelf is not None else Shelf()
        for update in self.umq:  # older than what is shelved already: ``add`` keeps the least seq
            shelf.add(update.source, update.seq, update.received_at)
        self.shelf = shelf
        self.live.discard(self.umq)
        self.umq.clear()

    def wants_read_back(self) -> bool:
        """Whether to read the next chunk of the shelf: something is shelved and the UMQ is
        down to half its budget."""
        if self.shelf is None:
            return False
        return self.queue_budget is None or self.umq.changes <= self.queue_budget // 2

    def read_back(self) -> ReadBack:
        """Where a read of the shelf starts: read the log after it, in arrival order, and
        give what it found to ``take_back``."""
        assert self.shelf is not None
        return ReadBack(dict(self.shelf.after), self.shelf.added)

    def take_back(
        self, read: ReadBack, logged: Iterable[ViewUpdate], through: Mapping[str, int], exhausted: bool
    ) -> int:
        """Queue in memory what a read of the shelf found: ``logged``, in arrival order (each
        source's in seq order, after ``read.after``); ``through``: per source, the last seq
        the read looked at (updates the view does not read included); ``exhausted``: the log
        had no more. Returns how many were queued. The shelf ends when the read found it all
        and nothing was shelved since the read began: arrivals queue in memory again.

        >>> from contract.zset import ZSet
        >>> def update(seq): return ViewUpdate(seq, "s", seq, {0: ZSet({(seq,): 1})})
        >>> p = ViewProtocol(parallelism=1, queue_budget=1)
        >>> for seq in (1, 2, 4):
        ...     p.receive(update(seq))
        >>> read = p.read_back(); p.take_back(read, [update(2)], {"s": 3}, exhausted=False), p.shelf.after
        (1, {'s': 3})
        >>> read = p.read_back(); p.take_back(read, [update(4)], {"s": 4}, exhausted=True), p.shelf
        (1, None)
        >>> [u.seq for u in p.umq]
        [1, 2, 4]
        """
        shelf = self.shelf
        assert shelf is not None
        taken = 0
        for update in logged:
            if update.seq <= shelf.after.get(update.source, update.seq):
                continue  # not shelved (its source's reading starts later), or queued already
            shelf.after[update.source] = update.seq
            shelf.count = max(0, shelf.count - 1)
            if update.received_at is not None:  # those left arrived after it
                shelf.oldest = max(shelf.oldest or update.received_at, update.received_at)
            self.umq.append(update)
            self.live.add(update)
            taken += 1
        for source, seq in through.items():  # past what the view does not read, too
            if source in shelf.after:
                shelf.after[source] = max(shelf.after[source], seq)
        if exhausted and shelf.added == read.added:
            self.shelf = None
        return taken

    # -- CommitManager: W -------------------------------------------------------------------
    def mark_committed(self, orders: Iterable[int]) -> int:
        """Record committed orders (again: harmless); return the new visibility watermark W."""
        self.committed.update(o for o in orders if o > self.watermark)
        while self.watermark + 1 in self.committed:
            self.watermark += 1
            self.committed.discard(self.watermark)
            self.arrived.pop(self.watermark, None)
        return self.watermark

    # -- reading ------------------------------------------------------------------------------
    def oldest_invisible(self) -> float | None:
        """When the oldest update not visible at W arrived: queued, running, or maintained
        (even committed out of order) above W. None when every received update is visible."""
        # the UMQ's front arrived first (an update released after a gap in its source's seqs
        # may have been received before it: until it reaches the front, the lag reads it young)
        queued = [self.umq.oldest_received()]
        if self.shelf is not None:
            queued.append(self.shelf.oldest)
        return min((*self.arrived.values(), *(t for t in queued if t is not None)), default=None)

    def lag_seconds(self, now: float) -> float:
        """Age at ``now`` of the oldest update not visible at W (``oldest_invisible``); 0
        when every received update is visible.

        >>> p = ViewProtocol(parallelism=1)
        >>> p.receive(ViewUpdate(1, "s", 1, {}, received_at=100.0))
        >>> p.lag_seconds(now=102.5), ViewProtocol(parallelism=1).lag_seconds(now=102.5)
        (2.5, 0.0)
        """
        oldest = self.oldest_invisible()
        return 0.0 if oldest is None else round(max(0.0, now - oldest), 3)

    def progress(self) -> Progress:
        """Updates and units by where they are, and how far W is behind them.

        >>> p = ViewProtocol(parallelism=1)
        >>> for seq in (1, 2, 3):
        ...     p.receive(ViewUpdate(seq, "s", seq, {}))
        >>> unit = p.start(); p.progress()  # one update runs in unit 1, two are queued
        Progress(queued=2, spilled=0, queued_changes=0, running=1, waiting=0, retained=0, updates_pending=3, lag_updates=3, oldest_invisible=None)
        """
        running = sum(len(u.updates) for u in (*self.ppu.values(), *self.waiting.values()))
        return Progress(
            queued=self.queued,
            spilled=self.shelf.count if self.shelf is not None else 0,
            queued_changes=self.umq.changes,
            running=len(self.ppu),
            waiting=len(self.waiting),
            retained=len(self.rpu),
            updates_pending=self.queued + running,
            lag_updates=self.queued + max(0, self.next_order - 1 - self.watermark),
            oldest_invisible=self.oldest_invisible(),
        )

    def first_queued(self) -> dict[str, int]:
        """Per source, the first seq received and in no unit yet (in the UMQ or shelved).

        >>> p = ViewProtocol(parallelism=1)
        >>> for seq in (4, 5):
        ...     p.receive(ViewUpdate(seq, "s", seq, {}))
        >>> p.first_queued(), p.shelve(), p.first_queued()
        ({'s': 4}, None, {'s': 4})
        """
        first = self.umq.first_seqs()
        if self.shelf is not None:
            for source, after in self.shelf.after.items():
                first[source] = min(first.get(source, after + 1), after + 1)
        return first

    @property
    def queued(self) -> int:
        """Updates received and in no unit yet: in the UMQ, or shelved."""
        return len(self.umq) + (self.shelf.count if self.shelf is not None else 0)

    @property
    def quiet(self) -> bool:
        """Nothing queued, running or waiting to run (the paper's quiet warehouse state)."""
        return not self.queued and not self.ppu and not self.waiting
