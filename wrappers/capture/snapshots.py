"""Where snapshot-differential capture gets its snapshots: a live database, or dump files.

A *snapshot source* takes a snapshot of some tables into files of the wrapper's state
directory and opens such a file as a ``differential.Snapshot`` of ``<key, rest>`` records:

* ``DatabaseTables``: one read transaction of a live database (``SELECT`` of every table,
  in the order the database returns rows, which is what the window algorithm relies on
  being stable), kept as a record file of values in their wire form;
* ``DumpDirectory``: ``<table>.csv`` or ``<table>.parquet`` files that another program
  drops into a directory; a table is due when its file changed (name, size, modification
  time), and the file is copied before it is read, so a dump rewritten meanwhile never
  mixes into a differential.

Either way the key of a table is its primary key or the columns given with ``--key``, and
every column must have a type the wrapper can ship (``types``). CSV values are text unless
``--dump-types`` names a column's type; an empty CSV field of a typed column is NULL.
"""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa

from wrappers.capture.base import CaptureDialect
from wrappers.capture.types import SUPPORTED, wire_value
from wrappers.differential import (
    CsvSnapshot,
    ParquetSnapshot,
    RecordSnapshot,
    Schema,
    Snapshot,
    SnapshotError,
    write_records,
)
from wrappers.errors import WrapperError
from wrappers.schema import SourceSchema, TableSchema

ALGORITHMS = ("auto", "window", "partitioned-hash", "sort-merge", "range-checksums")
DUMP_SUFFIXES = (".csv", ".parquet", ".pq")


def _typed(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    return lambda text: None if text == "" else convert(text)


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "t", "true", "y", "yes"):
        return True
    if value in ("0", "f", "false", "n", "no"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _date(text: str) -> str:
    return datetime.date.fromisoformat(text).isoformat()


DUMP_TYPES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "integer": ("BIGINT", _typed(int)),
    "float": ("DOUBLE", _typed(float)),
    "boolean": ("BOOLEAN", _typed(_boolean)),
    "date": ("DATE", _typed(_date)),
    "text": ("TEXT", str),
}
"""CSV column types: name -> (the SQL type reported to the manager, the converter)."""


@dataclass(frozen=True)
class SnapshotOptions:
    """Snapshot-differential capture; see ``pvm wrapper run --help``."""

    dump_dir: Path | None = None
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    dump_types: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    interval: float = 60.0
    algorithm: str = "auto"
    memory_mb: int = 256
    aging_records: int = 65536
    checksum_bits: int = 64
    range_rows: int = 10_000

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise WrapperError(
                f"unknown differential algorithm {self.algorithm!r} (choose from {', '.join(ALGORITHMS)})"
            )
        if self.interval <= 0:
            raise WrapperError("the snapshot interval must be positive")
        if self.memory_mb < 1 or self.aging_records < 1:
            raise WrapperError("the differential's memory and aging buffer must be positive")
        if not 8 <= self.checksum_bits <= 512:
            raise WrapperError("checksum bits must be between 8 and 512")
        if self.range_rows < 1:
            raise WrapperError("rows per range must be at least 1")
        if self.algorithm == "range-checksums" and self.dump_dir is not None:
            raise WrapperError("range checksums query a live database by key range: give --url, not --dump-dir")
        for table, types in self.dump_types.items():
            unknown = sorted({t for t in types.values() if t not in DUMP_TYPES})
            if unknown:
                raise WrapperError(
                    f"unknown dump type(s) {', '.join(unknown)} for table {table!r} (known: {', '.join(DUMP_TYPES)})"
                )


class SnapshotSource(Protocol):
    """What ``differencing.SnapshotCapture`` needs from a source of snapshots."""

    schema: SourceSchema

    def signature(self, table: str) -> Any:
        """Something that changes when ``table`` may have changed (None: always take it)."""
        ...

    def take(self, tables: Sequence[str], directory: Path, tag: str) -> dict[str, Path]:
        """Snapshot ``tables`` into new files in ``directory`` whose names contain ``tag``."""
        ...

    def open(self, table: str, path: Path) -> Snapshot:
        """A file written by ``take`` as a snapshot of ``table``; SnapshotError if it is bad."""
        ...

    def close(self) -> None: ...


