"""What the capture modules of client-server databases (PostgreSQL, MariaDB) share: opening
an engine with clear connection errors, checking the tables an administrator picked, and
deleting outbox rows by id."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from wrappers.capture.base import OUTBOX
from wrappers.capture.types import check_shippable
from wrappers.errors import WrapperError

RESERVED_PREFIX = "_pvm_"
"""Names of the wrapper's own objects in a source; such tables are never captured."""


def reason(exc: BaseException) -> str:
    """The driver's message, without SQLAlchemy's statement dump and background link."""
    text = str(exc.orig) if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None else str(exc)
    return " ".join(text.split())


def shown(url: sa.URL) -> str:
    return url.render_as_string(hide_password=True)


IDLE_CONNECTIONS = 8
"""The most idle connections a server source's pool keeps (``open_server_engine``)."""


def open_server_engine(url: sa.URL, **options: object) -> sa.Engine:
    """An engine on ``url`` after one successful connection (WrapperError otherwise).

    Subquery snapshots each hold a connection while they wait for their turn, so the pool
    opens as many as needed, and keeps up to ``IDLE_CONNECTIONS`` of them for the next
    snapshots: under a steady write load the poller, the outbox deletes and a few subqueries
    hold one each at once, and a connection opened per snapshot cost a TCP and TLS handshake
    and, with PyMySQL, a new TLS context loading the CA store (a sixth of a busy MariaDB
    wrapper's time, profiled).
    """
    engine = sa.create_engine(url, pool_size=IDLE_CONNECTIONS, max_overflow=-1, pool_pre_ping=True, **options)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.DBAPIError as exc:
        engine.dispose()
        raise WrapperError(f"cannot connect to {shown(url)}: {reason(exc)}") from exc
    return engine


@dataclass(frozen=True)
class CheckedTable:
    name: str
    columns: tuple[str, ...]
    primary_key: tuple[str, ...]


def check_tables(
    engine: sa.Engine,
    tables: Sequence[str],
    *,
    need_primary_key: bool = False,
    not_shipped: Sequence[str] = (),
    check_types: bool = True,
) -> list[CheckedTable]:
    """The picked tables of the connection's default schema, or a WrapperError naming what
    is wrong: no table, a reserved name, a table that does not exist, a missing primary key
    (when the capture method needs one), a column type that cannot be shipped (unless
    ``check_types`` is off: SQLite columns are typed value by value). Columns in
    ``not_shipped`` (timestamp capture's own columns) are exempt from the type check."""
    if not tables:
        raise WrapperError("no tables to capture")
    reserved = [t for t in tables if t.startswith(RESERVED_PREFIX) or t == OUTBOX]
    if reserved:
        raise WrapperError(f"cannot capture the wrapper's own tables: {', '.join(reserved)}")
    inspector = sa.inspect(engine)
    existing = set(inspector.get_table_names())
    missing = [t for t in tables if t not in existing]
    if missing:
        schema = inspector.default_schema_name
        raise WrapperError(f"no such table in {shown(engine.url)} (schema {schema}): {', '.join(missing)}")
    out = []
    for table in tables:
        columns = inspector.get_columns(table)
        primary_key = tuple(inspector.get_pk_constraint(table).get("constrained_columns") or ())
        if need_primary_key and not primary_key:
            raise WrapperError(f"table {table!r} has no primary key, which this capture method needs")
        if check_types:
            check_shippable(table, [(c["name"], str(c["type"])) for c in columns if c["name"] not in not_shipped])
        out.append(CheckedTable(table, tuple(c["name"] for c in columns), primary_key))
    return out


def chunked(ids: Sequence[int], size: int = 1000) -> list[Sequence[int]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


_OUTBOX_IDS = sa.table(OUTBOX, sa.column("id"))


def delete_outbox(engine: sa.Engine, through: int) -> None:
    """Refused: these servers' outbox ids are not commit order, so a row below ``through``
    may not be captured yet; the wrapper deletes their rows by id (``delete_outbox_ids``)."""
    raise WrapperError("outbox ids are not in commit order on this server: delete acknowledged rows by id")


def delete_outbox_ids(engine: sa.Engine, ids: Sequence[int]) -> None:
    """Delete exactly the outbox rows ``ids`` (servers whose outbox ids are not commit order)."""
    with engine.begin() as conn:
        for part in chunked(ids):
            conn.execute(_OUTBOX_IDS.delete().where(_OUTBOX_IDS.c.id.in_(part)))
