"""Log capture of MariaDB: the row-based binary log, read with ``python-mysql-replication``.

Nothing is created in the source: ``install`` checks that the binary log is on and holds
whole rows with their column names (``log_bin``, ``binlog_format = ROW``,
``binlog_row_image = FULL``, ``binlog_row_metadata = FULL``), naming the setting to change.
A position in the log is the file's number and the offset in it, as one integer
(``number << 32 | offset``; a binlog file stays below 4 GiB).

**The handshake** is exact by construction: ``START TRANSACTION WITH CONSISTENT SNAPSHOT``
also fixes the binary log position the snapshot corresponds to (``SHOW STATUS LIKE
'binlog_snapshot_%'``): the snapshot sees every transaction written to the log before it
and none after. A subquery's read ships every transaction between the position already
handled and that one, so what a snapshot sees is always a prefix of the log, and a subquery
never retakes its snapshot; a poll waits for that position up to ``POLL_WAIT_SECONDS``,
then ships what the stream has delivered so far (up to the end of an event group). The first read of a fresh wrapper state starts at its snapshot's
position (what committed before is the base every later snapshot sees).

**Reading**: from the first read after that position on, one replica's dump connection
streams the log as the server writes it (``_BinlogDump``, blocking, in the thread of a
``log_stream.LogStream``): a commit reaches the wrapper within a millisecond or so and
wakes its ship loop, and a read only waits, if at all, until the stream has passed its
snapshot's position. (Earlier versions opened a non-blocking dump for every read, about
10 ms each, and learned of a commit only at the next poll.)

The server keeps no position for the wrapper (there is no slot): binary logs are purged by
``binlog_expire_logs_seconds`` / ``expire_logs_days`` or ``PURGE BINARY LOGS``, and a
wrapper whose position was purged refuses to start (the changes in between are lost).
Health shows how many bytes of binary log lie beyond the handled position.
"""

from __future__ import annotations

import datetime
import random
import re
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from wrappers.capture.base import OutboxRow
from wrappers.capture.common import check_tables, reason, shown
from wrappers.capture.log import LogRead, LogTransaction
from wrappers.capture.log_rows import RowsBuilder
from wrappers.capture.log_stream import Feed, LogStream, Streamed
from wrappers.capture.types import wire_value
from wrappers.errors import WrapperError
from wrappers.schema import SourceSchema

REQUIRED = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}
STATUS_EVERY_SECONDS = 1.0
HEARTBEAT_SECONDS = 1.0
"""The server sends the dump a heartbeat after this long without events: where the log ends."""
STREAM_WAIT_SECONDS = 10.0
"""How long a subquery's read waits for the stream to reach its snapshot's position (then it fails: it is retried)."""
POLL_WAIT_SECONDS = 0.1
"""How long a poll waits for it (then it takes what arrived)."""
_GTID_STANDALONE = 1  # a MariaDB GTID event's flag: the group is one statement, with no COMMIT or XID event
_TRUNCATE = re.compile(r"^\s*TRUNCATE\s+(?:TABLE\s+)?`?(\w+)`?", re.IGNORECASE)
_FILE = re.compile(r"^(.*)\.(\d+)$")


def position(file: str, offset: int) -> int:
    """A binlog file and offset as one integer.

    >>> position("mysql-bin.000002", 4), file_and_offset(position("mysql-bin.000002", 4), "mysql-bin")
    (8589934596, ('mysql-bin.000002', 4))
    """
    found = _FILE.match(file)
    if found is None:
        raise WrapperError(f"binary log file {file!r} has no number")
    return int(found.group(2)) << 32 | offset


def file_and_offset(value: int, base: str) -> tuple[str, int]:
    return f"{base}.{value >> 32:06d}", value & 0xFFFFFFFF


