"""``POST /v1/query`` over several views reads them at one consistent cut (docs/protocol.md,
'Consistent reads across views'), while a query over one view reads it as published; over
Spark Connect, ``pvm_consistent.<view>`` reads every view at the cut over all views.

Two views over source ``s1``; the second is paused, so it stays at its W while updates of
``s1`` reach the first. Read together, the first is read back to the state the second
shows; read alone, it shows its W. Once the second catches up, both show the same state again.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid

import pytest

from api.auth import issue, verifier_for
from api.connect_gateway import ConnectGateway, GatewaySettings
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


CLIENT = r"""
import json, sys
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

url, view, other = sys.argv[1:4]
spark = SparkSession.builder.remote(url).getOrCreate()
def count(sql):
    return spark.sql(sql).collect()[0][0]
a, b = spark.table(f"pvm_consistent.{view}"), spark.table(f"pvm_consistent.{other}")
out = {
    "published": [count(f"SELECT count(*) FROM {view}"), count(f"SELECT count(*) FROM {other}")],
    "consistent": [
        count(f"SELECT count(*) FROM pvm_consistent.{view}"),
        count(f"SELECT count(*) FROM pvm_consistent.{other}"),
    ],
    # both in one query: a join of the two at the cut (every joined row has b = 0, as every r0 row)
    "joined": count(
        f"SELECT count(*) FROM pvm_consistent.{view} v JOIN pvm_consistent.{other} o ON v.id = o.id"
    ),
    "dataframe": a.join(b, "id").count(),
}
for name, attempt in {
    "alter": lambda: spark.sql(f"ALTER VIEW pvm_consistent.{view} AS SELECT 1 AS id").collect(),
    "state": lambda: spark.table("pvm_consistent.__pvm_state").collect(),
    # each side analyzed on its own by the server: refused, it could read two cuts
    "split": lambda: a.withColumn("x", F.lit(1)).join(b.withColumn("y", F.lit(2)), "id").count(),
    "create": lambda: spark.sql("CREATE VIEW pvm_consistent.mine AS SELECT 1").collect(),
}.items():
    try:
        attempt()
        out[name] = "ran"
    except Exception as exc:
        out[name] = " ".join(str(exc).split())[:300]
print(json.dumps(out))
"""


async def shown_cut(manager, analysts, timeout: float = 30.0) -> dict[str, int]:
    """Until the analysts' query process shows the manager's cut over all views; its orders."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        cut = {name: pin.as_of for name, pin in manager.cut_of_all().items()}
        if cut and analysts.cut_orders() == cut and analysts.shown():
            return cut
        assert asyncio.get_running_loop().time() < deadline, (cut, analysts.cut_orders())
        await asyncio.sleep(0.05)


async def test_spark_connect_reads_every_view_at_one_cut(
    analyst_store: SparkStore, analysts, tmp_path, view: str
) -> None:
    pytest.importorskip("grpc", reason="the Spark Connect client needs grpcio (pip install '.[connect]')")
    other = f"w_{uuid.uuid4().hex[:10]}"
    manager, sources = await sim_manager(tmp_path, analyst_store, seed=3, analysts=analysts)
    sources["s2"].load("s", [(0, 1)])  # every r row with b = 0 joins
    gateway = ConnectGateway(
        GatewaySettings("127.0.0.1", 0), verifier_for(manager).verify, analysts, lambda: list(manager.views)
    )
    url = gateway.start()
    try:
        await manager.define_view(join_sql(view), name=view, parallelism=2)
        await manager.define_view("SELECT r.id, r.b FROM s1.r WHERE r.b = 0", name=other, parallelism=2)
        await settle(manager, analyst_store, view)
        await settle(manager, analyst_store, other)
        before = (len(analyst_store.read_rows(view)), len(analyst_store.read_rows(other)))
        manager.pause_view(other)
        sources["s1"].commit([("r", 1, (5000 + i, 0)) for i in range(3)])
        await sources["s1"].ship()
        await settle(manager, analyst_store, view)
        published = len(analyst_store.read_rows(view))
        assert published > before[0]  # the first view, as published, has the new rows
        cut = await shown_cut(manager, analysts)
        assert cut[view] < manager.watermark(view) and cut[other] == manager.watermark(other)

        _, token = await issue(manager, "analyst")
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", CLIENT, f"{url}/;token={token}", view, other],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen["published"] == [published, before[1]]  # each at its own W
        assert seen["consistent"] == list(before)  # the first read back to the paused one's state
        joined_rows = sum(1 for row in analyst_store.read_rows(view, as_of=cut[view]) if row[1] == 0)
        assert seen["joined"] == seen["dataframe"] == joined_rows
        for attempt in ("alter", "state", "create", "split"):  # readable, never changed by analysts
            assert "PERMISSION_DENIED" in seen[attempt], (attempt, seen[attempt])
        assert "before they are joined" in seen["split"]
    finally:
        gateway.stop()
        await manager.stop()
