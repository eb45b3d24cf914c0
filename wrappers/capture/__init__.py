"""Change capture: one module per source dialect (see ``base.CaptureDialect``), and the three
capture methods a wrapper can run (``CaptureConfig.method``):

* ``trigger``: triggers fill an outbox in the source; subqueries run in source snapshots.
* ``log``: reads the database's own change log (PostgreSQL: a logical replication slot,
  ``pg_log``; MariaDB: the binary log, ``maria_log``); subqueries run in source snapshots matched to a prefix of the log (``log``).
* ``timestamp``: polls last-modified timestamps (Carnes TS, TDI with a delete flag) into a
  replica; subqueries run on the replica (``timestamp`` module docstring says why).
* ``application``: the application posts its own changes, applied to a replica; subqueries
  run on the replica, since such a source cannot tie its changes to a query snapshot.
* ``snapshot``: differences successive snapshots (a live ``SELECT``, or dump files) into a
  replica (``differencing`` module); subqueries run on the replica.

Either way the wrapper reads one database through a trigger-capture dialect: the source, or
the replica (a SQLite file captured by SQLite triggers). ``open_capture`` sets that up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from contract.schemas import CAPTURE_METHODS
from wrappers.capture.base import CaptureDialect
from wrappers.capture.snapshots import SnapshotOptions
from wrappers.differential import SnapshotError
from wrappers.errors import WrapperError, masked_url
from wrappers.schema import SourceSchema, TableSchema

if TYPE_CHECKING:
    from wrappers.capture.log import LogReader
    from wrappers.replica import Replica

METHODS = CAPTURE_METHODS  # the wire schema names them, so that the manager knows them too


def dialect_for(url: str) -> CaptureDialect:
    """The capture module for the database behind ``url``."""
    try:
        backend = sa.make_url(url).get_backend_name()
    except sa.exc.ArgumentError as exc:
        raise WrapperError(f"not a database URL: {masked_url(url)!r}") from exc
    if backend == "sqlite":
        from wrappers.capture import sqlite

        return sqlite
    if backend == "postgresql":
        from wrappers.capture import postgresql

        return postgresql
    if backend in ("mysql", "mariadb"):
        from wrappers.capture import mariadb

        return mariadb
    raise WrapperError(
        f"capture is not implemented for {backend} sources (supported: sqlite, postgresql, mariadb/mysql)"
    )


@dataclass(frozen=True)
class CaptureConfig:
    """How a wrapper captures changes; see ``pvm wrapper run --help``."""

    method: str = "trigger"
    timestamp_column: str | None = None
    delete_flag_column: str | None = None
    settle_seconds: float = 5.0
    snapshot: SnapshotOptions | None = None
    slot: str | None = None  # log capture: the replication slot (and publication); None: the default

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise WrapperError(f"unknown capture method {self.method!r} (choose from {', '.join(METHODS)})")
        if (self.method == "timestamp") != (self.timestamp_column is not None):
            raise WrapperError("a timestamp column is needed by, and only by, timestamp capture")
        if self.delete_flag_column is not None and self.method != "timestamp":
            raise WrapperError("a delete-flag column belongs to timestamp capture")
        if self.settle_seconds < 0:
            raise WrapperError("settle_seconds must not be negative")
        if self.method == "snapshot" and self.snapshot is None:
            object.__setattr__(self, "snapshot", SnapshotOptions())
        if self.slot is not None and self.method != "log":
            raise WrapperError("a replication slot belongs to log capture")
        if self.snapshot is not None and self.method != "snapshot":
            raise WrapperError(
                "snapshot options (a dump directory, keys, an interval, an algorithm) belong to snapshot capture"
            )

    @property
    def dumps(self) -> bool:
        """Whether the source is a directory of dump files rather than a database."""
        return self.snapshot is not None and self.snapshot.dump_dir is not None

    @property
    def capture_columns(self) -> tuple[str, ...]:
        """Columns the capture method reads for itself; they are not part of the relations."""
        return tuple(c for c in (self.timestamp_column, self.delete_flag_column) if c is not None)


@dataclass
class Capture:
    """What a wrapper reads (``engine`` through ``dialect``: the source or its replica), the
    relations it serves, and how the replica is fed when there is one."""

    dialect: CaptureDialect
    engine: sa.Engine
    schema: SourceSchema
    replica: Replica | None = None
    pull: Callable[[], bool] | None = None  # True if it applied changes to the replica (they need capturing)
    source_engine: sa.Engine | None = None
    status: Callable[[], dict[str, Any]] | None = None
    log: LogReader | None = None  # log capture: where changes come from instead of an outbox

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
        self.engine.dispose()
        if self.source_engine is not None:
            self.source_engine.dispose()


def check_source(config: CaptureConfig, url: str | None, tables: Sequence[str]) -> SourceSchema:
    """Connect to the source and check that ``config`` can capture ``tables`` there (for
    ``pvm wrapper install`` of the methods that install nothing); the relations' schema."""
    if config.dumps:
        return _dump_directory(config, tables, {}).schema
    url = _need_url(url)
    engine = dialect_for(url).open_engine(url)
    try:
        if config.method == "snapshot":
            from wrappers.capture.snapshots import database_schema

            assert config.snapshot is not None
            return database_schema(engine, tables, config.snapshot.keys)
        return _source_schema(engine, tables, config)
    finally:
        engine.dispose()


