"""One view's processes: the MaintenanceManager and the CommitManager (paper Fig. 14, 17).

The MaintenanceManager moves queued updates into the PPU whenever it has room, records
each unit's order number durably, and runs a ViewChange per unit. The CommitManager adds
finished effects to the view store in groups (one store write per group) and advances the
watermark W. In ``out_of_order`` mode (PVM) every finished effect is committed at once; in
``arrival`` mode (PVM-CC, Fig. 17) an effect waits until every smaller order is committed,
so even the raw tables only ever hold a legal state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from warehouse.plan import ViewPlan
from warehouse.protocol import Unit, ViewProtocol, ViewUpdate
from warehouse.sources import SourceClient
from warehouse.store import Effect, ViewStore
from warehouse.view_change import ViewChange
from warehouse.zset import ZSet

log = logging.getLogger(__name__)

COMMIT_MODES = ("out_of_order", "arrival")


@dataclass
class ViewSettings:
    parallelism: int = 4
    batch_size: int = 1
    commit_mode: str = "out_of_order"
    commit_group_size: int = 1000
    commit_linger: float = 0.0


@dataclass
class ViewCounters:
    updates_received: int = 0
    units_started: int = 0
    units_maintained: int = 0
    units_committed: int = 0
    subqueries: int = 0
    compensations: int = 0
    commit_groups: list[int] = field(default_factory=list)
    peak_running: int = 0
    commit_wait_seconds: list[float] = field(default_factory=list)  # effect ready -> committed
    last_commit_at: float | None = None
    subquery_seconds: dict[str, list[float]] = field(default_factory=dict)


class ViewMaintainer:
    def __init__(
        self,
        name: str,
        plan: ViewPlan,
        settings: ViewSettings,
        protocol: ViewProtocol,
        store: ViewStore,
        sources: Mapping[str, SourceClient],
        db: Callable[..., Awaitable[Any]],
        on_state: Callable[[str, str, str | None], Awaitable[None]],
    ) -> None:
        self.name = name
        self.plan = plan
        self.settings = settings
        self.protocol = protocol
        self.store = store
        self.db = db  # runs a catalog method on the catalog thread
        self.on_state = on_state
        self.view_change = ViewChange(plan, protocol, sources)
        self.counters = ViewCounters()
        self.paused = False
        self.failed: str | None = None
        self.initial_order: int | None = None
        self._ready: dict[int, ZSet] = {}
        self._ready_at: dict[int, float] = {}
        self._committing = False  # a group is between the store write and the published W
        self._wake = asyncio.Event()
        self._commit_wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._loops: list[asyncio.Task] = []

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._loops = [
            asyncio.create_task(self._guarded(self._maintenance_manager), name=f"mm-{self.name}"),
            asyncio.create_task(self._guarded(self._commit_manager), name=f"cm-{self.name}"),
        ]
        self._wake.set()

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
        for task in [*self._loops, *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._loops, *self._tasks, return_exceptions=True)

    def receive(self, update: ViewUpdate) -> None:
        self.counters.updates_received += 1
        self.protocol.receive(update)
        self._idle.clear()
        self._wake.set()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._wake.set()

    async def begin_initial_load(self) -> None:
        unit = self.protocol.start_initial()
        self.initial_order = unit.order
        await self.db("start_unit", self.name, unit.order, [])
        self._spawn(unit)

    async def republish(self, loaded: int | None) -> None:
        """After a restart, before ``start``: publish the W the catalog recorded, since the
        process may have died between recording a group and publishing it. ``loaded``: the
        committed initial load of a view still marked initializing; once visible, the view
        is active."""
        if self.store.published(self.name) < self.protocol.watermark:
            await asyncio.to_thread(self.store.publish, self.name, self.protocol.watermark)
        if loaded is not None and loaded <= self.protocol.watermark:
            await self.on_state(self.name, "active", None)

    def resume_unit(self, unit: Unit) -> None:
        """Re-run a unit that was started but not committed before a restart."""
        self.protocol.resume(unit)
        if unit.initial:
            self.initial_order = unit.order
        self._spawn(unit)

    # -- MaintenanceManager -------------------------------------------------------------------
    async def _maintenance_manager(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while not self.paused and self.failed is None and self.protocol.can_start():
                unit = self.protocol.start()
                self.counters.units_started += 1
                await self.db("start_unit", self.name, unit.order, [u.log_id for u in unit.updates])
                self._spawn(unit)
            self._check_idle()

    def _spawn(self, unit: Unit) -> None:
        self.counters.peak_running = max(self.counters.peak_running, len(self.protocol.ppu))
        task = asyncio.create_task(self._maintain(unit), name=f"vc-{self.name}-{unit.order}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _maintain(self, unit: Unit) -> None:
        try:
            effect, stats = await self.view_change.run(unit)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a refused subquery or a bug: stop this view, keep the rest
            log.exception("maintenance of view %s failed at order %d", self.name, unit.order)
            await self._fail(f"maintenance of order {unit.order} failed: {exc}")
            return
        self.counters.subqueries += stats.subqueries
        self.counters.compensations += stats.compensations
        for source, seconds in stats.subquery_seconds.items():
            self.counters.subquery_seconds.setdefault(source, []).extend(seconds)
        self.protocol.finish(unit)
        self.counters.units_maintained += 1
        self._ready[unit.order] = effect
        self._ready_at[unit.order] = time.perf_counter()
        # The next unit first: its order-number record and this effect's commit record
        # share the catalog's one thread, and a unit waiting to start holds a PPU slot idle.
        self._wake.set()
        self._commit_wake.set()

    async def _fail(self, message: str) -> None:
        self.failed = message
        await self.on_state(self.name, "failed", message)
        self._idle.set()

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
            while group := self._committable()[: self.settings.commit_group_size]:
                await self._commit(group)
            self._check_idle()

    async def _commit(self, group: list[int]) -> None:
        self._committing = True
        try:
            await self._commit_group(group)
        finally:
            self._committing = False

    async def _commit_group(self, group: list[int]) -> None:
        effects = [Effect(o, self._ready[o]) for o in group if self._ready[o]]
        if effects:
            await asyncio.to_thread(self.store.commit, self.name, effects)
        now = time.perf_counter()
        for o in group:
            del self._ready[o]
            self.counters.commit_wait_seconds.append(now - self._ready_at.pop(o))
        before = self.protocol.watermark
        watermark = self.protocol.mark_committed(group)
        await self.db("commit_units", self.name, group, watermark)
        if watermark != before:
            await asyncio.to_thread(self.store.publish, self.name, watermark)
        self.counters.units_committed += len(group)
        self.counters.commit_groups.append(len(effects))
        self.counters.last_commit_at = time.time()
        if self.initial_order is not None and watermark >= self.initial_order:
            self.initial_order = None
            await self.on_state(self.name, "active", None)

    # -- quiescence ------------------------------------------------------------------------------
    def _check_idle(self) -> None:
        if self.idle:
            self._idle.set()

    @property
    def idle(self) -> bool:
        """Nothing queued, running, waiting for commit or being published."""
        busy = not self.protocol.quiet or self._ready or self._tasks or self._committing
        return self.failed is not None or not busy

    async def wait_idle(self) -> None:
        while not self.idle:
            self._idle.clear()
            self._check_idle()
            try:
                await asyncio.wait_for(self._idle.wait(), timeout=0.05)
            except asyncio.TimeoutError:
                pass
