"""Trigger capture for MariaDB and MySQL sources (InnoDB tables, PyMySQL).

Three ``AFTER`` row triggers per captured table write every changed row as ``JSON_OBJECT``
into the outbox ``_pvm_outbox`` of the URL's database, inside the writer's transaction, so
only committed changes become visible. ``CREATE OR REPLACE TRIGGER`` swaps a trigger in one
step: re-installing never leaves a window in which a write goes uncaptured.

MariaDB does not expose the writing transaction's id to a trigger reliably: the only
source, ``information_schema.INNODB_TRX``, is a cache refreshed at most every 100 ms, so a
trigger reading it sees a previous transaction's id or none at all (and pays ~25 % of a
small write for it); a session variable cannot tell where one transaction ends. So outbox
rows carry no transaction id here. Updates still hold whole transactions: a snapshot read
only ever shows whole committed transactions, and all rows of one read form one update,
however large (one larger than a message is shipped in parts of one seq: ``wrappers.shipper``).
``TRUNCATE`` fires no triggers in MariaDB: truncating a captured table is not captured.

AUTO_INCREMENT ids are not commit order (``OUTBOX_IDS_IN_COMMIT_ORDER = False``), see
``base``. Snapshots are ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` at REPEATABLE READ:
the read view exists from that statement on, and a TEMPORARY table written in it (the
subquery keys) neither commits nor changes it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import sqlalchemy as sa

from wrappers.capture.base import OUTBOX

# read_outbox: in id order. Without transaction ids a read is one update, whose order only
# has to respect write-write dependencies, which id order does.
from wrappers.capture.base import read_json_outbox as read_outbox  # noqa: F401  (the capture interface)
from wrappers.capture.common import (
    RESERVED_PREFIX,
    check_tables,
    delete_outbox,  # noqa: F401  (this dialect's part of the capture interface)
    delete_outbox_ids,  # noqa: F401  (this dialect's part of the capture interface)
    open_server_engine,
    reason,
    shown,
)
from wrappers.errors import WrapperError, masked_url

OUTBOX_IDS_IN_COMMIT_ORDER = False
# wrappers.standing_snapshot: a consistent snapshot held a second holds back InnoDB's purge that long
SNAPSHOTS_MAY_STAND = True
_OPS = {"I": "INSERT", "U": "UPDATE", "D": "DELETE"}
_MAX_NAME = 64
# MariaDB error codes that mean "not allowed" rather than "broken".
_PRIVILEGE_ERRORS = {1044, 1142, 1227, 1419}


def open_engine(url: str) -> sa.Engine:
    """An engine on ``url`` (``mysql://``/``mariadb://`` mean PyMySQL, utf8mb4), checked by connecting."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise WrapperError(f"not a database URL: {masked_url(url)!r}") from exc
    if parsed.get_backend_name() not in ("mysql", "mariadb"):
        raise WrapperError(f"not a MariaDB/MySQL URL: {shown(parsed)}")
    if "+" not in parsed.drivername:
        parsed = parsed.set(drivername=f"{parsed.drivername}+pymysql")
    if not parsed.database:
        raise WrapperError(f"{shown(parsed)} names no database: add /DATABASE to the URL")
    if "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    return open_server_engine(parsed)


def begin_snapshot(engine: sa.Engine) -> sa.Connection:
    """A connection in a REPEATABLE READ transaction with its consistent snapshot taken."""
    conn = engine.connect()
    try:
        conn.execution_options(isolation_level="REPEATABLE READ")
        conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
    except BaseException:
        conn.close()
        raise
    return conn


# -- install / uninstall -----------------------------------------------------------------
def trigger_name(table: str, op: str) -> str:
    """``_pvm_<table>_<insert|update|delete>``, hashed when that exceeds MariaDB's 64 characters."""
    suffix = f"_{_OPS[op].lower()}"
    name = f"{RESERVED_PREFIX}{table}{suffix}"
    if len(name) > _MAX_NAME:
        name = f"{RESERVED_PREFIX}{hashlib.sha1(table.encode()).hexdigest()[:24]}{suffix}"
    return name


def _text_literal(value: str) -> str:
    """A string literal for a name read from the database's own catalog (default sql_mode:
    backslash is an escape character)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _json_row(engine: sa.Engine, ref: str, columns: Sequence[str]) -> str:
    q = engine.dialect.identifier_preparer.quote_identifier
    return "JSON_OBJECT(" + ", ".join(f"{_text_literal(c)}, {ref}.{q(c)}" for c in columns) + ")"


def _trigger_sql(engine: sa.Engine, table: str, op: str, columns: Sequence[str]) -> str:
    q = engine.dialect.identifier_preparer.quote_identifier
    old = _json_row(engine, "OLD", columns) if op in "UD" else "NULL"
    new = _json_row(engine, "NEW", columns) if op in "IU" else "NULL"
    return (
        f"CREATE OR REPLACE TRIGGER {q(trigger_name(table, op))} AFTER {_OPS[op]} ON {q(table)} FOR EACH ROW "
        f"INSERT INTO {q(OUTBOX)} (relation, op, old, new) VALUES ({_text_literal(table)}, '{op}', {old}, {new})"
    )


def _raise_install_error(engine: sa.Engine, exc: sa.exc.DBAPIError) -> None:
    code = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
    hint = ""
    if code in _PRIVILEGE_ERRORS:
        hint = (
            " (the wrapper's user needs CREATE and TRIGGER on the database, and SUPER or "
            "log_bin_trust_function_creators=1 when binary logging is on)"
        )
    raise WrapperError(f"cannot install capture in {shown(engine.url)}: {reason(exc)}{hint}") from exc


def check_innodb(conn: sa.Connection, tables: Sequence[str], method: str) -> None:
    """WrapperError naming the tables that are not InnoDB: only transactional tables have
    changes that commit, or roll back, with their transaction."""
    engines: dict[str, str] = dict(
        conn.execute(
            sa.text(
                "SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN :tables"
            ).bindparams(sa.bindparam("tables", expanding=True)),
            {"tables": list(tables)},
        ).all()
    )
    not_innodb = [f"{t} ({e})" for t, e in engines.items() if str(e).upper() != "INNODB"]
    if not_innodb:
        raise WrapperError(f"{method} capture needs transactional (InnoDB) tables: {', '.join(not_innodb)}")


def install(engine: sa.Engine, tables: Sequence[str]) -> None:
    """Create the outbox and (re)place the capture triggers of ``tables``; idempotent."""
    checked = check_tables(engine, tables)
    try:
        with engine.connect() as conn:
            check_innodb(conn, [t.name for t in checked], "trigger")
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {OUTBOX} (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, "
                "relation VARCHAR(64) NOT NULL, op CHAR(1) NOT NULL, "
                "old LONGTEXT NULL, new LONGTEXT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            )
            for table in checked:
                for op in _OPS:
                    conn.exec_driver_sql(_trigger_sql(engine, table.name, op, table.columns))
    except sa.exc.DBAPIError as exc:
        _raise_install_error(engine, exc)


def uninstall(engine: sa.Engine, tables: Sequence[str]) -> None:
    """Drop the triggers of ``tables``; drop the outbox when no captured table is left."""
    q = engine.dialect.identifier_preparer.quote_identifier
    try:
        with engine.connect() as conn:
            for table in tables:
                for op in _OPS:
                    conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {q(trigger_name(table, op))}")
            remaining: int = conn.execute(
                sa.text(
                    "SELECT count(*) FROM information_schema.TRIGGERS "
                    "WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE <> :outbox AND "
                    "LEFT(TRIGGER_NAME, :n) = :prefix"
                ),
                {"outbox": OUTBOX, "n": len(RESERVED_PREFIX), "prefix": RESERVED_PREFIX},
            ).scalar_one()
            if not remaining:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {OUTBOX}")
    except sa.exc.DBAPIError as exc:
        raise WrapperError(f"cannot uninstall capture from {shown(engine.url)}: {reason(exc)}") from exc


# -- the outbox --------------------------------------------------------------------------


def outbox_high_water(engine: sa.Engine) -> int:
    """The last AUTO_INCREMENT value the outbox handed out (0 for a fresh outbox)."""
    with engine.connect() as conn:
        value = conn.execute(
            sa.text(
                "SELECT AUTO_INCREMENT FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :outbox"
            ),
            {"outbox": OUTBOX},
        ).scalar_one_or_none()
    return max(int(value or 1) - 1, 0)