def _snapshot_schema(table: TableSchema) -> Schema:
    return Schema(table.columns, table.primary_key, table.types)


class DatabaseTables:
    """Snapshots read from a live database, all tables in one read transaction."""

    def __init__(self, dialect: CaptureDialect, engine: sa.Engine, schema: SourceSchema) -> None:
        self._dialect = dialect
        self._engine = engine
        self.schema = schema

    def signature(self, table: str) -> Any:
        return None

    def take(self, tables: Sequence[str], directory: Path, tag: str) -> dict[str, Path]:
        out: dict[str, Path] = {}
        conn = self._dialect.begin_snapshot(self._engine)
        try:
            for name in tables:
                table = self.schema.tables[name]
                columns = sa.table(name, *(sa.column(c) for c in table.columns)).c
                key = [columns[c] for c in table.primary_key]
                rest = [columns[c] for c in table.columns if c not in table.primary_key]
                width = len(key)
                rows = conn.execute(sa.select(*key, *rest).execution_options(yield_per=10_000))
                path = directory / f"{name}.{tag}.rec"
                write_records(
                    path, ((tuple(map(wire_value, r[:width])), tuple(map(wire_value, r[width:]))) for r in rows)
                )
                out[name] = path
        finally:
            conn.close()
        return out

    def open(self, table: str, path: Path) -> Snapshot:
        t = self.schema.tables[table]
        key = t.primary_key
        columns = (*key, *(c for c in t.columns if c not in key))
        return RecordSnapshot(path, Schema(columns, key))

    def close(self) -> None:
        self._engine.dispose()


def database_schema(engine: sa.Engine, tables: Sequence[str], keys: Mapping[str, Sequence[str]]) -> SourceSchema:
    """The tables' schema, keyed by ``keys[table]`` where given, else by the primary key."""
    from wrappers.capture.common import check_tables

    reflected = SourceSchema.reflect(engine, tables)
    out = {}
    for checked in check_tables(engine, tables, check_types=engine.dialect.name != "sqlite"):
        full = reflected.tables[checked.name]
        out[checked.name] = TableSchema(
            full.name, full.columns, full.types, _key(checked.name, full.columns, full.primary_key, keys)
        )
    return SourceSchema(out)


def _key(
    table: str, columns: Sequence[str], primary_key: Sequence[str], keys: Mapping[str, Sequence[str]]
) -> tuple[str, ...]:
    key = tuple(keys.get(table) or primary_key)
    if not key:
        raise WrapperError(
            f"table {table!r} has no primary key: name its key columns with --key {table}=COLUMN[,COLUMN]"
        )
    missing = [c for c in key if c not in columns]
    if missing:
        raise WrapperError(
            f"--key of table {table!r} names unknown column(s) {', '.join(missing)} (columns: {', '.join(columns)})"
        )
    return key


