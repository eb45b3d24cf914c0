"""One view's processes: the MaintenanceManager and the CommitManager (paper Fig. 14, 17).

The MaintenanceManager moves queued updates into the PPU whenever it has room, records
each unit's order number durably, and runs a ViewChange per unit. The CommitManager adds
finished effects to the view store in groups (one store write per group) and advances the
watermark W. In ``out_of_order`` mode (PVM) every finished effect is committed at once; in
``arrival`` mode (PVM-CC, Fig. 17) an effect waits until every smaller order is committed,
so even the raw tables only ever hold a legal state.

Faults are retried, not remembered. A transient one (a source's wrapper unreachable or
failing past its client's retries, the store's JVM or the catalog not answering) is retried
with backoff for as long as it lasts, shown in ``retrying``; the unit keeps its PPU slot
and order number, and its effect is computed again from scratch. A fault that needs a
person (``is_transient`` says which) fails the view: the unit waits, numbered, and
``resume`` runs it again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential

from contract.value_fit import store_type_family, unfit_reason
from contract.zset import ZSet
from warehouse.aggregate import encode
from warehouse.backoff import Backoff
from warehouse.catalog.db import Catalog, CatalogCall
from warehouse.consistent_cut import ViewSeqs
from warehouse.counters import ViewCounters
from warehouse.plan import ViewPlan
from warehouse.protocol import Unit, ViewProtocol, ViewUpdate
from warehouse.seq_history import SeqHistory
from warehouse.sources import SourceClient, SourceError
from warehouse.sources import is_transient as source_unavailable
from warehouse.spill import READ_BACK_UPDATES, SpillLog
from warehouse.store import Effect, StoreError, ViewStore
from warehouse.store.base import PartStore
from warehouse.view_change import ChangeStats, ViewChange

log = logging.getLogger(__name__)

COMMIT_MODES = ("out_of_order", "arrival")
T = TypeVar("T")

# Faults that need a person: a source that refuses a subquery (4xx: a schema that no longer
# matches the view, a token it does not accept), a store that refuses a request, a value the
# store cannot hold, a malformed answer, a bug. Retrying them would only repeat them.
NEEDS_A_PERSON: tuple[type[BaseException], ...] = (
    SourceError,
    StoreError,
    TypeError,
    ValueError,
    LookupError,
    AttributeError,
    AssertionError,
    ArithmeticError,
    NotImplementedError,
)


def is_transient(exc: BaseException) -> bool:
    """Whether a fault may go away by itself, and is retried: a source unreachable or failing
    (5xx) past its client's retries, a timeout, a lost connection, the store's JVM or the
    catalog database failing. Everything in ``NEEDS_A_PERSON`` fails the view instead.

    >>> is_transient(ConnectionRefusedError("the JVM is gone")), is_transient(TimeoutError())
    (True, True)
    >>> is_transient(SourceError("source 's' refused POST /v1/subquery: unknown column"))
    False
    >>> is_transient(KeyError("a bug"))
    False
    """
    if source_unavailable(exc) or isinstance(exc, OSError):
        return True
    return not isinstance(exc, NEEDS_A_PERSON)


async def run_blocking(executor: Executor | None, function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` off the event loop: on ``executor``, or on a worker thread when it is
    None (``asyncio.to_thread``). A store call may take seconds (a Spark job)."""
    if executor is None:
        return await asyncio.to_thread(function, *args)
    return await asyncio.get_running_loop().run_in_executor(executor, function, *args)


def always(exc: BaseException) -> bool:
    """Faults of the catalog, the backbone of recovery: retried whatever they are."""
    return True


@dataclass
class ViewSettings:
    parallelism: int = 4
    batch_size: int = 1
    commit_mode: str = "out_of_order"
    commit_group_size: int = 1000
    commit_linger: float = 0.0
    backoff: Backoff = field(default_factory=Backoff)


