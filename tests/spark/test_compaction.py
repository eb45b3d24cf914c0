"""Compaction folds the z-log into a new base without changing any readable state."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from contract.zset import ZSet
from warehouse.store import spark as spark_module
from warehouse.store import spark_compaction
from warehouse.store.base import Effect, StoreError
from warehouse.store.compaction import CompactionPolicy, Compactor, ZlogStats
from warehouse.store.spark import SparkStore
from warehouse.store.spark_files import part_files, read_footer

pytestmark = pytest.mark.spark


def effect(order: int) -> Effect:
    """Order o inserts row (o, 'r<o>') twice and deletes one copy of the previous row, so
    every state differs from the next and some sums go back to zero or below."""
    return Effect(order, ZSet({(order, f"r{order}"): 2, (order - 1, f"r{order - 1}"): -1}))


def states(store: SparkStore, view: str, orders: range) -> dict[int, ZSet]:
    return {w: store.read(view, as_of=w) for w in orders}


@pytest.fixture
def compacted(spark_store: SparkStore, view: str) -> tuple[SparkStore, str, dict[int, ZSet]]:
    """Orders 1..8 committed, W = 5, then compacted; returns the states before compaction.
    The z-log's files lie below W (1-3), above it (6-7) and on both sides (4, 5, 8)."""
    spark_store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
    spark_store.commit(view, [effect(o) for o in (1, 2, 3)])
    spark_store.commit(view, [effect(o) for o in (6, 7)])
    spark_store.commit(view, [effect(o) for o in (4, 5, 8)])
    files = part_files(spark_store._state(view).meta.zlog_location)
    assert sorted(read_footer(f).span for f in files) == [(1, 3), (4, 8), (6, 7)]
    spark_store.publish(view, 5)
    before = states(spark_store, view, range(5, 9)) | {-1: spark_store.read(view)}
    old = spark_store._state(view).meta
    assert spark_store.compact(view)
    new = spark_store._state(view).meta
    assert not Path(old.base_location).exists() and not Path(old.zlog_location).exists()
    assert Path(new.base_location).exists() and Path(new.zlog_location).exists()
    return spark_store, view, before


def test_compaction_keeps_every_readable_state(
    spark: SparkSession, compacted: tuple[SparkStore, str, dict[int, ZSet]]
) -> None:
    store, view, before = compacted
    assert states(store, view, range(5, 9)) | {-1: store.read(view)} == before
    assert sorted(store.read_rows(view)) == sorted(before[5].expand())
    assert sorted(tuple(r) for r in spark.sql(f"SELECT * FROM {view}").collect()) == sorted(before[5].expand())
    zlog_orders = spark.sql(f"SELECT DISTINCT _order FROM {SparkStore.zlog_table(view)}")
    assert sorted(r[0] for r in zlog_orders.collect()) == [6, 7, 8]


def rows_in(session: SparkSession, view: str) -> list[tuple]:
    return sorted(tuple(r) for r in session.sql(f"SELECT * FROM {view}").collect())


