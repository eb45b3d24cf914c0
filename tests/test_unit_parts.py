"""A unit larger than ``unit_parts.PART_ROWS`` rows is swept in parts, each part's effect
stored under the unit's order before the unit commits: the view is right at every W, a
unit run again skips the parts the store holds (after a transient fault, after a restart),
and its parts show in the view's counters (docs/protocol.md, "Units in parts")."""

from __future__ import annotations

import asyncio
import tempfile
import threading

import pytest
from py4j.protocol import Py4JNetworkError

from contract.zset import ZSet
from tests.sim import start_sim_manager
from tests.test_recovery import FAST, TABLES, VIEW, converged, until
from warehouse import unit_parts, view_change
from warehouse.store.memory import MemoryStore

ROWS = 20  # one transaction's rows: seven parts of at most three


class PartCountingStore(MemoryStore):
    """Records every part stored, and can fail the ``fail_at``-th store of a part (as
    py4j fails once the Spark JVM has died) or hold parts from ``hold_from`` on until
    ``released`` (a write still held when its process dies is never made)."""

    def __init__(self, fail_at: int | None = None, hold_from: int | None = None) -> None:
        super().__init__()
        self.stored: list[tuple[str, int, str]] = []
        self.calls = 0
        self.fail_at = fail_at
        self.hold_from = hold_from
        self.released = threading.Event()
        self.abandoned = False

    def commit_part(self, view: str, order: int, part: str, delta: ZSet) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise Py4JNetworkError("An error occurred while trying to connect to the Java server")
        if self.hold_from is not None and self.calls >= self.hold_from:
            assert self.released.wait(60), "never released"
            if self.abandoned:
                return
        super().commit_part(view, order, part, delta)
        self.stored.append((view, order, part))


async def define(manager, sources) -> None:
    sources["a"].load("R", [(0, "x"), (1, "y")])
    sources["b"].load("S", [(k, 10 * k) for k in range(ROWS + 2)])
    await manager.define_view(VIEW, "v", parallelism=2)
    await manager.wait_idle("v")


def insert_many(sources) -> None:
    sources["a"].commit([("R", 1, (k, f"n{k}")) for k in range(2, ROWS + 2)])


SHIPPED = ("whole", "in_parts")
"""How the large update is shipped: whole, its delta held by its unit, or in parts of four
changes, so that its delta, larger than a unit sweeps at once, stays in the update log
(``ViewUpdate.logged``) and is spooled to disk by part."""


async def ship(source, shipped: str) -> None:
    if shipped == "whole":
        await source.ship()
    else:
        await source.ship_in_parts(4)


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unit_parts, "PART_ROWS", 3)


@pytest.mark.parametrize("shipped", SHIPPED)
async def test_a_large_unit_is_stored_in_parts_and_shown_only_once_committed(tmp_path, shipped):
    store = PartCountingStore()
    manager, sources = await start_sim_manager(tmp_path / "catalog.db", TABLES, store=store)
    try:
        await define(manager, sources)
        before, shown = manager.watermark("v"), manager.read("v")
        store.calls, store.hold_from = 0, 7  # the last part waits
        insert_many(sources)
        await ship(sources["a"], shipped)
        await until(lambda: store.calls >= 7)
        assert len(store.stored) == 6 and manager.watermark("v") == before
        assert manager.read("v") == shown  # six parts stored, none of them visible
        store.released.set()
        assert await converged(manager, sources)
        order = manager.watermark("v")
        assert order == before + 1
        parts = [part for _, o, part in store.stored if o == order]
        assert len(parts) == len(set(parts)) == unit_parts.part_count(ROWS, 3) == 7
        assert all(name.endswith("of7") for name in parts)
        assert len(manager.read("v")) == len(shown) + ROWS
        assert order not in store.committed_orders("v")  # its commit only recorded the order
        assert manager.status("v")["counters"]["unit_parts"] == 7
    finally:
        store.released.set()
        await manager.stop()


async def test_an_update_larger_than_a_unit_sweeps_stays_in_the_log(tmp_path, monkeypatch):
    """Shipped in parts, an update whose delta has more rows than a unit sweeps at once is
    never held whole: the view's update counts its rows only, its unit spools them to disk
    and sweeps one part at a time, and the spool is gone once the unit is done."""
    spool_dir = tmp_path / "tmp"
    spool_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool_dir))
    swept: list[int] = []
    sweep = view_change.ViewChange._sweep

    async def recorded(self, unit, term, started, stats, delta=None):
        swept.append(len(unit.delta(term)) if delta is None else len(delta))
        return await sweep(self, unit, term, started, stats, delta)

    monkeypatch.setattr(view_change.ViewChange, "_sweep", recorded)
    store = PartCountingStore(hold_from=4)
    manager, sources = await start_sim_manager(tmp_path / "catalog.db", TABLES, store=store)
    try:
        await define(manager, sources)
        store.calls = 0
        insert_many(sources)
        await sources["a"].ship_in_parts(4)
        await until(lambda: store.calls >= 4)
        [unit] = manager.view("v").maintainer.protocol.ppu.values()
        [update] = unit.updates
        assert update.logged == {0: ROWS} and update.deltas == {}
        assert len(list(spool_dir.iterdir())) == 1  # the unit's spool
        store.released.set()
        assert await converged(manager, sources)
        assert len(store.stored) == 7 and max(swept) <= 6  # parts of about three rows, never 20
        assert list(spool_dir.iterdir()) == []
    finally:
        store.released.set()
        await manager.stop()


