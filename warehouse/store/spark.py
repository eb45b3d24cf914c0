"""The Spark view store: append-only z-log and compacted base tables per view.

Spark 4 cannot update or delete rows of a plain parquet table, and signed counts do not need
it: a commit appends the effect's rows with their weights and order number to the view's
z-log, and the view's contents are ``SUM(_w)`` per row over the base plus the z-log. Reads
``as_of=W`` filter the z-log by order; compaction folds the old part of the z-log into a new
base version at a new location (Spark cannot overwrite a table it is reading) and swaps.

Per view, under ``<data_dir>/views/<view>/``:

* ``zlog/v<N>/``: table ``pvm_zlog_<view>`` (view columns, ``_w`` BIGINT, ``_order`` BIGINT);
* ``base/v<N>/``: table ``pvm_base_<view>`` (view columns, ``_w`` BIGINT).

The two tables keep their names for good; compaction moves them to new locations, one
``ALTER TABLE`` each, for raw reads in this session. Commits append to a second pair of
tables per version, ``pvm_store.base_<N>_<view>`` and ``pvm_store.zlog_<N>_<view>``, which
never move.

Which versions are current, the published watermark and the compacted orders live in a
``StoreCatalog`` record, written only at the few points that change them, so that a restart
re-registers every table. Which orders are committed is read back from the z-log itself:
an append is the commit, and a crash between two appends loses nothing and repeats nothing.

What analysts query is not here: every change of a record goes to the store's listeners
(``subscribe``), and ``PublishedViews`` (``warehouse/store/published.py``) turns the records
into the views analysts read, in the Spark session of the analysts' query process
(``warehouse/analysts``), a JVM of its own. A compaction's old version stays on disk for
``retire_after_s`` after the record moves on, so a query planned on it can finish.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import (
    AtomicType,
    BooleanType,
    DataType,
    DoubleType,
    FloatType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from contract.schemas import NAN, loads_wire_json
from contract.zset import Row, ZSet
from warehouse.store.base import BASE_PREFIX, VERSIONS_DB, ZLOG_PREFIX, Effect, StoreError
from warehouse.store.file_access import store_files

WEIGHT = "_w"
ORDER = "_order"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# Spark SQL's reserved keywords under ``spark.sql.ansi.enforceReservedKeywords=true``
# (``SELECT keyword FROM sql_keywords() WHERE reserved`` with that setting on). A view named
# after one of them breaks analysts' queries as soon as a deployment turns enforcement on.
RESERVED_WORDS = frozenset(
    [
        "ALL",
        "AND",
        "ANY",
        "AS",
        "AUTHORIZATION",
        "BOTH",
        "CALL",
        "CASE",
        "CAST",
        "CHECK",
        "COLLATE",
        "COLLATION",
        "COLLATIONS",
        "COLUMN",
        "CONSTRAINT",
        "CREATE",
        "CROSS",
        "CURRENT_DATE",
        "CURRENT_PATH",
        "CURRENT_SCHEMA",
        "CURRENT_TIME",
        "CURRENT_TIMESTAMP",
        "CURRENT_USER",
        "DISTINCT",
        "ELSE",
        "END",
        "ESCAPE",
        "EXCEPT",
        "EXECUTE",
        "FALSE",
        "FETCH",
        "FILTER",
        "FOR",
        "FOREIGN",
        "FROM",
        "FULL",
        "GRANT",
        "GROUP",
        "HAVING",
        "IN",
        "INNER",
        "INTERSECT",
        "INTO",
        "IS",
        "JOIN",
        "LATERAL",
        "LEADING",
        "LEFT",
        "LOCALTIME",
        "NATURAL",
        "NOT",
        "NULL",
        "OFFSET",
        "ON",
        "ONLY",
        "OR",
        "ORDER",
        "OUTER",
        "OVERLAPS",
        "PRIMARY",
        "RECURSIVE",
        "REFERENCES",
        "RIGHT",
        "SELECT",
        "SESSION_USER",
        "SOME",
        "SQL",
        "TABLE",
        "THEN",
        "TIME",
        "TO",
        "TRAILING",
        "UNION",
        "UNIQUE",
        "UNKNOWN",
        "USER",
        "USING",
        "WHEN",
        "WHERE",
        "WITH",
        "WITHIN",
    ]
)


def _check_view_name(view: str) -> None:
    if not _IDENTIFIER.match(view):
        raise StoreError(f"view name {view!r} is not an identifier [A-Za-z_][A-Za-z0-9_]*")
    if view.upper() in RESERVED_WORDS:
        raise StoreError(f"view name {view!r} is a reserved Spark SQL keyword")
    if view.lower().startswith((ZLOG_PREFIX, BASE_PREFIX)):
        raise StoreError(f"view name {view!r} collides with the store's own table names")


def _check_columns(columns: tuple[str, ...]) -> None:
    if not columns:
        raise StoreError("a view needs at least one column")
    seen: set[str] = set()
    for name in columns:
        if not _IDENTIFIER.match(name):
            raise StoreError(f"column name {name!r} is not an identifier")
        if name.lower() in (WEIGHT, ORDER):
            raise StoreError(f"column name {name!r} is reserved for the store")
        if name.lower() in seen:  # Spark resolves column names case-insensitively
            raise StoreError(f"duplicate column {name!r}")
        seen.add(name.lower())


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


# -- order sets --------------------------------------------------------------------------------
# Orders folded into a base are kept as closed intervals: the watermark makes them contiguous
# in practice, so the record stays a handful of numbers however long the view lives.

Ranges = list[tuple[int, int]]


def _merge_ranges(ranges: Ranges, orders: set[int]) -> Ranges:
    merged: Ranges = []
    for lo, hi in sorted([*ranges, *((o, o) for o in orders)]):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _in_ranges(ranges: Sequence[tuple[int, int]], order: int) -> bool:
    i = bisect.bisect_right(ranges, (order, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= order <= ranges[i][1]


# -- metadata ----------------------------------------------------------------------------------


class StoreCatalog(Protocol):
    """Durable home of the per-view records (JSON-compatible dicts)."""

    def views(self) -> list[str]: ...

    def load(self, view: str) -> dict[str, Any] | None: ...

    def save(self, view: str, record: dict[str, Any]) -> None: ...

    def delete(self, view: str) -> None: ...


class JsonStoreCatalog:
    """All records in one JSON file, replaced atomically on every save."""

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        self._records: dict[str, dict[str, Any]] = json.loads(self._path.read_text()) if self._path.exists() else {}

    def views(self) -> list[str]:
        with self._lock:
            return list(self._records)

    def load(self, view: str) -> dict[str, Any] | None:
        with self._lock:
            record = self._records.get(view)
            return None if record is None else json.loads(json.dumps(record))

    def save(self, view: str, record: dict[str, Any]) -> None:
        with self._lock:
            self._records[view] = json.loads(json.dumps(record))
            self._write()

    def delete(self, view: str) -> None:
        with self._lock:
            if self._records.pop(view, None) is not None:
                self._write()

    def _write(self) -> None:
        store_files().make_dir(self._path.parent)
        tmp = store_files().create_file(self._path.with_suffix(".tmp"))
        with open(tmp, "w") as f:
            json.dump(self._records, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)


@dataclass(frozen=True)
class ViewMeta:
    """One view's record: what a restart needs to find and serve the view again."""

    columns: tuple[str, ...]
    # Spark SQL type names; None (for the view or one column): JSON text in a STRING column
    types: tuple[str | None, ...] | None
    base_location: str
    base_version: int
    zlog_location: str
    zlog_version: int
    watermark: int = 0
    compacted_through: int = 0
    compacted_orders: tuple[tuple[int, int], ...] = ()

    def to_record(self) -> dict[str, Any]:
        return {
            "columns": list(self.columns),
            "types": None if self.types is None else list(self.types),
            "base_location": self.base_location,
            "base_version": self.base_version,
            "zlog_location": self.zlog_location,
            "zlog_version": self.zlog_version,
            "watermark": self.watermark,
            "compacted_through": self.compacted_through,
            "compacted_orders": [list(r) for r in self.compacted_orders],
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ViewMeta:
        types = record["types"]
        return cls(
            columns=tuple(record["columns"]),
            types=None if types is None else tuple(types),
            base_location=record["base_location"],
            base_version=int(record["base_version"]),
            zlog_location=record["zlog_location"],
            zlog_version=int(record["zlog_version"]),
            watermark=int(record["watermark"]),
            compacted_through=int(record["compacted_through"]),
            compacted_orders=tuple((int(lo), int(hi)) for lo, hi in record["compacted_orders"]),
        )


# -- values ------------------------------------------------------------------------------------


def _json_float(value: float) -> str:
    return float.__repr__(value) if math.isfinite(value) else json.dumps(value)


# What json.dumps(value, ensure_ascii=False) returns for the common exact types, without its
# per-call overhead (it dominated the cost of a grouped commit).
_JSON_ENCODERS: dict[type, Callable[[Any], str]] = {
    str: json.encoder.encode_basestring,
    int: int.__repr__,
    bool: lambda value: "true" if value else "false",
    float: _json_float,
}


def _json_scalar(value: Any) -> str | None:
    encode = _JSON_ENCODERS.get(type(value))
    if encode is not None:
        return encode(value)
    if value is None:
        return None
    if isinstance(value, (str, int, float)):  # subclasses
        return json.dumps(value, ensure_ascii=False)
    raise StoreError(f"cannot store {value!r} in an untyped column; give the view column types")


class RowCodec:
    """Rows of Python scalars to Arrow columns and back, so reads return what was committed.

    Typed columns are stored in their Spark type. Untyped columns (known by name only) store
    JSON text, which keeps 1, 1.0, "1" and True apart and round-trips them.
    """

    def __init__(self, columns: tuple[str, ...], types: tuple[str | None, ...] | None) -> None:
        self.columns = columns
        self.json_columns = [True] * len(columns) if types is None else [t is None for t in types]
        self.json = all(self.json_columns)
        spark_types = [StringType() if t is None else _parse(t) for t in (types or (None,) * len(columns))]
        self._bool_columns = [isinstance(t, BooleanType) for t in spark_types]
        # every NaN read back is the one object Z-sets can cancel (contract.schemas.NAN)
        self._float_columns = [isinstance(t, (DoubleType, FloatType)) for t in spark_types]
        view_fields = [StructField(c, t) for c, t in zip(columns, spark_types)]
        self.base_schema = StructType([*view_fields, StructField(WEIGHT, LongType())])
        self.zlog_schema = StructType([*self.base_schema.fields, StructField(ORDER, LongType())])
        self._arrow_schema = pa.schema(
            [pa.field(f.name, to_arrow_type(f.dataType, timezone="UTC")) for f in self.zlog_schema]
        )

    def effects_table(self, effects: Sequence[Effect]) -> pa.Table:
        """The z-log rows of a group. An empty effect becomes one all-NULL row of weight 0,
        which sums to nothing but leaves the order in the z-log as committed."""
        rows: list[Row] = []
        weights: list[int] = []
        orders: list[int] = []
        empty = (None,) * len(self.columns)
        for effect in effects:
            if effect.delta.is_empty():
                rows.append(empty)
                weights.append(0)
                orders.append(effect.order)
            for row, weight in effect.delta.items():
                if len(row) != len(self.columns):
                    raise StoreError(f"row {row!r} does not have {len(self.columns)} columns")
                rows.append(row)
                weights.append(weight)
                orders.append(effect.order)
        values: list[Sequence[Any]] = list(zip(*rows))
        values = [
            [_json_scalar(v) for v in column] if as_json else [_as_bool(v) for v in column] if as_bool else column
            for column, as_json, as_bool in zip(values, self.json_columns, self._bool_columns)
        ]
        try:
            arrays = [pa.array(v, type=f.type) for v, f in zip(values, self._arrow_schema)]
            arrays += [pa.array(weights, pa.int64()), pa.array(orders, pa.int64())]
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as e:
            raise StoreError(f"values do not fit the view's column types: {e}") from e
        return pa.Table.from_arrays(arrays, schema=self._arrow_schema)

    def decode(self, table: pa.Table) -> Iterator[Row]:
        """Rows of a result whose first columns are the view's columns."""
        columns = [table.column(i).to_pylist() for i in range(len(self.columns))]
        columns = [
            [None if v is None else loads_wire_json(v) for v in c]
            if as_json
            else [NAN if v != v else v for v in c]
            if as_float
            else c
            for c, as_json, as_float in zip(columns, self.json_columns, self._float_columns)
        ]
        return zip(*columns)

    def decode_weighted(self, table: pa.Table) -> Iterator[tuple[Row, int]]:
        return zip(self.decode(table), table.column(WEIGHT).to_pylist())


def _as_bool(value: Any) -> Any:
    """Sources without a boolean type (SQLite, MySQL) hand out 0 and 1 for BOOLEAN columns."""
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    return value


def _parse(type_name: str) -> DataType:
    try:
        parsed = DataType.fromDDL(type_name)
    except Exception as e:
        raise StoreError(f"unknown Spark SQL type {type_name!r}") from e
    if not isinstance(parsed, AtomicType):
        raise StoreError(f"column type {type_name!r} is not a scalar type")
    return parsed


# -- SQL over a view's tables ------------------------------------------------------------------
# What readers see, as Spark SQL over one version's base and z-log tables: the writer's own
# reads and the analysts' query process (``warehouse/analysts``) build it the same way.


def version_table(view: str, kind: str, version: int) -> str:
    """The table over version ``version`` of a view's ``kind`` ("base" or "zlog") files:
    unlike the stable tables, it is never moved, so a query that names it reads one version
    from its planning to its end."""
    return f"{VERSIONS_DB}.{kind}_{version}_{view}"


def sums_sql(base: str, zlog: str, columns: Sequence[str], as_of: int | None, keep: str) -> str:
    """Summed weights per row over ``base`` plus ``zlog`` up to ``as_of`` (None: every
    committed effect), keeping the sums for which ``SUM(_w) <keep>`` holds.

    >>> sums_sql("b", "z", ["k"], 7, "> 0")
    'SELECT `k`, SUM(_w) AS _w FROM (SELECT `k`, _w FROM b UNION ALL SELECT `k`, _w FROM z WHERE _order <= 7) GROUP BY `k` HAVING SUM(_w) > 0'
    """
    cols = ", ".join(f"`{c}`" for c in columns)
    bound = "" if as_of is None else f" WHERE {ORDER} <= {int(as_of)}"
    return (
        f"SELECT {cols}, SUM({WEIGHT}) AS {WEIGHT} FROM ("
        f"SELECT {cols}, {WEIGHT} FROM {base} UNION ALL "
        f"SELECT {cols}, {WEIGHT} FROM {zlog}{bound}"
        f") GROUP BY {cols} HAVING SUM({WEIGHT}) {keep}"
    )


def visible_sql(base: str, zlog: str, columns: Sequence[str], as_of: int | None) -> str:
    """Bag semantics, as a SQL reader sees the view: rows with a positive sum, each repeated
    as many times as its sum."""
    cols = ", ".join(f"t.`{c}`" for c in columns)
    return (
        f"SELECT {cols} FROM ({sums_sql(base, zlog, columns, as_of, '> 0')}) t "
        f"LATERAL VIEW explode(sequence(CAST(1 AS BIGINT), t.{WEIGHT})) copies AS _copy"
    )


def table_schemas(columns: Sequence[str], types: Sequence[str | None] | None) -> tuple[StructType, StructType]:
    """The Spark schemas of a view's base and z-log tables."""
    codec = RowCodec(tuple(columns), None if types is None else tuple(types))
    return codec.base_schema, codec.zlog_schema


# -- the store ---------------------------------------------------------------------------------

Listener = Callable[[str, "ViewMeta | None"], None]


@dataclass(frozen=True)
class ZlogStats:
    """What a compaction policy looks at."""

    files: int
    rows: int
    oldest_age_s: float
    watermark: int
    compacted_through: int


@dataclass
class _View:
    name: str
    meta: ViewMeta
    codec: RowCodec
    zlog_orders: set[int]  # committed orders whose rows are in the z-log
    lock: threading.RLock = field(default_factory=threading.RLock)  # commits, reads, swaps
    compaction: threading.Lock = field(default_factory=threading.Lock)  # one at a time
    dropped: bool = False
    footers: dict[str, _Footer] = field(default_factory=dict)  # by z-log file path
    footers_lock: threading.Lock = field(default_factory=threading.Lock)  # not the view lock

    def committed(self, order: int) -> bool:
        return order in self.zlog_orders or _in_ranges(self.meta.compacted_orders, order)

    def read_footers(self, files: Sequence[str]) -> list[_Footer]:
        """The footers of ``files``, a listing of the current z-log, each read from disk the
        first time only: the compactor asks for them every interval, and compaction again.
        A data file never changes once written (appends add files, compaction writes a new
        directory) and its name is unique, so a path's footer stays right; files no longer
        listed (compacted away) are forgotten, so the cache holds one z-log's files."""
        with self.footers_lock:
            known = self.footers
            self.footers = {f: known[f] if f in known else _read_footer(f) for f in files}
            return [self.footers[f] for f in files]


def _part_files(location: str) -> list[str]:
    """Data files of a table directory (Spark skips names starting with '_' or '.')."""
    path = Path(location)
    if not path.is_dir():
        return []
    return sorted(str(p) for p in path.iterdir() if p.name.startswith("part-"))


@dataclass(frozen=True)
class _Footer:
    """What the compactor needs from a z-log file's parquet footer."""

    rows: int
    span: tuple[int, int] | None  # smallest and largest ``_order``; None: the footer does not tell


def _read_footer(path: str) -> _Footer:
    meta = pq.read_metadata(path)
    return _Footer(meta.num_rows, _order_span(meta))


def _order_span(meta: pq.FileMetaData) -> tuple[int, int] | None:
    """Smallest and largest ``_order`` in a z-log file, from its parquet footer (Spark writes
    min/max statistics); None when the footer does not tell."""
    column = meta.schema.names.index(ORDER)
    low: int | None = None
    high: int | None = None
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(column).statistics
        if stats is None or not stats.has_min_max:
            return None
        low = stats.min if low is None else min(low, stats.min)
        high = stats.max if high is None else max(high, stats.max)
    return None if low is None or high is None else (low, high)  # both are set together


def _link(files: Sequence[str], location: str) -> None:
    """Put immutable data files into another table version without copying their bytes."""
    store_files().make_dir(Path(location))
    for file in files:
        target = os.path.join(location, os.path.basename(file))
        try:
            os.link(file, target)
        except OSError:  # another file system, or one without hard links
            shutil.copyfile(file, store_files().create_file(Path(target)))


def _remove(*locations: str) -> None:
    for location in locations:
        shutil.rmtree(location, ignore_errors=True)


class SparkStore:
    """A ``ViewStore`` whose views are Spark tables that analysts can query with Spark SQL."""

    def __init__(
        self,
        spark: SparkSession,
        data_dir: Path,
        catalog: StoreCatalog | None = None,
        retire_after_s: float = 0.0,
    ) -> None:
        """``retire_after_s``: how long a compacted-away table version stays on disk for SQL
        readers that planned their query before the swap (0: deleted at once)."""
        self._spark = spark
        self._retire_after_s = retire_after_s
        self._retired: list[tuple[float, tuple[tuple[str, ...], tuple[str, ...]]]] = []
        self._root = Path(data_dir).resolve() / "views"
        self._catalog = catalog or JsonStoreCatalog(Path(data_dir) / "store-catalog.json")
        self._lock = threading.Lock()  # guards the _views dict and the listeners only
        self._views: dict[str, _View] = {}
        self._listeners: list[Listener] = []
        self._spark.sql(f"CREATE DATABASE IF NOT EXISTS {VERSIONS_DB}")
        for view in self._catalog.views():
            record = self._catalog.load(view)
            if record is not None:
                self._views[view] = self._attach(view, ViewMeta.from_record(record))
        self._remove_orphans()

    @property
    def spark(self) -> SparkSession:
        """The session the views live in (analysts' queries run in it too)."""
        return self._spark

    # -- names and places --------------------------------------------------------------
    @staticmethod
    def zlog_table(view: str) -> str:
        return ZLOG_PREFIX + view

    @staticmethod
    def base_table(view: str) -> str:
        return BASE_PREFIX + view

    version_table = staticmethod(version_table)

    @classmethod
    def _version_tables(cls, view: str, meta: ViewMeta) -> tuple[str, str]:
        return (
            cls.version_table(view, "base", meta.base_version),
            cls.version_table(view, "zlog", meta.zlog_version),
        )

    def _location(self, view: str, kind: str, version: int) -> str:
        return str(self._root / view / kind / f"v{version}")

    def views(self) -> list[str]:
        with self._lock:
            return list(self._views)

    def _state(self, view: str) -> _View:
        with self._lock:
            state = self._views.get(view)
        if state is None:
            raise StoreError(f"unknown view {view!r}")
        return state

    @staticmethod
    @contextmanager
    def _guard(state: _View) -> Iterator[_View]:
        """Hold the view's lock; a view dropped while we waited for it is unknown."""
        with state.lock:
            if state.dropped:
                raise StoreError(f"unknown view {state.name!r}")
            yield state

    def _hold(self, view: str) -> AbstractContextManager[_View]:
        return self._guard(self._state(view))

    # -- registration ------------------------------------------------------------------
    def _attach(self, view: str, meta: ViewMeta) -> _View:
        """Register a known view's tables in this session and load its committed orders."""
        codec = RowCodec(meta.columns, meta.types)
        self._register(self.base_table(view), meta.base_location, codec.base_schema)
        self._register(self.zlog_table(view), meta.zlog_location, codec.zlog_schema)
        self._register_versions(view, meta, codec)
        orders = self._spark.sql(f"SELECT DISTINCT {ORDER} FROM {self.zlog_table(view)}")
        return _View(view, meta, codec, set(orders.toArrow().column(0).to_pylist()))

    def _register(self, table: str, location: str, schema: StructType) -> None:
        store_files().make_dir(Path(location))
        self._spark.sql(f"DROP TABLE IF EXISTS {table}")
        self._spark.catalog.createTable(table, path=location, source="parquet", schema=schema)

    def _register_versions(self, view: str, meta: ViewMeta, codec: RowCodec) -> None:
        base, zlog = self._version_tables(view, meta)
        self._register(base, meta.base_location, codec.base_schema)
        self._register(zlog, meta.zlog_location, codec.zlog_schema)

    def _drop_tables(self, *tables: str) -> None:
        for table in tables:
            self._spark.sql(f"DROP TABLE IF EXISTS {table}")  # external: the files stay

    def _remove_orphans(self) -> None:
        """Delete directories and version tables no record points to: leftovers of a crash
        during create, drop or compaction, which made them before (or removed them after)
        the record changed. (An in-memory Spark catalog starts empty; a persistent one keeps
        tables across restarts.)"""
        with self._lock:
            live = {view: state.meta for view, state in self._views.items()}
        # Other stores may share the session: only this store's views' tables are looked at.
        ours = re.compile(r"(base|zlog)_[0-9]+_(.+)\Z")
        names = {view.lower() for view in live}
        current = {t.lower() for view, meta in live.items() for t in self._version_tables(view, meta)}
        for table in self._spark.catalog.listTables(VERSIONS_DB):
            match = ours.match(table.name)
            name = f"{VERSIONS_DB}.{table.name}"
            if match and match.group(2).lower() in names and name.lower() not in current:
                self._drop_tables(name)
        if not self._root.is_dir():
            return
        for view_dir in self._root.iterdir():
            meta = live.get(view_dir.name)
            if meta is None:
                shutil.rmtree(view_dir, ignore_errors=True)
                continue
            keep = {Path(meta.base_location), Path(meta.zlog_location)}
            for version_dir in (*view_dir.glob("base/*"), *view_dir.glob("zlog/*")):
                if version_dir not in keep:
                    shutil.rmtree(version_dir, ignore_errors=True)

    def _relocate(self, table: str, location: str) -> None:
        self._spark.sql(f"ALTER TABLE {table} SET LOCATION {_sql_string(location)}")
        self._spark.catalog.refreshTable(table)

    # -- SQL ---------------------------------------------------------------------------
    def _sums_sql(self, state: _View, as_of: int | None, keep: str) -> str:
        return sums_sql(*self._version_tables(state.name, state.meta), state.meta.columns, as_of, keep)

    def _visible_sql(self, state: _View, as_of: int | None) -> str:
        return visible_sql(*self._version_tables(state.name, state.meta), state.meta.columns, as_of)

    @staticmethod
    def _check_as_of(state: _View, as_of: int | None) -> None:
        floor = state.meta.compacted_through
        if as_of is not None and as_of < floor:
            raise StoreError(
                f"as_of {as_of} is older than the compacted state (order {floor}); "
                f"states from as_of={floor} on are readable"
            )

    def _save(self, state: _View, meta: ViewMeta) -> None:
        self._catalog.save(state.name, meta.to_record())
        state.meta = meta
        self._notify(state.name, meta)

    # -- listeners ---------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(view, record)`` whenever a view's record changes (created,
        published, compacted) and ``listener(view, None)`` when it is dropped; at once for
        every view already known. Calls come from the thread that changed the record, under
        the view's lock, so one view's records arrive in order: a listener must be quick
        and must not call back into the store."""
        with self._lock:
            self._listeners.append(listener)
            known = list(self._views.values())
        for state in known:
            with state.lock:
                if not state.dropped:
                    listener(state.name, state.meta)

    def unsubscribe(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.remove(listener)

    def _notify(self, view: str, meta: ViewMeta | None) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(view, meta)

    def record(self, view: str) -> ViewMeta:
        """The view's current record: its versions' locations and published watermark."""
        return self._state(view).meta

    def check_as_of(self, view: str, as_of: int | None) -> None:
        """StoreError unless the state as of ``as_of`` is still stored."""
        self._check_as_of(self._state(view), as_of)

    # -- ViewStore ---------------------------------------------------------------------
    def check_new_view(self, view: str, columns: Sequence[str], types: Sequence[str | None] | None = None) -> None:
        """Raise StoreError naming the problem if ``create`` would refuse these arguments;
        changes nothing. The manager asks before it records a new view anywhere."""
        with self._lock:
            self._normalized(view, tuple(columns), types)

    def _normalized(
        self, view: str, cols: tuple[str, ...], types: Sequence[str | None] | None
    ) -> tuple[str | None, ...] | None:
        """Checked and normalized types of a view to create (caller holds ``_lock``)."""
        _check_view_name(view)
        _check_columns(cols)
        if types is not None and len(types) != len(cols):
            raise StoreError(f"{len(types)} types for {len(cols)} columns")
        normalized = (
            None
            if types is None or all(t is None for t in types)
            else tuple(None if t is None else _parse(t).simpleString() for t in types)
        )
        existing = self._views.get(view)
        if existing is not None:
            if existing.meta.columns != cols or normalized not in (None, existing.meta.types):
                raise StoreError(f"view {view!r} exists with other columns")
        for other in self._views:
            if other != view and other.lower() == view.lower():
                raise StoreError(f"view {view!r} collides with view {other!r} in Spark SQL")
        return normalized

    def create(self, view: str, columns: Sequence[str], types: Sequence[str | None] | None = None) -> None:
        """Create an empty view. ``types`` are Spark SQL type names, one per column; a column
        without one (None) stores its values as JSON text, exact but awkward for analysts'
        SQL."""
        cols = tuple(columns)
        with self._lock:
            normalized = self._normalized(view, cols, types)
            if view in self._views:
                return
            meta = ViewMeta(
                columns=cols,
                types=normalized,
                base_location=self._location(view, "base", 0),
                base_version=0,
                zlog_location=self._location(view, "zlog", 0),
                zlog_version=0,
            )
            self._catalog.save(view, meta.to_record())
            state = self._attach(view, meta)
            self._views[view] = state
        with state.lock:
            self._notify(view, meta)

    def drop(self, view: str) -> None:
        with self._lock:
            state = self._views.pop(view, None)
        if state is None:
            return
        with state.lock:
            state.dropped = True
            self._notify(view, None)
            self._drop_tables(self.zlog_table(view), self.base_table(view), *self._version_tables(view, state.meta))
            self._catalog.delete(view)
            shutil.rmtree(self._root / view, ignore_errors=True)

    def commit(self, view: str, effects: Sequence[Effect]) -> None:
        """One Spark append for the whole group: a Spark job costs far more than its rows."""
        with self._hold(view) as state:
            fresh: dict[int, Effect] = {}
            for effect in effects:
                if effect.order not in fresh and not state.committed(effect.order):
                    fresh[effect.order] = effect
            if fresh:
                table = state.codec.effects_table(list(fresh.values()))
                frame = self._spark.createDataFrame(table, schema=state.codec.zlog_schema)
                # the version table: the stable one moves only after a compaction's swap
                frame.coalesce(1).write.insertInto(self._version_tables(view, state.meta)[1])
                state.zlog_orders.update(fresh)

    def publish(self, view: str, watermark: int) -> None:
        """Record W: readers' default state (``PublishedViews`` shows it to analysts)."""
        with self._hold(view) as state:
            self._check_as_of(state, watermark)
            self._save(state, replace(state.meta, watermark=watermark))

    def published(self, view: str) -> int:
        return self._state(view).meta.watermark

    def read(self, view: str, as_of: int | None = None) -> ZSet:
        """Summed signed weights; negative sums (owed deletes) are kept, zeros dropped."""
        with self._hold(view) as state:
            self._check_as_of(state, as_of)
            table = self._spark.sql(self._sums_sql(state, as_of, "<> 0")).toArrow()
        return ZSet(state.codec.decode_weighted(table))

    def read_rows(self, view: str, as_of: int | None = None, latest: bool = False) -> list[Row]:
        """What a SQL reader sees: as of the published watermark by default, as of ``as_of``,
        or every committed effect with ``latest``; only positive rows, bag-expanded."""
        if latest and as_of is not None:
            raise StoreError("as_of and latest are exclusive")
        with self._hold(view) as state:
            bound = None if latest else state.meta.watermark if as_of is None else as_of
            self._check_as_of(state, bound)
            table = self._spark.sql(self._visible_sql(state, bound)).toArrow()
        return list(state.codec.decode(table))

    def committed_orders(self, view: str) -> set[int]:
        with self._hold(view) as state:
            folded = {o for lo, hi in state.meta.compacted_orders for o in range(lo, hi + 1)}
            return state.zlog_orders | folded

    def health(self) -> str | None:
        """Whether the JVM answers a trivial call and its Spark context runs: an executor
        that ran out of memory can take the whole JVM down, and every commit fails after."""
        try:
            stopped = self._spark.sparkContext._jsc.sc().isStopped()
        except Exception as exc:  # py4j: the JVM is gone or its gateway refuses
            return f"the Spark JVM does not answer: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        return "the Spark context is stopped" if stopped else None

    def close(self) -> None:
        """Nothing to release: the session is the process's, and the tables stay registered
        for analysts until the process ends."""

    # -- compaction --------------------------------------------------------------------
    def zlog_stats(self, view: str) -> ZlogStats:
        """Cheap figures from the file system and parquet footers, no Spark job. Only the
        listing takes the view lock: commits and publishes do not wait for file reads."""
        self._retire()  # the compactor asks often: a good moment to delete what is due
        state = self._state(view)
        while True:
            with self._guard(state):
                meta = state.meta
                files = _part_files(meta.zlog_location)
            try:
                rows = sum(footer.rows for footer in state.read_footers(files))
                oldest = min((os.path.getmtime(f) for f in files), default=time.time())
                break
            except FileNotFoundError:
                # A compaction swapped the z-log and deleted the listed one (or a drop did,
                # which the next guard reports): list again.
                if state.meta.zlog_location == meta.zlog_location and not state.dropped:
                    raise
        age = time.time() - oldest
        return ZlogStats(len(files), rows, age, meta.watermark, meta.compacted_through)

    def compact(self, view: str) -> bool:
        """Fold the z-log up to the published watermark into a new base version.

        The heavy writes run without the view lock, from a snapshot of the z-log's files;
        commits meanwhile append to the old z-log and are carried over to the new one under
        the lock, together with the record update and the switch of the analysts' view. The record is the
        commit point: a crash before it leaves the old versions current, after it the new.
        Returns False when there was nothing to compact.
        """
        state = self._state(view)
        with state.compaction:
            with self._guard(state):
                start = state.meta
                snapshot = _part_files(start.zlog_location)
                folded = {o for o in state.zlog_orders if o <= start.watermark}
            if not snapshot:
                return False
            new_base = self._location(view, "base", start.base_version + 1)
            new_zlog = self._location(view, "zlog", start.zlog_version + 1)
            target = replace(
                start,
                base_location=new_base,
                base_version=start.base_version + 1,
                zlog_location=new_zlog,
                zlog_version=start.zlog_version + 1,
            )
            try:
                self._write_compacted(state, start, snapshot, new_base, new_zlog)
                # Registered before the lock: nothing names the new tables until the swap.
                self._register_versions(view, target, state.codec)
                swapped = self._swap(state, start, snapshot, folded, target)
            except BaseException:
                if state.meta.base_location != new_base:  # the record never pointed there
                    self._discard(view, target)
                raise
            if not swapped:
                self._discard(view, target)
                return False
            # Moved after the lock: commits go to the version tables, and the stable names are
            # for raw reads, which a compaction may show at different versions anyway.
            self._relocate(self.base_table(view), new_base)
            self._relocate(self.zlog_table(view), new_zlog)
            self._retire(self._version_tables(view, start), (start.base_location, start.zlog_location))
            return True

    def _discard(self, view: str, target: ViewMeta) -> None:
        """Remove a compaction's new versions that never became current."""
        self._drop_tables(*self._version_tables(view, target))
        _remove(target.base_location, target.zlog_location)

    def _swap(self, state: _View, start: ViewMeta, snapshot: Sequence[str], folded: set[int], target: ViewMeta) -> bool:
        """Under the view lock: carry over late commits, switch the record and the analysts'
        view. False (nothing changed) if W was lowered meanwhile."""
        with self._guard(state):
            if state.meta.watermark < start.watermark:
                return False
            # Appended since the snapshot, all above its W: carried over as they are, so the
            # commits this lock holds up wait for file links, not for a Spark job.
            _link(sorted(set(_part_files(start.zlog_location)) - set(snapshot)), target.zlog_location)
            meta = replace(
                state.meta,
                base_location=target.base_location,
                base_version=target.base_version,
                zlog_location=target.zlog_location,
                zlog_version=target.zlog_version,
                compacted_through=start.watermark,
                compacted_orders=tuple(_merge_ranges(list(start.compacted_orders), folded)),
            )
            self._save(state, meta)  # listeners move the analysts' view to the new pair at once
            state.zlog_orders -= folded
            return True

    def _retire(self, tables: Sequence[str] = (), locations: Sequence[str] = ()) -> None:
        """Drop old version tables and delete their files once analysts' queries planned on
        them are done (after ``retire_after_s``); a restart removes whatever is left
        (``_remove_orphans``)."""
        now = time.time()
        with self._lock:
            if tables or locations:
                self._retired.append((now + self._retire_after_s, (tuple(tables), tuple(locations))))
            due = [old for deadline, old in self._retired if deadline <= now]
            self._retired = [(deadline, old) for deadline, old in self._retired if deadline > now]
        for old_tables, old_locations in due:
            self._drop_tables(*old_tables)
            _remove(*old_locations)

    def _read(self, schema: StructType, paths: Sequence[str]) -> DataFrame:
        return self._spark.read.schema(schema).parquet(*paths)

    def _write_compacted(
        self,
        state: _View,
        start: ViewMeta,
        zlog_files: Sequence[str],
        new_base: str,
        new_zlog: str,
    ) -> None:
        """New base: old base plus z-log rows up to W, summed, zeros dropped (negative sums
        stay: a later insert must still cancel them). New z-log: the rows after W.

        Each Spark job reads only the files that hold rows for it (by the ``_order`` range
        in their footers); a job with no such file is not run: the old base is linked into
        the new version, or the new z-log starts empty."""
        codec, bound = state.codec, start.watermark
        spans = {f: footer.span for f, footer in zip(zlog_files, state.read_footers(zlog_files))}
        upto = [f for f, span in spans.items() if span is None or span[0] <= bound]
        after = [f for f, span in spans.items() if span is None or span[1] > bound]
        if upto:
            base = self._read(codec.base_schema, [start.base_location])
            zlog = self._read(codec.zlog_schema, upto).where(F.col(ORDER) <= bound).drop(ORDER)
            summed = (
                base.unionByName(zlog)
                .groupBy(*codec.columns)
                .agg(F.sum(WEIGHT).alias(WEIGHT))
                .where(F.col(WEIGHT) != 0)
            )
            summed.write.mode("overwrite").parquet(new_base)
        else:
            _link(_part_files(start.base_location), new_base)
        if after:
            zlog = self._read(codec.zlog_schema, after).where(F.col(ORDER) > bound)
            zlog.write.mode("overwrite").parquet(new_zlog)
        else:
            store_files().make_dir(Path(new_zlog))
