"""Log capture of PostgreSQL (13 or newer): a logical replication slot read with ``pgoutput``.

``install`` creates a publication of the captured tables and a logical replication slot of
the same name (``--slot``, default ``pvm_<database>_<schema>``), and sets the tables'
``REPLICA IDENTITY FULL`` so that updates and deletes carry the whole old row (the manager
needs it; with the default identity the log holds the key only). ``uninstall`` removes the
tables from the publication and, once none is left, drops the publication and the slot,
so that the server releases the WAL the slot retains.

The wrapper streams the slot over a replication connection of its own (``pg_stream``,
the streaming replication protocol through psycopg's libpq layer) from its first read on,
in a thread (``log_stream.LogStream``), and decodes the ``pgoutput`` messages itself
(``pgoutput``). The stream tells the wrapper about a commit about a millisecond after it,
which wakes the ship loop; a read decodes nothing and opens no connection: it takes the
transactions the stream delivered up to its snapshot's position. The slot's confirmed
position moves only by the stream's status updates, which report the position whose
updates the manager acknowledged and never more, so a crash anywhere re-reads what is not
acknowledged and the wrapper's state (``captured_through``, an LSN) skips what it already
turned into updates. (Earlier versions peeked the slot with
``pg_logical_slot_peek_binary_changes`` on every read, which decoded the log again from the
slot's restart position each time, and learned of a commit only at the next poll.)

**The handshake** (``log`` module): a read runs inside a REPEATABLE READ snapshot S and
learns S's transaction snapshot (``pg_current_snapshot()``) and the WAL insert position L
read after S was fixed. Every transaction S sees wrote its commit record before S was
taken, so before L; every transaction committing at or after L is invisible to S. The server
decodes flushed WAL only: when the WAL is not flushed through L, a subquery's read has it
flushed by committing a logical message of its own (``_flush_through``), and waits until
the stream has passed L. Whether S sees a streamed transaction follows from its xid and
S's ``xmin:xmax:xip``. A poll neither flushes nor waits for long: it waits up to
``POLL_WAIT_SECONDS`` for the stream to pass the flushed WAL, and records a position
beyond its last transaction only where the stream had passed L.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from contract.value_fit import source_family
from wrappers.capture import pgoutput
from wrappers.capture.base import OutboxRow
from wrappers.capture.common import check_tables, reason, shown
from wrappers.capture.log import LogRead, LogTransaction, visible_prefix
from wrappers.capture.log_rows import RowsBuilder
from wrappers.capture.log_stream import LogStream, Streamed
from wrappers.capture.pg_stream import PgReplication
from wrappers.capture.types import wire_value
from wrappers.errors import WrapperError
from wrappers.schema import SourceSchema

log = logging.getLogger(__name__)

SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")
_INSUFFICIENT_PRIVILEGE = "42501"
CREATED_WAIT_SECONDS = 60.0
IN_USE_WAIT_SECONDS = 5.0
STATUS_EVERY_SECONDS = 1.0
STREAM_NUDGE_SECONDS = 0.2
"""How long an exact read waits for the stream before it writes WAL past its position."""
STREAM_WAIT_SECONDS = 10.0
"""How long an exact read waits for the stream in all (then it fails: the subquery is retried)."""
POLL_WAIT_SECONDS = 0.1
"""How long a poll waits for the stream to pass the flushed WAL (then it takes what arrived)."""
# A transaction that writes WAL (a logical message no table holds) and so flushes it when it commits.
FLUSH_TRANSACTION = (
    "BEGIN; SET LOCAL synchronous_commit = local; SELECT pg_logical_emit_message(true, 'pvm', ''); COMMIT"
)

# What a read learns first, in one statement: the snapshot, then the WAL insert position read
# after it, and the flushed position; and, for the rest of the read transaction, the text
# form of the values the peek decodes (ISO dates, floats that read back exactly).
READ_POSITIONS = (
    "SELECT pg_current_snapshot()::text, (pg_current_wal_insert_lsn() - '0/0')::bigint, "
    "(pg_current_wal_flush_lsn() - '0/0')::bigint, "
    "set_config('datestyle', 'ISO', true), set_config('extra_float_digits', '3', true)"
)


# -- names ---------------------------------------------------------------------------------------
def default_slot(engine: sa.Engine) -> str:
    """``pvm_<database>_<schema>`` in the characters a slot name may hold (63 at most)."""
    with engine.connect() as conn:
        database, schema = conn.exec_driver_sql("SELECT current_database(), current_schema()").one()
    if schema is None:
        raise WrapperError(f"{shown(engine.url)}: no current schema (no schema on the search_path exists)")
    return re.sub(r"[^a-z0-9_]", "_", f"pvm_{database}_{schema}".lower())[:63]


def check_slot_name(name: str) -> str:
    """``name`` if PostgreSQL takes it as a slot (and publication) name.

    >>> check_slot_name("pvm_shop")
    'pvm_shop'
    >>> check_slot_name("Shop-1")
    Traceback (most recent call last):
    ...
    wrappers.errors.WrapperError: invalid slot name 'Shop-1': use 1-63 lower-case letters, digits and '_'
    """
    if not SLOT_NAME.fullmatch(name):
        raise WrapperError(f"invalid slot name {name!r}: use 1-63 lower-case letters, digits and '_'")
    return name


def lsn_text(position: int) -> str:
    """An LSN as PostgreSQL writes it.

    >>> lsn_text(31059616)
    '0/1D9EEA0'
    """
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


# -- checks, install, uninstall -------------------------------------------------------------------
def check_server(engine: sa.Engine) -> None:
    """WrapperError naming the setting to change if the server or the role cannot decode the log."""
    with engine.connect() as conn:
        wal_level: str = conn.exec_driver_sql("SHOW wal_level").scalar_one()
        slots = int(conn.exec_driver_sql("SHOW max_replication_slots").scalar_one())
        senders = int(conn.exec_driver_sql("SHOW max_wal_senders").scalar_one())
        may_replicate: bool = conn.exec_driver_sql(
            "SELECT rolsuper OR rolreplication FROM pg_roles WHERE rolname = current_user"
        ).scalar_one()
        user: str = conn.exec_driver_sql("SELECT current_user").scalar_one()
    if wal_level != "logical":
        raise WrapperError(
            f"{shown(engine.url)}: log capture needs wal_level = logical, the server has {wal_level} "
            "(ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL)"
        )
    if slots < 1:
        raise WrapperError(f"{shown(engine.url)}: log capture needs max_replication_slots of at least 1")
    if senders < 1:
        raise WrapperError(
            f"{shown(engine.url)}: log capture streams the slot: it needs max_wal_senders of at least 1 "
            "(a WAL sender per log-captured source)"
        )
    if not may_replicate:
        raise WrapperError(
            f"{shown(engine.url)}: log capture needs the REPLICATION attribute for role {user!r} "
            f"(ALTER ROLE {user} REPLICATION)"
        )


def _slot(conn: sa.Connection, slot: str) -> dict[str, Any] | None:
    row = (
        conn.execute(
            sa.text(
                "SELECT plugin, database, active_pid, (confirmed_flush_lsn - '0/0')::bigint AS confirmed "
                "FROM pg_replication_slots WHERE slot_name = :slot"
            ),
            {"slot": slot},
        )
        .mappings()
        .one_or_none()
    )
    return dict(row) if row is not None else None


def install(engine: sa.Engine, tables: Sequence[str], slot: str) -> None:
    """Publication, slot and REPLICA IDENTITY FULL for ``tables``; idempotent."""
    check_server(engine)
    checked = check_tables(engine, tables)
    q = engine.dialect.identifier_preparer.quote_identifier
    try:
        with engine.begin() as conn:
            schema: str = conn.exec_driver_sql("SELECT current_schema()").scalar_one()
            for table in checked:
                identity: str = conn.execute(
                    sa.text("SELECT relreplident FROM pg_class WHERE oid = CAST(:t AS regclass)"),
                    {"t": f"{q(schema)}.{q(table.name)}"},
                ).scalar_one()
                if identity != "f":
                    conn.exec_driver_sql(f"ALTER TABLE {q(schema)}.{q(table.name)} REPLICA IDENTITY FULL")
            published = {
                t
                for (t,) in conn.execute(
                    sa.text("SELECT tablename FROM pg_publication_tables WHERE pubname = :p AND schemaname = :s"),
                    {"p": slot, "s": schema},
                )
            }
            exists = conn.execute(sa.text("SELECT 1 FROM pg_publication WHERE pubname = :p"), {"p": slot}).first()
            targets = ", ".join(f"{q(schema)}.{q(t.name)}" for t in checked if t.name not in published)
            if not exists:
                conn.exec_driver_sql(f"CREATE PUBLICATION {q(slot)} FOR TABLE {targets}")
            elif targets:
                conn.exec_driver_sql(f"ALTER PUBLICATION {q(slot)} ADD TABLE {targets}")
    except sa.exc.DBAPIError as exc:
        hint = ""
        if getattr(exc.orig, "sqlstate", None) == _INSUFFICIENT_PRIVILEGE:
            hint = (
                " (the wrapper's user must own the captured tables to set REPLICA IDENTITY FULL and publish "
                "them, and needs CREATE on the database for the publication)"
            )
        raise WrapperError(f"cannot install log capture in {shown(engine.url)}: {reason(exc)}{hint}") from exc
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        database: str = conn.exec_driver_sql("SELECT current_database()").scalar_one()
        existing = _slot(conn, slot)
        if existing is not None:
            if existing["plugin"] != "pgoutput" or existing["database"] != database:
                raise WrapperError(
                    f"replication slot {slot!r} exists for plugin {existing['plugin']} in database "
                    f"{existing['database']}; name another one with --slot"
                )
            return
        try:
            conn.execute(sa.text("SELECT pg_create_logical_replication_slot(:slot, 'pgoutput')"), {"slot": slot})
        except sa.exc.DBAPIError as exc:
            raise WrapperError(f"cannot create replication slot {slot!r}: {reason(exc)}") from exc
        try:
            _wait_for_older_transactions(conn, slot)
        except BaseException:
            conn.execute(sa.text("SELECT pg_drop_replication_slot(:slot)"), {"slot": slot})
            raise


def _wait_for_older_transactions(conn: sa.Connection, slot: str) -> None:
    """Wait until every transaction running when the slot was created has ended.

    The log starts at the slot's consistent point; a transaction whose commit comes before
    it is not in the log, so every snapshot the wrapper answers from must already see it.
    One that committed just before but is still finishing (waiting for a synchronous
    standby, say) would appear later in some snapshot with no update for it.
    """
    xmax = int(conn.exec_driver_sql("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").scalar_one())
    deadline = time.monotonic() + CREATED_WAIT_SECONDS
    while True:
        xmin = int(conn.exec_driver_sql("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").scalar_one())
        if xmin >= xmax:
            return
        if time.monotonic() > deadline:
            raise WrapperError(
                f"transaction {xmin}, running when replication slot {slot!r} was created, has not ended after "
                f"{CREATED_WAIT_SECONDS:.0f} s; install again once it has"
            )
        time.sleep(0.05)


def uninstall(engine: sa.Engine, tables: Sequence[str], slot: str) -> None:
    """Unpublish ``tables``; drop the publication and the slot once none is left (idempotent)."""
    q = engine.dialect.identifier_preparer.quote_identifier
    try:
        with engine.begin() as conn:
            schema: str = conn.exec_driver_sql("SELECT current_schema()").scalar_one()
            published = {
                t
                for (t,) in conn.execute(
                    sa.text("SELECT tablename FROM pg_publication_tables WHERE pubname = :p AND schemaname = :s"),
                    {"p": slot, "s": schema},
                )
            }
            dropped = [t for t in tables if t in published]
            if dropped:
                conn.exec_driver_sql(
                    f"ALTER PUBLICATION {q(slot)} DROP TABLE {', '.join(f'{q(schema)}.{q(t)}' for t in dropped)}"
                )
            remaining: int = conn.execute(
                sa.text("SELECT count(*) FROM pg_publication_tables WHERE pubname = :p"), {"p": slot}
            ).scalar_one()
            if remaining:
                return
            conn.exec_driver_sql(f"DROP PUBLICATION IF EXISTS {q(slot)}")
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            existing = _slot(conn, slot)
            if existing is not None:
                if existing["active_pid"] is not None:
                    raise WrapperError(
                        f"replication slot {slot!r} is in use by process {existing['active_pid']}: "
                        "stop its wrapper first"
                    )
                conn.execute(sa.text("SELECT pg_drop_replication_slot(:slot)"), {"slot": slot})
    except sa.exc.DBAPIError as exc:
        raise WrapperError(f"cannot uninstall log capture from {shown(engine.url)}: {reason(exc)}") from exc


# -- reading -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PgSnapshot:
    """A transaction snapshot, ``xmin:xmax:xip,…`` as ``pg_current_snapshot()`` writes it."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> PgSnapshot:
        """
        >>> PgSnapshot.parse("733:740:734,736").sees(736), PgSnapshot.parse("733:740:734,736").sees(735)
        (False, True)
        """
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))

    def sees(self, xid: int) -> bool:
        """Whether a committed transaction ``xid`` (32 bits, as the log names it) is visible."""
        full = widen(xid, self.xmax)
        return full < self.xmax and full not in self.xip


