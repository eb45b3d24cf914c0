"""The analysts' REST API on the Spark store: read-only SQL over views run in Spark, the rows
endpoint served from Spark, view names Spark cannot live with, and the view's column types
derived from the sources' types. What the SQL check accepts and refuses, without Spark:
tests/test_analyst_check.py."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import SparkSession

from tests.spark.analyst_support import api_client, change, join_sql, settle, sim_manager
from warehouse.store.memory import MemoryStore
from warehouse.store.spark import SparkStore

pytestmark = pytest.mark.spark


async def test_query_rows_and_names_over_http(
    spark: SparkSession, analyst_store: SparkStore, analysts, tmp_path, view: str
) -> None:
    manager, sources = await sim_manager(tmp_path, analyst_store, analysts=analysts)
    try:
        await manager.define_view(join_sql(view), name=view, parallelism=2)
        rng = random.Random(5)
        for _ in range(12):
            change(sources[rng.choice(["s1", "s2"])], rng)
            for s in sources.values():
                await s.ship()
        await settle(manager, analyst_store, view)
        # the column types come from the sources' (INTEGER) types
        assert spark.table(SparkStore.zlog_table(view)).dtypes[:3] == [
            ("id", "bigint"),
            ("b", "bigint"),
            ("c", "bigint"),
        ]
        expected = sorted(analyst_store.read_rows(view))
        async with await api_client(manager) as api:
            # a query over the view sees the view as of W, bag semantics
            answer = await api.post(
                "/v1/query", json={"sql": f"SELECT id, b, c FROM {view} ORDER BY id, b, c", "limit": 10_000}
            )
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["columns"] == ["id", "b", "c"] and not body["truncated"]
            assert [tuple(r) for r in body["rows"]] == expected
            answer = await api.post(
                "/v1/query", json={"sql": f"SELECT c, count(*) AS n FROM {view.upper()} GROUP BY c", "limit": 1}
            )
            assert answer.status_code == 200 and len(answer.json()["rows"]) == 1
            assert answer.json()["truncated"] == (len({r[2] for r in expected}) > 1)

            # nested WITH clauses run where they were written (Spark scopes them lexically):
            # the inner CTE named like the view hides it only inside its subquery
            nested = f"SELECT count(*) FROM {view} WHERE id IN (WITH {view} AS (SELECT -1 AS id) SELECT id FROM {view})"
            answer = await api.post("/v1/query", json={"sql": nested})
            assert answer.status_code == 200 and answer.json()["rows"] == [[0]], answer.text
            nested = f"WITH a AS (SELECT * FROM (WITH z AS (SELECT id FROM {view}) SELECT * FROM z) AS t) SELECT count(*) FROM a"
            answer = await api.post("/v1/query", json={"sql": nested})
            assert answer.status_code == 200 and answer.json()["rows"] == [[len(expected)]], answer.text

            for sql, reason in [
                (f"SELECT * FROM {SparkStore.zlog_table(view)}", "unknown view"),
                (
                    f"SELECT * FROM {view} UNION ALL SELECT * FROM (WITH hidden AS (SELECT 1 AS a) "
                    "SELECT a FROM hidden) JOIN hidden",  # a CTE used outside its scope
                    "not in scope here",
                ),
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
            assert analyst_store.views() == [view]
    finally:
        await manager.stop()


async def test_rows_as_of_a_compacted_order_is_422(analyst_store: SparkStore, analysts, tmp_path, view: str) -> None:
    manager, sources = await sim_manager(tmp_path, analyst_store, seed=2, analysts=analysts)
    try:
        await manager.define_view(join_sql(view), name=view, parallelism=2)
        rng = random.Random(2)
        for _ in range(6):
            change(sources["s1"], rng)
            await sources["s1"].ship()
        await settle(manager, analyst_store, view)
        watermark = manager.watermark(view)
        assert watermark > 2
        assert analyst_store.compact(view)
        async with await api_client(manager) as api:
            answer = await api.get(f"/v1/views/{view}/rows", params={"as_of": 1})
            assert answer.status_code == 422
            assert "compacted" in answer.json()["detail"]
            answer = await api.get(f"/v1/views/{view}/rows", params={"as_of": watermark})
            assert answer.status_code == 200
            assert sorted(tuple(r) for r in answer.json()["rows"]) == sorted(analyst_store.read_rows(view))
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


async def test_row_pages_are_read_by_the_query_process_never_the_manager(
    analyst_store: SparkStore, analysts, tmp_path, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GET /rows?limit=1`` read a whole view into the manager under its commit lock: now the
    analysts' query process sorts and cuts the page from the store's files."""
    manager, sources = await sim_manager(tmp_path, analyst_store, seed=4, analysts=analysts)
    try:
        await manager.define_view(join_sql(view), name=view, parallelism=2)
        rng = random.Random(4)
        for _ in range(10):
            change(sources[rng.choice(["s1", "s2"])], rng)
            for s in sources.values():
                await s.ship()
        await settle(manager, analyst_store, view)
        expected = sorted(analyst_store.read_rows(view))
        assert len(expected) > 3

        def no_whole_view(*args, **kwargs):
            raise AssertionError("the manager read the whole view")

        monkeypatch.setattr(SparkStore, "read_rows", no_whole_view)
        monkeypatch.setattr(SparkStore, "read", no_whole_view)
        async with await api_client(manager) as api:
            pages = []
            for offset in range(0, len(expected), 2):
                answer = await api.get(f"/v1/views/{view}/rows", params={"limit": 2, "offset": offset})
                assert answer.status_code == 200, answer.text
                body = answer.json()
                assert body["total"] == len(expected) and body["watermark"] == manager.watermark(view)
                pages += [tuple(r) for r in body["rows"]]
            assert pages == expected  # sorted by every column, paged without gaps or repeats
    finally:
        await manager.stop()
