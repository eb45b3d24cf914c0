"""Aggregate and DISTINCT views through the manager and the REST API, over in-process
sources and the in-memory store (the Spark store's are tests/spark/test_aggregate_store.py)."""

from __future__ import annotations

import asyncio

import pytest

from contract.zset import ZSet
from tests.api_support import api_env
from tests.sim import recompute, start_sim_manager
from warehouse.verify import verify_view

TABLES = {"shop": {"orders": ("id", "customer", "amount")}, "crm": {"customers": ("id", "country TEXT")}}
REVENUE = (
    "SELECT c.country, COUNT(*) AS orders, SUM(o.amount) AS revenue, AVG(o.amount) AS mean, "
    "MIN(o.amount) AS smallest, MAX(o.amount) AS largest "
    "FROM shop.orders o JOIN crm.customers c ON o.customer = c.id GROUP BY c.country"
)


def everything(sources) -> tuple[dict, dict]:
    contents = {(s, t): z for s, src in sources.items() for t, z in src.state.items()}
    columns = {(s, t): cols for s, src in sources.items() for t, cols in src.tables.items()}
    return contents, columns


@pytest.fixture
async def shop(tmp_path):
    manager, sources = await start_sim_manager(tmp_path / "catalog.db", TABLES)
    sources["crm"].load("customers", [(1, "fr"), (2, "fr"), (3, "de")])
    sources["shop"].load("orders", [(10, 1, 5), (11, 2, 7), (12, 3, 100), (13, 3, None)])
    yield manager, sources
    await manager.stop()


async def settle(manager, sources, view: str) -> None:
    for s in sources.values():
        await s.ship()
    await manager.wait_idle(view, timeout=30)


async def test_groups_follow_inserts_deletes_and_a_deleted_extreme(shop):
    manager, sources = shop
    await manager.define_view(REVENUE, "revenue")
    await manager.wait_idle("revenue")
    assert manager.read("revenue") == ZSet({("fr", 2, 12, 6.0, 5, 7): 1, ("de", 2, 100, 100.0, 100, 100): 1})
    first = manager.watermark("revenue")

    sources["shop"].commit([("orders", -1, (12, 3, 100))])  # the group's MAX and MIN go
    sources["shop"].commit([("orders", -1, (10, 1, 5))])  # fr's MIN goes
    await settle(manager, sources, "revenue")
    # de keeps one order whose amount is NULL: COUNT(*) 1, SUM/AVG/MIN/MAX NULL
    assert manager.read("revenue") == ZSet({("fr", 1, 7, 7.0, 7, 7): 1, ("de", 1, None, None, None, None): 1})
    sources["shop"].commit([("orders", -1, (13, 3, None))])  # de's count reaches 0: the group goes
    await settle(manager, sources, "revenue")
    assert manager.read("revenue") == ZSet({("fr", 1, 7, 7.0, 7, 7): 1})
    # time travel: the first state is still readable as of its W
    assert manager.read("revenue", as_of=first) == ZSet(
        {("fr", 2, 12, 6.0, 5, 7): 1, ("de", 2, 100, 100.0, 100, 100): 1}
    )
    assert manager.read("revenue") == recompute(manager.view("revenue").plan, *everything(sources))
    report = await verify_view(manager, "revenue")
    assert report.missing_total == 0 and report.extra_total == 0 and report.expected_rows == 1
    assert report.columns == ["country", "orders", "revenue", "mean", "smallest", "largest"]


async def test_without_group_by_one_row_always(shop):
    manager, sources = shop
    await manager.define_view("SELECT COUNT(*) AS n, SUM(amount) AS s, MAX(amount) AS m FROM shop.orders", "all")
    await manager.wait_idle("all")
    assert manager.read("all") == ZSet({(4, 112, 100): 1})
    sources["shop"].commit([("orders", -1, row) for row in list(sources["shop"].state["orders"].rows())])
    await settle(manager, sources, "all")
    assert manager.read("all") == ZSet({(0, None, None): 1})  # SQL: COUNT 0, SUM and MAX NULL