def test_a_query_planned_during_the_swap_reads_one_version(
    spark: SparkSession, spark_store: SparkStore, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap moves the two stable tables one after the other; an analyst's query (its own
    session, no view lock) planned at any moment of it reads the published state once: not
    the new base with the old z-log (rows up to W twice), nor the old base with the new."""
    spark_store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
    spark_store.commit(view, [effect(o) for o in range(1, 9)])
    spark_store.publish(view, 5)
    analyst = spark.newSession()
    expected = sorted(spark_store.read(view, as_of=5).expand())
    assert rows_in(analyst, view) == expected
    seen: list[list[tuple]] = []
    relocate = SparkStore._relocate

    def relocate_and_read(self: SparkStore, table: str, location: str) -> None:
        relocate(self, table, location)
        seen.append(rows_in(analyst, view))

    monkeypatch.setattr(SparkStore, "_relocate", relocate_and_read)
    assert spark_store.compact(view)
    assert len(seen) == 2 and seen == [expected, expected]
    assert rows_in(analyst, view) == expected


def test_another_session_sees_each_publish_and_compaction(
    spark: SparkSession, spark_store: SparkStore, view: str
) -> None:
    """A Spark Connect client's session is not the store's: it must see new commits and new
    table versions, not the files its first query listed."""
    analyst = spark.newSession()
    spark_store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
    spark_store.commit(view, [effect(1)])
    spark_store.publish(view, 1)
    assert rows_in(analyst, view) == sorted(spark_store.read(view).expand())
    spark_store.commit(view, [effect(2), effect(3)])
    spark_store.publish(view, 3)
    assert rows_in(analyst, view) == sorted(spark_store.read(view).expand())
    assert analyst.table(SparkStore.zlog_table(view)).count() == 3 * 2
    assert spark_store.compact(view)
    spark_store.commit(view, [effect(4)])
    spark_store.publish(view, 4)
    assert rows_in(analyst, view) == sorted(spark_store.read(view).expand())
    assert analyst.table(SparkStore.zlog_table(view)).count() == 2


def test_compacted_as_of_is_refused(compacted: tuple[SparkStore, str, dict[int, ZSet]]) -> None:
    store, view, _ = compacted
    with pytest.raises(StoreError, match="as_of 4 is older than the compacted state"):
        store.read(view, as_of=4)
    with pytest.raises(StoreError):
        store.read_rows(view, as_of=2)
    with pytest.raises(StoreError):
        store.publish(view, 4)


def test_compacted_orders_stay_committed(
    spark: SparkSession, data_dir: Path, compacted: tuple[SparkStore, str, dict[int, ZSet]]
) -> None:
    store, view, before = compacted
    assert store.committed_orders(view) == set(range(1, 9))
    store.commit(view, [Effect(3, ZSet({(99, "again"): 1})), effect(9)])
    assert store.read(view, as_of=8) == before[8]
    assert store.read(view) == before[-1] + effect(9).delta
    restarted = SparkStore(spark, data_dir)
    assert restarted.committed_orders(view) == set(range(1, 10))
    assert restarted.read(view, as_of=8) == before[8]
    with pytest.raises(StoreError):
        restarted.read(view, as_of=4)


def test_compacting_twice_folds_the_new_part(
    compacted: tuple[SparkStore, str, dict[int, ZSet]],
) -> None:
    store, view, before = compacted
    store.publish(view, 7)
    assert store.compact(view)
    assert store.read(view, as_of=8) == before[8]
    assert store.read(view, as_of=7) == before[7]
    assert store._state(view).meta.compacted_orders == ((1, 7),)
    assert store._state(view).meta.base_version == 2


def test_commit_during_compaction_is_not_lost(
    spark_store: SparkStore, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spark_store.create(view, ["k", "name"])
    spark_store.commit(view, [effect(o) for o in range(1, 6)])
    spark_store.publish(view, 4)
    expected = spark_store.read(view) + effect(6).delta + effect(7).delta
    write = spark_module.write_compacted

    def write_while_committing(*args: Any) -> None:
        # Commits from another thread land between the snapshot and the swap; order 3 is a
        # duplicate of a folded order, order 7 ≤ nothing yet published.
        committer = threading.Thread(target=lambda: spark_store.commit(view, [effect(6), effect(3), effect(7)]))
        committer.start()
        write(*args)
        committer.join()

    monkeypatch.setattr(spark_module, "write_compacted", write_while_committing)
    assert spark_store.compact(view)
    assert spark_store.read(view) == expected
    assert spark_store.committed_orders(view) == set(range(1, 8))
    assert spark_store._state(view).zlog_orders == {5, 6, 7}


def test_a_compaction_with_nothing_to_fold_keeps_the_base(
    spark_store: SparkStore, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """W has not moved past the z-log (the file-count policy can ask for this): the base is
    carried over as it is, not read by a Spark job, and every state stays readable."""
    spark_store.create(view, ["k", "name"])
    spark_store.commit(view, [effect(1)])
    spark_store.publish(view, 1)
    assert spark_store.compact(view)
    spark_store.commit(view, [effect(o) for o in (2, 3)])
    spark_store.commit(view, [effect(4)])
    before = states(spark_store, view, range(1, 5))
    base = spark_store._state(view).meta.base_location
    read: list[str] = []
    plain_read = spark_compaction._read

    def recording_read(spark, schema, paths):
        read.extend(paths)
        return plain_read(spark, schema, paths)

    monkeypatch.setattr(spark_compaction, "_read", recording_read)
    assert spark_store.compact(view)
    assert read and base not in read  # only the z-log files above W were rewritten
    monkeypatch.undo()
    assert states(spark_store, view, range(1, 5)) == before
    assert spark_store._state(view).meta.compacted_orders == ((1, 1),)
    assert spark_store._state(view).zlog_orders == {2, 3, 4}


def test_compaction_copies_files_where_it_cannot_link_them(
    spark_store: SparkStore, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another file system, or one without hard links: the files are copied instead."""
    spark_store.create(view, ["k", "name"])
    spark_store.commit(view, [effect(1)])
    spark_store.publish(view, 1)
    assert spark_store.compact(view)
    spark_store.commit(view, [effect(2)])
    before = states(spark_store, view, range(1, 3))

    def no_links(source: str, target: str) -> None:
        raise OSError("hard links not supported")

    monkeypatch.setattr(os, "link", no_links)
    assert spark_store.compact(view)  # the base is carried over whole
    assert states(spark_store, view, range(1, 3)) == before


