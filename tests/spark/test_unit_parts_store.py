"""A unit's parts in the Spark store: read as of their order, never committing it, found by
name after a restart, dropped when asked, and kept by name through a compaction
(``warehouse.unit_parts``, docs/protocol.md "Units in parts")."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from contract.zset import ZSet
from warehouse.store import spark as spark_module
from warehouse.store.base import Effect, PartStore
from warehouse.store.spark import SparkStore
from warehouse.store.spark_files import part_files, unit_part

pytestmark = pytest.mark.spark

A, B, C = (1, "a"), (2, "b"), (3, "c")


def parts_on_disk(store: SparkStore, view: str) -> set[tuple[int, str]]:
    return {named for f in part_files(store.record(view).zlog_location) if (named := unit_part(f)) is not None}


def test_parts_are_read_as_of_their_order_and_do_not_commit_it(
    spark: SparkSession, spark_store: SparkStore, data_dir: Path, view: str
) -> None:
    assert isinstance(spark_store, PartStore)
    spark_store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
    spark_store.commit(view, [Effect(1, ZSet({A: 1}))])
    spark_store.commit_part(view, 2, "t0.0of2", ZSet({B: 1}))
    spark_store.commit_part(view, 2, "t0.1of2", ZSet({C: 1, A: -1}))
    assert spark_store.read(view, as_of=1) == ZSet({A: 1})
    assert spark_store.read(view, as_of=2) == ZSet({B: 1, C: 1})
    assert spark_store.committed_orders(view) == {1}

    spark_store.commit_part(view, 2, "t0.1of2", ZSet({C: 1, A: -1}))  # written again: replaces itself
    assert spark_store.read(view, as_of=2) == ZSet({B: 1, C: 1})

    restarted = SparkStore(spark, data_dir)
    assert restarted.committed_orders(view) == {1}
    assert restarted.keep_parts(view, 2, ["t0.0of2", "t0.1of2", "t1.0of1"]) == {"t0.0of2", "t0.1of2"}
    assert restarted.keep_parts(view, 2, ["t0.0of3"]) == set()  # cut otherwise: the old parts go
    assert parts_on_disk(restarted, view) == set()
    assert restarted.read(view, as_of=2) == ZSet({A: 1})


def test_compaction_folds_parts_up_to_w_and_keeps_later_ones_by_name(spark_store: SparkStore, view: str) -> None:
    spark_store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
    spark_store.commit(view, [Effect(1, ZSet({A: 1}))])
    spark_store.commit_part(view, 2, "t0.0of1", ZSet({B: 2}))
    spark_store.commit_part(view, 3, "t1.0of2", ZSet({C: 1}))
    spark_store.commit_part(view, 3, "t1.1of2", ZSet({A: -1}))
    spark_store.publish(view, 2)
    before = {w: spark_store.read(view, as_of=w) for w in (2, 3)}
    assert spark_store.compact(view)
    assert {w: spark_store.read(view, as_of=w) for w in (2, 3)} == before
    assert parts_on_disk(spark_store, view) == {(3, "t1.0of2"), (3, "t1.1of2")}
    assert spark_store.keep_parts(view, 3, ["t1.0of2", "t1.1of2"]) == {"t1.0of2", "t1.1of2"}
    assert spark_store.keep_parts(view, 2, ["t0.0of1"]) == set()  # folded: a committed order's


def test_a_part_dropped_during_a_compaction_stays_dropped(
    spark_store: SparkStore, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compaction links a later order's part into its new z-log from its snapshot; a
    part dropped before its swap is deleted there too, not carried over."""
    spark_store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
    spark_store.commit(view, [Effect(1, ZSet({A: 1}))])
    spark_store.commit_part(view, 2, "t0.0of2", ZSet({B: 1}))
    spark_store.publish(view, 1)
    write = spark_module.write_compacted

    def write_while_dropping(*args: Any) -> None:
        write(*args)  # the part is linked into the new z-log by now
        dropper = threading.Thread(target=lambda: spark_store.keep_parts(view, 2, ["t0.0of3"]))
        dropper.start()
        dropper.join()

    monkeypatch.setattr(spark_module, "write_compacted", write_while_dropping)
    assert spark_store.compact(view)
    assert parts_on_disk(spark_store, view) == set()
    assert spark_store.read(view, as_of=2) == ZSet({A: 1})