def widen(xid: int, near: int) -> int:
    """The 64-bit transaction id whose low 32 bits are ``xid``, closest to ``near``.

    >>> widen(5, (1 << 32) + 10), widen(0xFFFFFFF0, (1 << 32) + 10)
    (4294967301, 4294967280)
    """
    full = (near & ~0xFFFFFFFF) | xid
    if full > near + (1 << 31):
        full -= 1 << 32
    elif full < near - (1 << 31):
        full += 1 << 32
    return full


_CONVERTERS: dict[str | None, Callable[[str], Any]] = {
    "integer": int,
    "float": float,
    "numeric": lambda text: wire_value(Decimal(text)),
    "boolean": lambda text: text == "t",
    "text": str,
    "date": str,
    None: str,
}


@dataclass(frozen=True)
class _Table:
    """A captured table as the wrapper ships it, and as its ``pgoutput`` relation must look."""

    name: str
    columns: tuple[pgoutput.Column, ...]
    convert: tuple[Callable[[str], Any], ...]

    def problem(self, relation: pgoutput.Relation) -> str | None:
        """Why changes described by ``relation`` cannot be shipped as rows of this table."""
        if relation.columns != self.columns:
            now = ", ".join(f"{c.name} ({c.type_oid})" for c in relation.columns)
            was = ", ".join(f"{c.name} ({c.type_oid})" for c in self.columns)
            return (
                f"table {self.name!r} changed in the source (columns with type oids now: {now}; captured: {was}); "
                "log capture ships no row of it until capture is installed again and the views are reloaded"
            )
        if relation.replica_identity != "f":
            return (
                f"table {self.name!r} lost REPLICA IDENTITY FULL: its updates and deletes no longer carry the "
                f"old row (ALTER TABLE {self.name} REPLICA IDENTITY FULL; the changes since are lost to the views)"
            )
        return None

    def row(self, values: pgoutput.Tuple | None, old: dict[str, Any] | None) -> dict[str, Any] | None:
        if values is None:
            return None
        out: dict[str, Any] = {}
        for column, convert, value in zip(self.columns, self.convert, values):
            if value == pgoutput.UNCHANGED:
                if old is None:
                    raise WrapperError(f"table {self.name!r}: an unchanged TOAST value without the old row")
                out[column.name] = old[column.name]
            else:
                out[column.name] = None if value is None else convert(value)
        return out