def open_capture(config: CaptureConfig, url: str | None, tables: Sequence[str], replica_path: Path) -> Capture:
    """Install (trigger) or set up the replica (timestamp, application, snapshot) for ``tables``."""
    if config.dumps:
        return _snapshot_capture(config, None, None, tables, replica_path)
    url = _need_url(url)
    dialect = dialect_for(url)
    engine = dialect.open_engine(url)
    try:
        if config.method == "trigger":
            dialect.install(engine, tables)
            return Capture(dialect, engine, SourceSchema.reflect(engine, tables))
        if config.method == "log":
            return _log_capture(config, dialect, engine, tables)
        if config.method == "snapshot":
            return _snapshot_capture(config, dialect, engine, tables, replica_path)
        return _replica_capture(config, dialect, engine, tables, replica_path)
    except BaseException:
        engine.dispose()
        raise


def _replica_capture(
    config: CaptureConfig, dialect: CaptureDialect, engine: sa.Engine, tables: Sequence[str], path: Path
) -> Capture:
    from wrappers.capture import sqlite
    from wrappers.capture.timestamp import TimestampCapture, TimestampOptions
    from wrappers.replica import Replica

    schema = _source_schema(engine, tables, config)
    replica = Replica(path, schema)
    try:
        pull = None
        if config.method == "timestamp":
            assert config.timestamp_column is not None
            options = TimestampOptions(config.timestamp_column, config.delete_flag_column, config.settle_seconds)
            feeder = TimestampCapture(dialect, engine, list(schema.tables.values()), replica, options)
            if not replica.loaded:
                feeder.load()
            pull = feeder.pull
        elif not replica.loaded:
            _copy(dialect, engine, schema, replica)
        sqlite.install(replica.engine, tables)
    except BaseException:
        replica.close()
        raise
    if pull is None:
        engine.dispose()  # application capture reads the source once, for the initial copy
    return Capture(sqlite, replica.engine, schema, replica, pull, engine if pull is not None else None)


def log_module(engine: sa.Engine) -> Any:
    """The log capture module of ``engine``'s database; WrapperError where there is none."""
    if engine.dialect.name == "postgresql":
        from wrappers.capture import pg_log

        return pg_log
    if engine.dialect.name in ("mysql", "mariadb"):
        from wrappers.capture import maria_log

        return maria_log
    raise WrapperError(
        f"log capture is not implemented for {engine.dialect.name} sources (supported: postgresql, mariadb)"
    )


def log_slot(config: CaptureConfig, engine: sa.Engine) -> str:
    """The slot (and publication) log capture uses: ``--slot``, or one named after the schema."""
    module = log_module(engine)
    return str(module.check_slot_name(config.slot) if config.slot else module.default_slot(engine))


def install_log(config: CaptureConfig, engine: sa.Engine, tables: Sequence[str]) -> str:
    """``pvm wrapper install --capture log``; the slot's name."""
    slot = log_slot(config, engine)
    log_module(engine).install(engine, tables, slot)
    return slot


def uninstall_log(config: CaptureConfig, engine: sa.Engine, tables: Sequence[str]) -> str:
    """``pvm wrapper uninstall --capture log``: the slot goes once no table is captured."""
    slot = log_slot(config, engine)
    log_module(engine).uninstall(engine, tables, slot)
    return slot


def _log_capture(config: CaptureConfig, dialect: CaptureDialect, engine: sa.Engine, tables: Sequence[str]) -> Capture:
    slot = install_log(config, engine, tables)
    schema = SourceSchema.reflect(engine, tables)
    reader = log_module(engine).reader(engine, schema, slot)
    return Capture(dialect, engine, schema, status=reader.status, log=reader)


