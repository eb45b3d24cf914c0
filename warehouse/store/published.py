"""The analysts' views in a Spark session: what readers query, as of each view's watermark.

The store (``warehouse/store/spark.py``) writes a view's files and keeps, per view, a record
of its current base and z-log versions and its published watermark W. ``PublishedViews``
turns those records into catalog objects of one Spark session, the session analysts query
(the analysts' query process, ``warehouse/analysts``, runs one in its own JVM):

* per version of a view's files, a table over that version's directory,
  ``pvm_views.base_<N>_<view>`` and ``pvm_views.zlog_<N>_<view>``; a version's files never
  change once the record names them, so a query planned on a version reads one version;
* a view named ``<view>`` (a catalog view, not a temporary one, so that every session of the
  application sees it, Spark Connect sessions included): the view as of W, each row repeated
  by its weight (``visible_sql``); an aggregate view's rows come from its groups' sums
  (``shown_sql``).

A new record moves the view with one ``ALTER VIEW``: a query planned before it reads the old
version's tables, whose files the store keeps for a while after a compaction
(``retire_after_s``). Tables of versions no record names any more are dropped from the
catalog (the files are the store's to delete).

``apply`` is idempotent: it may be given the same record twice, or records out of date, and
it ignores a record older than the one it holds (by version, then watermark).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pyspark.sql import SparkSession

from warehouse.store.spark_records import ViewMeta
from warehouse.store.spark_rows import table_schemas
from warehouse.store.spark_sql import shown_sql

DATABASE = "pvm_views"


@dataclass(frozen=True)
class _Shown:
    meta: ViewMeta
    base: str
    zlog: str


def _order(meta: ViewMeta) -> tuple[int, int, int]:
    """Records of one view are totally ordered: compaction moves versions forward, publishes
    move W forward (a restart may publish the same W again)."""
    return (meta.zlog_version, meta.base_version, meta.watermark)


class PublishedViews:
    """The analysts' views of the store's records, in ``spark``'s catalog."""

    def __init__(self, spark: SparkSession, database: str = DATABASE) -> None:
        self._spark = spark
        self._database = database
        self._lock = threading.Lock()
        self._shown: dict[str, _Shown] = {}
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {database}")

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._shown)

    def watermark(self, view: str) -> int | None:
        """The W the view shows, None if it is not shown."""
        with self._lock:
            shown = self._shown.get(view)
            return None if shown is None else shown.meta.watermark

    def apply(self, view: str, meta: ViewMeta | None) -> None:
        """Show ``view`` as ``meta`` records it; ``None``: the view was dropped."""
        with self._lock:
            current = self._shown.get(view)
            if meta is None:
                if current is not None:
                    self._spark.sql(f"DROP VIEW IF EXISTS `{view}`")
                    self._drop(current.base, current.zlog)
                    del self._shown[view]
                return
            if current is not None and _order(meta) < _order(current.meta):
                return
            base = self._table(view, "base", meta.base_version)
            zlog = self._table(view, "zlog", meta.zlog_version)
            base_schema, zlog_schema = table_schemas(meta.columns, meta.types)
            self._create_table(base, meta.base_location, base_schema)
            self._create_table(zlog, meta.zlog_location, zlog_schema)
            sql = shown_sql(base, zlog, meta.columns, meta.summed, meta.watermark)
            if current is None:
                self._spark.sql(f"CREATE OR REPLACE VIEW `{view}` AS {sql}")
            else:
                self._alter(view, sql)
                self._drop(*({current.base, current.zlog} - {base, zlog}))
            self._shown[view] = _Shown(meta, base, zlog)

    def _alter(self, view: str, sql: str) -> None:
        """ALTER VIEW swaps the definition in one catalog update (CREATE OR REPLACE drops and
        re-creates it, so a concurrent reader could find no view at all)."""
        try:
            self._spark.sql(f"ALTER VIEW `{view}` AS {sql}")
        except Exception:  # dropped behind our back: define it anew
            self._spark.sql(f"CREATE OR REPLACE VIEW `{view}` AS {sql}")

    def _table(self, view: str, kind: str, version: int) -> str:
        return f"{self._database}.{kind}_{version}_{view}"

    def _create_table(self, table: str, location: str, schema) -> None:
        if not self._spark.catalog.tableExists(table):
            self._spark.catalog.createTable(table, path=location, source="parquet", schema=schema)

    def _drop(self, *tables: str) -> None:
        for table in tables:
            self._spark.sql(f"DROP TABLE IF EXISTS {table}")  # external: the files stay