async def test_distinct_and_having(shop):
    manager, sources = shop
    await manager.define_view("SELECT DISTINCT c.country FROM crm.customers c", "countries")
    await manager.define_view(
        "SELECT o.customer, COUNT(*) AS n FROM shop.orders o GROUP BY o.customer HAVING COUNT(*) > 1", "regulars"
    )
    await manager.wait_idle("countries")
    await manager.wait_idle("regulars")
    assert manager.read("countries") == ZSet({("fr",): 1, ("de",): 1})
    assert manager.read("regulars") == ZSet({(3, 2): 1})
    sources["crm"].commit([("customers", -1, (1, "fr"))])  # fr stays: customer 2 is in fr too
    sources["shop"].commit([("orders", 1, (14, 1, 1)), ("orders", 1, (15, 1, 2))])
    await settle(manager, sources, "countries")
    await settle(manager, sources, "regulars")
    assert manager.read("countries") == ZSet({("fr",): 1, ("de",): 1})
    assert manager.read("regulars") == ZSet({(3, 2): 1, (1, 3): 1})
    sources["crm"].commit([("customers", -1, (2, "fr"))])
    await settle(manager, sources, "countries")
    assert manager.read("countries") == ZSet({("de",): 1})


async def test_rows_and_columns_over_rest(tmp_path):
    async with api_env(tmp_path, TABLES) as env:
        env.sources["crm"].load("customers", [(1, "fr"), (2, "de")])
        env.sources["shop"].load("orders", [(10, 1, 5), (11, 1, 7), (12, 2, 1)])
        admin = env.auth("admin")
        made = await env.client.post("/v1/views", json={"sql": REVENUE, "name": "revenue"}, headers=admin)
        assert made.status_code == 201, made.text
        await env.manager.wait_idle("revenue")
        page = (await env.client.get("/v1/views/revenue/rows", headers=env.auth("analyst"))).json()
        assert page["columns"] == ["country", "orders", "revenue", "mean", "smallest", "largest"]
        assert page["rows"] == [["de", 1, 1, 1.0, 1, 1], ["fr", 2, 12, 6.0, 5, 7]]
        assert page["total"] == 2
        # a count that took long is reused for a few seconds (a loaded machine's, taken when the
        # view was defined, at W 0): the count as of the view's W comes within them
        for _ in range(100):
            shown = (await env.client.get("/v1/views/revenue", headers=admin)).json()
            if shown["row_count_as_of"] == shown["watermark"]:
                break
            await asyncio.sleep(0.05)
        assert (shown["row_count"], shown["row_count_as_of"]) == (2, shown["watermark"])


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT c.country, SUM(c.country) FROM crm.customers c GROUP BY c.country", "needs a numeric column"),
        ("SELECT c.id, COUNT(*) FROM crm.customers c GROUP BY c.country", "neither in GROUP BY"),
        ("SELECT COUNT(*) FROM crm.customers c GROUP BY UPPER(c.country)", "is not a column"),
        ("SELECT c.country FROM crm.customers c GROUP BY c.country HAVING c.id > 1", "HAVING reads c.id"),
        ("SELECT MAX(COUNT(*)) FROM crm.customers c", "nested aggregates"),
        ("SELECT c.id FROM crm.customers c WHERE COUNT(*) > 1", "aggregate COUNT is not allowed here"),
    ],
)
async def test_bad_aggregates_are_422_and_create_nothing(tmp_path, sql, message):
    async with api_env(tmp_path, TABLES) as env:
        answer = await env.client.post("/v1/views", json={"sql": sql, "name": "bad"}, headers=env.auth("admin"))
        assert answer.status_code == 422, answer.text
        assert message in answer.text
        assert "bad" not in env.manager.views
        assert (await env.client.get("/v1/views", headers=env.auth("admin"))).json() == []


async def test_an_aggregate_view_survives_a_restart(tmp_path):
    """The plan (and its aggregate) is parsed again from the catalog's SQL; the stored
    per-group rows are read as before and maintenance goes on from them."""
    from warehouse.store.memory import MemoryStore

    store = MemoryStore()
    manager, sources = await start_sim_manager(tmp_path / "catalog.db", TABLES, store=store)
    sources["crm"].load("customers", [(1, "fr"), (2, "de")])
    sources["shop"].load("orders", [(10, 1, 5), (11, 2, 7)])
    await manager.define_view(REVENUE, "revenue")
    await manager.wait_idle("revenue")
    before = manager.read("revenue")
    await manager.stop()
    manager, sources = await start_sim_manager(tmp_path / "catalog.db", TABLES, store=store, sources=sources)
    try:
        assert manager.read("revenue") == before
        sources["shop"].commit([("orders", -1, (11, 2, 7)), ("orders", 1, (12, 1, 9))])
        await settle(manager, sources, "revenue")
        assert manager.read("revenue") == ZSet({("fr", 2, 14, 7.0, 5, 9): 1})
        assert manager.read("revenue") == recompute(manager.view("revenue").plan, *everything(sources))
    finally:
        await manager.stop()
