"""The manager's behaviour around the core: receiving, bad input, restart, commit modes,
batching, and SWEEP (p = 1), over in-process sources."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass

import pytest

from api.manager_errors import status_of
from api.metrics import view_progress
from contract.schemas import Change, Update
from tests.sim import Delays, SimSource, recompute, start_sim_manager
from warehouse.catalog.db import Catalog, NewUpdate, content_digest
from warehouse.errors import Refused
from warehouse.receiver import ReceiveError
from warehouse.store import StoreError
from warehouse.store.memory import MemoryStore

TABLES = {"a": {"R": ("k", "v TEXT")}, "b": {"S": ("k", "w")}}
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
        ("SELECT R.k, SUM(R.k) OVER () FROM a.R", 422, "window functions are not supported"),
        ("SELECT R.k, SUM(R.v) FROM a.R GROUP BY R.k", 422, r"SUM\(R.v\) needs a numeric column; R.v is TEXT"),
        ("SELECT R.v, COUNT(*) FROM a.R GROUP BY R.k", 422, "neither in GROUP BY nor in an aggregate"),
        ("SELECT R.k FROM a.R, nowhere.T", 422, "unknown relation"),
        ("SELECT R.k FROM a.R RIGHT JOIN b.S ON R.k = S.k", 422, "outer join"),
        ("SELECT R.nope FROM a.R", 422, "nope"),
    ],
)
async def test_bad_view_definitions(two_sources, sql, status, message):
    manager, _ = two_sources
    with pytest.raises(Refused, match=message) as info:
        await manager.define_view(sql, "bad")
    assert status_of(info.value) == status
    assert "bad" not in manager.views


async def test_duplicate_view_and_bad_settings(two_sources):
    manager, _ = two_sources
    await manager.define_view(VIEW, "v")
    with pytest.raises(Refused, match="already exists") as info:
        await manager.define_view(VIEW, "v")
    assert status_of(info.value) == 409
    with pytest.raises(Refused, match="parallelism"):
        await manager.define_view(VIEW, "w", parallelism=0)
    with pytest.raises(Refused, match="commit_mode"):
        await manager.define_view(VIEW, "w", commit_mode="sometimes")


async def test_as_of_beyond_watermark_is_refused(two_sources):
    manager, _ = two_sources
    await manager.define_view(VIEW, "v")
    await manager.wait_idle("v")
    with pytest.raises(Refused, match="beyond the view's watermark"):
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
    manager.pause_view("v")
    await queue_workload(manager, sources, 20)
    started = manager.view("v").maintainer.counters.units_started
    await manager.resume_view("v")
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
    # answers take 0-50 ms at random: wide enough that a later unit's answer often comes
    # before an earlier one's even when a busy machine adds its own milliseconds
    delays = Delays(before_snapshot=0.003, evaluation=0.05)
    manager, sources = await start_sim_manager(
        tmp_path / f"{mode}{seed}.db", TABLES, store=store, seed=seed, delays=delays
    )
    try:
        await manager.define_view(VIEW, "v", parallelism=6, commit_mode=mode)
        await manager.wait_idle("v")
        manager.pause_view("v")
        await queue_workload(manager, sources, 16)
        await manager.resume_view("v")
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
    some later unit is committed before an earlier one (and the result is still right).
    Whether a schedule shows it depends on timing, so up to 20 schedules are tried."""
    seen_disorder = False
    for seed in range(20):
        orders, ok = await commit_sequence(tmp_path, "out_of_order", seed)
        assert ok
        seen_disorder = orders != sorted(orders)
        if seen_disorder:
            break
    assert seen_disorder


