"""What the Spark store adds to the contract: SQL reads, bag semantics, typed columns,
names Spark can live with, one append per group, and restarts."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from contract.zset import ZSet
from warehouse.store.base import Effect, StoreError
from warehouse.store.spark import SparkStore
from warehouse.store.spark_files import part_files
from warehouse.store.spark_session import get_spark

pytestmark = pytest.mark.spark


def sql_rows(spark: SparkSession, view: str) -> list[tuple]:
    return sorted(tuple(r) for r in spark.sql(f"SELECT * FROM {view}").collect())


def test_sql_view_shows_the_published_state_as_a_bag(spark: SparkSession, spark_store: SparkStore, view: str) -> None:
    spark_store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
    spark_store.commit(view, [Effect(1, ZSet({(1, "a"): 3, (2, "b"): 1}))])
    spark_store.commit(view, [Effect(2, ZSet({(2, "b"): -2, (3, "c"): 1}))])
    assert sql_rows(spark, view) == []  # nothing published yet
    spark_store.publish(view, 1)
    assert sql_rows(spark, view) == [(1, "a"), (1, "a"), (1, "a"), (2, "b")]
    spark_store.publish(view, 2)
    # (2, "b") sums to -1: an owed delete, hidden from readers but kept in the sums
    assert sql_rows(spark, view) == [(1, "a"), (1, "a"), (1, "a"), (3, "c")]
    assert spark_store.read(view).weight((2, "b")) == -1
    assert sorted(spark_store.read_rows(view)) == sql_rows(spark, view)
    assert sorted(spark_store.read_rows(view, as_of=1)) == [(1, "a")] * 3 + [(2, "b")]


def test_latest_includes_effects_past_the_watermark(spark_store: SparkStore, view: str) -> None:
    spark_store.create(view, ["k"])
    spark_store.commit(view, [Effect(5, ZSet({(5,): 1})), Effect(1, ZSet({(1,): 2}))])
    spark_store.publish(view, 1)
    assert sorted(spark_store.read_rows(view)) == [(1,), (1,)]
    assert sorted(spark_store.read_rows(view, latest=True)) == [(1,), (1,), (5,)]
    with pytest.raises(StoreError):
        spark_store.read_rows(view, as_of=1, latest=True)


def test_untyped_columns_round_trip_python_scalars(spark_store: SparkStore, view: str) -> None:
    rows = [(1, "int"), (1.5, "float"), ("1", "str"), (True, "bool"), (None, "none")]
    rows += [(10**18, 'quote " and é'), (-0.25, "")]
    spark_store.create(view, ["value", "label"])
    spark_store.commit(view, [Effect(1, ZSet.from_rows(rows))])
    back = spark_store.read(view)
    assert back == ZSet.from_rows(rows)
    assert {(type(v), label) for v, label in back.rows()} == {(type(v), label) for v, label in rows}
    with pytest.raises(StoreError):
        spark_store.commit(view, [Effect(2, ZSet({((1, 2), "tuple"): 1}))])
    assert spark_store.committed_orders(view) == {1}


def test_typed_columns_keep_their_types(spark: SparkSession, spark_store: SparkStore, view: str) -> None:
    spark_store.create(view, ["n", "x", "s", "b"], types=["BIGINT", "DOUBLE", "STRING", "BOOLEAN"])
    rows = [(1, 2.5, "a", True), (None, None, None, None)]
    spark_store.commit(view, [Effect(1, ZSet.from_rows(rows))])
    back = spark_store.read(view)
    assert back == ZSet.from_rows(rows)
    assert [type(v) for v in next(r for r in back.rows() if r[0] is not None)] == [
        int,
        float,
        str,
        bool,
    ]
    table = spark.table(SparkStore.zlog_table(view))
    assert table.dtypes[:4] == [("n", "bigint"), ("x", "double"), ("s", "string"), ("b", "boolean")]
    with pytest.raises(StoreError):
        spark_store.commit(view, [Effect(2, ZSet({("not a number", 1.0, "a", True): 1}))])
    with pytest.raises(StoreError):
        spark_store.create(view, ["n", "x", "s", "b"], types=["INT", "DOUBLE", "STRING", "BOOLEAN"])


@pytest.mark.parametrize("name", ["select", "From", "1view", "my-view", "a b", "", "pvm_base_x", "PVM_ZLOG_y"])
def test_names_spark_cannot_serve_are_refused(spark_store: SparkStore, name: str) -> None:
    with pytest.raises(StoreError):
        spark_store.create(name, ["k"])


@pytest.mark.parametrize("columns", [[], ["_w"], ["k", "_ORDER"], ["k", "K"], ["bad name"]])
def test_bad_columns_are_refused(spark_store: SparkStore, view: str, columns: list[str]) -> None:
    with pytest.raises(StoreError):
        spark_store.create(view, columns)


def test_view_names_differing_only_in_case_are_refused(spark_store: SparkStore, view: str) -> None:
    spark_store.create(view, ["k"])
    with pytest.raises(StoreError):
        spark_store.create(view.upper(), ["k"])


def test_a_group_is_one_append(spark_store: SparkStore, view: str) -> None:
    spark_store.create(view, ["k", "name"])
    location = spark_store._state(view).meta.zlog_location
    for group in range(3):
        effects = [Effect(group * 50 + i, ZSet({(group * 50 + i, "x"): 1, (-i, "y"): 1})) for i in range(1, 51)]
        spark_store.commit(view, effects)
        assert len(part_files(location)) == group + 1
    spark_store.commit(view, effects)  # all already committed: no append at all
    assert len(part_files(location)) == 3
    assert len(spark_store.committed_orders(view)) == 150


def test_restart_sees_everything_and_stays_idempotent(
    spark: SparkSession, spark_store: SparkStore, data_dir: Path, view: str
) -> None:
    spark_store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
    spark_store.commit(view, [Effect(1, ZSet({(1, "a"): 2})), Effect(2, ZSet())])
    spark_store.commit(view, [Effect(3, ZSet({(1, "a"): -1, (2, "b"): 1}))])
    spark_store.publish(view, 2)
    before = spark_store.read(view)

    spark.catalog.dropTempView(view)  # a new process has neither tables nor the view
    spark.sql(f"DROP TABLE {SparkStore.zlog_table(view)}")
    spark.sql(f"DROP TABLE {SparkStore.base_table(view)}")
    restarted = SparkStore(spark, data_dir)

    assert restarted.views() == [view]
    assert restarted.read(view) == before
    assert restarted.published(view) == 2
    assert restarted.committed_orders(view) == {1, 2, 3}
    assert sql_rows(spark, view) == [(1, "a"), (1, "a")]
    location = restarted._state(view).meta.zlog_location
    files = len(part_files(location))
    restarted.commit(view, [Effect(2, ZSet({(7, "dup"): 1})), Effect(3, ZSet({(7, "dup"): 1}))])
    assert len(part_files(location)) == files
    assert restarted.read(view) == before


def test_one_session_per_process(spark: SparkSession) -> None:
    assert get_spark() is spark
    assert get_spark(master="local[1]", app_name="other") is spark
