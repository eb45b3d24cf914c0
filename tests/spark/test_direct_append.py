"""A commit's Parquet file, written by the store itself rather than by a Spark job: Spark
reads it as it read the file an ``insertInto`` of the same rows wrote, for every column type
the store holds; it appears whole or not at all, with the store's modes; compaction folds
it; and every session, the analysts' JVM included, sees it at its next query."""

from __future__ import annotations

import asyncio
import datetime as dt
import grp
import math
import os
import stat
import threading
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from contract.file_modes import FileModes
from contract.schemas import NAN
from contract.zset import ZSet
from warehouse.analysts.supervisor import AnalystProcess
from warehouse.store import file_access, spark_files
from warehouse.store import spark as spark_module
from warehouse.store.base import Effect, StoreError
from warehouse.store.spark import SparkStore
from warehouse.store.spark_files import UNFINISHED, part_files, read_footer
from warehouse.store.spark_rows import RowCodec

pytestmark = pytest.mark.spark

UTC = dt.UTC
BIG = "9" * 28 + "." + "9" * 10  # 38 digits: as text, since Decimal arithmetic rounds to 28

# Per type, values at its edges; every column also gets a NULL.
VALUES: dict[str, list[Any]] = {
    "BOOLEAN": [True, False],
    "TINYINT": [127, -128, 0],
    "SMALLINT": [32767, -32768],
    "INT": [2**31 - 1, -(2**31)],
    "BIGINT": [2**63 - 1, -(2**63)],
    "FLOAT": [1.5, NAN, -0.0, math.inf, -math.inf, 3.4028234663852886e38],
    "DOUBLE": [NAN, -0.0, 1.7976931348623157e308, -math.inf, 5e-324],
    "DECIMAL(5,2)": [Decimal("999.99"), Decimal("-999.99"), Decimal("0.01")],
    "DECIMAL(18,3)": [Decimal("999999999999999.999"), Decimal("-999999999999999.999")],
    "DECIMAL(38,10)": [Decimal(BIG), Decimal("-" + BIG)],
    "DECIMAL(38,0)": [Decimal(10**38 - 1), Decimal(-(10**38) + 1)],
    "STRING": ["", "é\x00x", "\U0001f600", "a" * 10_000],
    "BINARY": [b"", b"\x00\xff"],
    "DATE": [dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1582, 10, 4), dt.date(1970, 1, 1)],
    "TIMESTAMP": [
        dt.datetime(1, 1, 1, tzinfo=UTC),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(1582, 10, 4, 12, tzinfo=UTC),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ],
    "TIMESTAMP_NTZ": [dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999)],
    "INTERVAL DAY TO SECOND": [dt.timedelta(days=5, microseconds=3), -dt.timedelta(days=100_000)],
}
# Spark writes timestamps as INT96 by default, the store as INT64 microseconds (UTC-adjusted):
# a Parquet form Spark reads into the same values (the rows are compared below).
PHYSICAL_DIFFERENCES = {"TIMESTAMP": ("INT96", "INT64")}


def effects_of(values: list[Any]) -> list[Effect]:
    return [Effect(1, ZSet({(v,): 1 for v in values} | {(None,): 2})), Effect(2, ZSet())]


def as_json(session: SparkSession, table: str) -> list[str]:
    """Every row as Spark reads it, in JSON: -0.0, NaN, decimals' digits and binary exact."""
    return sorted(r[0] for r in session.sql(f"SELECT to_json(struct(*)) FROM {table}").collect())


def column_type(path: str) -> tuple[str, str]:
    column = pq.read_metadata(path).schema.column(0)
    return column.physical_type, str(column.logical_type)