async def test_restart_recovers_running_and_queued_units(tmp_path):
    """The manager dies with units running and queued; a new one on the same catalog and
    store finishes them, and the view is right as of every watermark."""
    store = MemoryStore()
    # slow enough that units still run 0.05 s after the last update, even on a busy machine
    slow = Delays(before_snapshot=0.01, evaluation=0.1)
    catalog = tmp_path / "catalog.db"
    manager, sources = await start_sim_manager(catalog, TABLES, store=store, delays=slow)
    sources["a"].load("R", [(0, "a0"), (1, "a1")])
    sources["b"].load("S", [(0, 0), (1, 1)])
    await manager.define_view(VIEW, "v", parallelism=3)
    await queue_workload(manager, sources, 14)
    await asyncio.sleep(0.05)
    assert not manager.view("v").maintainer.protocol.quiet  # work in flight
    at_crash = await manager.db(Catalog.units, "v")
    assert any(not u.committed for u in at_crash)
    await manager.stop()  # a crash: running units never commit

    manager2, _ = await start_sim_manager(catalog, TABLES, store=store, sources=sources)
    try:
        assert await converged(manager2, sources)
        units = await manager2.db(Catalog.units, "v")
        assert [u.order for u in units] == list(range(1, len(units) + 1))
        assert all(u.committed for u in units)
        assert not manager2.read("v").has_negative()
    finally:
        await manager2.stop()


