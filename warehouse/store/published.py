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

**One consistent state of every view** (``consistent``, docs/protocol.md, 'Consistent reads
across views'). Each view read at its own W shows its own state of the sources. The second
database, ``pvm_consistent``, shows every view of a cut the manager sends (each view as of
its order in it, from the files of the record the manager pinned with it) as
``pvm_consistent.<view>``. A reader that reads several of them reads them at one cut, also
while a new cut is being shown:

* every view's pinned rows are one branch of ONE catalog view, ``pvm_consistent.__pvm_state``:
  the branch of view ``a`` is ``SELECT 'a' AS __pvm_view, struct(rows of a) AS a, NULL AS b,
  …``, so that the branches line up;
* ``pvm_consistent.a`` is ``SELECT a.* FROM pvm_consistent.__pvm_state WHERE __pvm_view = 'a'``
  (the optimizer drops the other branches: their tag is a different literal);
* showing a new cut is one ``ALTER VIEW pvm_consistent.__pvm_state``. Spark's analyzer looks a
  relation up once per query: a name seen again, also inside the definitions of the views
  the query reads, is taken from the query's relation cache (``AnalysisContext``'s, which
  nested views share), so every ``pvm_consistent`` view a query reads resolves the same
  state, one cut. ALTERing one view after another would not do: a query can resolve
  ``a`` before and ``b`` after the switch. One query is one analysis; Spark Connect
  analyzes the inputs of some operators apart, which the gateway refuses for consistent
  views (``api/connect_check.py``, ``check_one_cut``).

A view's own ``pvm_consistent.<view>`` changes only when the view joins or leaves the cut
or its columns change (after the switch: meanwhile a query of that view alone fails to
resolve and can be asked again). The tables of the cut shown before stay until the next
switch, for queries that were resolving the state as it switched.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from warehouse.store.base import CONSISTENT_DB, CONSISTENT_PREFIX
from warehouse.store.spark_records import ViewMeta
from warehouse.store.spark_rows import table_schemas
from warehouse.store.spark_sql import shown_sql

DATABASE = "pvm_views"
STATE = f"{CONSISTENT_PREFIX}_state"  # the catalog view all of a cut's views read, in the consistent database
TAG = f"{CONSISTENT_PREFIX}_view"  # the column of the state that says whose row a row is


def as_of_sql(meta: ViewMeta, base: str, zlog: str, as_of: int | None) -> str:
    """The rows a reader of the view sees as of ``as_of``, over relations ``base`` and
    ``zlog`` of the files ``meta`` names (catalog tables, or a session's temporary views):
    the published view, a pinned one and a cut's all read a view this way."""
    return shown_sql(base, zlog, meta.columns, meta.summed, as_of)


@dataclass(frozen=True)
class _Shown:
    meta: ViewMeta
    base: str
    zlog: str


def _order(meta: ViewMeta) -> tuple[int, int, int]:
    """Records of one view are totally ordered: compaction moves versions forward, publishes
    move W forward (a restart may publish the same W again)."""
    return (meta.zlog_version, meta.base_version, meta.watermark)


@dataclass(frozen=True)
class _Pinned:
    """A view in the consistent state: read as of ``as_of`` from the tables of ``meta``."""

    meta: ViewMeta
    as_of: int
    base: str
    zlog: str
    rows_type: str  # the Spark SQL type of its rows as one struct


