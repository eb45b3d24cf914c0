"""The consistent database (``pvm_consistent``, ``warehouse/store/published.py``): every view
as of one cut, switched to a new cut at once for every reader.

The views here come straight from the store (no manager): ``a`` and ``b`` both hold the one
row ``(k,)`` as of order ``k``, so a query that joins them on ``k`` finds one row exactly when
it reads both as of the same order.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator

import pytest
from pyspark.sql import SparkSession

from contract.zset import ZSet
from warehouse.store.base import Effect
from warehouse.store.published import PublishedViews
from warehouse.store.spark import SparkStore
from warehouse.store.spark_records import ViewMeta

pytestmark = pytest.mark.spark

ORDERS = 2


@pytest.fixture
def consistent(spark: SparkSession) -> Iterator[tuple[PublishedViews, str]]:
    """A ``PublishedViews`` of its own (its own databases: the session's shows the store's
    views too, and drops the tables it no longer needs)."""
    suffix = uuid.uuid4().hex[:8]
    database = f"pvm_consistent_{suffix}"
    shown = PublishedViews(spark, database=f"pvm_views_{suffix}", consistent=database)
    yield shown, database
    shown.show_consistent({})


def two_views(store: SparkStore) -> tuple[str, str]:
    names = (f"a_{uuid.uuid4().hex[:8]}", f"b_{uuid.uuid4().hex[:8]}")
    for name in names:
        store.create(name, ["k"], types=["BIGINT"])
        store.commit(
            name, [Effect(k, ZSet({(k,): 1, (k - 1,): -1} if k > 1 else {(k,): 1})) for k in range(1, ORDERS + 1)]
        )
        store.publish(name, ORDERS)
    return names


def cut(store: SparkStore, names: tuple[str, ...], order: int) -> dict[str, tuple[ViewMeta, int]]:
    return {name: (store.record(name), order) for name in names}


def flip_while_reading(
    spark: SparkSession, switch: Callable[[int], None], read: str, reads: int
) -> tuple[list[tuple[int, int | None]], int]:
    """Switch between the cuts at orders 1 and 2 as fast as possible in a thread while this
    one runs ``read`` ``reads`` times; the rows read, and how many switches were made."""
    done = threading.Event()
    switches = 0

    def flip() -> None:
        nonlocal switches
        while not done.is_set():
            switch(1 + switches % 2)
            switches += 1

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    session = spark.newSession()  # another session of the application, as a Connect client's
    try:
        seen = [tuple(session.sql(read).collect()[0]) for _ in range(reads)]
    finally:
        done.set()
        flipper.join(timeout=60)
    return seen, switches


def test_every_view_moves_to_a_new_cut_at_once(
    spark: SparkSession, spark_store: SparkStore, consistent: tuple[PublishedViews, str]
) -> None:
    shown, database = consistent
    a, b = two_views(spark_store)
    shown.show_consistent(cut(spark_store, (a, b), 1))
    assert shown.consistent() == {a: 1, b: 1}
    assert spark.sql(f"SELECT k FROM {database}.{a}").collect() == [(1,)]
    # the other branch of the state is pruned away: one view reads its own files only
    plan = spark.sql(f"SELECT k FROM {database}.{a}")._jdf.queryExecution().optimizedPlan().toString()
    assert f"_{b}" not in plan and f"_{a}" in plan  # the tables are <kind>_<version>_<view>

    read = f"SELECT count(*), max(x.k) FROM {database}.{a} x JOIN {database}.{b} y ON x.k = y.k"
    seen, switches = flip_while_reading(
        spark, lambda order: shown.show_consistent(cut(spark_store, (a, b), order)), read, reads=8
    )
    assert all(count == 1 for count, _ in seen), seen  # both views as of one order, every time
    assert {k for _, k in seen} == {1, 2}, (seen, switches)  # the reads saw both cuts


def in_database(spark: SparkSession, database: str) -> set[str]:
    """The tables and views of ``database``: ``listTables`` names the session's temporary
    views too (other tests of the session leave theirs)."""
    return {t.name for t in spark.catalog.listTables(database) if not t.isTemporary}


def test_views_join_and_leave_the_consistent_database(
    spark: SparkSession, spark_store: SparkStore, consistent: tuple[PublishedViews, str]
) -> None:
    shown, database = consistent
    a, b = two_views(spark_store)
    shown.show_consistent(cut(spark_store, (a,), 2))
    tables = in_database(spark, database)
    assert a in tables and b not in tables
    shown.show_consistent(cut(spark_store, (a, b), 1))
    assert spark.sql(f"SELECT * FROM {database}.{b}").collect() == [(1,)]
    assert spark.sql(f"SELECT * FROM {database}.{a}").collect() == [(1,)]
    # a view dropped from the store leaves the consistent state at once; the others stay
    spark_store.drop(a)
    shown.apply(a, None)
    assert shown.consistent() == {b: 1}
    assert a not in in_database(spark, database)
    assert spark.sql(f"SELECT * FROM {database}.{b}").collect() == [(1,)]
    shown.show_consistent({})
    assert in_database(spark, database) == set()
