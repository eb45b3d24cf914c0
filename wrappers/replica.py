"""The wrapper's own copy of a source's captured relations, for sources that cannot tie a
change to a query snapshot (timestamp and application capture; snapshot differentials).

Invariant 3 (docs/design.md) asks every subquery answer to reflect exactly the updates with
seq <= its watermark. A source whose changes arrive by polling timestamps or by the
application posting them has no snapshot in which "shipped" and "visible" coincide, so the
wrapper answers from this replica instead: a SQLite file in the wrapper's state directory,
changed only through ``apply`` (one SQLite transaction per call), and captured by the same
SQLite triggers as any SQLite source. Shipping, seqs, acknowledgments and the handshake
are then exactly those of a trigger-captured SQLite source, and the replica is by
construction the source state the shipped updates describe.

``apply`` takes changes keyed by primary key and reads the old row from the replica, so a
feeder never needs to know old values (Carnes's TS/TDI keep "the copy" for this reason).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa

from contract.file_modes import PRIVATE
from wrappers.capture import sqlite as sqlite_capture
from wrappers.errors import InvalidRequest, WrapperError
from wrappers.schema import SourceSchema, TableSchema

META = "_pvm_replica_meta"
"""Key-value table of the replica; its name is reserved, so it is never captured."""

_LOAD_BATCH = 10_000


@dataclass(frozen=True)
class RowChange:
    """One change of one relation, keyed by primary key.

    * ``insert``: ``row`` is the new row (absent columns are NULL);
    * ``update``: the row whose key is ``key`` gets the columns of ``row`` (others keep their
      values; changing key columns is a key change);
    * ``delete``: the row whose key is ``key`` goes.
    """

    relation: str
    op: Literal["insert", "update", "delete"]
    key: Mapping[str, Any] | None = None
    row: Mapping[str, Any] | None = None


class DuplicateKey(InvalidRequest):
    """An insert of a key that ``relation`` already has; ``key`` is in wire form. A feeder
    that must tell this conflict apart (snapshot differencing: a key repeated in the new
    snapshot) catches it instead of looking every inserted key up before ``apply``."""

    def __init__(self, message: str, relation: str, key: tuple[Any, ...]) -> None:
        super().__init__(message)
        self.relation = relation
        self.key = key


class Replica:
    """A SQLite copy of the relations of ``schema``, each of which must have a primary key."""

    def __init__(self, path: Path, schema: SourceSchema) -> None:
        for table in schema.tables.values():
            if not table.primary_key:
                raise WrapperError(f"table {table.name!r} has no primary key, which a replica needs")
        self.path = path
        self.schema = schema
        PRIVATE.make_dir(path.parent)
        PRIVATE.create_file(path)  # a copy of the source's rows: owner-only
        self.engine = sqlite_capture.open_engine(f"sqlite:///{path}")
        self._tables = {name: sa.table(name, *(sa.column(c) for c in t.columns)) for name, t in schema.tables.items()}
        try:
            self._create()
        except BaseException:
            self.engine.dispose()
            raise

    def _create(self) -> None:
        """Create missing tables; refuse a replica that was made for other relations."""
        q = self.engine.dialect.identifier_preparer.quote_identifier
        with self.engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {META} (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            made = conn.exec_driver_sql(f"SELECT value FROM {META} WHERE key = 'relations'").scalar_one_or_none()
            wanted = {n: [list(t.columns), list(t.primary_key)] for n, t in self.schema.tables.items()}
            if made is not None and json.loads(made) != wanted:
                raise WrapperError(
                    f"the replica {self.path} holds other relations or columns ({made}) than the source now has; "
                    "remove it (and the wrapper state next to it) to start from a fresh copy"
                )
            for name, table in self.schema.tables.items():
                key = ", ".join(q(c) for c in table.primary_key)
                columns = ", ".join(q(c) + (" NOT NULL" if c in table.primary_key else "") for c in table.columns)
                conn.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {q(name)} ({columns}, PRIMARY KEY ({key}))")
            conn.execute(
                sa.text(f"INSERT OR IGNORE INTO {META} VALUES ('relations', :value)"), {"value": json.dumps(wanted)}
            )

    @staticmethod
    def stored_meta(path: Path) -> dict[str, str]:
        """The metadata of the replica at ``path`` without opening it as one (empty if none)."""
        if not path.exists():
            return {}
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return dict(conn.execute(f"SELECT key, value FROM {META}").fetchall())
        except sqlite3.OperationalError:  # no metadata table yet
            return {}
        finally:
            conn.close()

    # -- reads -------------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        """Whether the initial copy of the source is in place."""
        return self.meta("loaded") == "1"

    def meta(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(
                sa.text(f"SELECT value FROM {META} WHERE key = :key"), {"key": key}
            ).scalar_one_or_none()

    def rows(self, relation: str, keys: Iterable[tuple[Any, ...]]) -> dict[tuple[Any, ...], dict[str, Any]]:
        """The current rows of ``relation`` with the given primary keys, by key."""
        table = self.schema.table(relation)
        t = self._tables[relation]
        out: dict[tuple[Any, ...], dict[str, Any]] = {}
        with self.engine.connect() as conn:
            for key in keys:
                found = conn.execute(sa.select(t).where(*_key_match(t, table, key))).mappings().first()
                if found is not None:
                    out[key] = dict(found)
        return out

    # -- writes ------------------------------------------------------------------------------
    def load(self, rows: Mapping[str, Iterable[Mapping[str, Any]]], meta: Mapping[str, str] = {}) -> None:
        """The initial copy, in one transaction, before capture triggers exist (it is the
        state the manager's views start from, not a change)."""
        if self.loaded:
            raise WrapperError(f"the replica {self.path} is already loaded")
        with self.engine.begin() as conn:
            for relation, relation_rows in rows.items():
                it = iter(relation_rows)
                while batch := [dict(r) for r in islice(it, _LOAD_BATCH)]:
                    try:
                        conn.execute(self._tables[relation].insert(), batch)
                    except sa.exc.IntegrityError as exc:
                        raise InvalidRequest(
                            f"{relation!r}: two rows with the same key, or a NULL key ({exc.orig})"
                        ) from None
            self._set_meta(conn, {**meta, "loaded": "1"})

    def apply(self, changes: Sequence[RowChange], meta: Mapping[str, str] = {}) -> None:
        """Apply ``changes`` (and set ``meta``) in one transaction: all or nothing.

        InvalidRequest for a change the replica cannot take (unknown relation or column, a
        missing key column, an insert of an existing key (DuplicateKey), an update or delete
        of a missing row); nothing of the call is applied then.
        """
        with self.engine.begin() as conn:
            for i, change in enumerate(changes):
                try:
                    self._apply_one(conn, change)
                except DuplicateKey as exc:
                    raise DuplicateKey(f"change {i}: {exc}", exc.relation, exc.key) from None
                except InvalidRequest as exc:
                    raise InvalidRequest(f"change {i}: {exc}") from None
            self._set_meta(conn, meta)

    def _apply_one(self, conn: sa.Connection, change: RowChange) -> None:
        table = self.schema.table(change.relation)
        t = self._tables[change.relation]
        row = dict(change.row or {})
        table.check_columns(list(row))
        if change.op == "insert":
            missing = [c for c in table.primary_key if row.get(c) is None]
            if missing:
                raise InvalidRequest(f"insert into {table.name!r} lacks key column(s) {', '.join(missing)}")
            try:
                with conn.begin_nested():
                    conn.execute(t.insert().values(row))
            except sa.exc.IntegrityError:
                key = _key_of(table, row)
                raise DuplicateKey(f"{table.name!r} already has a row with key {key}", table.name, key) from None
            return
        key = _key_tuple(table, change.key)
        where = _key_match(t, table, key)
        if change.op == "update":
            if not row:
                raise InvalidRequest(f"update of {table.name!r} sets no column")
            try:
                with conn.begin_nested():
                    count = conn.execute(t.update().where(*where).values(row)).rowcount
            except sa.exc.IntegrityError:
                raise InvalidRequest(f"the new key of {table.name!r} row {key} is taken") from None
        elif change.op == "delete":
            count = conn.execute(t.delete().where(*where)).rowcount
        else:
            raise InvalidRequest(f"unknown operation {change.op!r}")
        if count == 0:
            raise InvalidRequest(f"{table.name!r} has no row with key {key}")

    @staticmethod
    def _set_meta(conn: sa.Connection, meta: Mapping[str, str]) -> None:
        for key, value in meta.items():
            conn.execute(sa.text(f"INSERT OR REPLACE INTO {META} VALUES (:key, :value)"), {"key": key, "value": value})

    def close(self) -> None:
        self.engine.dispose()


def _key_tuple(table: TableSchema, key: Mapping[str, Any] | None) -> tuple[Any, ...]:
    if key is None or set(key) != set(table.primary_key):
        raise InvalidRequest(f"a key of {table.name!r} names exactly its primary key columns {list(table.primary_key)}")
    return tuple(key[c] for c in table.primary_key)


def _key_of(table: TableSchema, row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(c) for c in table.primary_key)


def _key_match(t: sa.TableClause, table: TableSchema, key: Sequence[Any]) -> list[sa.ColumnElement[bool]]:
    return [t.c[c] == v for c, v in zip(table.primary_key, key)]