def test_compacting_nothing_is_a_no_op(spark_store: SparkStore, view: str) -> None:
    spark_store.create(view, ["k"])
    assert not spark_store.compact(view)


def test_policy() -> None:
    policy = CompactionPolicy(max_rows=100, max_files=10, max_age_s=60)
    assert not policy.due(ZlogStats(0, 0, 0, watermark=5, compacted_through=0))
    assert policy.due(ZlogStats(10, 10, 1, watermark=0, compacted_through=0))
    assert policy.due(ZlogStats(2, 100, 1, watermark=5, compacted_through=0))
    assert policy.due(ZlogStats(2, 10, 61, watermark=5, compacted_through=0))
    assert not policy.due(ZlogStats(2, 100, 61, watermark=5, compacted_through=5))
    assert not policy.due(ZlogStats(2, 10, 1, watermark=5, compacted_through=0))


def test_compactor_compacts_views_that_are_due(spark_store: SparkStore, view: str) -> None:
    spark_store.create(view, ["k", "name"])
    for order in range(1, 4):
        spark_store.commit(view, [effect(order)])
    spark_store.publish(view, 3)
    stats = spark_store.zlog_stats(view)
    assert (stats.files, stats.rows, stats.watermark) == (3, 6, 3)
    compactor = Compactor(spark_store, CompactionPolicy(max_files=3))
    assert compactor.run_once() == [view]
    assert spark_store.zlog_stats(view).compacted_through == 3
    assert compactor.run_once() == []
    location = spark_store._state(view).meta.zlog_location
    assert len(part_files(location)) <= 1