def _need_url(url: str | None) -> str:
    if not url:
        raise WrapperError(
            "a source database URL is needed (snapshot capture of dump files takes a dump directory instead)"
        )
    return url


def _snapshot_directory(replica_path: Path) -> Path:
    """Where snapshot capture keeps its snapshot files, next to the replica."""
    return replica_path.with_name(replica_path.name.removesuffix(".replica.sqlite3") + ".snapshots")


def _dump_directory(config: CaptureConfig, tables: Sequence[str], kept: dict[str, Path]):
    from wrappers.capture.snapshots import DumpDirectory

    options = config.snapshot
    assert options is not None and options.dump_dir is not None
    return DumpDirectory(options.dump_dir, tables, options.keys, options.dump_types, kept)


def _snapshot_capture(
    config: CaptureConfig, dialect: CaptureDialect | None, engine: sa.Engine | None, tables: Sequence[str], path: Path
) -> Capture:
    """A replica fed by differencing snapshots of a database (``engine``) or of dump files."""
    from wrappers.capture import sqlite
    from wrappers.capture.differencing import SnapshotCapture
    from wrappers.capture.ranges import RangeCapture
    from wrappers.capture.snapshots import DatabaseTables, database_schema
    from wrappers.replica import Replica

    options = config.snapshot
    assert options is not None
    directory = _snapshot_directory(path)
    if engine is None:
        source = _dump_directory(config, tables, SnapshotCapture.kept_files(Replica.stored_meta(path), directory))
    else:
        assert dialect is not None
        source = DatabaseTables(dialect, engine, database_schema(engine, tables, options.keys))
    replica = Replica(path, source.schema)
    try:
        feeder: RangeCapture | SnapshotCapture
        if options.algorithm == "range-checksums":
            assert dialect is not None and engine is not None
            feeder = RangeCapture(dialect, engine, source.schema, replica, options.interval, options.range_rows)
        else:
            feeder = SnapshotCapture(source, replica, options, directory)
        if not replica.loaded:
            try:
                feeder.load()
            except SnapshotError as exc:
                raise WrapperError(f"cannot take the first snapshot: {exc}") from exc
        sqlite.install(replica.engine, tables)
    except BaseException:
        replica.close()
        raise
    return Capture(sqlite, replica.engine, source.schema, replica, feeder.pull, engine, feeder.status)


def _copy(dialect: CaptureDialect, engine: sa.Engine, schema: SourceSchema, replica: Replica) -> None:
    """Load ``replica`` with the source's rows, read in one snapshot."""
    from wrappers.capture.types import wire_value

    conn = dialect.begin_snapshot(engine)
    try:
        rows = {
            name: [
                {c: wire_value(v) for c, v in zip(table.columns, values)}
                for values in conn.execute(sa.select(*table.query_table().c))
            ]
            for name, table in schema.tables.items()
        }
    finally:
        conn.close()
    replica.load(rows)


def _source_schema(engine: sa.Engine, tables: Sequence[str], config: CaptureConfig) -> SourceSchema:
    """The relations as the manager sees them (capture columns removed), after the checks the
    method needs: a primary key for the replica methods, the capture columns present, the
    column types shippable (SQLite: any, its values are typed one by one)."""
    from wrappers.capture.common import check_tables

    needs_key = config.method != "trigger"
    checked = check_tables(
        engine,
        tables,
        need_primary_key=needs_key,
        not_shipped=config.capture_columns,
        check_types=engine.dialect.name != "sqlite",
    )
    reflected = SourceSchema.reflect(engine, tables)
    out: dict[str, TableSchema] = {}
    for table in checked:
        missing = [c for c in config.capture_columns if c not in table.columns]
        if missing:
            raise WrapperError(
                f"table {table.name!r} has no column {', '.join(map(repr, missing))} for {config.method} capture"
            )
        if any(c in table.primary_key for c in config.capture_columns):
            raise WrapperError(f"table {table.name!r}: a capture column cannot be part of the primary key")
        full = reflected.tables[table.name]
        kept = [i for i, c in enumerate(full.columns) if c not in config.capture_columns]
        out[table.name] = TableSchema(
            full.name, tuple(full.columns[i] for i in kept), tuple(full.types[i] for i in kept), full.primary_key
        )
    return SourceSchema(out)