@pytest.mark.parametrize("shipped", SHIPPED)
async def test_a_unit_run_again_after_a_fault_skips_the_parts_it_stored(tmp_path, shipped):
    store = PartCountingStore(fail_at=4)
    manager, sources = await start_sim_manager(tmp_path / "catalog.db", TABLES, store=store)
    manager.backoff = FAST
    try:
        await define(manager, sources)
        insert_many(sources)
        await ship(sources["a"], shipped)
        assert await converged(manager, sources)
        assert store.calls == 8  # seven parts, one of them twice: the one that failed
        assert len(store.stored) == len(set(store.stored)) == 7
        assert manager.status("v")["counters"]["retries"] == 1
    finally:
        await manager.stop()


@pytest.mark.parametrize("shipped", SHIPPED)
async def test_a_restart_in_the_middle_of_a_unit_keeps_the_parts_it_stored(tmp_path, shipped):
    store = PartCountingStore(hold_from=4)
    catalog = tmp_path / "catalog.db"
    manager, sources = await start_sim_manager(catalog, TABLES, store=store)
    await define(manager, sources)
    store.calls = 0
    insert_many(sources)
    await ship(sources["a"], shipped)
    await until(lambda: store.calls >= 4)  # three parts stored, the fourth held
    await manager.stop()  # the crash
    store.abandoned = True
    store.released.set()
    await asyncio.sleep(0.05)  # the held write returns, writing nothing
    assert len(store.stored) == 3
    store.hold_from = None

    manager, _ = await start_sim_manager(catalog, TABLES, store=store, sources=sources)
    try:
        assert await converged(manager, sources)
        assert len(store.stored) == len(set(store.stored)) == 7  # the first three not again
    finally:
        await manager.stop()


async def test_the_manager_bound_sets_the_part_size(tmp_path):
    """``pvm serve --unit-part-rows`` reaches every view: parts of at most five rows here."""
    store = PartCountingStore()
    manager, sources = await start_sim_manager(tmp_path / "catalog.db", TABLES, store=store, unit_part_rows=5)
    try:
        await define(manager, sources)
        insert_many(sources)
        await sources["a"].ship()
        assert await converged(manager, sources)
        assert manager.status("v")["counters"]["unit_parts"] == unit_parts.part_count(ROWS, 5) == 4
    finally:
        await manager.stop()


@pytest.mark.parametrize("shipped", SHIPPED)
async def test_a_unit_cut_into_parts_then_run_whole_is_counted_once(tmp_path, shipped):
    """Restarted with a larger part bound, a unit stopped between its parts runs whole, and
    the parts stored before are dropped, even where its whole effect is empty and so writes
    nothing that would replace them: here every changed R row keeps its key and passes the
    view's predicate, and the view shows S's column only."""
    store = PartCountingStore(hold_from=4)
    catalog = tmp_path / "catalog.db"
    manager, sources = await start_sim_manager(catalog, TABLES, store=store)
    sources["a"].load("R", [(k, "x") for k in range(ROWS)])
    sources["b"].load("S", [(k, 10 * k) for k in range(ROWS)])
    await manager.define_view("SELECT S.w FROM a.R, b.S WHERE R.k = S.k AND R.v <> 'z'", "v", parallelism=2)
    await manager.wait_idle("v")
    store.calls = 0
    renamed = [("R", -1, (k, "x")) for k in range(ROWS)] + [("R", 1, (k, "y")) for k in range(ROWS)]
    sources["a"].commit(renamed)
    await ship(sources["a"], shipped)
    await until(lambda: store.calls >= 4)
    await manager.stop()
    store.abandoned = True
    store.released.set()
    await asyncio.sleep(0.05)
    assert len(store.stored) == 3 and store.read("v") != store.read("v", as_of=1)  # the parts show past W

    manager, _ = await start_sim_manager(catalog, TABLES, store=store, sources=sources, unit_part_rows=1000)
    try:
        assert await converged(manager, sources)  # no part of the first run is left in the view
        assert manager.status("v")["counters"]["unit_parts"] == 0
    finally:
        await manager.stop()