def check_server(engine: sa.Engine) -> None:
    """WrapperError naming each binary log setting that log capture cannot work with."""
    with engine.connect() as conn:
        found = {
            str(name).lower(): str(value)
            for name, value in conn.exec_driver_sql(
                "SHOW VARIABLES WHERE Variable_name IN ('log_bin', 'binlog_format', 'binlog_row_image', "
                "'binlog_row_metadata')"
            )
        }
        try:
            conn.exec_driver_sql("SHOW BINARY LOGS").all()
        except sa.exc.DBAPIError as exc:
            raise WrapperError(
                f"{shown(engine.url)}: log capture must read the binary log ({reason(exc)}); grant the wrapper's "
                "user REPLICATION SLAVE and BINLOG MONITOR (MySQL: REPLICATION CLIENT)"
            ) from exc
    wrong = [
        f"{name} = {want} (it is {found.get(name, 'unset')})"
        for name, want in REQUIRED.items()
        if found.get(name) != want
    ]
    if wrong:
        raise WrapperError(
            f"{shown(engine.url)}: log capture needs {', '.join(wrong)}: set it in the server's configuration"
        )


def install(engine: sa.Engine, tables: Sequence[str], slot: str) -> None:
    """Check that ``tables`` can be captured from the binary log; nothing is created."""
    from wrappers.capture.mariadb import check_innodb

    check_server(engine)
    checked = check_tables(engine, tables)
    with engine.connect() as conn:
        check_innodb(conn, [t.name for t in checked], "log")


def uninstall(engine: sa.Engine, tables: Sequence[str], slot: str) -> None:
    """Nothing to remove: log capture of MariaDB keeps nothing in the source."""


def default_slot(engine: sa.Engine) -> str:
    return ""


def check_slot_name(name: str) -> str:
    raise WrapperError("--slot names a PostgreSQL replication slot; MariaDB log capture has none")


