"""Shared set-up of the analyst tests: a manager over in-process sources whose views live in
the Spark store on the test session, and an HTTP client of its API with an admin token."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import httpx

from api.auth import issue
from api.manager_app import create_app
from tests.sim import SimSource, start_sim_manager

TABLES = {"s1": {"r": ("id", "b")}, "s2": {"s": ("b", "c")}}


def join_sql(view: str) -> str:
    return f"CREATE VIEW {view} AS SELECT r.id, r.b, s.c FROM s1.r, s2.s WHERE r.b = s.b AND s.c > 0"


async def sim_manager(tmp_path: Path, store, seed: int = 1, analysts=None):
    """A started manager over two loaded in-process sources; ``analysts``: its analysts'
    query process (the store must be subscribed to it)."""
    manager, sources = await start_sim_manager(
        tmp_path / f"catalog-{uuid.uuid4().hex[:8]}.db", TABLES, store, seed=seed
    )
    manager.analysts = analysts
    rng = random.Random(seed)
    sources["s1"].load("r", [(i, rng.randrange(4)) for i in range(1, 13)])
    sources["s2"].load("s", [(b, rng.randrange(3)) for b in range(4) for _ in range(2)])
    return manager, sources


def change(source: SimSource, rng: random.Random) -> None:
    """One source transaction: insert a row, or delete one that exists."""
    table = next(iter(source.tables))
    rows = list(source.state[table].rows())
    if rows and rng.random() < 0.4:
        source.commit([(table, -1, rng.choice(rows))])
    elif table == "r":
        source.commit([(table, 1, (rng.randrange(100, 10_000), rng.randrange(4)))])
    else:
        source.commit([(table, 1, (rng.randrange(4), rng.randrange(3)))])


async def settle(manager, store, view: str, timeout: float = 60.0) -> None:
    """Until the view is maintained and shows W to analysts: ``wait_idle`` may return while
    the last publish is still under way, and the analysts' query process learns of it after."""
    import asyncio

    await manager.wait_idle(view, timeout=timeout)
    deadline = asyncio.get_running_loop().time() + timeout
    while store.published(view) != manager.watermark(view) or not (
        manager.analysts is None or manager.analysts.shown()
    ):
        assert asyncio.get_running_loop().time() < deadline, "the watermark was not published"
        await asyncio.sleep(0.02)


async def api_client(manager) -> httpx.AsyncClient:
    """A client of the manager's app (not started by it: the manager already runs)."""
    _, token = await issue(manager, "admin")
    transport = httpx.ASGITransport(app=create_app(manager))
    return httpx.AsyncClient(
        transport=transport, base_url="http://manager", headers={"Authorization": f"Bearer {token}"}
    )