class DumpDirectory:
    """Snapshots dropped as ``<table>.csv`` or ``<table>.parquet`` files into ``directory``.

    The schema of a table comes from its ``kept`` snapshot when there is one (the replica
    was made from it), else from the dump now in the directory; a later dump with other
    columns or key is refused when it is differenced, and the kept snapshot stays.
    """

    def __init__(
        self,
        directory: Path,
        tables: Sequence[str],
        keys: Mapping[str, Sequence[str]],
        dump_types: Mapping[str, Mapping[str, str]],
        kept: Mapping[str, Path],
    ) -> None:
        if not directory.is_dir():
            raise WrapperError(f"the dump directory {directory} does not exist")
        unknown = sorted(set(keys) - set(tables)) + sorted(set(dump_types) - set(tables))
        if unknown:
            raise WrapperError(f"--key or --dump-types name table(s) not captured: {', '.join(unknown)}")
        self.directory = directory
        self._keys = {t: tuple(keys.get(t, ())) for t in tables}
        self._types = {t: dict(dump_types.get(t, {})) for t in tables}
        tables_out = {}
        for table in tables:
            if not self._keys[table]:
                raise WrapperError(
                    f"dumps carry no primary key: name the key of table {table!r} with --key {table}=COLUMN[,COLUMN]"
                )
            path = kept.get(table) or self.dump_file(table)
            if path is None:
                raise WrapperError(
                    f"no dump of table {table!r} in {directory} (expected {table}.csv or {table}.parquet)"
                )
            try:
                snapshot = self.open(table, path)
            except SnapshotError as exc:
                raise WrapperError(f"cannot read the dump of table {table!r}: {exc}") from exc
            tables_out[table] = self._table_schema(table, path, snapshot.schema)
        self.schema = SourceSchema(tables_out)

    def dump_file(self, table: str) -> Path | None:
        """The table's dump in the directory; WrapperError if there are two."""
        found = [self.directory / f"{table}{s}" for s in DUMP_SUFFIXES if (self.directory / f"{table}{s}").is_file()]
        if len(found) > 1:
            raise WrapperError(f"two dumps of table {table!r} in {self.directory}: {', '.join(p.name for p in found)}")
        return found[0] if found else None

    def signature(self, table: str) -> Any:
        path = self.dump_file(table)
        if path is None:
            return None
        stat = path.stat()
        return [path.name, stat.st_size, stat.st_mtime_ns]

    def take(self, tables: Sequence[str], directory: Path, tag: str) -> dict[str, Path]:
        out = {}
        for table in tables:
            source = self.dump_file(table)
            if source is None:
                raise SnapshotError(f"the dump of table {table!r} disappeared from {self.directory}")
            before = self.signature(table)
            target = directory / f"{table}.{tag}{source.suffix}"
            shutil.copyfile(source, target)
            if self.signature(table) != before:
                os.unlink(target)
                raise SnapshotError(f"{source} changed while it was copied; it is read again at the next interval")
            out[table] = target
        return out

    def open(self, table: str, path: Path) -> Snapshot:
        key = self._keys[table]
        if path.suffix == ".csv":
            types = self._types[table]
            return CsvSnapshot(path, key, types={c: DUMP_TYPES[t][1] for c, t in types.items()})
        return ParquetSnapshot(path, key)

    def _table_schema(self, table: str, path: Path, schema: Schema | None) -> TableSchema:
        assert schema is not None
        _key(table, schema.columns, (), self._keys)
        if path.suffix == ".csv":
            named = self._types[table]
            unknown = sorted(set(named) - set(schema.columns))
            if unknown:
                raise WrapperError(f"--dump-types of table {table!r} names unknown column(s) {', '.join(unknown)}")
            types = tuple(DUMP_TYPES[named.get(c, "text")][0] for c in schema.columns)
        else:
            types = tuple(_arrow_sql_type(table, c, t) for c, t in zip(schema.columns, schema.types or ()))
        return TableSchema(table, schema.columns, types, tuple(self._keys[table]))

    def close(self) -> None:
        pass


_ARROW_TYPES = {
    "int8": "BIGINT", "int16": "BIGINT", "int32": "BIGINT", "int64": "BIGINT",
    "uint8": "BIGINT", "uint16": "BIGINT", "uint32": "BIGINT",
    "float": "DOUBLE", "double": "DOUBLE", "halffloat": "DOUBLE",
    "string": "TEXT", "large_string": "TEXT", "bool": "BOOLEAN", "date32[day]": "DATE",
}  # fmt: skip


def _arrow_sql_type(table: str, column: str, arrow_type: str) -> str:
    if arrow_type.startswith("decimal"):
        return "NUMERIC"
    if arrow_type not in _ARROW_TYPES:
        raise WrapperError(
            f"table {table!r}: column {column} has Parquet type {arrow_type}, which the wrapper cannot ship; supported: {SUPPORTED}"
        )
    return _ARROW_TYPES[arrow_type]