@dataclass
class StoreParts:
    """Where ``ViewChange`` puts a large unit's parts (``view_change.PartSink``): the view's
    store, off the event loop, an aggregate view's parts encoded as its commits are."""

    view: str
    plan: ViewPlan
    store: PartStore
    executor: Executor | None

    async def keep(self, order: int, parts: Collection[str]) -> set[str]:
        return await run_blocking(self.executor, self.store.keep_parts, self.view, order, parts)

    async def put(self, order: int, part: str, effect: ZSet) -> None:
        stored = effect if self.plan.summary is None else encode(self.plan.summary, effect)
        await run_blocking(self.executor, self.store.commit_part, self.view, order, part, stored)


@dataclass
class Retry:
    """A step being retried after a transient fault: what, how often, the last error."""

    attempts: int
    error: str
    since: float  # wall-clock time of the first failure


class ViewMaintainer:
    def __init__(
        self,
        name: str,
        plan: ViewPlan,
        settings: ViewSettings,
        protocol: ViewProtocol,
        store: ViewStore,
        sources: Mapping[str, SourceClient],
        db: CatalogCall,
        on_state: Callable[[str, str, str | None], Awaitable[None]],
        store_types: Sequence[str | None] = (),
        store_executor: Executor | None = None,
        spill_log: SpillLog | None = None,
    ) -> None:
        """``store_executor``: where store calls run (``run_blocking``); None: worker threads.
        ``spill_log``: where the UMQ's spilled tail is read back from (``warehouse.spill``);
        needed once anything is shelved."""
        self.name = name
        self.store_types = tuple(store_types)  # the view columns' store types, to explain a refused commit
        self.plan = plan
        self.settings = settings
        self.protocol = protocol
        self.store = store
        self.store_executor = store_executor
        self.db = db  # runs a catalog method on the catalog thread
        self.on_state = on_state
        self.spill_log = spill_log
        self.view_change = ViewChange(plan, protocol, sources, spill_log)
        self.view_change.executor = store_executor
        if settings.commit_mode == "out_of_order" and isinstance(store, PartStore):
            # In arrival mode the raw tables hold only legal states: no part before its turn.
            self.view_change.parts = StoreParts(name, plan, store, store_executor)
        self.counters = ViewCounters()
        self.paused = False
        self.failed: str | None = None
        self.initial_order: int | None = None
        self.history = SeqHistory()  # the seqs of the sources each of its states shows
        self.retrying: dict[str, Retry] = {}  # at most one per PPU slot, plus commit and start
        self.progress_at = time.monotonic()  # a unit started, maintained or committed; work arrived
        self._published = 0  # the W readers see in the store
        self.recorded_watermark = 0  # the W the catalog holds (the protocol's may be ahead, being recorded)
        self._ready: dict[int, ZSet] = {}
        self._ready_at: dict[int, float] = {}
        self._ready_from: dict[int, tuple[tuple[str, int], ...]] = {}  # (source, seq) of each ready unit's updates
        self._committing = False  # a group is between the store write and the published W
        self._reading_back = False  # a chunk of the shelf is being read from the log
        self._wake = asyncio.Event()
        self._commit_wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._loops: dict[str, asyncio.Task] = {}

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the MaintenanceManager and the CommitManager (again, if one stopped)."""
        for kind, loop in (("mm", self._maintenance_manager), ("cm", self._commit_manager)):
            if kind not in self._loops or self._loops[kind].done():
                self._loops[kind] = asyncio.create_task(self._guarded(loop), name=f"{kind}-{self.name}")
        self._wake.set()
        self._commit_wake.set()

    async def _guarded(self, loop: Callable[[], Awaitable[None]]) -> None:
        """A loop that dies takes its view to the failed state instead of hanging it."""
        try:
            await loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("view %s: %s stopped", self.name, loop.__name__)
            await self._fail(f"{loop.__name__.strip('_').replace('_', ' ')} stopped: {exc}")

    async def stop(self) -> None:
        tasks = [*self._loops.values(), *self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def receive(self, update: ViewUpdate) -> None:
        self._arrives()
        self.protocol.receive(update)
        self._wake.set()

    def receive_logged(self, source: str, seq: int, received_at: float | None) -> None:
        """An update released by name (logged from parts): queued in the update log only,
        read back as maintenance gets to it (``ViewProtocol.receive_logged``)."""
        self._arrives()
        self.protocol.receive_logged(source, seq, received_at)
        self._wake.set()

    def _arrives(self) -> None:
        self.counters.updates_received += 1
        if not self._busy:
            self.progress_at = time.monotonic()  # the watchdog counts from when work arrives
        self._idle.clear()

    def pause(self) -> None:
        self.paused = True
        self._wake.set()  # to shelve the queue once nothing runs

    async def resume(self) -> None:
        """Maintain again: a paused view, or a failed one (its waiting units run again with
        their order numbers). A shelved queue is read back a chunk at a time as the UMQ runs
        low, as any spilled tail is."""
        self.paused = False
        if self.failed is not None:
            self.failed = None
            await self.on_state(self.name, "initializing" if self.initial_order is not None else "active", None)
        self.progress_at = time.monotonic()
        self.start()

    async def begin_initial_load(self, bases: Mapping[str, int]) -> None:
        """Load the view, each source as of seq ``bases[source]``."""
        unit = self.protocol.start_initial()
        self.initial_order = unit.order
        self.history.begin(unit.order, bases)
        await self.db(Catalog.start_unit, self.name, unit.order, [])
        self._spawn(unit)

    async def republish(self, loaded: int | None) -> None:
        """After a restart, before ``start``: publish the W the catalog recorded, since the
        process may have died between recording a group and publishing it. ``loaded``: the
        committed initial load of a view still marked initializing; once visible, the view
        is active."""
        self._published = self.store.published(self.name)
        await self._publish()
        if loaded is not None and loaded <= self.protocol.watermark:
            await self.on_state(self.name, "active", None)

    def recover(self, units: Iterable[Unit]) -> None:
        """Units started but not committed before a restart: they wait for PPU slots, oldest
        first, with their order numbers (``start`` runs them)."""
        units = list(units)
        self.protocol.recover(units)
        self.history.number(units)
        self.initial_order = next((u.order for u in units if u.initial), self.initial_order)

    # -- MaintenanceManager -------------------------------------------------------------------
    async def _maintenance_manager(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._may_start() and self.protocol.can_start():
                unit = self.protocol.restart()  # numbered units that wait go first
                again = unit is not None  # run before: parts of it may be stored
                if unit is None:
                    unit = self.protocol.start()
                    self.history.number([unit])  # at once: its updates are no longer queued
                    log_ids = [u.log_id for u in unit.updates]
                    start = partial(self.db, Catalog.start_unit, self.name, unit.order, log_ids)
                    await self._retrying("start", start, always)
                self.counters.units_started += 1
                self._spawn(unit, again)
            self._shelve_if_held()
            self._read_back_if_low()
            self._check_idle()

    def _may_start(self) -> bool:
        return not self.paused and self.failed is None

    def _shelve_if_held(self) -> None:
        """A paused or failed view with nothing running keeps its queue in the update log
        only, until it maintains again."""
        held = self.paused or self.failed is not None
        if held and not self._reading_back and not self.protocol.ppu and self.protocol.umq:
            self.protocol.shelve()

    def _read_back_if_low(self) -> None:
        """Read the next chunk of the shelf back into the UMQ when it runs low, one read at
        a time, while the view maintains."""
        if self._may_start() and not self._reading_back and self.protocol.wants_read_back():
            self._reading_back = True
            task = asyncio.create_task(self._read_back(), name=f"read-back-{self.name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _read_back(self) -> None:
        assert self.spill_log is not None, "a view shelved updates without a log to read them back from"
        spill_log = self.spill_log
        try:
            read = self.protocol.read_back()
            chunk = await self._retrying(
                "read back", lambda: spill_log.read_back(read.after, READ_BACK_UPDATES), always
            )
            self.counters.updates_read_back += self.protocol.take_back(
                read, chunk.updates, chunk.through, chunk.exhausted
            )
            self.progress_at = time.monotonic()
        finally:
            self._reading_back = False
            self._wake.set()

    def _spawn(self, unit: Unit, again: bool = False) -> None:
        """Maintain ``unit``; ``again``: it ran before (a restart, or a fault that set it aside)."""
        self.progress_at = time.monotonic()
        self.counters.peak_running = max(self.counters.peak_running, len(self.protocol.ppu))
        task = asyncio.create_task(self._maintain(unit, again), name=f"vc-{self.name}-{unit.order}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _maintain(self, unit: Unit, again: bool = False) -> None:
        clock = asyncio.get_running_loop().time  # the loop's: virtual in the replayed schedules
        took = 0.0

        async def attempt() -> tuple[ZSet, ChangeStats]:
            nonlocal took
            began = clock()
            done = await self.view_change.run(unit, again)
            took = clock() - began  # the attempt that succeeded: what a unit of its size costs
            return done

        try:
            effect, stats = await self._retrying(
                f"order {unit.order}",
                attempt,
                lambda exc: self.failed is None and is_transient(exc),  # a failed view stops retrying
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.protocol.set_aside(unit)  # numbered, waiting for resume
            self._wake.set()
            if self.failed is None:  # needs a person: stop this view, keep the rest
                log.exception("maintenance of view %s failed at order %d", self.name, unit.order)
                await self._fail(f"maintenance of order {unit.order} failed: {_describe(exc)}")
            return
        self.counters.subqueries += stats.subqueries
        self.counters.compensations += stats.compensations
        self.counters.compensations_from_log += stats.compensations_from_log
        self.counters.unit_parts += stats.parts
        for source, seconds in stats.subquery_seconds.items():
            for value in seconds:
                self.counters.subquery(source, value)
        self.protocol.measured(unit, took)  # what the next units' sizes follow
        self.protocol.finish(unit)
        self.progress_at = time.monotonic()
        self.counters.units_maintained += 1
        # An aggregate view stores per-group deltas of the body's effect (warehouse/aggregate.py)
        self._ready[unit.order] = effect if self.plan.summary is None else encode(self.plan.summary, effect)
        self._ready_at[unit.order] = time.perf_counter()
        self._ready_from[unit.order] = tuple((u.source, u.seq) for u in unit.updates)
        # The next unit first: its order-number record and this effect's commit record
        # share the catalog's one thread, and a unit waiting to start holds a PPU slot idle.
        self._wake.set()
        self._commit_wake.set()

    async def _fail(self, message: str) -> None:
        self.failed = message
        await self.on_state(self.name, "failed", message)
        self._wake.set()  # to shelve the queue once nothing runs
        self._idle.set()

    # -- retries ---------------------------------------------------------------------------------
    async def _retrying(
        self, step: str, call: Callable[[], Awaitable[T]], transient: Callable[[BaseException], bool] = is_transient
    ) -> T:
        """``call()``, repeated with backoff while it fails with a transient fault; shown in
        ``retrying`` under ``step`` meanwhile. A fault that needs a person is raised."""
        backoff = self.settings.backoff
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(lambda exc: isinstance(exc, Exception) and transient(exc)),  # never a cancel
                wait=wait_exponential(multiplier=backoff.first_s, max=backoff.max_s),
                before_sleep=lambda state: self._note_retry(step, state),
                reraise=True,
            ):
                with attempt:
                    return await call()
        finally:
            self.retrying.pop(step, None)
        raise AssertionError("unreachable")

    def _note_retry(self, step: str, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        error = _describe(exc) if exc is not None else "unknown"
        since = self.retrying[step].since if step in self.retrying else time.time()
        self.retrying[step] = Retry(state.attempt_number, error, since)
        self.counters.retries += 1
        log.warning("view %s: %s failed (attempt %d), retrying: %s", self.name, step, state.attempt_number, error)

    # -- CommitManager -------------------------------------------------------------------------
    def _committable(self) -> list[int]:
        if self.settings.commit_mode == "arrival":
            orders, nxt = [], self.protocol.watermark + 1
            while nxt in self._ready:
                orders.append(nxt)
                nxt += 1
            return orders
        return sorted(self._ready)

    async def _commit_manager(self) -> None:
        while True:
            await self._commit_wake.wait()
            self._commit_wake.clear()
            if self.settings.commit_linger:
                await asyncio.sleep(self.settings.commit_linger)
            try:
                if self.failed is None and self._published < self.protocol.watermark:
                    await self._commit([])  # a publish that failed before resume
                while self.failed is None and (group := self._committable()[: self.settings.commit_group_size]):
                    await self._commit(group)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # needs a person: the effects wait in memory for resume
                log.exception("view %s: commit failed", self.name)
                await self._fail(f"commit failed: {_describe(exc)}")
            self._check_idle()

    async def _commit(self, group: list[int]) -> None:
        """Commit a group of ready effects (none: only publish W), then publish W."""
        self._committing = True
        try:
            if group:
                try:
                    effects = await self._retrying("commit", lambda: self._store_group(group))
                except StoreError as exc:
                    explained = self._unstorable(group)
                    if explained is None:
                        raise
                    raise StoreError(explained) from exc
                self._committed(group, effects)
            await self._retrying("publish", self._publish)
        finally:
            self._committing = False
        if self.initial_order is not None and self.protocol.watermark >= self.initial_order:
            self.initial_order = None
            await self.on_state(self.name, "active", None)

    async def _store_group(self, group: list[int]) -> int:
        """Append the group's effects and record them with the new W; every step may be
        repeated: the store skips orders it holds, W only grows, the record is the same."""
        effects = [Effect(o, self._ready[o]) for o in group if self._ready[o]]
        if effects:
            await run_blocking(self.store_executor, self.store.commit, self.name, effects)
        watermark = self.protocol.mark_committed(group)
        await self.db(Catalog.commit_units, self.name, group, watermark)
        self.recorded_watermark = max(self.recorded_watermark, watermark)
        return len(effects)

    def _unstorable(self, group: list[int]) -> str | None:
        """What to tell a person when the store refused ``group`` because of a value that
        does not fit its view column (an update logged before the manager checked values on
        receipt): the view, the column, the updates it comes from and the way out; None if
        no value of the group is to blame."""
        found = unfit_value(((o, self._ready[o]) for o in group), self.store_types)
        if found is None:
            return None
        order, column, reason = found
        updates = self._ready_from.get(order, ())
        origin = (
            f"update(s) {_seqs(updates)}, logged before values were checked on receipt"
            if updates
            else "the initial load, from a wrapper that does not leave such rows out"
        )
        return (
            f"view {self.name!r}, column {self.plan.stored_names[column]!r}: {reason}, from {origin}; resume "
            "fails again. Fix the row at the source or run a wrapper that leaves such rows out (docs/capture.md), "
            "then drop and define the view again: it loads the sources as they are and maintains only later updates"
        )

    def _committed(self, group: list[int], effects: int) -> None:
        now = time.perf_counter()
        for o in group:
            del self._ready[o]
            self._ready_from.pop(o, None)
            self.counters.commit_wait.observe(now - self._ready_at.pop(o))
        self.progress_at = time.monotonic()
        self.counters.units_committed += len(group)
        self.counters.commit_groups += 1
        self.counters.group_sizes.observe(effects)
        self.history.fold(self.protocol.watermark)

    async def _publish(self) -> None:
        """Point readers at W if the store shows an older one (also after a failed publish)."""
        watermark = self.protocol.watermark
        if self._published < watermark:
            await run_blocking(self.store_executor, self.store.publish, self.name, watermark)
            self._published = watermark

    # -- consistent cuts ------------------------------------------------------------------------
    @property
    def has_state(self) -> bool:
        """Whether ``seqs`` can answer: not while the initial load runs."""
        return self.initial_order is None

    def passed_over(self, released: Mapping[str, int]) -> dict[str, int]:
        """Per source, the seq through which every update the view holds in no unit at or
        below its recorded W is one it does not read (it was never queued): what pruning
        may remove as far as this view goes (``warehouse.log_pruning``). The ``hi`` of the
        interval its recorded state shows the source at (``ViewSeqs.interval``); nothing
        while the initial load runs (the catalog knows the view's bases)."""
        seqs = self.seqs()
        if seqs is None or seqs.base_order > self.recorded_watermark:
            return {}
        return {s: seqs.interval(self.recorded_watermark, s, released.get(s, 0))[1] for s in seqs.sources}

    def seqs(self, readable_from: int = 0) -> ViewSeqs | None:
        """What the view's states show of its sources (``warehouse.consistent_cut``); None
        while it has no state to show (the initial load runs)."""
        if not self.has_state:
            return None
        return self.history.seqs(self.protocol.watermark, self.protocol.first_queued(), readable_from)

    # -- quiescence ------------------------------------------------------------------------------
    def _check_idle(self) -> None:
        if self.idle:
            self._idle.set()

    @property
    def _busy(self) -> bool:
        """Something queued, running, waiting for commit or being published."""
        return bool(not self.protocol.quiet or self._ready or self._tasks or self._committing)

    @property
    def idle(self) -> bool:
        """Nothing to do, or nothing it can do: failed."""
        return self.failed is not None or not self._busy

    def seconds_without_progress(self, now: float | None = None) -> float:
        """How long maintenance has had work and made no progress: no unit started,
        maintained or committed since. 0 when it has none, or is paused or failed (which
        say so themselves). The watchdog of readiness compares it with its limit."""
        if self.paused or self.failed is not None or not self._busy:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self.progress_at)

    async def wait_idle(self) -> None:
        while not self.idle:
            self._idle.clear()
            self._check_idle()
            try:
                async with asyncio.timeout(0.05):  # not wait_for, which can drop a cancel (3.11)
                    await self._idle.wait()
            except TimeoutError:
                pass


