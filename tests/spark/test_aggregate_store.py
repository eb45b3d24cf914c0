"""An aggregate view in the Spark store: per-group rows committed out of order, read as of
W (by the store, by analysts' SQL and by verification), compacted per key, and every state
still readable afterwards as before; then the service end to end through the analysts'
query process (rows endpoint, POST /v1/query, verification)."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from contract.zset import ZSet
from warehouse.aggregate import encode, evaluate, summed, visible
from warehouse.analysts.verification import stored_as_of
from warehouse.sql_views import parse_view
from warehouse.store.base import Effect, StoreError
from warehouse.store.spark import SparkStore
from warehouse.store.spark_files import part_files

pytestmark = pytest.mark.spark

SQL = (
    "SELECT R.g, COUNT(*) AS n, COUNT(R.x) AS nx, SUM(R.x) AS s, AVG(R.x) AS mean, MIN(R.x) AS lo, "
    "MAX(R.x) AS hi FROM src.R GROUP BY R.g HAVING COUNT(*) < 5"
)
PLAN = parse_view(SQL, lambda source, table: ("g", "x"), name="agg")
SUMMARY = PLAN.summary
assert SUMMARY is not None
BODY_TYPES = ["STRING", "BIGINT"]

# body effects by order: groups appear, change, lose their extremes and disappear
EFFECTS = {
    1: ZSet({("a", 5): 1, ("a", 9): 1, ("b", 1): 2}),
    2: ZSet({("a", 9): -1, ("a", 7): 1, ("c", None): 1}),  # a's MAX 9 is deleted
    3: ZSet({("b", 1): -2, ("b", 4): 1}),  # b's only values go, b keeps one row
    4: ZSet({("c", None): -1, ("a", 5): -1}),  # c disappears, a's MIN 5 is deleted
    5: ZSet({("d", 3): 5}),  # d: five rows, filtered by HAVING
    6: ZSet({("d", 3): -1, ("a", 7): 2}),
}


def body_as_of(w: int) -> ZSet:
    return sum((EFFECTS[o] for o in EFFECTS if o <= w), ZSet())


def rows_sql(spark: SparkSession, view: str) -> ZSet:
    return ZSet.from_rows(tuple(r) for r in spark.sql(f"SELECT * FROM `{view}`").collect())


def test_an_aggregate_view_through_commits_out_of_order_and_compaction(
    spark: SparkSession, spark_store: SparkStore, view: str
) -> None:
    store = spark_store
    assert SUMMARY is not None
    store.create(view, SUMMARY.stored_names, SUMMARY.stored_types(BODY_TYPES), summed(SUMMARY, BODY_TYPES))
    stored = {o: Effect(o, encode(SUMMARY, e)) for o, e in EFFECTS.items()}
    for group in ([3, 1], [6, 2], [5, 4]):  # out of order, in groups
        store.commit(view, [stored[o] for o in group])
    expected = {w: evaluate(SUMMARY, body_as_of(w)) for w in range(7)}
    assert expected[6] == ZSet(
        {("a", 3, 3, 21, 7.0, 7, 7): 1, ("b", 1, 1, 4, 4.0, 4, 4): 1, ("d", 4, 4, 12, 3.0, 3, 3): 1}
    )
    for w in range(7):
        assert visible(SUMMARY, store.read(view, as_of=w)) == expected[w], w
        assert ZSet.from_rows(store.read_rows(view, as_of=w)) == expected[w], w
        assert stored_as_of(spark.newSession(), store.record(view).to_record(), w) == expected[w], w
    store.publish(view, 4)
    assert rows_sql(spark, view) == expected[4]  # the analysts' view shows W
    assert ZSet.from_rows(store.read_rows(view, latest=True)) == expected[6]

    before_rows = len(part_files(store.record(view).zlog_location))
    assert store.compact(view)
    meta = store.record(view)
    assert meta.compacted_through == 4 and before_rows > 0
    # the base holds one row per key (group, or group and MIN/MAX value), each of weight 1
    base = spark.read.parquet(meta.base_location).collect()
    keys = [tuple(r[: SUMMARY.keys]) for r in base]
    assert len(keys) == len(set(keys)) and {r["_w"] for r in base} == {1}
    for w in range(4, 7):  # time travel after compaction: the same states
        assert ZSet.from_rows(store.read_rows(view, as_of=w)) == expected[w], w
        assert visible(SUMMARY, store.read(view, as_of=w)) == expected[w], w
    assert rows_sql(spark, view) == expected[4]
    with pytest.raises(StoreError, match="older than the compacted state"):
        store.read_rows(view, as_of=3)
    store.publish(view, 6)
    assert rows_sql(spark, view) == expected[6]


def test_an_aggregate_without_group_by_shows_one_row_over_nothing(
    spark: SparkSession, spark_store: SparkStore, view: str
) -> None:
    plan = parse_view("SELECT COUNT(*) AS n, SUM(R.x) AS s, MAX(R.x) AS m FROM src.R", lambda s, t: ("g", "x"), "all")
    s = plan.summary
    assert s is not None
    spark_store.create(view, s.stored_names, s.stored_types(["BIGINT"]), summed(s, ["BIGINT"]))
    spark_store.publish(view, 0)
    assert rows_sql(spark, view) == ZSet({(0, None, None): 1})
    spark_store.commit(view, [Effect(2, encode(s, ZSet({(4,): 1}))), Effect(1, encode(s, ZSet({(2,): 1})))])
    spark_store.publish(view, 2)
    assert rows_sql(spark, view) == ZSet({(2, 6, 4): 1})
    spark_store.commit(view, [Effect(3, encode(s, ZSet({(4,): -1, (2,): -1})))])
    assert ZSet.from_rows(spark_store.read_rows(view, latest=True)) == ZSet({(0, None, None): 1})


async def test_an_aggregate_view_read_queried_and_verified_through_the_analysts_process(
    analyst_store: SparkStore, analysts, tmp_path, view: str
) -> None:
    """The service end to end on the Spark store: the rows endpoint, POST /v1/query and
    verification (Spark recomputing the view's GROUP BY from the sources) all agree with
    first-principles recomputation of the aggregate."""
    import random

    from tests.sim import recompute
    from tests.spark.analyst_support import api_client, change, settle, sim_manager
    from warehouse.verify import verify_view

    sql = (
        f"CREATE VIEW {view} AS SELECT s.c, COUNT(*) AS n, SUM(r.id) AS total, AVG(r.id) AS mean, "
        "MIN(r.id) AS lo, MAX(r.id) AS hi FROM s1.r, s2.s WHERE r.b = s.b GROUP BY s.c HAVING COUNT(*) > 1"
    )
    manager, sources = await sim_manager(tmp_path, analyst_store, analysts=analysts)
    try:
        await manager.define_view(sql, name=view, parallelism=3)
        rng = random.Random(7)
        for _ in range(15):
            change(sources[rng.choice(["s1", "s2"])], rng)
            if rng.random() < 0.5:
                await sources[rng.choice(["s1", "s2"])].ship()
        for s in sources.values():
            await s.ship()
        await settle(manager, analyst_store, view)
        contents = {(s, t): z for s, src in sources.items() for t, z in src.state.items()}
        columns = {(s, t): cols for s, src in sources.items() for t, cols in src.tables.items()}
        expected = recompute(manager.view(view).plan, contents, columns)
        assert len(expected) >= 1
        async with await api_client(manager) as api:
            page = (await api.get(f"/v1/views/{view}/rows", params={"limit": 100})).json()
            assert page["columns"] == ["c", "n", "total", "mean", "lo", "hi"]
            assert ZSet.from_rows(tuple(r) for r in page["rows"]) == expected and page["total"] == len(expected)
            answer = await api.post("/v1/query", json={"sql": f"SELECT * FROM {view}"})
            assert answer.status_code == 200, answer.text
            assert ZSet.from_rows(tuple(r) for r in answer.json()["rows"]) == expected
        report = await verify_view(manager, view)
        assert report.engine == "spark" and report.missing_total == 0 and report.extra_total == 0, report
        assert report.expected_rows == len(expected)
    finally:
        await manager.stop()
