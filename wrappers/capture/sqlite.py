"""Trigger capture for SQLite sources.

AFTER INSERT/UPDATE/DELETE triggers copy every changed row as JSON into the outbox within the
writer's own transaction, so the outbox holds exactly the committed changes. SQLite runs one
writer at a time, hence AUTOINCREMENT ids grow in commit order and a reader never sees half a
transaction. The source is switched to WAL mode so that the wrapper's long snapshot reads
never block the application's writers.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import QueuePool

from wrappers.capture.base import OUTBOX

# read_outbox: id order is commit order here (one writer at a time).
from wrappers.capture.base import read_json_outbox as read_outbox  # noqa: F401  (the capture interface)
from wrappers.capture.common import delete_outbox_ids  # noqa: F401  (the capture interface; safe for any outbox)
from wrappers.errors import WrapperError, masked_url

TRIGGER_PREFIX = "_pvm_"
OUTBOX_IDS_IN_COMMIT_ORDER = True  # one writer at a time
# wrappers.standing_snapshot: none. In WAL mode, snapshots that overlap without a gap keep the
# WAL from ever being reset (checkpoint starvation): it would grow for as long as writes go on.
SNAPSHOTS_MAY_STAND = False
BUSY_TIMEOUT_S = 10.0
# SQLite before 3.48 allows 127 function arguments: json_object takes at most 63 columns,
# wider rows are merged from several objects.
_COLUMNS_PER_JSON_OBJECT = 60
_OPS = {"I": "INSERT", "U": "UPDATE", "D": "DELETE"}
_LARGEST_DOUBLE = "1.7976931348623157e308"


# -- connections -----------------------------------------------------------------------
def database_path(url: sa.URL) -> str:
    """The file behind a ``sqlite:///PATH`` (or ``sqlite:///file:PATH?uri=true``) URL."""
    database = url.database or ""
    if url.query.get("uri") == "true" and database.startswith("file:"):
        database = database[len("file:") :]
    if database in ("", ":memory:"):
        raise WrapperError("a wrapped SQLite source must be a database file, not an in-memory database")
    return database


def open_engine(url: str) -> sa.Engine:
    """An engine on an existing SQLite file whose transactions are real snapshot transactions.

    Python's sqlite3 module defers BEGIN until the first write, so a plain SELECT would run
    outside any transaction; the events below hand transaction control back to SQLAlchemy
    (``BEGIN`` at the start of each transaction), which makes a read transaction pin one
    snapshot until it ends.
    """
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise WrapperError(f"not a database URL: {masked_url(url)!r}") from exc
    if parsed.get_backend_name() != "sqlite":
        raise WrapperError(f"not a SQLite URL: {masked_url(url)!r}")
    path = database_path(parsed)
    if not os.path.isfile(path):
        raise WrapperError(f"no such database file: {path}")
    # Connections are kept for reuse (opening one costs more than a subquery's join), with
    # no bound: waiting subqueries each hold a snapshot connection, which a bounded pool
    # could run out of. Returning one rolls its transaction back, TEMP tables included.
    # Each connection is used by one thread at a time, but not always the one that opened it.
    engine = sa.create_engine(
        parsed,
        poolclass=QueuePool,
        pool_size=8,
        max_overflow=-1,
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_S},
    )

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        # contract.expr evaluates LIKE case-sensitively; the source must agree.
        dbapi_connection.execute("PRAGMA case_sensitive_like = ON")
        dbapi_connection.execute("PRAGMA temp_store = MEMORY")

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


def begin_snapshot(engine: sa.Engine) -> sa.Connection:
    """A connection in a read transaction: in WAL mode the first read fixes its snapshot."""
    conn = engine.connect()
    try:
        conn.exec_driver_sql("SELECT 1 FROM sqlite_master LIMIT 1").all()
    except BaseException:
        conn.close()
        raise
    return conn


# -- install / uninstall -----------------------------------------------------------------
def _quote(engine: sa.Engine, name: str) -> str:
    return engine.dialect.identifier_preparer.quote_identifier(name)


def _text_literal(value: str) -> str:
    """An SQL string literal for a name read from the database's own catalog."""
    return "'" + value.replace("'", "''") + "'"


def _json_row(engine: sa.Engine, ref: str, columns: Sequence[str]) -> str:
    """``json_object`` of the trigger row ``ref`` (NEW or OLD) over ``columns``.

    BLOB values become hex text: JSON cannot hold them, and a trigger error would make the
    application's own write fail. A finite REAL is written with 17 significant digits, which
    read back as the same double (``json_object`` writes 15, and 0.1 + 0.2 would arrive as
    0.3 while a subquery answers 0.30000000000000004); an infinite one as ``json_object``
    writes it (``Inf`` before SQLite 3.42, read by ``base.row_json``).
    """

    def value(column: str) -> str:
        v = f"{ref}.{_quote(engine, column)}"
        exact = f"CASE WHEN abs({v}) <= {_LARGEST_DOUBLE} THEN json(printf('%!.17g', {v})) ELSE {v} END"
        return f"CASE typeof({v}) WHEN 'blob' THEN hex({v}) WHEN 'real' THEN {exact} ELSE {v} END"

    objects = [
        "json_object("
        + ", ".join(f"{_text_literal(c)}, {value(c)}" for c in columns[i : i + _COLUMNS_PER_JSON_OBJECT])
        + ")"
        for i in range(0, len(columns), _COLUMNS_PER_JSON_OBJECT)
    ]
    expr = objects[0]
    for more in objects[1:]:
        expr = f"json_patch({expr}, {more})"  # drops null members; readers treat absent as NULL
    return expr


