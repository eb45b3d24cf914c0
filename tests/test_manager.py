"""The manager's behaviour around the core: receiving, bad input, restart, commit modes,
batching, and SWEEP (p = 1), over in-process sources."""

from __future__ import annotations

import asyncio

import pytest

from api.schemas import Change, Update
from tests.sim import Delays, recompute, start_sim_manager
from warehouse.manager import ManagerError
from warehouse.receiver import ReceiveError
from warehouse.store.memory import MemoryStore

TABLES = {"a": {"R": ("k", "v")}, "b": {"S": ("k", "w")}}
VIEW = "SELECT R.k, R.v, S.w FROM a.R, b.S WHERE R.k = S.k"


def update(seq: int, relation: str, sign: int, row: dict) -> Update:
    return Update(seq=seq, changes=[Change(relation=relation, sign=sign, row=row)])


def contents(sources) -> dict:
    return {(s, t): z for s, src in sources.items() for t, z in src.state.items()}


def columns(sources) -> dict:
    return {(s, t): cols for s, src in sources.items() for t, cols in src.tables.items()}


async def converged(manager, sources, view="v") -> bool:
    for s in sources.values():
        await s.ship()
    await manager.wait_idle(view, timeout=30)
    expected = recompute(manager.view(view).plan, contents(sources), columns(sources))
    return manager.read(view) == expected


@pytest.fixture
async def two_sources(tmp_path):
    manager, sources = await start_sim_manager(tmp_path / "catalog.db", TABLES)
    sources["a"].load("R", [(1, "x"), (2, "y")])
    sources["b"].load("S", [(1, 10), (2, 20), (2, 21)])
    yield manager, sources
    await manager.stop()


async def test_initial_load_over_existing_data(two_sources):
    manager, sources = two_sources
    await manager.define_view(VIEW, "v")
    await manager.wait_idle("v")
    assert sorted(manager.read("v").expand()) == [(1, "x", 10), (2, "y", 20), (2, "y", 21)]
    assert manager.status("v")["state"] == "active"


async def test_resent_update_is_applied_once(two_sources):
    manager, sources = two_sources
    await manager.define_view(VIEW, "v")
    await manager.wait_idle("v")
    base = manager.receiver.released_through("a")
    u = update(base + 1, "R", 1, {"k": 1, "v": "z"})
    first = await manager.receive("a", [u])
    again = await manager.receive("a", [u])
    assert first.through == again.through == base + 1
    await manager.wait_idle("v")
    assert manager.read("v").weight((1, "z", 10)) == 1


async def test_gap_is_held_until_filled(two_sources):
    manager, sources = two_sources
    await manager.define_view(VIEW, "v")
    await manager.wait_idle("v")
    base = manager.receiver.released_through("a")
    ack = await manager.receive("a", [update(base + 2, "R", 1, {"k": 2, "v": "late"})])
    assert ack.through == base and ack.held == [base + 2]
    await manager.wait_idle("v")
    assert manager.read("v").weight((2, "late", 20)) == 0  # not applied past the gap
    ack = await manager.receive("a", [update(base + 1, "R", -1, {"k": 1, "v": "x"})])
    assert ack.through == base + 2 and ack.held == []
    await manager.wait_idle("v")
    assert manager.read("v").weight((2, "late", 20)) == 1
    assert manager.read("v").weight((1, "x", 10)) == 0


@pytest.mark.parametrize(
    "source, changes, message",
    [
        ("nowhere", [("R", {"k": 1, "v": "x"})], "unknown source 'nowhere'"),
        ("a", [("Nope", {"k": 1})], "unknown relation 'Nope'"),
        ("a", [("R", {"k": 1, "v": "x", "extra": 3})], "no column"),
        ("a", [("R", {"k": 1})], "lacks column"),
    ],
)
async def test_bad_updates_are_refused_and_nothing_is_lost(two_sources, source, changes, message):
    manager, sources = two_sources
    await manager.define_view(VIEW, "v")
    await manager.wait_idle("v")
    before = manager.read("v")
    base = manager.receiver.released_through("a")
    good = update(base + 1, "R", 1, {"k": 2, "v": "ok"})
    bad = Update(seq=base + 2, changes=[Change(relation=r, sign=1, row=row) for r, row in changes])
    with pytest.raises(ReceiveError, match=message):
        await manager.receive(source, [good, bad])
    assert manager.receiver.released_through("a") == base  # the whole batch was refused
    await manager.wait_idle("v")
    assert manager.read("v") == before
    assert (await manager.receive("a", [good])).through == base + 1


@pytest.mark.parametrize(
    "sql, status, message",
    [
        ("SELECT R.k, COUNT(*) FROM a.R GROUP BY R.k", 422, "not supported"),
        ("SELECT R.k FROM a.R, nowhere.T", 422, "unknown relation"),
        ("SELECT R.k FROM a.R LEFT JOIN b.S ON R.k = S.k", 422, "outer join"),
        ("SELECT R.nope FROM a.R", 422, "nope"),
    ],
)
async def test_bad_view_definitions(two_sources, sql, status, message):
    manager, _ = two_sources
    with pytest.raises(ManagerError, match=message) as info:
        await manager.define_view(sql, "bad")
    assert info.value.status == status
    assert "bad" not in manager.views


