"""``POST /v1/query`` over several views reads them at one consistent cut (docs/protocol.md,
'Consistent reads across views'), while a query over one view reads it as published.

Two views over source ``s1``; the second is paused, so it stays at its W while updates of
``s1`` reach the first. Read together, the first is read back to the state the second
shows; read alone, it shows its W. Once the second catches up, both show the same state again.
"""

from __future__ import annotations

import uuid

import pytest

from tests.spark.analyst_support import api_client, join_sql, settle, sim_manager
from warehouse.store.spark import SparkStore

pytestmark = pytest.mark.spark


async def counts(api, sql: str) -> dict[str, int]:
    answer = await api.post("/v1/query", json={"sql": sql, "limit": 100})
    assert answer.status_code == 200, answer.text
    return {name: n for n, name in answer.json()["rows"]}


async def test_a_query_over_two_views_reads_them_at_one_state(
    analyst_store: SparkStore, analysts, tmp_path, view: str
) -> None:
    other = f"w_{uuid.uuid4().hex[:10]}"
    manager, sources = await sim_manager(tmp_path, analyst_store, seed=3, analysts=analysts)
    sources["s2"].load("s", [(0, 1)])  # every r row with b = 0 joins
    try:
        await manager.define_view(join_sql(view), name=view, parallelism=2)
        await manager.define_view("SELECT r.id, r.b FROM s1.r WHERE r.b = 0", name=other, parallelism=2)
        await settle(manager, analyst_store, view)
        await settle(manager, analyst_store, other)
        both = f"SELECT count(*) AS n, 'joined' AS v FROM {view} UNION ALL SELECT count(*), 'r0' FROM {other}"
        async with await api_client(manager) as api:
            before = await counts(api, both)
            manager.pause_view(other)
            sources["s1"].commit([("r", 1, (5000 + i, 0)) for i in range(3)])
            await sources["s1"].ship()
            await settle(manager, analyst_store, view)
            alone = await counts(api, f"SELECT count(*) AS n, 'joined' AS v FROM {view}")
            assert alone["joined"] > before["joined"]  # the first view, as published, has the rows
            assert await counts(api, both) == before  # read with the paused one: as it shows s1
            cut = manager.consistent_cut([view, other])
            assert cut.orders[view] < manager.watermark(view)

            await manager.resume_view(other)
            await settle(manager, analyst_store, other)
            after = await counts(api, both)
            assert after == {"joined": alone["joined"], "r0": before["r0"] + 3}
    finally:
        await manager.stop()