@pytest.mark.parametrize("type_name", list(VALUES))
def test_spark_reads_a_commit_as_it_reads_its_own_append(
    spark: SparkSession, spark_store: SparkStore, view: str, tmp_path: Path, type_name: str
) -> None:
    values = VALUES[type_name]
    spark_store.create(view, ["c"], types=[type_name])
    spark_store.commit(view, effects_of(values))
    # what the store wrote before: the same Arrow table, appended by a Spark job
    codec = RowCodec(("c",), (type_name,))
    reference = f"ref_{uuid.uuid4().hex[:10]}"
    spark.catalog.createTable(reference, path=str(tmp_path / reference), source="parquet", schema=codec.zlog_schema)
    try:
        frame = spark.createDataFrame(codec.effects_table(effects_of(values)), schema=codec.zlog_schema)
        frame.coalesce(1).write.insertInto(reference)
        zlog = spark_store.version_table(view, "zlog", 0)
        assert as_json(spark, zlog) == as_json(spark, reference)
        [written] = part_files(spark_store.record(view).zlog_location)
        [theirs] = part_files(str(tmp_path / reference))
        physical, logical = column_type(written)
        if type_name in PHYSICAL_DIFFERENCES:
            assert (column_type(theirs)[0], physical) == PHYSICAL_DIFFERENCES[type_name]
        else:
            assert (physical, logical) == column_type(theirs)
    finally:
        spark.sql(f"DROP TABLE {reference}")
    assert read_footer(written).span == (1, 2)  # the statistics compaction goes by
    assert spark_store.read(view) == ZSet({(v,): 1 for v in values} | {(None,): 2})


def test_types_the_store_cannot_write_are_refused(spark_store: SparkStore, view: str) -> None:
    for type_name in ("VARCHAR(10)", "CHAR(3)", "INTERVAL YEAR TO MONTH", "TIME", "VARIANT"):
        with pytest.raises(StoreError, match="not one the store holds"):
            spark_store.create(view, ["c"], types=[type_name])
    assert spark_store.views() == []


def test_compaction_folds_direct_commits_of_every_type(spark_store: SparkStore, view: str) -> None:
    types = list(VALUES)
    columns = [f"c{i}" for i in range(len(types))]
    width = max(len(v) for v in VALUES.values())
    rows = [tuple(VALUES[t][i % len(VALUES[t])] for t in types) for i in range(width)]
    spark_store.create(view, columns, types=types)
    spark_store.commit(view, [Effect(1, ZSet({rows[0]: 2, rows[1]: 1}))])
    spark_store.commit(view, [Effect(2, ZSet({rows[1]: -1, rows[2]: 1})), Effect(3, ZSet({rows[3]: 1}))])
    spark_store.commit(view, [Effect(4, ZSet({rows[4]: 1}))])
    spans = sorted(read_footer(f).span for f in part_files(spark_store.record(view).zlog_location))
    assert spans == [(1, 1), (2, 3), (4, 4)]
    spark_store.publish(view, 3)
    before = {w: spark_store.read(view, as_of=w) for w in (3, 4)}
    assert spark_store.compact(view)
    assert {w: spark_store.read(view, as_of=w) for w in (3, 4)} == before
    assert spark_store.committed_orders(view) == {1, 2, 3, 4}
    [carried] = part_files(spark_store.record(view).zlog_location)
    assert read_footer(carried).span == (4, 4)