class _Decoder:
    """The ``pgoutput`` messages of one replication stream as the transactions of the
    captured tables (``pg_stream.Decoder``). Relations are described once per stream, before
    their first change and after every change of their definition."""

    def __init__(self, tables: dict[str, _Table]) -> None:
        self._tables = tables
        self._relations: dict[int, pgoutput.Relation] = {}
        self._begin: pgoutput.Begin | None = None
        self._rows = RowsBuilder()
        self._problems: list[str] = []

    def message(self, message: pgoutput.Message) -> Streamed | None:
        if isinstance(message, pgoutput.Begin):
            self._begin, self._rows, self._problems = message, RowsBuilder(), []
        elif isinstance(message, pgoutput.Relation):
            self._relations[message.relid] = message
        elif isinstance(message, pgoutput.Change):
            assert self._begin is not None, "a change outside of a transaction"
            relation = self._relations[message.relid]
            table = self._tables.get(relation.name)
            if table is None:
                return None
            problem = table.problem(relation)
            if problem is not None:
                self._problems.append(problem)
                return None
            old = table.row(message.old, None)
            new = table.row(message.new, old)
            self._rows.append(OutboxRow(len(self._rows), table.name, message.op, old, new, str(self._begin.xid)))  # type: ignore[arg-type]
        elif isinstance(message, pgoutput.Truncate):
            names = [self._relations[r].name for r in message.relids if self._relations[r].name in self._tables]
            if names:
                self._problems.append(
                    f"TRUNCATE of {', '.join(names)} cannot be captured from the log (it holds no rows); "
                    "delete rows with DELETE, or install capture again and reload the views"
                )
        elif isinstance(message, pgoutput.Commit):
            begin, rows, problems = self._begin, self._rows, self._problems
            assert begin is not None, "a commit outside of a transaction"
            self._begin, self._rows, self._problems = None, RowsBuilder(), []
            if len(rows) or problems:
                transaction = LogTransaction(str(begin.xid), message.end_lsn, rows.finish(), message.committed_at)
                return Streamed(transaction, message.commit_lsn, problems[0] if problems else None)
        return None