def test_each_zlog_footer_is_read_once_and_outside_the_view_lock(
    spark_store: SparkStore, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compactor asks for a view's z-log figures every interval, and compaction needs
    each file's ``_order`` span: both come from the footers of files that never change, so
    each is read once, without holding up commits, and the figures follow new commits and
    compactions."""
    spark_store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
    state = spark_store._state(view)
    reads: list[tuple[str, bool]] = []  # (path, whether the view lock was free meanwhile)
    read_metadata = pq.read_metadata

    def lock_is_free() -> bool:
        free: list[bool] = []

        def probe() -> None:  # from another thread: the view lock is reentrant
            free.append(state.lock.acquire(blocking=False))
            if free[0]:
                state.lock.release()

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
        return free[0]

    def recording_read_metadata(path: str, *args: object, **kwargs: object) -> pq.FileMetaData:
        reads.append((path, lock_is_free()))
        return read_metadata(path, *args, **kwargs)

    monkeypatch.setattr(pq, "read_metadata", recording_read_metadata)

    def figures() -> tuple[int, int]:
        stats = spark_store.zlog_stats(view)
        return stats.files, stats.rows

    spark_store.commit(view, [effect(1), effect(2)])  # 2 rows per effect
    spark_store.commit(view, [effect(3)])
    assert figures() == figures() == (2, 6)
    assert len(reads) == 2
    spark_store.commit(view, [effect(4)])
    assert figures() == figures() == (3, 8)
    assert len(reads) == 3
    spark_store.publish(view, 3)
    assert spark_store.compact(view)
    assert len(reads) == 3  # the spans came from the footers zlog_stats had read
    zlog = state.meta.zlog_location
    assert figures() == figures() == (len(part_files(zlog)), 2)  # order 4 is left
    spark_store.commit(view, [effect(5)])
    assert figures() == (len(part_files(zlog)), 4)
    paths = [path for path, _ in reads]
    assert len(paths) == len(set(paths)) == 3 + len(part_files(zlog))
    assert all(free for _, free in reads)
    assert set(state.footers) == set(part_files(zlog))  # the compacted-away files are forgotten


def test_failed_compaction_leaves_the_old_state(
    spark: SparkSession, tmp_path: Path, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SparkStore(spark, tmp_path / "it's data")  # a quote in ALTER TABLE … LOCATION
    try:
        store.create(view, ["k", "name"])
        store.commit(view, [effect(o) for o in range(1, 5)])
        store.publish(view, 3)
        before = states(store, view, range(3, 5))
        meta = store._state(view).meta

        def crash(view: str, record: dict) -> None:
            raise OSError("disk full")

        monkeypatch.setattr(store._catalog, "save", crash)
        with pytest.raises(OSError):
            store.compact(view)
        assert store._state(view).meta == meta
        assert sorted(p.name for p in Path(meta.base_location).parent.iterdir()) == ["v0"]
        assert sorted(p.name for p in Path(meta.zlog_location).parent.iterdir()) == ["v0"]
        assert states(store, view, range(3, 5)) == before

        monkeypatch.undo()
        assert store.compact(view)
        assert states(store, view, range(3, 5)) == before
    finally:
        for name in store.views():
            store.drop(name)


def test_restart_removes_directories_no_record_points_to(
    spark: SparkSession, spark_store: SparkStore, data_dir: Path, view: str
) -> None:
    spark_store.create(view, ["k"])
    spark_store.commit(view, [Effect(1, ZSet({(1,): 1}))])
    leftovers = [
        data_dir / "views" / view / "base" / "v1",  # a compaction that crashed before the record
        data_dir / "views" / view / "zlog" / "v1",
        data_dir / "views" / "dropped_view" / "zlog" / "v0",  # a drop that crashed after it
    ]
    for path in leftovers:
        path.mkdir(parents=True)
        (path / "part-00000.parquet").write_bytes(b"junk")
    restarted = SparkStore(spark, data_dir)
    assert not any(path.exists() for path in leftovers)
    assert not (data_dir / "views" / "dropped_view").exists()
    assert restarted.read(view) == ZSet({(1,): 1})


def test_compactor_thread_runs_in_the_background(spark_store: SparkStore, view: str) -> None:
    spark_store.create(view, ["k", "name"])
    spark_store.commit(view, [effect(1)])
    spark_store.commit(view, [effect(2)])
    spark_store.publish(view, 2)
    before = spark_store.read(view)
    compactor = Compactor(spark_store, CompactionPolicy(max_files=2), interval_s=0.05)
    compactor.start()
    try:
        deadline = time.monotonic() + 60
        while spark_store.zlog_stats(view).compacted_through < 2:
            assert time.monotonic() < deadline, "the compactor never ran"
            time.sleep(0.1)
    finally:
        compactor.stop()
    assert spark_store.read(view) == before


def test_serve_keeps_old_versions_past_the_query_timeout(
    spark: SparkSession, tmp_path: Path, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pvm serve``'s store keeps a compacted-away version at least as long as an analyst's
    query may run (``QUERY_TIMEOUT_S`` by default) and deletes it once that time is up."""
    from api.analyst import QUERY_TIMEOUT_S
    from pvm.cli import build_parser
    from pvm.serve import catalog_url, open_store, retention_s

    defaults = build_parser(["serve"]).parse_args(["serve"])
    store = open_store("spark", tmp_path, None, catalog_url(tmp_path, None), retire_after_s=retention_s(defaults))
    try:
        assert store._retire_after_s >= QUERY_TIMEOUT_S
        store.create(view, ["k", "name"])
        store.commit(view, [effect(1), effect(2)])
        store.publish(view, 2)
        old = store._state(view).meta
        assert store.compact(view)
        clock = time.time()
        monkeypatch.setattr(time, "time", lambda: clock + QUERY_TIMEOUT_S)
        store.zlog_stats(view)  # the compactor's check retires what is due
        assert Path(old.base_location).exists() and Path(old.zlog_location).exists()
        monkeypatch.setattr(time, "time", lambda: clock + store._retire_after_s + 1)
        store.zlog_stats(view)
        assert not Path(old.base_location).exists() and not Path(old.zlog_location).exists()
    finally:
        monkeypatch.undo()
        store.drop(view)