def trigger_name(table: str, op: str) -> str:
    return f"{TRIGGER_PREFIX}{table}_{_OPS[op].lower()}"


def _trigger_sql(engine: sa.Engine, table: str, op: str, columns: Sequence[str]) -> str:
    old = _json_row(engine, "OLD", columns) if op in "UD" else "NULL"
    new = _json_row(engine, "NEW", columns) if op in "IU" else "NULL"
    return (
        f"CREATE TRIGGER {_quote(engine, trigger_name(table, op))} AFTER {_OPS[op]} ON {_quote(engine, table)} "
        f"FOR EACH ROW BEGIN INSERT INTO {OUTBOX} (relation, op, old, new) "
        f"VALUES ({_text_literal(table)}, '{op}', {old}, {new}); END"
    )


def _check_tables(engine: sa.Engine, tables: Sequence[str]) -> dict[str, list[str]]:
    """The column names of each table; WrapperError naming the tables that do not exist."""
    if not tables:
        raise WrapperError("no tables to capture")
    inspector = sa.inspect(engine)
    existing = set(inspector.get_table_names())
    reserved = [t for t in tables if t.startswith(TRIGGER_PREFIX)]
    if reserved:
        raise WrapperError(f"cannot capture the wrapper's own tables: {', '.join(reserved)}")
    missing = [t for t in tables if t not in existing]
    if missing:
        path = database_path(engine.url)
        raise WrapperError(f"no such table in {path}: {', '.join(missing)}")
    return {t: [c["name"] for c in inspector.get_columns(t)] for t in tables}


def _reason(exc: Exception) -> str:
    return str(exc.orig) if isinstance(exc, sa.exc.DBAPIError) else str(exc)


def install(engine: sa.Engine, tables: Sequence[str]) -> None:
    """Create the outbox and (re)create the capture triggers of ``tables``; idempotent.

    Triggers are recreated rather than skipped so that a re-install after a schema change
    captures the current columns.
    """
    path = database_path(engine.url)
    try:
        columns = _check_tables(engine, tables)
        with engine.connect() as conn:
            # journal_mode cannot change inside a transaction: use the driver connection.
            driver_connection = conn.connection.driver_connection
            assert driver_connection is not None  # a checked-out connection has one
            mode = driver_connection.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise WrapperError(f"cannot switch {path} to WAL mode (journal mode is {mode})")
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {OUTBOX} (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                "relation TEXT NOT NULL, op TEXT NOT NULL, old TEXT, new TEXT)"
            )
            for table, cols in columns.items():
                for op in _OPS:
                    conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {_quote(engine, trigger_name(table, op))}")
                    conn.exec_driver_sql(_trigger_sql(engine, table, op, cols))
    except (sa.exc.DBAPIError, sqlite3.Error) as exc:
        raise WrapperError(f"cannot install capture in {path}: {_reason(exc)}") from exc


def uninstall(engine: sa.Engine, tables: Sequence[str]) -> None:
    """Drop the triggers of ``tables``; drop the outbox when no captured table is left."""
    path = database_path(engine.url)
    try:
        with engine.begin() as conn:
            for table in tables:
                for op in _OPS:
                    conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {_quote(engine, trigger_name(table, op))}")
            remaining: int = conn.execute(
                sa.text("SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND substr(name, 1, :n) = :prefix"),
                {"n": len(TRIGGER_PREFIX), "prefix": TRIGGER_PREFIX},
            ).scalar_one()
            if not remaining:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {OUTBOX}")
    except sa.exc.DBAPIError as exc:
        raise WrapperError(f"cannot uninstall capture from {path}: {_reason(exc)}") from exc


# -- the outbox --------------------------------------------------------------------------


def delete_outbox(engine: sa.Engine, through: int) -> None:
    """Delete the outbox rows with id <= ``through``."""
    with engine.begin() as conn:
        conn.execute(sa.text(f"DELETE FROM {OUTBOX} WHERE id <= :through"), {"through": through})


def outbox_high_water(engine: sa.Engine) -> int:
    """The highest id the outbox ever assigned; AUTOINCREMENT never reuses ids, but a dropped
    and re-created outbox starts again from 1."""
    with engine.connect() as conn:
        value = conn.execute(
            sa.text("SELECT seq FROM sqlite_sequence WHERE name = :name"), {"name": OUTBOX}
        ).scalar_one_or_none()
    return int(value or 0)