def test_an_unfinished_write_is_never_read_and_is_removed_on_open(
    spark: SparkSession, spark_store: SparkStore, data_dir: Path, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spark_store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
    spark_store.commit(view, [Effect(1, ZSet({(1, "a"): 1}))])
    location = Path(spark_store.record(view).zlog_location)
    [complete] = part_files(str(location))

    def crash_after_writing(table: Any, out: Any, **options: Any) -> None:
        out.write(b"PAR1 and half a file")
        raise OSError("no space left on device")

    monkeypatch.setattr(spark_files.pq, "write_table", crash_after_writing)
    with pytest.raises(OSError, match="no space left"):
        spark_store.commit(view, [Effect(2, ZSet({(2, "b"): 1}))])
    monkeypatch.undo()
    assert [p.name for p in location.iterdir()] == [Path(complete).name]
    assert spark_store.committed_orders(view) == {1}

    # A crash of the process itself leaves the hidden file: Spark does not list it.
    leftover = location / f"{UNFINISHED}part-{uuid.uuid4().hex}.snappy.parquet"
    leftover.write_bytes(b"PAR1 and half a file")
    assert spark_store.read(view) == ZSet({(1, "a"): 1})
    assert spark.table(SparkStore.zlog_table(view)).count() == 1
    restarted = SparkStore(spark, data_dir)
    assert not leftover.exists()
    assert restarted.read(view) == ZSet({(1, "a"): 1})
    restarted.commit(view, [Effect(2, ZSet({(2, "b"): 1}))])
    assert restarted.read(view) == ZSet({(1, "a"): 1, (2, "b"): 1})


@pytest.mark.parametrize("shared", [False, True])
def test_a_commit_file_has_the_store_modes(
    spark_store: SparkStore, view: str, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    # another group than the process's where it may give files one (root), else its own
    others = [g for g in grp.getgrall() if g.gr_gid != os.getgid()] if os.geteuid() == 0 else []
    group = others[0] if others else grp.getgrgid(os.getgid())
    modes = FileModes(0o750, 0o640, group.gr_name) if shared else file_access.OWNER_ONLY
    monkeypatch.setattr(file_access, "_store_files", modes)
    spark_store.create(view, ["k"], types=["BIGINT"])
    spark_store.commit(view, [Effect(1, ZSet({(1,): 1}))])
    [written] = part_files(spark_store.record(view).zlog_location)
    info = os.stat(written)
    assert stat.S_IMODE(info.st_mode) == modes.file_mode
    assert info.st_gid == (group.gr_gid if shared else os.getegid())


def test_a_commit_waiting_for_a_swap_writes_into_the_new_version(
    spark_store: SparkStore, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that asks for the view while the swap holds it writes its file where the
    new record points, never into the version the swap retires (deleted at once here)."""
    spark_store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
    spark_store.commit(view, [Effect(1, ZSet({(1, "a"): 1}))])
    spark_store.publish(view, 1)
    written: list[str] = []
    append = spark_module.append_file

    def recording_append(table: Any, location: str) -> str:
        written.append(location)
        return append(table, location)

    monkeypatch.setattr(spark_module, "append_file", recording_append)
    link = spark_module.link
    committer = threading.Thread(target=lambda: spark_store.commit(view, [Effect(2, ZSet({(2, "b"): 1}))]))

    def link_while_a_commit_waits(files: list[str], location: str) -> None:
        committer.start()
        time.sleep(0.3)  # the commit now waits for the view lock the swap holds
        link(files, location)

    monkeypatch.setattr(spark_module, "link", link_while_a_commit_waits)
    old = spark_store.record(view).zlog_location
    assert spark_store.compact(view)
    committer.join()
    new = spark_store.record(view).zlog_location
    assert written == [new] and new != old and not Path(old).exists()
    assert spark_store.read(view) == ZSet({(1, "a"): 1, (2, "b"): 1})


def test_a_session_with_a_listing_cache_is_refused(spark: SparkSession, data_dir: Path) -> None:
    class Conf:
        @staticmethod
        def get(key: str) -> str:
            return "1000"

    class CachingSession:
        conf = Conf()

    with pytest.raises(StoreError, match="filesourceTableRelationCacheSize=0"):
        SparkStore(CachingSession(), data_dir)  # type: ignore[arg-type]


def test_the_analysts_jvm_sees_a_commit_at_its_next_query(
    analyst_store: SparkStore, analysts: AnalystProcess, view: str
) -> None:
    """No record changes between the two queries: the second one lists the z-log afresh."""
    analyst_store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
    analyst_store.commit(view, [Effect(1, ZSet({(1, "a"): 1}))])
    analyst_store.publish(view, 2)  # order 2 is not committed yet
    deadline = time.monotonic() + 30
    while not analysts.shown() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert analysts.shown()

    def rows() -> list[list[Any]]:
        return sorted(asyncio.run(analysts.query(f"SELECT * FROM {view}", 100, "test")).rows)

    assert rows() == [[1, "a"]]
    analyst_store.commit(view, [Effect(2, ZSet({(2, "b"): 1}))])
    assert rows() == [[1, "a"], [2, "b"]]
