"""The analysts' REST API on the Spark store: read-only SQL over views (what it accepts and
what it refuses), the rows endpoint served from Spark, view names Spark cannot live with, and
the view's column types derived from the sources' types."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import SparkSession

from api.analyst import QueryRejected, check_query
from tests.spark.analyst_support import api_client, change, join_sql, settle, sim_manager
from warehouse.store.memory import MemoryStore
from warehouse.store.spark import SparkStore
from warehouse.store.types import spark_type

pytestmark = pytest.mark.spark

VIEWS = ["order_details", "customers_v"]

ACCEPTED = [
    "SELECT region, count(*) AS n FROM order_details WHERE qty > 1 GROUP BY region ORDER BY n DESC",
    "WITH big AS (SELECT * FROM order_details WHERE qty > 3) SELECT customer, sum(qty) FROM big GROUP BY customer",
    "SELECT customer FROM order_details UNION ALL SELECT name FROM customers_v",
    "SELECT o.*, row_number() OVER (PARTITION BY region ORDER BY qty DESC) AS rk FROM order_details o",
    "SELECT upper(customer), coalesce(qty, 0), CAST(price AS STRING), date_format(current_date(), 'yyyy') FROM ORDER_DETAILS",
    "SELECT * FROM order_details WHERE customer IN (SELECT name FROM customers_v) LIMIT 5",
]

REJECTED = [
    ("DROP VIEW order_details", "only a SELECT"),
    ("INSERT INTO order_details SELECT * FROM order_details", "only a SELECT"),
    ("CREATE TABLE t AS SELECT * FROM order_details", "only a SELECT"),
    ("SET spark.sql.ansi.enabled=false", "only a SELECT"),
    ("SELECT 1; SELECT 2", "exactly one statement"),
    ("SELECT * FROM parquet.`/etc/passwd`", "file paths"),
    ("SELECT * FROM `/tmp/views/x/zlog/v0`", "unknown view"),
    ("SELECT * FROM csv.`/tmp/x.csv`", "file paths"),
    ("SELECT * FROM global_temp.order_details", "qualified names"),
    ("SELECT * FROM pvm_zlog_order_details", "unknown view"),
    ("SELECT * FROM pvm_base_order_details", "unknown view"),
    ("SELECT * FROM some_table", "unknown view"),
    ("SELECT * FROM range(10)", "in FROM is not allowed"),
    ("SELECT * FROM read_files('/tmp')", "in FROM is not allowed"),
    ("SELECT reflect('java.lang.Runtime', 'getRuntime')", "function reflect"),
    ("SELECT java_method('java.lang.System', 'getenv', 'HOME')", "function java_method"),
    ("SELECT input_file_name() FROM order_details", "function input_file_name"),
    ("SELECT current_user()", "function CURRENT_USER"),
    ("SELECT sequence(1, 1000000000)", "function SEQUENCE"),
    ("SELECT TRANSFORM(customer) USING 'cat' FROM order_details", "TRANSFORM"),
    ("SELECT /*+ REPARTITION(1000) */ * FROM order_details", "hints"),
    ("SELECT customer INTO t FROM order_details", "INTO"),
    ("SELECT '${spark.sql.warehouse.dir}' FROM order_details", "substitution"),
    ("EXPLAIN SELECT * FROM order_details", "only a SELECT"),
    ("SELECT * FROM", "could not parse"),
]


@pytest.mark.parametrize("sql", ACCEPTED)
def test_check_accepts_read_only_selects_over_views(sql: str) -> None:
    assert check_query(sql, VIEWS).upper().startswith(("SELECT", "WITH"))


@pytest.mark.parametrize("sql, reason", REJECTED)
def test_check_refuses_everything_else_naming_why(sql: str, reason: str) -> None:
    with pytest.raises(QueryRejected, match=None) as info:
        check_query(sql, VIEWS)
    assert reason in str(info.value), str(info.value)


def test_spark_types_from_source_types() -> None:
    assert [spark_type(t) for t in ("INTEGER", "TEXT", "REAL", "BOOLEAN", "DATE", "")] == [
        "BIGINT", "STRING", "DOUBLE", "BOOLEAN", None, None,
    ]


async def test_query_rows_and_names_over_http(spark: SparkSession, spark_store: SparkStore, tmp_path, view: str) -> None:
    manager, sources = await sim_manager(tmp_path, spark_store)
    try:
        await manager.define_view(join_sql(view), name=view, parallelism=2)
        rng = random.Random(5)
        for _ in range(12):
            change(sources[rng.choice(["s1", "s2"])], rng)
            for s in sources.values():
                await s.ship()
        await settle(manager, spark_store, view)
        # the column types come from the sources' (INTEGER) types
        assert spark.table(SparkStore.zlog_table(view)).dtypes[:3] == [("id", "bigint"), ("b", "bigint"), ("c", "bigint")]
        expected = sorted(spark_store.read_rows(view))
        async with await api_client(manager) as api:
            # a query over the view sees the view as of W, bag semantics
            answer = await api.post("/v1/query", json={"sql": f"SELECT id, b, c FROM {view} ORDER BY id, b, c", "limit": 10_000})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["columns"] == ["id", "b", "c"] and not body["truncated"]
            assert [tuple(r) for r in body["rows"]] == expected
            answer = await api.post("/v1/query", json={"sql": f"SELECT c, count(*) AS n FROM {view.upper()} GROUP BY c", "limit": 1})
            assert answer.status_code == 200 and len(answer.json()["rows"]) == 1
            assert answer.json()["truncated"] == (len({r[2] for r in expected}) > 1)

            for sql, reason in [
                (f"SELECT * FROM {SparkStore.zlog_table(view)}", "unknown view"),
                (f"DROP VIEW {view}", "only a SELECT"),
                (f"SELECT reflect('java.lang.Thread', 'currentThread') FROM {view}", "function reflect"),
            ]:
                answer = await api.post("/v1/query", json={"sql": sql})
                assert answer.status_code == 400 and reason in answer.json()["detail"], answer.text
            answer = await api.post("/v1/query", json={"sql": f"SELECT no_such_column FROM {view}"})
            assert answer.status_code == 400 and "no_such_column" in answer.json()["detail"]
            answer = await api.post("/v1/query", json={"sql": f"SELECT * FROM {view}", "limit": 0})
            assert answer.status_code in (400, 422)

            # the rows endpoint reads the Spark store
            rows = (await api.get(f"/v1/views/{view}/rows", params={"limit": 10_000})).json()
            assert sorted(tuple(r) for r in rows["rows"]) == expected

            # view names Spark SQL cannot live with are refused at definition, nothing kept
            for name in ("select", "TABLE", "pvm_zlog_x", "Order"):
                answer = await api.post("/v1/views", json={"sql": join_sql("x"), "name": name})
                assert answer.status_code == 422, answer.text
                assert name in answer.json()["detail"]
                assert name not in manager.views
                assert (await api.get(f"/v1/views/{name}")).status_code == 404
            assert spark_store.views() == [view]
    finally:
        await manager.stop()


async def test_rows_as_of_a_compacted_order_is_422(spark_store: SparkStore, tmp_path, view: str) -> None:
    manager, sources = await sim_manager(tmp_path, spark_store, seed=2)
    try:
        await manager.define_view(join_sql(view), name=view, parallelism=2)
        rng = random.Random(2)
        for _ in range(6):
            change(sources["s1"], rng)
            await sources["s1"].ship()
        await settle(manager, spark_store, view)
        watermark = manager.watermark(view)
        assert watermark > 2
        assert spark_store.compact(view)
        async with await api_client(manager) as api:
            answer = await api.get(f"/v1/views/{view}/rows", params={"as_of": 1})
            assert answer.status_code == 422
            assert "compacted" in answer.json()["detail"]
            answer = await api.get(f"/v1/views/{view}/rows", params={"as_of": watermark})
            assert answer.status_code == 200
            assert sorted(tuple(r) for r in answer.json()["rows"]) == sorted(spark_store.read_rows(view))
            answer = await api.get(f"/v1/views/{view}/rows", params={"as_of": watermark + 1})
            assert answer.status_code == 422
    finally:
        await manager.stop()


async def test_query_needs_the_spark_store(tmp_path) -> None:
    manager, _ = await sim_manager(tmp_path, MemoryStore())
    try:
        async with await api_client(manager) as api:
            answer = await api.post("/v1/query", json={"sql": "SELECT 1"})
            assert answer.status_code == 501
            assert "Spark" in answer.json()["detail"]
    finally:
        await manager.stop()