class PublishedViews:
    """The analysts' views of the store's records, in ``spark``'s catalog."""

    def __init__(self, spark: SparkSession, database: str = DATABASE, consistent: str = CONSISTENT_DB) -> None:
        self._spark = spark
        self._database = database
        self._consistent_db = consistent
        self._lock = threading.Lock()
        self._shown: dict[str, _Shown] = {}
        self._pinned: dict[str, _Pinned] = {}  # the consistent state: the cut shown in ``consistent``
        # the cut shown before: its tables stay until the next switch, for the queries that
        # were resolving the state as it switched
        self._held: dict[str, _Pinned] = {}
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {database}")
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {consistent}")

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
                if view in self._pinned:  # its files go: the others stay, still one cut
                    self._show_cut({k: v for k, v in self._pinned.items() if k != view})
                if current is not None:
                    self._spark.sql(f"DROP VIEW IF EXISTS `{view}`")
                    del self._shown[view]
                    self._drop(current.base, current.zlog)
                return
            if current is not None and _order(meta) < _order(current.meta):
                return
            base = self._table(view, "base", meta.base_version)
            zlog = self._table(view, "zlog", meta.zlog_version)
            self._create_tables(meta, base, zlog)
            sql = as_of_sql(meta, base, zlog, meta.watermark)
            if current is None:
                self._spark.sql(f"CREATE OR REPLACE VIEW `{view}` AS {sql}")
            else:
                self._alter(f"`{view}`", sql)
            self._shown[view] = _Shown(meta, base, zlog)
            if current is not None:
                self._drop(current.base, current.zlog)

    def consistent(self) -> dict[str, int]:
        """The order each view of the consistent state is shown at."""
        with self._lock:
            return {name: pinned.as_of for name, pinned in sorted(self._pinned.items())}

    def show_consistent(self, cut: Mapping[str, tuple[ViewMeta, int]]) -> None:
        """Show ``cut`` (per view: the record whose files it is read from, and the order it is
        read as of) in the consistent database, replacing the cut shown, in one switch (the
        module's docstring says why one). The manager computed the orders as a consistent
        cut; views not in it leave the database."""
        with self._lock:
            pinned: dict[str, _Pinned] = {}
            for view, (meta, as_of) in sorted(cut.items()):
                current = self._pinned.get(view)
                if current is not None and current.meta == meta and current.as_of == as_of:
                    pinned[view] = current
                    continue
                base = self._table(view, "base", meta.base_version)
                zlog = self._table(view, "zlog", meta.zlog_version)
                if current is None or current.meta != meta:
                    self._create_tables(meta, base, zlog)
                if current is not None and _shape(current.meta) == _shape(meta):
                    rows_type = current.rows_type  # the order read at does not change it
                else:
                    rows_type = _struct_type(self._spark, as_of_sql(meta, base, zlog, as_of))
                pinned[view] = _Pinned(meta, as_of, base, zlog, rows_type)
            self._show_cut(pinned)

    def _show_cut(self, pinned: dict[str, _Pinned]) -> None:
        previous = self._pinned
        if pinned == previous:
            return
        state = f"{self._consistent_db}.`{STATE}`"
        if pinned and not previous:
            self._spark.sql(f"CREATE OR REPLACE VIEW {state} AS {_state_sql(pinned)}")
        elif pinned:
            self._alter(state, _state_sql(pinned))
        else:
            self._spark.sql(f"DROP VIEW IF EXISTS {state}")
        # after the switch: a view's own definition only names its rows in the state
        for view in sorted(set(previous) - set(pinned)):
            self._spark.sql(f"DROP VIEW IF EXISTS {self._consistent_db}.`{view}`")
        for view, entry in sorted(pinned.items()):
            if view not in previous or previous[view].rows_type != entry.rows_type:
                self._spark.sql(
                    f"CREATE OR REPLACE VIEW {self._consistent_db}.`{view}` AS "
                    f"SELECT `{view}`.* FROM {state} WHERE `{TAG}` = '{view}'"
                )
        self._pinned = pinned  # only now: a failure above is tried again with the next cut
        retired, self._held = self._held, previous
        for entry in retired.values():
            self._drop(entry.base, entry.zlog)

    def _alter(self, view: str, sql: str) -> None:
        """ALTER VIEW swaps the definition in one catalog update (CREATE OR REPLACE drops and
        re-creates it, so a concurrent reader could find no view at all). ``view``: quoted."""
        try:
            self._spark.sql(f"ALTER VIEW {view} AS {sql}")
        except Exception:  # not there yet, or dropped behind our back: define it anew
            self._spark.sql(f"CREATE OR REPLACE VIEW {view} AS {sql}")

    def _table(self, view: str, kind: str, version: int) -> str:
        return f"{self._database}.{kind}_{version}_{view}"

    def _create_tables(self, meta: ViewMeta, base: str, zlog: str) -> None:
        base_schema, zlog_schema = table_schemas(meta.columns, meta.types)
        for table, location, schema in (
            (base, meta.base_location, base_schema),
            (zlog, meta.zlog_location, zlog_schema),
        ):
            if not self._spark.catalog.tableExists(table):
                self._spark.catalog.createTable(table, path=location, source="parquet", schema=schema)

    def _drop(self, *tables: str) -> None:
        """Drop the tables that neither a published view nor the consistent state reads."""
        used = {t for shown in self._shown.values() for t in (shown.base, shown.zlog)}
        used |= {t for cut in (self._pinned, self._held) for pinned in cut.values() for t in (pinned.base, pinned.zlog)}
        for table in set(tables) - used:
            self._spark.sql(f"DROP TABLE IF EXISTS {table}")  # external: the files stay


def _shape(meta: ViewMeta) -> tuple[object, ...]:
    """What the type of a view's rows depends on."""
    return (meta.columns, meta.types, meta.summed)


def _struct_type(spark: SparkSession, sql: str) -> str:
    """The Spark SQL type of one row of ``sql`` as a struct (its names quoted as needed)."""
    frame: Any = spark.sql(sql)
    return f"STRUCT<{frame._jdf.schema().toDDL()}>"


def _state_sql(pinned: Mapping[str, _Pinned]) -> str:
    """The state: one branch per view, its rows as one struct column named after it, the
    other views' columns NULL (of their types, so that the branches line up)."""
    branches = []
    for view, entry in sorted(pinned.items()):
        columns = ", ".join(
            f"struct(t.*) AS `{other}`" if other == view else f"CAST(NULL AS {pinned[other].rows_type}) AS `{other}`"
            for other in sorted(pinned)
        )
        rows = as_of_sql(entry.meta, entry.base, entry.zlog, entry.as_of)
        branches.append(f"SELECT '{view}' AS `{TAG}`, {columns} FROM ({rows}) t")
    return " UNION ALL ".join(branches)
