"""Trigger capture for PostgreSQL sources (13 or newer, psycopg 3).

One row trigger per captured table copies every changed row, ``to_jsonb(OLD/NEW)``, into the
outbox ``_pvm_outbox`` of the table's schema (the connection's current schema), in the
writer's own transaction, so only committed changes ever become visible and rolled-back
work never does. Each outbox row carries the writer's transaction id
(``pg_current_xact_id()``), so the wrapper can keep every source transaction inside one
update. A statement trigger turns ``TRUNCATE`` into deletes of every row it removes.

The trigger functions are ``SECURITY DEFINER`` with a fixed ``search_path``: applications
writing as other roles need no privilege on the outbox, and cannot redirect the insert.

Outbox ids come from a sequence, which is *not* commit order (``OUTBOX_IDS_IN_COMMIT_ORDER
= False``); the wrapper reads every row visible in a REPEATABLE READ snapshot and skips the
ids it has already captured (see ``base``). The snapshot is a real one: it is fixed by the
first statement and a TEMP table written inside it (the subquery keys) does not end it.
"""

from __future__ import annotations

import json
from collections.abc import Container, Generator, Sequence
from typing import Any

import sqlalchemy as sa

from wrappers.capture.base import FETCH_ROWS, OUTBOX, Op, OutboxRow, skip_clause
from wrappers.capture.common import (
    check_tables,
    delete_outbox,  # noqa: F401  (this dialect's part of the capture interface)
    delete_outbox_ids,  # noqa: F401  (this dialect's part of the capture interface)
    open_server_engine,
    reason,
    shown,
)
from wrappers.errors import WrapperError, masked_url

OUTBOX_IDS_IN_COMMIT_ORDER = False
# wrappers.standing_snapshot: a REPEATABLE READ snapshot held a second holds back vacuum that long
SNAPSHOTS_MAY_STAND = True
ROW_FUNCTION = "_pvm_capture"
TRUNCATE_FUNCTION = "_pvm_capture_truncate"
_INSUFFICIENT_PRIVILEGE = "42501"


def open_engine(url: str) -> sa.Engine:
    """An engine on ``url`` (``postgresql://`` means psycopg 3), checked by connecting once."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise WrapperError(f"not a database URL: {masked_url(url)!r}") from exc
    if parsed.get_backend_name() != "postgresql":
        raise WrapperError(f"not a PostgreSQL URL: {shown(parsed)}")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    engine = open_server_engine(parsed)
    version = engine.dialect.server_version_info
    assert version is not None  # known from the connection open_server_engine made
    if version < (13,):
        engine.dispose()
        raise WrapperError(f"{shown(parsed)}: trigger capture needs PostgreSQL 13 or newer (pg_current_xact_id)")
    return engine


def begin_snapshot(engine: sa.Engine) -> sa.Connection:
    """A connection in a REPEATABLE READ transaction whose snapshot the first statement fixed."""
    conn = engine.connect()
    try:
        conn.execution_options(isolation_level="REPEATABLE READ")
        conn.exec_driver_sql("SELECT 1").all()
    except BaseException:
        conn.close()
        raise
    return conn


# -- install / uninstall -----------------------------------------------------------------
def _current_schema(engine: sa.Engine, inspector: sa.Inspector) -> str:
    """The schema the outbox goes in: ``current_schema()``, NULL when no schema on the
    search path exists."""
    schema = inspector.default_schema_name
    if schema is None:
        raise WrapperError(f"{shown(engine.url)}: no current schema (no schema on the search_path exists)")
    return schema


def _names(engine: sa.Engine, schema: str) -> tuple[str, str, str]:
    """The quoted, schema-qualified outbox and trigger functions."""
    q = engine.dialect.identifier_preparer.quote_identifier
    return tuple(f"{q(schema)}.{q(name)}" for name in (OUTBOX, ROW_FUNCTION, TRUNCATE_FUNCTION))  # type: ignore[return-value]


def _row_function_sql(function: str, outbox: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $pvm$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {outbox} (relation, op, new) VALUES (TG_TABLE_NAME, 'I', to_jsonb(NEW));
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO {outbox} (relation, op, old, new) VALUES (TG_TABLE_NAME, 'U', to_jsonb(OLD), to_jsonb(NEW));
    ELSE
        INSERT INTO {outbox} (relation, op, old) VALUES (TG_TABLE_NAME, 'D', to_jsonb(OLD));
    END IF;
    RETURN NULL;
END $pvm$"""


def _truncate_function_sql(function: str) -> str:
    # %% is psycopg's escape for the % of format() placeholders.
    return f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $pvm$
BEGIN
    EXECUTE format('INSERT INTO %%I.%%I (relation, op, old) SELECT $1, ''D'', to_jsonb(t) FROM %%s AS t',
                   TG_TABLE_SCHEMA, '{OUTBOX}', TG_RELID::regclass) USING TG_TABLE_NAME;
    RETURN NULL;