async def test_duplicate_view_and_bad_settings(two_sources):
    manager, _ = two_sources
    await manager.define_view(VIEW, "v")
    with pytest.raises(ManagerError, match="already exists") as info:
        await manager.define_view(VIEW, "v")
    assert info.value.status == 409
    with pytest.raises(ManagerError, match="parallelism"):
        await manager.define_view(VIEW, "w", parallelism=0)
    with pytest.raises(ManagerError, match="commit_mode"):
        await manager.define_view(VIEW, "w", commit_mode="sometimes")


async def test_as_of_beyond_watermark_is_refused(two_sources):
    manager, _ = two_sources
    await manager.define_view(VIEW, "v")
    await manager.wait_idle("v")
    with pytest.raises(ManagerError, match="beyond the view's watermark"):
        manager.read("v", as_of=manager.watermark("v") + 5)


async def queue_workload(manager, sources, n: int) -> None:
    """n single-row transactions alternating between the sources, shipped while paused."""
    for i in range(n):
        if i % 2 == 0:
            sources["a"].commit([("R", 1, (i % 3, f"r{i}"))])
            await sources["a"].ship()
        else:
            sources["b"].commit([("S", 1, (i % 3, i))])
            await sources["b"].ship()


async def test_batching_maintains_fewer_units(two_sources):
    manager, sources = two_sources
    await manager.define_view(VIEW, "v", parallelism=2, batch_size=8)
    await manager.wait_idle("v")
    manager.view("v").maintainer.pause()
    await queue_workload(manager, sources, 20)
    started = manager.view("v").maintainer.counters.units_started
    manager.view("v").maintainer.resume()
    assert await converged(manager, sources)
    units = manager.view("v").maintainer.counters.units_started - started
    assert units < 20 and units >= 2  # one source's queued updates share a unit


async def test_sweep_runs_one_unit_at_a_time(tmp_path):
    manager, sources = await start_sim_manager(tmp_path / "c.db", TABLES, delays=Delays(evaluation=0.002))
    try:
        await manager.define_view(VIEW, "v", parallelism=1)
        await queue_workload(manager, sources, 12)
        assert await converged(manager, sources)
        assert manager.view("v").maintainer.counters.peak_running == 1
    finally:
        await manager.stop()


async def commit_sequence(tmp_path, mode: str, seed: int) -> tuple[list[int], bool]:
    store = MemoryStore()
    delays = Delays(before_snapshot=0.003, evaluation=0.006)
    manager, sources = await start_sim_manager(tmp_path / f"{mode}{seed}.db", TABLES, store=store, seed=seed, delays=delays)
    try:
        await manager.define_view(VIEW, "v", parallelism=6, commit_mode=mode)
        await manager.wait_idle("v")
        manager.view("v").maintainer.pause()
        await queue_workload(manager, sources, 16)
        manager.view("v").maintainer.resume()
        ok = await converged(manager, sources)
        return [o for group in store.commit_log for o in group], ok
    finally:
        await manager.stop()


async def test_arrival_mode_commits_in_order(tmp_path):
    for seed in range(3):
        orders, ok = await commit_sequence(tmp_path, "arrival", seed)
        assert ok and orders == sorted(orders)


async def test_out_of_order_mode_commits_out_of_order(tmp_path):
    """The PVM default commits as soon as an effect is ready: with random subquery delays,
    some later unit is committed before an earlier one (and the result is still right)."""
    seen_disorder = False
    for seed in range(6):
        orders, ok = await commit_sequence(tmp_path, "out_of_order", seed)
        assert ok
        seen_disorder |= orders != sorted(orders)
    assert seen_disorder


async def test_restart_recovers_running_and_queued_units(tmp_path):
    """The manager dies with units running and queued; a new one on the same catalog and
    store finishes them, and the view is right as of every watermark."""
    store = MemoryStore()
    slow = Delays(before_snapshot=0.01, evaluation=0.02)
    catalog = tmp_path / "catalog.db"
    manager, sources = await start_sim_manager(catalog, TABLES, store=store, delays=slow)
    sources["a"].load("R", [(0, "a0"), (1, "a1")])
    sources["b"].load("S", [(0, 0), (1, 1)])
    await manager.define_view(VIEW, "v", parallelism=3)
    await queue_workload(manager, sources, 14)
    await asyncio.sleep(0.05)
    assert not manager.view("v").maintainer.protocol.quiet  # work in flight
    at_crash = await manager.db("units", "v")
    assert any(not u.committed for u in at_crash)
    await manager.stop()  # a crash: running units never commit

    manager2, _ = await start_sim_manager(catalog, TABLES, store=store, sources=sources)
    try:
        assert await converged(manager2, sources)
        units = await manager2.db("units", "v")
        assert [u.order for u in units] == list(range(1, len(units) + 1))
        assert all(u.committed for u in units)
        assert not manager2.read("v").has_negative()
    finally:
        await manager2.stop()