def unfit_value(effects: Iterable[tuple[int, ZSet]], store_types: Sequence[str | None]) -> tuple[int, int, str] | None:
    """The first value of the ``(order, effect)`` rows that its view column (of store type
    ``store_types[i]``) cannot take: its order, column position and what is wrong with it.

    >>> unfit_value([(7, ZSet({(1, 2.5): 1})), (8, ZSet({(2, "x"): 1}))], ["BIGINT", "DOUBLE"])
    (8, 1, 'a text value in a column declared DOUBLE')
    >>> unfit_value([(7, ZSet({(1, None): 1}))], ["BIGINT", "DOUBLE"]) is None
    True
    """
    checked = [(i, family, t) for i, t in enumerate(store_types) if (family := store_type_family(t)) is not None]
    for order, effect in effects:
        for row in effect.rows():
            for i, family, store_type in checked:
                if (why := unfit_reason(family, store_type or "", row[i])) is not None:
                    return order, i, why
    return None


def _seqs(updates: Sequence[tuple[str, int]]) -> str:
    """Update numbers for a person: ``seq 4 of source 'a'``, ``seq 4-9 of source 'a'``.

    >>> _seqs([("a", 4)]), _seqs([("a", 4), ("a", 9)])
    ("seq 4 of source 'a'", "seq 4-9 of source 'a'")
    """
    sources = sorted({source for source, _ in updates})
    seqs = sorted(seq for _, seq in updates)
    span = f"seq {seqs[0]}" if seqs[0] == seqs[-1] else f"seq {seqs[0]}-{seqs[-1]}"
    return f"{span} of source {', '.join(map(repr, sources))}"


def _describe(exc: BaseException) -> str:
    """An error for a person, in one line: its kind and message."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:500] if text else type(exc).__name__
