"""Restarts of the Spark store as ``pvm serve`` runs it: table locations and W recorded in
the catalog database (``StoreRecords``), and a manager that dies between the Spark append of a
commit group and recording the group in the catalog."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from contract.zset import ZSet
from tests.sim import recompute, start_sim_manager
from tests.spark.analyst_support import TABLES, change, join_sql, settle
from warehouse.catalog.db import Catalog, StoreRecords
from warehouse.store.base import Effect
from warehouse.store.published import PublishedViews
from warehouse.store.spark import SparkStore
from warehouse.store.spark_files import part_files

pytestmark = pytest.mark.spark


def new_process(spark: SparkSession, views: list[str]) -> None:
    """What a new process lacks: the session catalog's tables and views of the store."""
    for view in views:
        spark.sql(f"DROP VIEW IF EXISTS `{view}`")  # as the analysts' query process shows it
        spark.sql(f"DROP TABLE IF EXISTS {SparkStore.zlog_table(view)}")
        spark.sql(f"DROP TABLE IF EXISTS {SparkStore.base_table(view)}")


def zlog_counts(spark: SparkSession, view: str) -> dict[int, int]:
    rows = spark.sql(f"SELECT _order, count(*) FROM {SparkStore.zlog_table(view)} GROUP BY _order").collect()
    return {r[0]: r[1] for r in rows}


def test_a_restart_registers_the_tables_from_the_catalog_database(
    spark: SparkSession, tmp_path: Path, view: str
) -> None:
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    data = tmp_path / "spark"
    store = SparkStore(spark, data, StoreRecords(Catalog(url)))
    try:
        store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
        store.commit(view, [Effect(1, ZSet({(1, "a"): 2})), Effect(2, ZSet({(2, "b"): 1}))])
        store.publish(view, 1)
        assert store.compact(view)  # new locations, recorded in the database
        store.commit(view, [Effect(3, ZSet({(1, "a"): -1, (3, "c"): 1}))])
        store.publish(view, 3)
        before, meta = store.read(view), store._state(view).meta
        assert not (data / "store-catalog.json").exists()  # the database is the only record
        assert StoreRecords(Catalog(url)).load(view) == meta.to_record()

        new_process(spark, [view])
        restarted = SparkStore(spark, data, StoreRecords(Catalog(url)))
        restarted.subscribe(PublishedViews(spark, database="pvm_views_restarted").apply)  # a new query process
        assert restarted.views() == [view]
        assert restarted._state(view).meta == meta
        assert meta.base_version == 1 and meta.compacted_through == 1
        assert restarted.read(view) == before
        assert restarted.published(view) == 3
        assert restarted.committed_orders(view) == {1, 2, 3}
        assert sorted(tuple(r) for r in spark.sql(f"SELECT * FROM {view}").collect()) == [(1, "a"), (2, "b"), (3, "c")]
        files = len(part_files(meta.zlog_location))
        restarted.commit(view, [Effect(1, ZSet({(9, "dup"): 1})), Effect(3, ZSet({(9, "dup"): 1}))])
        assert len(part_files(meta.zlog_location)) == files and restarted.read(view) == before
    finally:
        store.drop(view)


async def test_a_crash_between_the_append_and_the_catalog_applies_the_effect_once(
    spark: SparkSession, tmp_path: Path, view: str
) -> None:
    """The commit manager appends a group to Spark, then the process dies before
    ``commit_units`` records it. A manager restarted on the same catalog and Spark store runs
    those units again; the store finds their orders in the z-log and appends nothing, and the
    view equals the recomputation from the sources."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    data = tmp_path / "spark"
    store = SparkStore(spark, data, StoreRecords(Catalog(url)))
    manager, sources = await start_sim_manager(tmp_path / "catalog.db", TABLES, store, seed=3, catalog_url=url)
    try:
        rng = random.Random(3)
        sources["s1"].load("r", [(i, rng.randrange(4)) for i in range(1, 9)])
        sources["s2"].load("s", [(b, rng.randrange(3)) for b in range(4) for _ in range(2)])
        await manager.define_view(join_sql(view), name=view, parallelism=2)
        await settle(manager, store, view)

        maintainer = manager.view(view).maintainer
        real_db, crashed = maintainer.db, asyncio.Event()

        async def dying_db(method, *args, **kwargs):
            if method is Catalog.commit_units:  # the group is in Spark already: die right here
                crashed.set()
                await asyncio.Event().wait()
            return await real_db(method, *args, **kwargs)

        maintainer.db = dying_db
        for _ in range(6):
            change(sources[rng.choice(["s1", "s2"])], rng)
            for s in sources.values():
                await s.ship()
        await asyncio.wait_for(crashed.wait(), 60)
        units = await manager.db(Catalog.units, view)
        unrecorded = {u.order for u in units if not u.committed}
        appended = unrecorded & store.committed_orders(view)
        assert appended, (units, store.committed_orders(view))
        counts = zlog_counts(spark, view)
    finally:
        await manager.stop()  # the crash: the group is never recorded

    new_process(spark, [view])
    store2 = SparkStore(spark, data, StoreRecords(Catalog(url)))
    manager2, _ = await start_sim_manager(tmp_path / "catalog.db", TABLES, store2, sources=sources, catalog_url=url)
    try:
        for s in sources.values():
            await s.ship()
        await settle(manager2, store2, view)
        units = await manager2.db(Catalog.units, view)
        assert all(u.committed for u in units) and appended <= {u.order for u in units}
        after = zlog_counts(spark, view)
        assert {o: after.get(o) for o in appended} == {o: counts[o] for o in appended}  # not appended again
        contents = {(s, t): z for s, src in sources.items() for t, z in src.state.items()}
        columns = {(s, t): c for s, src in sources.items() for t, c in src.tables.items()}
        expected = recompute(manager2.view(view).plan, contents, columns)
        assert manager2.read(view) == expected
        assert sorted(store2.read_rows(view)) == sorted(expected.expand())
        assert store2.published(view) == manager2.watermark(view) == max(u.order for u in units)
    finally:
        await manager2.stop()
        store2.drop(view)