def _value(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    return wire_value(value)


class MariaLog:
    """Reads the binary log of ``engine``'s server for the tables of its database
    (``log.LogReader``), streamed (``_BinlogDump``) from the first read after a position on."""

    def __init__(self, engine: sa.Engine, schema: SourceSchema, slot: str = "") -> None:
        check_server(engine)
        url = engine.url
        self._engine = engine
        self._database = str(url.database)
        self._connection: dict[str, Any] = {
            "host": url.host or "127.0.0.1",
            "port": url.port or 3306,
            "user": url.username or "",
            "password": url.password or "",
            "charset": "utf8mb4",
            # TLS as the URL asks for it (PyMySQL's ssl_* options); without, no TLS context is
            # built for the stream's two connections (a quarter second each)
            **({str(k): v for k, v in url.query.items() if str(k).startswith("ssl")} or {"ssl_disabled": True}),
        }
        self._columns = {name: table.columns for name, table in schema.tables.items()}
        self._server_id = random.randint(1 << 20, (1 << 31) - 1)  # a replica's id, unique among the server's
        with engine.connect() as conn:
            file = str(conn.exec_driver_sql("SHOW MASTER STATUS").one()[0])
        found = _FILE.match(file)
        assert found is not None
        self._base = found.group(1)
        self._stream = LogStream(self._dump, f"{shown(url)} binary log")
        self._status: dict[str, Any] = {}
        self._status_at = 0.0
        self._last_commit: float | None = None

    def _dump(self) -> _BinlogDump:
        return _BinlogDump(self._connection, self._server_id, self._database, self._columns, self._base)

    def on_transaction(self, callback: Callable[[], None]) -> None:
        self._stream.on_transaction(callback)

    def close(self) -> None:
        self._stream.close()

    def check_position(self, captured_through: int) -> None:
        if not captured_through:
            return
        file, _ = file_and_offset(captured_through, self._base)
        with self._engine.connect() as conn:
            files = {str(row[0]) for row in conn.exec_driver_sql("SHOW BINARY LOGS")}
        if file not in files:
            raise WrapperError(
                f"binary log {file}, where the wrapper state says capture stopped, was purged: the changes since "
                "are lost; start from a new state directory and reload the views"
            )

    def read(self, conn: sa.Connection, after: int, *, exact: bool) -> LogRead:
        status = {
            str(k).lower(): str(v)
            for k, v in conn.exec_driver_sql(
                "SHOW STATUS WHERE Variable_name IN ('binlog_snapshot_file', 'binlog_snapshot_position')"
            )
        }
        target = position(status["binlog_snapshot_file"], int(status["binlog_snapshot_position"]))
        if not after:  # a fresh state: what the snapshot sees is the base, the log starts after it
            self._refresh_status(conn, target)
            return LogRead([], target)
        self._stream.ensure(after)
        # a poll waits briefly: the stream is a millisecond or so behind the server
        if not self._stream.wait_until(target, STREAM_WAIT_SECONDS if exact else POLL_WAIT_SECONDS) and exact:
            file, offset = file_and_offset(target, self._base)
            raise WrapperError(
                f"the binary log stream did not reach {file}:{offset}, the snapshot's position, within "
                f"{STREAM_WAIT_SECONDS:.0f} s"
            )
        through = max(after, min(target, self._stream.position))  # exact: the snapshot's position
        arrived = self._stream.transactions(after)
        taken = [item for item in arrived if item.transaction.end <= through]
        for item in taken:
            if item.problem is not None:
                file, offset = file_and_offset(item.transaction.end, self._base)
                raise WrapperError(f"transaction ending at {file}:{offset}: {item.problem}")
        if taken:
            self._last_commit = taken[-1].transaction.committed_at
        self._refresh_status(conn, through)
        return LogRead([item.transaction for item in taken], through, more=len(taken) < len(arrived))

    def confirm(self, position: int) -> None:
        """Nothing to confirm: the server keeps no position for the wrapper."""

    def _refresh_status(self, conn: sa.Connection, through: int) -> None:
        now = time.monotonic()
        if now - self._status_at < STATUS_EVERY_SECONDS:
            return
        self._status_at = now
        file, offset = file_and_offset(through, self._base)
        logs = [(str(row[0]), int(str(row[1]))) for row in conn.exec_driver_sql("SHOW BINARY LOGS")]
        behind = sum(size for name, size in logs if name > file) + sum(
            size - offset for name, size in logs if name == file
        )
        self._status = {
            "position": f"{file}:{offset}",
            "unread_binlog_bytes": max(0, behind),
            "binlog_files": len(logs),
            "last_commit_at": self._last_commit,
        }

    def status(self) -> dict[str, Any]:
        return dict(self._status)


class _BinlogDump:
    """One blocking binary log dump (a replica's connection), read with python-mysql-replication
    in the stream's thread (a ``log_stream.LogSource``), filtered to the source's database.

    Where the stream stands (``Feed.reached``) moves at the ends of event groups only (a
    transaction's XID or COMMIT, a statement logged on its own, a heartbeat or a rotation
    outside of a group): a position recorded from it is one a later stream can start at.
    Every group ends with an event the filter lets through (the library filters row events
    of other databases, not these), so the stream reaches the end of every transaction it
    passes, and the server's heartbeats (``HEARTBEAT_SECONDS``) carry it to the end of the
    log when it is idle."""

    def __init__(
        self, connection: dict[str, Any], server_id: int, database: str, columns: dict[str, tuple[str, ...]], base: str
    ) -> None:
        self._connection = connection
        self._server_id = server_id
        self._database = database
        self._columns = columns
        self._base = base
        self._opened: list[Any] = []
        self._stopped = False

    def _connect(self, **settings: Any) -> Any:
        """The library's connections, two per dump (the dump's and one for its queries). It
        would open the dump again by itself after a lost connection, from the position of the
        last event it read, which may lie inside a transaction: refuse, so that the stream
        ends and the next read starts a new one where the wrapper's state stands."""
        import pymysql

        if self._stopped or len(self._opened) >= 2:
            raise WrapperError("the binary log connection was lost" if not self._stopped else "stopped")
        if "db" in settings:  # the library still names it so; PyMySQL deprecates the name
            settings["database"] = settings.pop("db")
        connection = pymysql.connect(**settings)
        self._opened.append(connection)
        return connection

    def stop(self) -> None:
        self._stopped = True
        for connection in list(self._opened):
            sock = getattr(connection, "_sock", None)  # PyMySQL's socket: its blocking read ends
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def run(self, after: int, feed: Feed) -> None:
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import HeartbeatLogEvent, MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        group_events = [QueryEvent, RotateEvent, XidEvent, MariadbGtidEvent, HeartbeatLogEvent]
        file, offset = file_and_offset(after, self._base)
        stream = BinLogStreamReader(
            connection_settings=self._connection,
            server_id=self._server_id,
            resume_stream=True,
            log_file=file,
            log_pos=offset,
            blocking=True,
            slave_heartbeat=HEARTBEAT_SECONDS,
            # not is_mariadb: that switches the library to GTID positions, and ignores log_file/log_pos
            only_events=[*group_events, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
            only_schemas=[self._database],
            enable_logging=False,
            pymysql_wrapper=self._connect,
        )
        rows = RowsBuilder()
        problems: list[str] = []
        current = file
        in_group = standalone = False
        try:
            for event in stream:
                if self._stopped:
                    return
                if isinstance(event, RotateEvent):
                    current = event.next_binlog
                    if not in_group:
                        feed.started()
                        feed.reached(position(current, event.position))
                    continue
                end = position(current, event.packet.log_pos)
                if isinstance(event, HeartbeatLogEvent):
                    if not in_group:
                        feed.reached(end)
                elif isinstance(event, MariadbGtidEvent):
                    in_group, standalone = True, bool(event.flags & _GTID_STANDALONE)
                elif isinstance(event, QueryEvent) and event.query == "BEGIN":  # MySQL's groups begin so
                    in_group, standalone = True, False
                elif isinstance(event, XidEvent) or (
                    isinstance(event, QueryEvent) and event.query in ("COMMIT", "ROLLBACK")
                ):
                    self._deliver(feed, end, rows, problems, float(event.timestamp), str(getattr(event, "xid", end)))
                    rows, problems, in_group = RowsBuilder(), [], False
                    feed.reached(end)
                elif isinstance(event, QueryEvent):
                    self._query(event, problems)
                    if standalone or not in_group:  # a statement logged on its own (DDL): its group ends here
                        self._deliver(feed, end, rows, problems, float(event.timestamp), str(end))
                        rows, problems, in_group = RowsBuilder(), [], False
                        feed.reached(end)
                elif event.schema == self._database and event.table in self._columns:
                    self._rows(event, rows, problems)
        except WrapperError:
            raise
        except Exception as exc:
            if self._stopped:
                return
            raise WrapperError(f"cannot read the binary log from {file}:{offset}: {type(exc).__name__}: {exc}") from exc
        finally:
            stream.close()

    @staticmethod
    def _deliver(feed: Feed, end: int, rows: RowsBuilder, problems: list[str], at: float, xid: str) -> None:
        if len(rows) or problems:
            transaction = LogTransaction(xid, end, rows.finish(), at)
            feed.transaction(Streamed(transaction, end, problems[0] if problems else None))

    def _query(self, event: Any, problems: list[str]) -> None:
        schema = event.schema.decode() if isinstance(event.schema, bytes) else str(event.schema)
        truncated = _TRUNCATE.match(str(event.query))
        if schema == self._database and truncated and truncated.group(1) in self._columns:
            problems.append(
                f"TRUNCATE of {truncated.group(1)} cannot be captured from the log (it holds no rows); delete rows "
                "with DELETE, or register the source again to reload the views"
            )

    def _rows(self, event: Any, rows: RowsBuilder, problems: list[str]) -> None:
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent

        table = str(event.table)
        names = tuple(c.name for c in event.columns)
        if names != self._columns[table]:
            problems.append(
                f"table {table!r} changed in the source (columns now: {', '.join(map(str, names))}; captured: "
                f"{', '.join(self._columns[table])}); log capture ships no row of it until the source is registered again"
            )
            return
        for row in event.rows:
            if isinstance(event, UpdateRowsEvent):
                old = {c: _value(v) for c, v in row["before_values"].items()}
                new = {c: _value(v) for c, v in row["after_values"].items()}
                rows.append(OutboxRow(len(rows), table, "U", old, new))
            elif isinstance(event, DeleteRowsEvent):
                rows.append(OutboxRow(len(rows), table, "D", {c: _value(v) for c, v in row["values"].items()}, None))
            else:
                rows.append(OutboxRow(len(rows), table, "I", None, {c: _value(v) for c, v in row["values"].items()}))


def reader(engine: sa.Engine, schema: SourceSchema, slot: str) -> MariaLog:
    return MariaLog(engine, schema, slot)
