"""What an initial load in Spark appends (``engine_load.load_sql`` through ``SparkStore.load``),
over staged files written by hand: snapshots that hold a row twice, and compensations that
cancel rows of the snapshots or add back rows they lost. The join's rows are appended as they
come, not summed per row, so the z-log holds duplicates and rows that cancel; what every
reader sums from it must be the view over the relations as of the load, and an aggregate
view's stored rows exactly what ``aggregate.encode`` makes of that body."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from contract.relation_snapshot import arrow_type
from contract.zset import ZSet
from warehouse.aggregate import encode, evaluate, summed
from warehouse.analysts.verification import stored_as_of
from warehouse.engine_load import body_types, load_sql, supports, write_taken_back
from warehouse.plan import ViewPlan
from warehouse.recompute import recompute_body
from warehouse.sql_views import parse_view
from warehouse.store.spark import SparkStore

pytestmark = pytest.mark.spark

COLUMNS = {("a", "R"): ("k", "a", "n", "x"), ("b", "S"): ("k", "g")}
DECLARED = {("a", "R"): ["INTEGER", "TEXT", "INTEGER", "DOUBLE"], ("b", "S"): ["INTEGER", "TEXT"]}

# What each snapshot holds (a row twice where a table has no key), and what its compensation
# stages (``write_taken_back``: the concurrent deltas, negated). R's row 2 and 6 were
# inserted after the load's order: they cancel. R's row 4 was deleted after it: added back.
# S's row 3 moved from G3 to G2 after it (G2 is left with rows that cancel, as G4 is through
# R's row 6); row 4 was inserted once more after it.
SNAPSHOTS = {
    ("a", "R"): [(1, "p", 5, 0.5), (1, "p", 5, 0.5), (2, "q", 7, 1e16), (3, "q", 1, 0.25), (6, "s", 4, 3.0)],
    ("b", "S"): [(1, "G1"), (1, "G1"), (2, "G3"), (3, "G2"), (4, "G1"), (4, "G1"), (6, "G4")],
}
CONCURRENT = {
    ("a", "R"): ZSet({(2, "q", 7, 1e16): 1, (6, "s", 4, 3.0): 1, (4, "r", 9, 2.0): -1}),
    ("b", "S"): ZSet({(3, "G3"): -1, (3, "G2"): 1, (4, "G1"): 1}),
}
JOIN = "FROM a.R, b.S WHERE R.k = S.k"
VIEWS = {
    # the projection drops the join key: rows come more than once
    "plain": f"SELECT S.g, R.a {JOIN}",
    # G2's and G4's rows all cancel: they must leave no stored row
    "counts": f"SELECT S.g, COUNT(*) AS c, COUNT(R.n) AS cn, SUM(R.n) AS s, MIN(R.a) AS lo, MAX(R.n) AS hi {JOIN} GROUP BY S.g",
    # a sum of doubles: G3's 1e16 and -1e16 summed with its 0.25 could lose the 0.25
    "means": f"SELECT S.g, AVG(R.x) AS mean, SUM(R.x) AS total {JOIN} GROUP BY S.g",
    "ungrouped": f"SELECT COUNT(*) AS c, SUM(R.n) AS s {JOIN}",
    "distinct": f"SELECT DISTINCT S.g {JOIN}",
}


def as_of_load() -> dict[tuple[str, str], ZSet]:
    """Each relation as of the load: its snapshot less what it must not reflect."""
    return {key: ZSet.from_rows(rows) - CONCURRENT[key] for key, rows in SNAPSHOTS.items()}


def declared_types(plan: ViewPlan) -> list[list[str]]:
    """Each relation's declared types, in the order of the columns the view reads of it."""
    return [
        [DECLARED[(r.source, r.table)][COLUMNS[(r.source, r.table)].index(c)] for c in r.columns]
        for r in plan.relations
    ]


def staged(tmp_path: Path, plan: ViewPlan) -> list[tuple[str, str | None]]:
    """Each relation staged as the load stages it: the columns the view reads, the snapshot's
    rows, the compensation beside them."""
    files: list[tuple[str, str | None]] = []
    for j, (r, declared) in enumerate(zip(plan.relations, declared_types(plan), strict=True)):
        key = (r.source, r.table)
        picked = [COLUMNS[key].index(c) for c in r.columns]
        schema = pa.schema([(c, arrow_type(t)) for c, t in zip(r.columns, declared, strict=True)])
        rows = [{c: row[i] for c, i in zip(r.columns, picked)} for row in SNAPSHOTS[key]]
        path = tmp_path / f"r{j}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema), path)
        compensation = ZSet((tuple(row[i] for i in picked), w) for row, w in CONCURRENT[key].items())
        files.append((str(path), write_taken_back(compensation, schema, tmp_path / f"c{j}.parquet")))
    return files


@pytest.mark.parametrize("shape", sorted(VIEWS))
def test_the_load_sums_duplicates_and_cancelled_rows_as_the_view_as_of_the_load(
    spark: SparkSession, spark_store: SparkStore, view: str, tmp_path: Path, shape: str
) -> None:
    plan = parse_view(VIEWS[shape], lambda source, table: COLUMNS[(source, table)], name=view)
    declared = declared_types(plan)
    assert supports(plan, declared) is None  # a view the engine loads
    body = recompute_body(plan, as_of_load(), COLUMNS)
    if shape == "means":
        assert "DOUBLE" in body_types(plan, declared)
    types = body_types(plan, declared)
    s = plan.summary
    if s is None:
        spark_store.create(view, plan.stored_names, types)
    else:
        spark_store.create(view, s.stored_names, s.stored_types(types), summed(s, types))
    assert spark_store.load(view, 1, load_sql(plan, staged(tmp_path, plan), declared))
    spark_store.publish(view, 1)

    if s is None:
        expected = body
        assert spark_store.read(view) == expected
        assert ZSet.from_rows(spark_store.read_rows(view)) == expected
        # the z-log holds the join's rows unsummed: more rows than the view has
        zlog = spark.sql(f"SELECT * FROM {spark_store.zlog_table(view)} WHERE _w <> 0").count()
        assert zlog > len(expected)
    else:
        # the stored rows are those ``encode`` makes of the body, no more (no row of a
        # group whose rows all cancel), and each row's numbers exact
        assert spark_store.read(view) == encode(s, body)
        expected = evaluate(s, body)
        assert ZSet.from_rows(spark_store.read_rows(view)) == expected
    assert stored_as_of(spark.newSession(), spark_store.record(view).to_record(), 1) == expected
    assert spark_store.compact(view)  # compaction sums the same
    assert ZSet.from_rows(spark_store.read_rows(view)) == expected