class GatedStore(MemoryStore):
    """A memory store whose writes wait while its gate is closed (a slow Spark append):
    effects finished meanwhile pile up in the commit manager. Publishes have a gate of
    their own; a publish held when its process dies is abandoned (``abandon_held``)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()  # a write is held at the gate
        self.publish_gate = threading.Event()
        self.publish_gate.set()
        self.publish_waiting = threading.Event()
        self.abandon_held = False

    def commit(self, view, effects) -> None:
        if not self.gate.is_set():
            self.waiting.set()
            assert self.gate.wait(60), "the gate was never opened"
        super().commit(view, effects)

    def publish(self, view, watermark) -> None:
        if not self.publish_gate.is_set():
            self.publish_waiting.set()
            assert self.publish_gate.wait(60), "the publish gate was never opened"
            if self.abandon_held:
                return
        super().publish(view, watermark)


async def until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_ready_effects_are_committed_together_in_groups_of_at_most_commit_group_size(tmp_path):
    store = GatedStore()
    manager, sources = await start_sim_manager(tmp_path / "c.db", TABLES, store=store)
    manager.commit_group_size = 3
    try:
        sources["a"].load("R", [(0, "r0")])
        sources["b"].load("S", [(0, 0), (1, 10), (2, 20)])
        await manager.define_view(VIEW, "v", parallelism=8)
        await manager.wait_idle("v")
        counters = manager.view("v").maintainer.counters
        written = len(store.commit_log)
        before = (counters.group_sizes.count, counters.group_sizes.total)
        store.gate.clear()  # the next store write waits: the effects finished meanwhile wait with it
        for i in range(10):  # every insert joins: ten non-empty effects
            sources["a"].commit([("R", 1, (i % 3, f"n{i}"))])
            await sources["a"].ship()
        await until(lambda: counters.units_maintained == 11 and store.waiting.is_set())
        store.gate.set()
        assert await converged(manager, sources)
        groups = [len(g) for g in store.commit_log[written:]]
        assert sum(groups) == 10
        assert max(groups) > 1, groups  # ready together: one store write for several effects
        assert max(groups) <= 3, groups  # never more than commit_group_size
        assert len(groups) < 10
        # what the metrics histogram shows: one observation per store write, of its size
        assert counters.group_sizes.count - before[0] >= len(groups)
        assert counters.group_sizes.total - before[1] == sum(groups)
    finally:
        await manager.stop()


async def test_lag_seconds_counts_updates_not_visible_at_the_watermark(tmp_path):
    """lag_seconds is the age of the oldest update received but not visible at W: it keeps
    growing while the update's unit runs and while its effect waits to be committed, not
    only while the update is queued, and is 0 once W covers it."""
    store = GatedStore()
    manager, sources = await start_sim_manager(tmp_path / "c.db", TABLES, store=store)
    try:
        sources["a"].load("R", [(1, "x")])
        sources["b"].load("S", [(1, 10)])
        await manager.define_view(VIEW, "v")
        await manager.wait_idle("v")
        assert manager.status("v")["lag_seconds"] == 0.0
        handle = manager.view("v")
        answer, asked, answering = sources["b"].subquery, asyncio.Event(), asyncio.Event()

        async def held(q):
            asked.set()
            await answering.wait()
            return await answer(q)

        sources["b"].subquery = held
        store.gate.clear()
        sources["a"].commit([("R", 1, (1, "z"))])
        await sources["a"].ship()
        await asyncio.wait_for(asked.wait(), 10)
        await asyncio.sleep(0.3)
        status = manager.status("v")
        assert (status["updates_queued"], status["units_running"], status["watermark"]) == (0, 1, 1)
        assert status["lag_seconds"] >= 0.25, status  # its unit runs: not visible at W
        assert view_progress(handle)["lag_seconds"] >= 0.25  # what the API and /metrics show

        answering.set()  # maintained, but its commit is held: still above W
        await until(lambda: handle.maintainer.counters.units_maintained == 2 and store.waiting.is_set())
        await asyncio.sleep(0.1)
        status = manager.status("v")
        assert (status["updates_queued"], status["units_running"], status["watermark"]) == (0, 0, 1)
        assert status["lag_seconds"] >= 0.35, status

        store.gate.set()
        await manager.wait_idle("v")
        assert manager.watermark("v") == 2
        assert manager.status("v")["lag_seconds"] == 0.0 == view_progress(handle)["lag_seconds"]
    finally:
        store.gate.set()
        await manager.stop()


@dataclass
class ReportingSource(SimSource):
    """An in-process source whose wrapper reports its capture method in its health."""

    method: str = "trigger"

    async def health(self) -> dict:
        return {"ok": True, "source": self.name, "last_seq": 0, "pending": 0, "capture": {"method": self.method}}


async def test_source_registration_checks_the_capture_method(tmp_path):
    manager, _ = await start_sim_manager(tmp_path / "c.db", {})
    manager.connect = lambda name, url: ReportingSource(name, {"T": ("k", "v")}, random.Random(0), method="timestamp")
    try:
        with pytest.raises(
            Refused, match="unknown capture method 'binlog'.*trigger, log, timestamp, application, snapshot"
        ) as info:
            await manager.add_source("c", "http://c.invalid", capture="binlog")
        assert status_of(info.value) == 422
        with pytest.raises(Refused, match="capture 'trigger' was given.*reports capture method 'timestamp'") as info:
            await manager.add_source("c", "http://c.invalid", capture="trigger")
        assert status_of(info.value) == 422
        with pytest.raises(Refused, match="no captured table.*nope.*captures: T") as info:
            await manager.add_source("c", "http://c.invalid", capture="timestamp", tables=["nope"])
        assert status_of(info.value) == 422
        assert "c" not in manager.clients and await manager.db(Catalog.sources) == {}  # nothing registered
        await manager.add_source("c", "http://c.invalid", capture="timestamp")
        assert (await manager.db(Catalog.sources))["c"].capture == "timestamp"
    finally:
        await manager.stop()


async def test_restart_publishes_the_watermark_the_catalog_recorded(tmp_path):
    """The process dies after recording the initial load's commit but before publishing it:
    the next start publishes it, and the view becomes active."""
    store = GatedStore()
    store.publish_gate.clear()
    catalog = tmp_path / "c.db"
    manager, sources = await start_sim_manager(catalog, TABLES, store=store)
    sources["a"].load("R", [(1, "x")])
    sources["b"].load("S", [(1, 10)])
    await manager.define_view(VIEW, "v")
    await until(store.publish_waiting.is_set)
    assert [u.committed for u in await manager.db(Catalog.units, "v")] == [True]
    assert manager.status("v")["state"] == "initializing"
    await manager.stop()
    store.abandon_held = True
    store.publish_gate.set()

    manager2, _ = await start_sim_manager(catalog, TABLES, store=store, sources=sources)
    try:
        await manager2.wait_idle("v")
        assert store.published("v") == manager2.watermark("v") == 1
        assert manager2.status("v")["state"] == "active"
        assert sorted(manager2.read_rows("v")) == [(1, "x", 10)]
    finally:
        await manager2.stop()


class TypedStore(MemoryStore):
    """A memory store that refuses what the Spark store's column types cannot hold (text in
    a DOUBLE column, here)."""

    def __init__(self) -> None:
        super().__init__()
        self.types: dict[str, tuple[str | None, ...]] = {}

    def create(self, view, columns, types=None, summed=None) -> None:
        super().create(view, columns, types, summed)
        self.types[view] = tuple(types or ())

    def commit(self, view, effects) -> None:
        for effect in effects:
            for row in effect.delta.rows():
                if any(t == "DOUBLE" and isinstance(v, str) for v, t in zip(row, self.types[view])):
                    raise StoreError(f"values do not fit the view's column types: could not convert {row}")
        super().commit(view, effects)


async def test_a_logged_value_the_store_refuses_fails_the_view_saying_what_to_do(tmp_path):
    """An update logged before the manager checked values on receipt: the view fails naming
    the column, the update and the way out, and a resume fails the same way."""
    tables = {"a": {"R": ("k", "v DOUBLE")}, "b": {"S": ("k", "w")}}
    store, catalog = TypedStore(), tmp_path / "c.db"
    manager, sources = await start_sim_manager(catalog, tables, store=store)
    sources["a"].load("R", [(1, 0.5)])
    sources["b"].load("S", [(1, 10), (2, 20)])
    await manager.define_view(VIEW, "v")
    await manager.wait_idle("v")
    seq = manager.receiver.released_through("a") + 1
    await manager.stop()
    changes = [{"relation": "R", "sign": 1, "row": {"k": 2, "v": "oops"}}]
    logged_by_an_older_manager = Catalog(f"sqlite:///{catalog}")
    try:
        logged_by_an_older_manager.append_updates("a", [NewUpdate(seq, changes, None, None, content_digest(changes))])
    finally:
        logged_by_an_older_manager.close()

    manager2, _ = await start_sim_manager(catalog, tables, store=store, sources=sources)
    try:
        for attempt in ("after the restart", "after resume"):
            await manager2.wait_idle("v")
            status = manager2.status("v")
            assert status["state"] == "failed", attempt
            assert all(
                words in status["error"]
                for words in (
                    "view 'v', column 'v'",
                    "a text value in a column declared DOUBLE",
                    f"update(s) seq {seq} of source 'a'",
                    "drop and define the view again",
                )
            ), status["error"]
            assert "oops" not in status["error"]
            await manager2.resume_view("v")
        await manager2.drop_view("v")  # the way out: the new view's initial load reads the sources
        await manager2.define_view(VIEW, "v")
        await manager2.wait_idle("v")
        assert manager2.status("v")["state"] == "active"
        assert sorted(manager2.read_rows("v")) == [(1, 0.5, 10)]
    finally:
        await manager2.stop()


async def test_counters_do_not_grow_with_the_units_maintained(tmp_path):
    """A manager that runs for months keeps the same few numbers per view: histograms of
    bucket counts, not a list entry per unit, subquery or commit group."""
    import pickle

    manager, sources = await start_sim_manager(tmp_path / "c.db", TABLES)
    try:
        sources["a"].load("R", [(0, "r0")])
        sources["b"].load("S", [(0, 0), (1, 10)])
        await manager.define_view(VIEW, "v", parallelism=4)
        await manager.wait_idle("v")
        counters = manager.view("v").maintainer.counters

        async def maintain(n: int) -> int:
            for i in range(n):
                sources["a"].commit([("R", 1, (i % 2, f"n{i}"))])
                await sources["a"].ship()
            await manager.wait_idle("v")
            return len(pickle.dumps(counters))

        after_few = await maintain(10)
        units = counters.units_committed
        after_many = await maintain(200)
        assert counters.units_committed >= units + 200 and counters.subqueries > 200
        assert after_many == after_few, (after_few, after_many)
    finally:
        await manager.stop()


async def test_the_managers_health_names_sources_whose_capture_is_blocked(tmp_path):
    """A wrapper whose capture keeps failing ships nothing: the views look idle, not stalled,
    so the manager asks every wrapper for its health and names such sources in its own."""
    import httpx

    from api.manager_app import create_app

    manager, sources = await start_sim_manager(tmp_path / "c.db", TABLES, source_watch_s=0.05)
    blocked = {"loop": "capturing and shipping", "error": "no such table: _pvm_outbox", "since": 1.0, "attempts": 3}

    async def blocked_health() -> dict:
        return {"ok": False, "blocked": blocked}

    async def no_answer() -> dict:
        raise ConnectionError("connection refused")

    try:
        app = create_app(manager)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://manager") as api:
            assert (await api.get("/v1/health")).json()["problems"] == []
            sources["a"].health = blocked_health
            sources["b"].health = no_answer
            await until(lambda: len(manager.source_problems()) == 2, timeout=5)
            problems = (await api.get("/v1/health")).json()["problems"]
            assert problems == [
                "source 'a': capture blocked (capturing and shipping, 3 attempts): no such table: _pvm_outbox",
                "source 'b': its wrapper does not answer (ConnectionError: connection refused)",
            ]
            ready = await api.get("/v1/ready")  # reported there too, without making the manager unready
            assert ready.status_code == 200 and ready.json()["sources"] == problems
    finally:
        await manager.stop()


class RefusingStore(MemoryStore):
    """A store whose ``create`` fails after the view passed every check (a full disk, say)."""

    def create(self, view, columns, types=None, summed=None) -> None:
        raise StoreError("no space left on the store's volume")


async def test_a_definition_that_fails_half_way_leaves_nothing_behind(tmp_path):
    catalog = tmp_path / "c.db"
    manager, sources = await start_sim_manager(catalog, TABLES, store=RefusingStore())
    try:
        with pytest.raises(StoreError, match="no space"):
            await manager.define_view(VIEW, "v")
        assert "v" not in manager.views
        assert await manager.db(Catalog.views) == {}
        for source in sources.values():  # the sources no longer capture for the view
            assert source.interest.relations == {}
    finally:
        await manager.stop()
    manager2, _ = await start_sim_manager(catalog, TABLES, sources=sources)
    try:
        assert "v" not in manager2.views
        await manager2.define_view(VIEW, "v")
        await manager2.wait_idle("v")
        assert manager2.status("v")["state"] == "active"
    finally:
        await manager2.stop()


async def test_a_change_log_kept_past_the_warning_is_named_and_measured(tmp_path):
    """Log capture: a stopped or slow wrapper makes its database keep change log (a slot's
    WAL) without limit; past ``change_log_warning_bytes`` the manager's health names the
    source and ``/metrics`` flags it."""
    import httpx

    from api.manager_app import create_app

    manager, sources = await start_sim_manager(
        tmp_path / "c.db", TABLES, source_watch_s=0.05, change_log_warning_bytes=1 << 20
    )
    kept = {"a": 512, "b": 3 << 20}

    def log_health(name: str):
        async def health() -> dict:
            return {"ok": True, "capture": {"method": "log", "retained_wal_bytes": kept[name], "unread_wal_bytes": 0}}

        return health

    try:
        app = create_app(manager)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://manager") as api:
            for name in ("a", "b"):
                sources[name].health = log_health(name)
            await until(lambda: len(manager.source_problems()) == 1, timeout=5)
            [problem] = (await api.get("/v1/health")).json()["problems"]
            assert problem.startswith("source 'b': its database keeps 3 MiB of change log") and "uninstall" in problem
            metrics = (await api.get("/metrics")).text
            assert 'pvm_source_change_log_bytes{source="a"} 512.0' in metrics
            assert 'pvm_source_change_log_bytes{source="b"} 3.145728e+06' in metrics
            assert 'pvm_source_change_log_warning{source="a"} 0.0' in metrics
            assert 'pvm_source_change_log_warning{source="b"} 1.0' in metrics
    finally:
        await manager.stop()