END $pvm$"""


def install(engine: sa.Engine, tables: Sequence[str]) -> None:
    """Create the outbox, the trigger functions and the triggers of ``tables``; idempotent,
    and atomic (PostgreSQL DDL is transactional), so writers never see a table half-captured."""
    checked = check_tables(engine, tables)
    schema = _current_schema(engine, sa.inspect(engine))
    outbox, row_function, truncate_function = _names(engine, schema)
    if "$pvm$" in outbox:
        raise WrapperError(f"schema name {schema!r} cannot hold the outbox")
    q = engine.dialect.identifier_preparer.quote_identifier
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {outbox} (id BIGSERIAL PRIMARY KEY, "
                "txid XID8 NOT NULL DEFAULT pg_current_xact_id(), relation TEXT NOT NULL, "
                "op CHAR(1) NOT NULL, old JSONB, new JSONB)"
            )
            conn.exec_driver_sql(_row_function_sql(row_function, outbox))
            conn.exec_driver_sql(_truncate_function_sql(truncate_function))
            for table in checked:
                target = f"{q(schema)}.{q(table.name)}"
                for trigger in (ROW_FUNCTION, TRUNCATE_FUNCTION):
                    conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {q(trigger)} ON {target}")
                conn.exec_driver_sql(
                    f"CREATE TRIGGER {q(ROW_FUNCTION)} AFTER INSERT OR UPDATE OR DELETE ON {target} "
                    f"FOR EACH ROW EXECUTE FUNCTION {row_function}()"
                )
                conn.exec_driver_sql(
                    f"CREATE TRIGGER {q(TRUNCATE_FUNCTION)} BEFORE TRUNCATE ON {target} "
                    f"FOR EACH STATEMENT EXECUTE FUNCTION {truncate_function}()"
                )
    except sa.exc.DBAPIError as exc:
        hint = ""
        if getattr(exc.orig, "sqlstate", None) == _INSUFFICIENT_PRIVILEGE:
            hint = (
                f" (the wrapper's user needs CREATE on schema {schema!r} and must own the captured tables "
                "or hold the TRIGGER privilege on them)"
            )
        raise WrapperError(f"cannot install capture in {shown(engine.url)}: {reason(exc)}{hint}") from exc


def uninstall(engine: sa.Engine, tables: Sequence[str]) -> None:
    """Drop the triggers of ``tables``; the outbox and functions go once no table uses them."""
    inspector = sa.inspect(engine)
    schema = _current_schema(engine, inspector)
    existing = set(inspector.get_table_names())
    outbox, row_function, truncate_function = _names(engine, schema)
    q = engine.dialect.identifier_preparer.quote_identifier
    try:
        with engine.begin() as conn:
            for table in tables:
                if table in existing:
                    for trigger in (ROW_FUNCTION, TRUNCATE_FUNCTION):
                        conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {q(trigger)} ON {q(schema)}.{q(table)}")
            remaining: int = conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_trigger t JOIN pg_proc p ON t.tgfoid = p.oid "
                    "JOIN pg_namespace n ON p.pronamespace = n.oid "
                    "WHERE n.nspname = :schema AND p.proname IN (:row, :truncate)"
                ),
                {"schema": schema, "row": ROW_FUNCTION, "truncate": TRUNCATE_FUNCTION},
            ).scalar_one()
            if not remaining:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {outbox}")
                conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {row_function}()")
                conn.exec_driver_sql(f"DROP FUNCTION IF EXISTS {truncate_function}()")
    except sa.exc.DBAPIError as exc:
        raise WrapperError(f"cannot uninstall capture from {shown(engine.url)}: {reason(exc)}") from exc


# -- the outbox --------------------------------------------------------------------------


def read_outbox(conn: sa.Connection, after: int, skip: Container[int] = ()) -> Generator[OutboxRow]:
    """The outbox rows visible in ``conn``'s snapshot with id > ``after`` and not in ``skip``,
    in transaction order, made as they are taken from a server-side cursor.

    Transaction order: rows grouped by transaction, each group in id order, the groups in
    the order of their largest ids. Ids are taken when a row is written: if transaction B
    overwrote a row that A wrote, B could only do so after A committed, so B's rows got
    larger ids than every row of A, and ordering by the largest id respects every
    write-write dependency, as commit order does. The server sorts (on disk for a large
    read). Skipping keeps that order among the rows left: a transaction's rows are captured
    all at once (one update holds them) or not at all. The values are read as
    text and decoded here, so that skipped rows are not decoded (psycopg decodes a
    ``jsonb`` column with ``json.loads`` too)."""
    skipped, params = skip_clause(skip)  # whole transactions: the others' largest ids stay
    result: sa.CursorResult[int, str, str, Op, str | None, str | None] = conn.execute(
        sa.text(
            f"SELECT id, txid::text, relation, op, old::text, new::text FROM {OUTBOX} WHERE id > :after{skipped} "
            "ORDER BY max(id) OVER (PARTITION BY txid), id"
        ),
        {"after": after, **params},
        execution_options={"yield_per": FETCH_ROWS},
    )
    with result:
        for id, txid, relation, op, old, new in result:
            if id not in skip:
                yield OutboxRow(id, relation, op, _values(old), _values(new), txid)


def _values(text: str | None) -> dict[str, Any] | None:
    return json.loads(text) if text is not None else None


def outbox_high_water(engine: sa.Engine) -> int:
    """The last value the outbox's sequence handed out (0 for a fresh outbox)."""
    with engine.connect() as conn:
        value: int | None = conn.execute(
            sa.text("SELECT pg_sequence_last_value(pg_get_serial_sequence(:outbox, 'id')::regclass)"),
            {"outbox": OUTBOX},
        ).scalar_one()
    return int(value or 0)
