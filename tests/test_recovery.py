"""Views recover from faults, over in-process sources and the HTTP API (ASGI).

A transient fault (a wrapper unreachable past its client's retries, the store's JVM gone
for a while) is retried with backoff and shown in the view's status, never remembered as
``failed``; a fault that needs a person fails the view, and ``resume`` (or a restart) runs
its unfinished units again with their order numbers. A restart keeps the PPU limit, a paused
or failed view keeps its queue in the update log only, readiness reports a dead store and a
stalled view, and verifications run one at a time per view and within the manager's limit.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import httpx
import pytest
from py4j.protocol import Py4JNetworkError

import warehouse.maintainer
import warehouse.manager
from api.auth import issue
from api.manager_app import create_app
from contract.schemas import Subquery, SubqueryAnswer
from pvm.client.view import _show as show_view
from tests.sim import Delays, SimSource, recompute, start_sim_manager
from tests.test_oracle import TABLES as ORACLE_TABLES
from tests.test_oracle import VIEWS as ORACLE_VIEWS
from tests.test_oracle import check_view, random_row, random_transaction
from warehouse.backoff import Backoff
from warehouse.catalog.db import Catalog
from warehouse.sources import SourceError
from warehouse.store.base import StoreError
from warehouse.store.memory import MemoryStore

TABLES = {"a": {"R": ("k", "v TEXT")}, "b": {"S": ("k", "w")}}
VIEW = "SELECT R.k, R.v, S.w FROM a.R, b.S WHERE R.k = S.k"
FAST = Backoff(first_s=0.01, max_s=0.05)


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def expected(manager, sources, view: str = "v"):
    contents = {(s, t): z for s, src in sources.items() for t, z in src.state.items()}
    columns = {(s, t): c for s, src in sources.items() for t, c in src.tables.items()}
    return recompute(manager.view(view).plan, contents, columns)


async def converged(manager, sources, view: str = "v") -> bool:
    for s in sources.values():
        await s.ship()
    await manager.wait_idle(view, timeout=30)
    return manager.read(view) == expected(manager, sources, view)


def fail_subqueries(source: SimSource, error: Exception, fixed: asyncio.Event) -> list[float]:
    """The source's subqueries fail with ``error`` until ``fixed`` is set; returns the times
    of the failed attempts."""
    answer, failures = source.subquery, []

    async def failing(q: Subquery) -> SubqueryAnswer:
        if not fixed.is_set():
            failures.append(time.monotonic())
            raise error
        return await answer(q)

    source.subquery = failing  # type: ignore[method-assign]
    return failures


def change_r(sources, i: int) -> None:
    sources["a"].commit([("R", 1, (i % 3, f"n{i}"))])


@dataclass
class Env:
    manager: object
    sources: dict[str, SimSource]
    client: httpx.AsyncClient
    admin: dict[str, str]


@asynccontextmanager
async def served(tmp_path, store=None, catalog: str = "catalog.db", sources=None) -> AsyncIterator[Env]:
    """A manager over in-process sources (p = 2, quick retries, view ``v`` defined over
    loaded sources when new) and an ASGI client of its API with an admin token."""
    manager, sources = await start_sim_manager(tmp_path / catalog, TABLES, store=store, sources=sources)
    manager.backoff = FAST
    try:
        if "v" not in manager.views:
            sources["a"].load("R", [(0, "x"), (1, "y")])
            sources["b"].load("S", [(0, 0), (1, 10), (2, 20)])
            await manager.define_view(VIEW, "v", parallelism=2)
            await manager.wait_idle("v")
        admin = {"Authorization": f"Bearer {(await issue(manager, 'admin'))[1]}"}
        transport = httpx.ASGITransport(app=create_app(manager))
        async with httpx.AsyncClient(transport=transport, base_url="http://pvm.test") as client:
            yield Env(manager, sources, client, admin)
    finally:
        await manager.stop()


async def state_in_catalog(manager, view: str = "v") -> str:
    return (await manager.db(Catalog.views))[view].state


# -- transient faults are retried ---------------------------------------------------------------


async def test_a_source_unreachable_past_its_retries_is_retried_not_failed(tmp_path, capsys):
    async with served(tmp_path) as env:
        manager, sources = env.manager, env.sources
        fixed = asyncio.Event()
        failures = fail_subqueries(sources["b"], aiohttp.ClientConnectionError("wrapper of b unreachable"), fixed)
        change_r(sources, 1)
        await sources["a"].ship()
        await until(lambda: len(failures) >= 3)
        view = (await env.client.get("/v1/views/v", headers=env.admin)).json()
        assert view["state"] == "active" and view["error"] is None, view
        assert view["retrying"]["attempts"] >= 2 and view["retrying"]["steps"] == 1, view
        assert view["retrying"]["error"] == "ClientConnectionError: wrapper of b unreachable"
        show_view(view)  # what `pvm view show v` prints
        assert "retrying" in capsys.readouterr().out
        assert await state_in_catalog(manager) == "active"
        health = (await env.client.get("/v1/health")).json()
        assert any("view 'v' retrying" in p for p in health["problems"]), health
        gaps = [b - a for a, b in itertools.pairwise(failures)]
        assert gaps[-1] >= FAST.first_s  # backoff between attempts

        fixed.set()
        assert await converged(manager, sources)
        view = (await env.client.get("/v1/views/v", headers=env.admin)).json()
        assert view["state"] == "active" and view["retrying"] is None
        assert view["counters"]["retries"] >= 3
        metrics = (await env.client.get("/metrics")).text
        assert f'pvm_view_retries_total{{view="v"}} {float(view["counters"]["retries"])}' in metrics


class FlakyStore(MemoryStore):
    """Writes fail as py4j fails once the Spark JVM has died, while ``down`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.down = threading.Event()
        self.failed_writes = 0

    def _check(self) -> None:
        if self.down.is_set():
            self.failed_writes += 1
            raise Py4JNetworkError("An error occurred while trying to connect to the Java server (127.0.0.1:40123)")

    def commit(self, view, effects) -> None:
        self._check()
        super().commit(view, effects)

    def publish(self, view, watermark) -> None:
        self._check()
        super().publish(view, watermark)


async def test_a_store_that_fails_for_a_while_is_retried_and_nothing_is_applied_twice(tmp_path):
    store = FlakyStore()
    async with served(tmp_path, store) as env:
        manager, sources = env.manager, env.sources
        before = manager.watermark("v")
        store.down.set()
        for i in range(5):
            change_r(sources, i)
            await sources["a"].ship()
        await until(lambda: store.failed_writes >= 3)
        status = manager.status("v")
        assert status["state"] == "active" and status["watermark"] == before, status
        assert "Py4JNetworkError" in status["retrying"]["error"], status
        assert await state_in_catalog(manager) == "active"

        store.down.clear()
        assert await converged(manager, sources)
        assert manager.watermark("v") == before + 5 == store.published("v")
        orders = [o for group in store.commit_log for o in group]
        assert sorted(orders) == sorted(set(orders))  # every effect written once
        assert manager.status("v")["retrying"] is None


# -- faults that need a person fail the view; resume and restarts retry it -------------------------


class RefusingStore(MemoryStore):
    """Refuses to publish (a request the store cannot serve) while ``refusing``."""

    refusing = False

    def publish(self, view, watermark) -> None:
        if self.refusing:
            raise StoreError(f"cannot publish {watermark} of view {view!r}")
        super().publish(view, watermark)


async def test_a_view_that_failed_to_publish_publishes_on_resume(tmp_path):
    store = RefusingStore()
    async with served(tmp_path, store) as env:
        manager, sources = env.manager, env.sources
        store.refusing = True
        change_r(sources, 1)
        await sources["a"].ship()
        await until(lambda: manager.status("v")["state"] == "failed")
        assert "cannot publish 2" in manager.status("v")["error"]
        assert (manager.watermark("v"), store.published("v")) == (2, 1)  # committed, not shown

        store.refusing = False
        await manager.resume_view("v")
        await until(lambda: store.published("v") == 2)
        assert manager.status("v")["state"] == "active"
        assert await converged(manager, sources)
        assert sorted(manager.read_rows("v")) == sorted(expected(manager, sources).expand())


async def test_a_failed_view_is_retried_by_resume_with_its_order_numbers(tmp_path):
    async with served(tmp_path) as env:
        manager, sources, client = env.manager, env.sources, env.client
        fixed = asyncio.Event()
        fail_subqueries(sources["b"], SourceError("source 'b' refused POST /v1/subquery: unknown column 'w'"), fixed)
        change_r(sources, 1)
        await sources["a"].ship()
        await until(lambda: manager.status("v")["state"] == "failed")
        for i in range(2, 12):  # arrive while it is failed: kept in the update log only
            change_r(sources, i)
            await sources["a"].ship()
        view = (await client.get("/v1/views/v", headers=env.admin)).json()
        assert "unknown column 'w'" in view["error"] and view["units_waiting"] == 1, view
        assert view["updates_queued"] == 10 and len(manager.view("v").maintainer.protocol.umq) == 0
        assert await state_in_catalog(manager) == "failed"
        health = (await client.get("/v1/health")).json()
        assert any("view 'v' failed" in p and "unknown column" in p for p in health["problems"]), health
        started = await manager.db(Catalog.units, "v")

        fixed.set()  # the person fixed the source
        resumed = await client.post("/v1/views/v/resume", headers=env.admin)
        assert resumed.status_code == 200, resumed.text
        assert await converged(manager, sources)
        units = await manager.db(Catalog.units, "v")
        assert [u.order for u in units] == list(range(1, len(units) + 1)) and all(u.committed for u in units)
        assert [(u.order, u.log_ids) for u in started] == [(u.order, u.log_ids) for u in units[: len(started)]]
        view = (await client.get("/v1/views/v", headers=env.admin)).json()
        assert (view["state"], view["error"], view["units_waiting"]) == ("active", None, 0), view
        assert await state_in_catalog(manager) == "active"
        assert await check_view(manager, "v", sources, check_history=True) == []


async def test_a_view_recorded_failed_is_tried_again_after_a_restart(tmp_path):
    store = MemoryStore()
    async with served(tmp_path, store) as env:
        sources = env.sources
        fixed = asyncio.Event()
        fail_subqueries(sources["b"], SourceError("source 'b' refused POST /v1/subquery: 401"), fixed)
        change_r(sources, 1)
        await sources["a"].ship()
        await until(lambda: env.manager.status("v")["state"] == "failed")
    fixed.set()  # fixed while the manager was down

    async with served(tmp_path, store, sources=sources) as env:
        assert env.manager.status("v")["state"] != "failed"
        assert await converged(env.manager, sources)
        assert env.manager.status("v")["state"] == "active"
        assert await state_in_catalog(env.manager) == "active"


# -- a restart keeps the PPU limit -----------------------------------------------------------------


class HeldStore(MemoryStore):
    """Writes wait while ``held``; a write still waiting when its process dies is never made."""

    def __init__(self) -> None:
        super().__init__()
        self.open = threading.Event()
        self.open.set()
        self.abandoned = False

    def commit(self, view, effects) -> None:
        if not self.open.is_set():
            assert self.open.wait(60), "never opened"
            if self.abandoned:
                return
        super().commit(view, effects)


async def restart_schedule(tmp_path, seed: int) -> tuple[list[str], dict[str, tuple[int, int, int]]]:
    """The oracle's workload and views; commits are held while updates are maintained, the
    manager dies with every unit since uncommitted, and a new one finishes the work. Returns
    the oracle's mismatches and, per view, (p, units recovered, peak running after restart)."""
    rng = random.Random(seed)
    store = HeldStore()
    catalog = tmp_path / f"catalog-{seed}-{uuid.uuid4().hex[:8]}.db"
    delays = Delays(before_snapshot=0.002, evaluation=0.003, shipping=0.001)
    manager, sources = await start_sim_manager(catalog, ORACLE_TABLES, store, seed=seed, delays=delays)
    for s in sources.values():
        for t, cols in s.tables.items():
            s.load(t, [random_row(rng, len(cols)) for _ in range(6)])
    for name, sql in ORACLE_VIEWS.items():
        await manager.define_view(
            sql,
            name=name,
            parallelism=rng.choice([1, 2, 3]),
            batch_size=rng.choice([1, 1, 2]),
            commit_mode=rng.choice(["out_of_order", "arrival"]),
        )
        await manager.wait_idle(name)

    async def workload(transactions: int) -> None:
        for _ in range(transactions):
            source = rng.choice(list(sources.values()))
            source.commit(random_transaction(rng, source))
            await source.ship()

    store.open.clear()
    await workload(16)
    await until(lambda: all(manager.view(v).maintainer.protocol.quiet for v in ORACLE_VIEWS))
    uncommitted = {v: sum(not u.committed for u in await manager.db(Catalog.units, v)) for v in ORACLE_VIEWS}
    await manager.stop()  # the crash: nothing since the hold is committed
    store.abandoned = True
    store.open.set()

    manager, _ = await start_sim_manager(catalog, ORACLE_TABLES, store, sources=sources)
    try:
        await workload(8)
        for s in sources.values():
            await s.ship()
        mismatches: list[str] = []
        shape = {}
        for name in ORACLE_VIEWS:
            await manager.wait_idle(name, timeout=60)
            mismatches += await check_view(manager, name, sources, check_history=True)
            maintainer = manager.view(name).maintainer
            shape[name] = (maintainer.protocol.parallelism, uncommitted[name], maintainer.counters.peak_running)
        return mismatches, shape
    finally:
        await manager.stop()


@pytest.mark.parametrize("seed", range(6))
async def test_a_restart_keeps_the_ppu_limit_and_the_view_stays_right(tmp_path, monkeypatch, seed):
    monkeypatch.setattr(warehouse.manager, "LOG_IDS_PER_READ", 4)  # the units' updates read in several parts
    mismatches, shape = await restart_schedule(tmp_path, seed)
    assert not mismatches, "\n".join(mismatches)
    assert any(recovered > p for p, recovered, _ in shape.values()), shape  # more than p waited
    assert all(peak <= p for p, _, peak in shape.values()), shape


# -- a held view keeps its queue in the update log -------------------------------------------------


async def test_a_paused_view_keeps_no_queue_in_memory_and_resume_maintains_it_all(tmp_path):
    async with served(tmp_path) as env:
        manager, sources, client = env.manager, env.sources, env.client
        assert (await client.post("/v1/views/v/pause", headers=env.admin)).status_code == 200
        for i in range(200):
            change_r(sources, i)
            await sources["a"].ship()
        protocol = manager.view("v").maintainer.protocol
        view = (await client.get("/v1/views/v", headers=env.admin)).json()
        assert len(protocol.umq) == 0 and view["updates_queued"] == 200 and view["lag_updates"] == 200, view
        assert view["lag_seconds"] > 0

        async def more() -> None:  # arriving while the queue is read back
            for i in range(200, 230):
                change_r(sources, i)
                await sources["a"].ship()
                await asyncio.sleep(0.001)

        arriving = asyncio.create_task(more())
        resumed = await client.post("/v1/views/v/resume", headers=env.admin)
        assert resumed.status_code == 200, resumed.text
        await arriving
        assert await converged(manager, sources)
        units = await manager.db(Catalog.units, "v")
        maintained = sorted(i for u in units for i in u.log_ids)
        assert len(maintained) == len(set(maintained)) == 230  # each update once
        assert await check_view(manager, "v", sources, check_history=True) == []


async def test_a_backlog_past_the_queue_budget_is_maintained_from_the_log_in_chunks(tmp_path, monkeypatch):
    """A view whose queue may hold 5 changes in memory takes a backlog of 200 updates: the
    UMQ never holds more than the budget plus one chunk read back, the rest waits in the
    update log, and every update is maintained once, the view right as of every W."""
    monkeypatch.setattr(warehouse.maintainer, "READ_BACK_UPDATES", 8)
    async with served(tmp_path) as env:
        manager, sources, client = env.manager, env.sources, env.client
        protocol = manager.view("v").maintainer.protocol
        protocol.queue_budget = 5
        assert (await client.post("/v1/views/v/pause", headers=env.admin)).status_code == 200
        for i in range(200):
            change_r(sources, i)
            await sources["a"].ship()
        view = (await client.get("/v1/views/v", headers=env.admin)).json()
        assert view["updates_queued"] == 200 and view["updates_spilled"] == 200 and view["queued_changes"] == 0, view
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, protocol.umq.changes)
                await asyncio.sleep(0)

        watching = asyncio.create_task(watch())
        assert (await client.post("/v1/views/v/resume", headers=env.admin)).status_code == 200
        assert await converged(manager, sources)
        watching.cancel()
        assert 0 < peak <= 5 + 8  # the budget, plus one chunk of one-change updates read back
        counters = manager.view("v").maintainer.counters
        assert counters.updates_read_back == 200
        units = await manager.db(Catalog.units, "v")
        maintained = sorted(i for u in units for i in u.log_ids)
        assert len(maintained) == len(set(maintained)) == 200  # each update once
        assert await check_view(manager, "v", sources, check_history=True) == []
        metrics = (await client.get("/metrics", headers=env.admin)).text
        assert 'pvm_view_updates_read_back_total{view="v"} 200.0' in metrics, metrics


# -- readiness: a dead store, a stalled view -------------------------------------------------------


class SickStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.problem: str | None = None

    def health(self) -> str | None:
        return self.problem


async def test_ready_and_health_report_a_store_that_does_not_answer(tmp_path):
    store = SickStore()
    async with served(tmp_path, store) as env:
        env.manager.store_probe.ttl_s = 0.0
        ready = await env.client.get("/v1/ready")
        assert ready.status_code == 200 and ready.json()["store"] == "ok", ready.text

        store.problem = "the Spark JVM does not answer: Py4JNetworkError: connection refused"
        ready = await env.client.get("/v1/ready")
        assert ready.status_code == 503, ready.text
        assert "the view store does not answer: the Spark JVM does not answer" in ready.json()["detail"]
        health = await env.client.get("/v1/health")
        assert health.status_code == 200 and health.json()["ok"] is True
        assert any("Spark JVM does not answer" in p for p in health.json()["problems"]), health.json()
        assert "pvm_store_up 0.0" in (await env.client.get("/metrics")).text

        store.problem = None
        assert (await env.client.get("/v1/ready")).status_code == 200
        assert "pvm_store_up 1.0" in (await env.client.get("/metrics")).text


async def test_ready_reports_a_stalled_view(tmp_path, capsys):
    async with served(tmp_path) as env:
        manager, sources = env.manager, env.sources
        manager.stall_after_s = 0.3
        answer, release = sources["b"].subquery, asyncio.Event()

        async def hanging(q):
            await release.wait()
            return await answer(q)

        sources["b"].subquery = hanging
        change_r(sources, 1)
        await sources["a"].ship()
        await asyncio.sleep(0.4)
        view = (await env.client.get("/v1/views/v", headers=env.admin)).json()
        assert view["stalled"] is True and view["no_progress_seconds"] >= 0.3, view
        show_view(view)
        assert "stalled" in capsys.readouterr().out
        ready = await env.client.get("/v1/ready")
        assert ready.status_code == 503 and "view 'v': maintenance stalled" in ready.json()["detail"], ready.text
        assert 'pvm_view_stalled{view="v"} 1.0' in (await env.client.get("/metrics")).text

        release.set()
        assert await converged(manager, sources)
        assert (await env.client.get("/v1/ready")).status_code == 200
        assert manager.status("v")["stalled"] is False


async def test_a_paused_view_is_not_stalled(tmp_path):
    async with served(tmp_path) as env:
        env.manager.stall_after_s = 0.1
        env.manager.pause_view("v")
        change_r(env.sources, 1)
        await env.sources["a"].ship()
        await asyncio.sleep(0.2)
        assert env.manager.status("v")["stalled"] is False
        assert (await env.client.get("/v1/ready")).status_code == 200


# -- verification: one at a time per view, at most --max-verifications over all views ----------------


def hold_snapshots(source: SimSource) -> tuple[asyncio.Event, asyncio.Event]:
    """The source's snapshot reads (a verification's initial-load subqueries) wait for
    ``release``; ``reached`` is set once one waits."""
    reached, release = asyncio.Event(), asyncio.Event()
    answer = source.subquery

    async def held(q: Subquery) -> SubqueryAnswer:
        if q.keys == [[]]:
            reached.set()
            await release.wait()
        return await answer(q)

    source.subquery = held  # type: ignore[method-assign]
    return reached, release


async def test_a_second_verification_of_a_view_is_refused_while_one_runs(tmp_path):
    async with served(tmp_path) as env:
        reached, release = hold_snapshots(env.sources["a"])
        first = asyncio.create_task(env.client.post("/v1/views/v/verify", headers=env.admin))
        await asyncio.wait_for(reached.wait(), 10)
        second = await asyncio.wait_for(env.client.post("/v1/views/v/verify", headers=env.admin), 10)
        assert second.status_code == 429, second.text
        assert "a verification of view 'v' is already running" in second.json()["detail"]
        assert int(second.headers["Retry-After"]) > 0
        release.set()
        assert (await first).json()["equal"] is True
        third = await env.client.post("/v1/views/v/verify", headers=env.admin)
        assert third.status_code == 200 and third.json()["equal"] is True


async def test_verifications_of_other_views_wait_for_the_global_limit(tmp_path):
    """One verification at a time over all views by default (``--max-verifications``): each
    reads every relation through its wrapper and recomputes its view, and N of them at once
    would pile that work up."""
    async with served(tmp_path) as env:
        await env.manager.define_view(VIEW, "w", parallelism=2)
        await env.manager.wait_idle("w")
        reached, release = hold_snapshots(env.sources["a"])
        first = asyncio.create_task(env.client.post("/v1/views/v/verify", headers=env.admin))
        await asyncio.wait_for(reached.wait(), 10)
        other = await asyncio.wait_for(env.client.post("/v1/views/w/verify", headers=env.admin), 10)
        assert other.status_code == 429, other.text
        detail = other.json()["detail"]
        assert "the most this manager runs at once" in detail and "--max-verifications" in detail, detail
        assert "'v'" in detail  # which one runs
        assert int(other.headers["Retry-After"]) > 0
        release.set()
        assert (await first).json()["equal"] is True
        again = await env.client.post("/v1/views/w/verify", headers=env.admin)
        assert again.status_code == 200 and again.json()["equal"] is True

        # with room for two, both run at once
        env.manager.verifications.limit = 2
        reached.clear()
        release.clear()
        first = asyncio.create_task(env.client.post("/v1/views/v/verify", headers=env.admin))
        await asyncio.wait_for(reached.wait(), 10)
        second = asyncio.create_task(env.client.post("/v1/views/w/verify", headers=env.admin))
        await until(lambda: len(env.manager.verifications.running) == 2)
        release.set()
        assert [(await t).json()["equal"] for t in (first, second)] == [True, True]
        assert not env.manager.verifications.running