def replication_conninfo(engine: sa.Engine) -> str:
    """The libpq connection string of ``engine``'s URL, for a logical replication connection."""
    from psycopg import conninfo, pq

    _, options = engine.dialect.create_connect_args(engine.url)
    known = {option.keyword.decode() for option in pq.Conninfo.get_defaults()}
    return conninfo.make_conninfo(**{k: v for k, v in options.items() if k in known}, replication="database")


class PgLog:
    """Reads the slot ``slot`` of ``engine``'s database (``log.LogReader``), streamed
    (``pg_stream``) from the first read on."""

    def __init__(self, engine: sa.Engine, schema: SourceSchema, slot: str) -> None:
        self._engine = engine
        self.slot = slot
        self._tables: dict[str, _Table] = {}
        with engine.connect() as conn:
            for name, table in schema.tables.items():
                oids: dict[str, int] = {
                    str(column): int(str(oid))
                    for column, oid in conn.execute(
                        sa.text(
                            "SELECT attname, atttypid::int8 FROM pg_attribute WHERE attrelid = CAST(:t AS regclass) "
                            "AND attnum > 0 AND NOT attisdropped"
                        ),
                        {"t": engine.dialect.identifier_preparer.quote_identifier(name)},
                    )
                }
                families = [source_family(t) for t in table.types]
                self._tables[name] = _Table(
                    name,
                    tuple(pgoutput.Column(c, int(oids[c])) for c in table.columns),
                    tuple(_CONVERTERS[f] for f in families),
                )
            lacking = [
                name
                for name in schema.tables
                if conn.execute(
                    sa.text("SELECT relreplident FROM pg_class WHERE oid = CAST(:t AS regclass)"),
                    {"t": engine.dialect.identifier_preparer.quote_identifier(name)},
                ).scalar_one()
                != "f"
            ]
            if lacking:
                raise WrapperError(
                    f"table(s) {', '.join(lacking)} lack REPLICA IDENTITY FULL, without which the log holds no old "
                    "rows: run pvm wrapper install --capture log (the tables' owner may: ALTER TABLE … REPLICA IDENTITY FULL)"
                )
            found = _slot(conn, slot)
            deadline = time.monotonic() + IN_USE_WAIT_SECONDS
            while found is not None and found["active_pid"] is not None and time.monotonic() < deadline:
                time.sleep(0.1)  # the WAL sender of a wrapper killed a moment ago ends once it notices
                found = _slot(conn, slot)
            writer_delay_ms = int(
                conn.exec_driver_sql("SELECT setting FROM pg_settings WHERE name = 'wal_writer_delay'").scalar_one()
            )
        self._async_flush_seconds = 3 * writer_delay_ms / 1000 + 0.1
        self._force_flush = True
        self._flusher: sa.Connection | None = None
        if found is None:
            raise WrapperError(f"replication slot {slot!r} does not exist: run pvm wrapper install --capture log")
        if found["active_pid"] is not None:
            raise WrapperError(f"replication slot {slot!r} is in use by another process (PID {found['active_pid']})")
        self._conninfo = replication_conninfo(engine)
        self._confirmed = 0
        self._replication: PgReplication | None = None
        self._stream = LogStream(self._connect, f"{shown(engine.url)} slot {slot}")
        self._status: dict[str, Any] = {"slot": slot}
        self._status_at = 0.0
        self._last_commit: float | None = None

    def _connect(self) -> PgReplication:
        self._replication = PgReplication(
            self._conninfo, self.slot, _Decoder(self._tables), lambda: self._confirmed, shown(self._engine.url)
        )
        return self._replication

    def on_transaction(self, callback: Callable[[], None]) -> None:
        self._stream.on_transaction(callback)

    def close(self) -> None:
        self._stream.close()
        if self._flusher is not None:
            self._flusher.close()
            self._flusher = None

    def check_position(self, captured_through: int) -> None:
        with self._engine.connect() as conn:
            found = _slot(conn, self.slot)
        if found is None:
            raise WrapperError(f"replication slot {self.slot!r} does not exist: run pvm wrapper install --capture log")
        if captured_through and found["confirmed"] > captured_through:
            raise WrapperError(
                f"replication slot {self.slot!r} starts at {lsn_text(found['confirmed'])}, after the position "
                f"{lsn_text(captured_through)} the wrapper state holds: the slot was re-created, and the changes "
                "between are lost; start from a new state directory and reload the views"
            )

    def read(self, conn: sa.Connection, after: int, *, exact: bool) -> LogRead:
        found = conn.exec_driver_sql(READ_POSITIONS).one()  # one round trip
        snapshot_text, upto, flushed = str(found[0]), int(found[1]), int(found[2])
        if exact and flushed < upto:
            flushed = self._flush_through(conn, upto)
        self._stream.ensure(after)
        if exact:
            self._wait_for_stream(conn, min(upto, flushed))
        else:  # the stream is a millisecond or so behind the server, unless it decodes a large transaction
            self._stream.wait_until(min(upto, flushed), POLL_WAIT_SECONDS)
        reached = self._stream.position  # every transaction committing before it has arrived
        snapshot = PgSnapshot.parse(snapshot_text)
        arrived = self._stream.transactions(after)
        streamed = [item for item in arrived if item.commit < upto]
        for item in streamed:
            if item.problem is not None:
                raise WrapperError(f"transaction {item.transaction.xid} at {lsn_text(item.commit)}: {item.problem}")
        transactions = [item.transaction for item in streamed]
        prefix, complete = visible_prefix(transactions, lambda xid: snapshot.sees(int(xid)), exact=exact)
        if complete and reached >= upto:
            through = max(after, upto)  # every commit before upto has arrived
        else:
            through = prefix[-1].end if prefix else after
        if prefix:
            self._last_commit = prefix[-1].committed_at
        self._refresh_status(conn, through)
        return LogRead(prefix, through, more=len(prefix) < len(arrived))

    def _wait_for_stream(self, conn: sa.Connection, position: int) -> None:
        """Wait until the stream has read the log through ``position``, flushed already (an
        exact read's insert position). The server tells how far it has read only once it has
        caught up with the flushed WAL: if nothing more is written, it may stop at the end of
        the last record before ``position`` (``position`` past the header of an empty WAL
        page); a flush transaction writes one beyond it."""
        if self._stream.wait_until(position, STREAM_NUDGE_SECONDS):
            return
        if self._force_flush:
            self._flush_through(conn, position)
        if not self._stream.wait_until(position, STREAM_WAIT_SECONDS):
            raise WrapperError(
                f"replication slot {self.slot!r}: the stream did not reach {lsn_text(position)} within "
                f"{STREAM_WAIT_SECONDS:.0f} s (it stands at {lsn_text(self._stream.position)})"
            )

    def _flush_through(self, conn: sa.Connection, upto: int) -> int:
        """Have the WAL flushed through ``upto``: the flushed position then (past ``upto``
        unless the flush could not be asked for, see below).

        The log can be read only as far as it is flushed. A transaction committing with
        ``synchronous_commit = on`` is flushed before it becomes visible; one with ``off``
        may be visible first, its commit record still unflushed. Waiting for the WAL writer
        to flush it (up to 3 x ``wal_writer_delay``), or for some writer's next commit, made
        a subquery wait most of the time: the WAL of transactions still running lies past
        the last flush whenever writers are busy. So the read commits a transaction of its
        own instead, on another connection: a transactional logical message (which changes
        no table, and which ``pgoutput`` does not pass on) committed with ``synchronous_commit
        = local``, whose commit flushes the WAL through its own commit record, written after
        ``upto`` was read. Where that fails other than by a lost connection (the function's
        EXECUTE right revoked, say), reads wait as before from then on, and say so once in
        the log."""
        if self._force_flush:
            try:
                if self._flusher is None:  # its own connection: the pool's may all be held by snapshots
                    self._flusher = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                self._flusher.exec_driver_sql(FLUSH_TRANSACTION)  # one round trip
            except sa.exc.DBAPIError as exc:
                flusher, self._flusher = self._flusher, None
                if flusher is not None:
                    flusher.invalidate()
                if not exc.connection_invalidated:  # a lost connection: wait this time, connect again the next
                    self._force_flush = False
                    log.warning(
                        "%s: cannot have the WAL flushed (%s); subqueries wait for the WAL writer instead",
                        shown(self._engine.url),
                        reason(exc),
                    )
        return self._wait_for_flush(conn, upto)

    def _wait_for_flush(self, conn: sa.Connection, upto: int) -> int:
        """Wait until the WAL is flushed through ``upto``, or for as long as the WAL writer
        takes to flush asynchronous commits (3 x ``wal_writer_delay``): the flushed WAL
        position then, or sooner once it is past ``upto``. Records of transactions still
        running may stay unflushed for longer; they do not matter."""
        deadline = time.monotonic() + self._async_flush_seconds
        wait = 0.001
        while True:
            flushed = int(conn.exec_driver_sql("SELECT (pg_current_wal_flush_lsn() - '0/0')::bigint").scalar_one())
            if flushed >= upto or time.monotonic() > deadline:
                return flushed
            time.sleep(wait)
            wait = min(wait * 2, 0.02)

    def confirm(self, position: int) -> None:
        """Confirmed to the server on the stream's connection, at once (a status update);
        never backwards."""
        if position > self._confirmed:
            self._confirmed = position
            if self._replication is not None:
                self._replication.nudge()

    def _refresh_status(self, conn: sa.Connection, through: int) -> None:
        now = time.monotonic()
        if now - self._status_at < STATUS_EVERY_SECONDS:
            return
        self._status_at = now
        found = conn.execute(
            sa.text(
                "SELECT (pg_current_wal_lsn() - restart_lsn)::bigint, (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, "
                "(pg_current_wal_lsn() - CAST(:through AS pg_lsn))::bigint FROM pg_replication_slots WHERE slot_name = :slot"
            ),
            {"slot": self.slot, "through": lsn_text(through)},
        ).one()
        retained, unconfirmed, unread = (int(v) if v is not None else 0 for v in found)
        self._status = {
            "slot": self.slot,
            "position": lsn_text(through),
            "retained_wal_bytes": retained,
            "unconfirmed_wal_bytes": unconfirmed,
            "unread_wal_bytes": max(0, unread),
            "last_commit_at": self._last_commit,
        }

    def status(self) -> dict[str, Any]:
        return dict(self._status)


def reader(engine: sa.Engine, schema: SourceSchema, slot: str) -> PgLog:
    return PgLog(engine, schema, slot)
