"""The Spark view store: append-only z-log and compacted base tables per view.

Spark 4 cannot update or delete rows of a plain parquet table, and signed counts do not need
it: a commit appends the effect's rows with their weights and order number to the view's
z-log, as one Parquet file this process writes into the z-log's directory (no Spark job:
every session lists a table's directory for every query), and the view's contents are
``SUM(_w)`` per row over the base plus the z-log. Reads
``as_of=W`` filter the z-log by order; compaction folds the old part of the z-log into a new
base version at a new location (Spark cannot overwrite a table it is reading) and swaps.

Per view, under ``<data_dir>/views/<view>/``:

* ``zlog/v<N>/``: table ``pvm_zlog_<view>`` (view columns, ``_w`` BIGINT, ``_order`` BIGINT);
* ``base/v<N>/``: table ``pvm_base_<view>`` (view columns, ``_w`` BIGINT).

The two tables keep their names for good; compaction moves them to new locations, one
``ALTER TABLE`` each, for raw reads in this session. Reads, and the initial load's append,
go to a second pair of tables per version, ``pvm_store.base_<N>_<view>`` and
``pvm_store.zlog_<N>_<view>``, which never move; commits write into the current z-log
version's directory.

Which versions are current, the published watermark and the compacted orders live in a
``StoreCatalog`` record, written only at the few points that change them, so that a restart
re-registers every table. Which orders are committed is read back from the z-log itself:
an append is the commit, and a crash between two appends loses nothing and repeats nothing.

What analysts query is not here: every change of a record goes to the store's listeners
(``subscribe``), and ``PublishedViews`` (``warehouse/store/published.py``) turns the records
into the views analysts read, in the Spark session of the analysts' query process
(``warehouse/analysts``), a JVM of its own. A compaction's old version stays on disk for
``retire_after_s`` after the record moves on, so a query planned on it can finish.

``SparkStore`` wires the parts together, each in a module of its own: the names of columns
and tables (``spark_names``), the per-view records (``spark_records``), rows to Arrow and
back (``spark_rows``), the SQL of the visible view (``spark_sql``), the tables' data files
(``spark_files``) and a compaction's Spark jobs (``spark_compaction``). When to compact is
``compaction``'s.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from contract.zset import Row, ZSet
from warehouse.store.base import BASE_PREFIX, VERSIONS_DB, ZLOG_PREFIX, Effect, Engine, StoreError, Summed
from warehouse.store.compaction import ZlogStats
from warehouse.store.file_access import store_files
from warehouse.store.spark_compaction import write_compacted
from warehouse.store.spark_files import (
    Footer,
    append_file,
    link,
    part_files,
    read_footer,
    remove,
    remove_unfinished,
    unit_part,
    unit_part_file,
)
from warehouse.store.spark_names import ORDER, check_columns, check_view_name, version_table
from warehouse.store.spark_records import JsonStoreCatalog, StoreCatalog, ViewMeta, in_ranges, merge_ranges
from warehouse.store.spark_rows import RowCodec, parse_type, shown_codec
from warehouse.store.spark_session import LISTING_CACHE
from warehouse.store.spark_sql import shown_sql, sums_sql


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


Listener = Callable[[str, "ViewMeta | None"], None]


@dataclass
class _View:
    name: str
    meta: ViewMeta
    codec: RowCodec
    zlog_orders: set[int]  # committed orders whose rows are in the z-log
    parts: dict[int, set[str]] = field(default_factory=dict)  # units' parts in the z-log, by order
    dropped_parts: set[str] = field(default_factory=set)  # part files deleted while a compaction ran
    lock: threading.RLock = field(default_factory=threading.RLock)  # commits, reads, swaps
    compaction: threading.Lock = field(default_factory=threading.Lock)  # one at a time
    dropped: bool = False
    footers: dict[str, Footer] = field(default_factory=dict)  # by z-log file path
    footers_lock: threading.Lock = field(default_factory=threading.Lock)  # not the view lock

    def committed(self, order: int) -> bool:
        return order in self.zlog_orders or in_ranges(self.meta.compacted_orders, order)

    def read_footers(self, files: Sequence[str]) -> list[Footer]:
        """The footers of ``files``, a listing of the current z-log, each read from disk the
        first time only: the compactor asks for them every interval, and compaction again.
        A data file never changes once written (appends add files, compaction writes a new
        directory) and its name is unique, so a path's footer stays right; files no longer
        listed (compacted away) are forgotten, so the cache holds one z-log's files."""
        with self.footers_lock:
            known = self.footers
            self.footers = {f: known[f] if f in known else read_footer(f) for f in files}
            return [self.footers[f] for f in files]


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
        if spark.conf.get(LISTING_CACHE) != "0":
            # commits write their files past Spark: a cached listing would not show them
            raise StoreError(f"the Spark store needs {LISTING_CACHE}=0 (the session caches table listings)")
        self._spark = spark
        self._retire_after_s = retire_after_s
        self._retired: list[tuple[float, tuple[tuple[str, ...], tuple[str, ...]]]] = []
        self._root = Path(data_dir).resolve() / "views"
        self._staging = Path(data_dir).resolve() / "staging"
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
    def engine(self) -> Engine:
        return "spark"

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
        files = part_files(meta.zlog_location)
        parts: dict[int, set[str]] = {}
        for file in files:
            if (named := unit_part(file)) is not None:
                parts.setdefault(named[0], set()).add(named[1])
        commits = [f for f in files if unit_part(f) is None]  # a unit's parts do not commit its order
        if not commits:  # a new view's: no Spark job to find no order
            return _View(view, meta, codec, set(), parts)
        orders = self._spark.read.schema(codec.zlog_schema).parquet(*commits).select(ORDER).distinct()
        return _View(view, meta, codec, set(orders.toArrow().column(0).to_pylist()), parts)

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
        the record changed; and the hidden file of a commit that a crash cut short. (An
        in-memory Spark catalog starts empty; a persistent one keeps tables across restarts.)"""
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
        # No load runs before the store is open: whatever is staged is a dead run's.
        shutil.rmtree(self._staging, ignore_errors=True)
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
            remove_unfinished(meta.zlog_location)  # a commit's file the crash cut short

    def _relocate(self, table: str, location: str) -> None:
        self._spark.sql(f"ALTER TABLE {table} SET LOCATION {_sql_string(location)}")
        self._spark.catalog.refreshTable(table)

    # -- SQL ---------------------------------------------------------------------------
    def _sums_sql(self, state: _View, as_of: int | None, keep: str) -> str:
        return sums_sql(*self._version_tables(state.name, state.meta), state.meta.columns, as_of, keep)

    def _visible_sql(self, state: _View, as_of: int | None) -> str:
        meta = state.meta
        return shown_sql(*self._version_tables(state.name, meta), meta.columns, meta.summed, as_of)

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
        check_view_name(view)
        check_columns(cols)
        if types is not None and len(types) != len(cols):
            raise StoreError(f"{len(types)} types for {len(cols)} columns")
        normalized = (
            None
            if types is None or all(t is None for t in types)
            else tuple(None if t is None else parse_type(t).simpleString() for t in types)
        )
        existing = self._views.get(view)
        if existing is not None:
            if existing.meta.columns != cols or normalized not in (None, existing.meta.types):
                raise StoreError(f"view {view!r} exists with other columns")
        for other in self._views:
            if other != view and other.lower() == view.lower():
                raise StoreError(f"view {view!r} collides with view {other!r} in Spark SQL")
        return normalized

    def create(
        self,
        view: str,
        columns: Sequence[str],
        types: Sequence[str | None] | None = None,
        summed: Summed | None = None,
    ) -> None:
        """Create an empty view. ``types`` are Spark SQL type names, one per column; a column
        without one (None) stores its values as JSON text, exact but awkward for analysts'
        SQL. ``summed``: the stored rows are an aggregate view's per-key numbers, read (and
        compacted) per key."""
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
                summed=summed,
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
            shutil.rmtree(self._staging / view, ignore_errors=True)

    def commit(self, view: str, effects: Sequence[Effect]) -> None:
        """The whole group as one Parquet file written into the current z-log version by this
        process (``append_file``), no Spark job: the next query of any session lists it."""
        with self._hold(view) as state:
            fresh: dict[int, Effect] = {}
            for effect in effects:
                if effect.order not in fresh and not state.committed(effect.order):
                    fresh[effect.order] = effect
            if fresh:
                table = state.codec.effects_table(list(fresh.values()))
                # Read and written under the view lock, which a compaction's swap holds while it
                # moves the record to the next version: the file lands in a version that is
                # current until it is there, and a swap after it carries it over.
                append_file(table, state.meta.zlog_location)
                state.zlog_orders.update(fresh)

    def commit_part(self, view: str, order: int, part: str, delta: ZSet) -> None:
        """One Parquet file of its own, named by the order and the part (``unit_part_file``):
        written again, it replaces itself. No Spark job, as ``commit``."""
        with self._hold(view) as state:
            table = state.codec.effects_table([Effect(order, delta)])
            append_file(table, state.meta.zlog_location, unit_part_file(order, part))
            state.parts.setdefault(order, set()).add(part)

    def keep_parts(self, view: str, order: int, parts: Collection[str]) -> set[str]:
        with self._hold(view) as state:
            stored = state.parts.get(order, set())
            self._drop_parts(state, order, stored - set(parts))
            stored &= set(parts)
            return set(stored)

    @staticmethod
    def _drop_parts(state: _View, order: int, parts: Collection[str]) -> None:
        """Delete parts of an order above W: no reader as of W reads them. (Under the view
        lock.) A compaction running meanwhile may have linked them into its new z-log
        already: its swap deletes them there too."""
        for part in parts:
            name = unit_part_file(order, part)
            Path(state.meta.zlog_location, name).unlink(missing_ok=True)
            state.parts.get(order, set()).discard(part)
            if state.compaction.locked():
                state.dropped_parts.add(name)

    def staging_dir(self, view: str) -> Path:
        """Where a view's initial load stages its relations (``warehouse.engine_load``): beside
        the view's tables, so wherever Spark reads those it reads these."""
        return self._staging / view

    def load(self, view: str, order: int, query: str) -> bool:
        """Append the rows of ``query`` (the view's columns, then ``_w``) to the z-log as order
        ``order``, in one Spark job, with the all-NULL row of weight 0 that marks an order
        committed even when it adds nothing (as ``commit`` writes for an empty effect).
        False, and nothing written, if the z-log holds the order already. The append is the
        commit: its files appear together when the job commits, or not at all."""
        with self._hold(view) as state:
            if state.committed(order):
                return False
            marker = ", ".join(["NULL"] * len(state.meta.columns))
            self._spark.sql(
                f"INSERT INTO {self._version_tables(view, state.meta)[1]} "
                f"SELECT *, {int(order)}L FROM ({query}) UNION ALL SELECT {marker}, 0L, {int(order)}L"
            )
            state.zlog_orders.add(order)
            return True

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
        return list(shown_codec(state.meta, state.codec).decode(table))

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
                files = part_files(meta.zlog_location)
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
                snapshot = part_files(start.zlog_location)
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
                write_compacted(
                    self._spark, state.codec, start, snapshot, state.read_footers(snapshot), new_base, new_zlog
                )
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
        remove(target.base_location, target.zlog_location)

    def _swap(self, state: _View, start: ViewMeta, snapshot: Sequence[str], folded: set[int], target: ViewMeta) -> bool:
        """Under the view lock: carry over late commits, switch the record and the analysts'
        view. False (nothing changed) if W was lowered meanwhile."""
        with self._guard(state):
            if state.meta.watermark < start.watermark:
                return False
            # Appended since the snapshot, all above its W: carried over as they are, so the
            # commits this lock holds up wait for file links, not for a Spark job.
            link(sorted(set(part_files(start.zlog_location)) - set(snapshot)), target.zlog_location)
            for name in state.dropped_parts:  # units' parts dropped since the snapshot
                Path(target.zlog_location, name).unlink(missing_ok=True)
            state.dropped_parts.clear()
            meta = replace(
                state.meta,
                base_location=target.base_location,
                base_version=target.base_version,
                zlog_location=target.zlog_location,
                zlog_version=target.zlog_version,
                compacted_through=start.watermark,
                compacted_orders=tuple(merge_ranges(list(start.compacted_orders), folded)),
            )
            self._save(state, meta)  # listeners move the analysts' view to the new pair at once
            state.zlog_orders -= folded
            # units' parts up to W are in the base now; those after it were linked, names and all
            state.parts = {o: parts for o, parts in state.parts.items() if o > start.watermark}
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
            remove(*old_locations)
