"""Log capture of MariaDB: the row-based binary log, read with ``python-mysql-replication``.

Nothing is created in the source: ``install`` checks that the binary log is on and holds
whole rows with their column names (``log_bin``, ``binlog_format = ROW``,
``binlog_row_image = FULL``, ``binlog_row_metadata = FULL``), naming the setting to change.
A position in the log is the file's number and the offset in it, as one integer
(``number << 32 | offset``; a binlog file stays below 4 GiB).

**The handshake** is exact by construction: ``START TRANSACTION WITH CONSISTENT SNAPSHOT``
also fixes the binary log position the snapshot corresponds to (``SHOW STATUS LIKE
'binlog_snapshot_%'``): the snapshot sees every transaction written to the log before it
and none after. A read ships every transaction between the position already handled and
that one, so what a snapshot sees is always a prefix of the log, and a subquery never
retakes its snapshot. The first read of a fresh wrapper state starts at its snapshot's
position (what committed before is the base every later snapshot sees).

The server keeps no position for the wrapper (there is no slot): binary logs are purged by
``binlog_expire_logs_seconds`` / ``expire_logs_days`` or ``PURGE BINARY LOGS``, and a
wrapper whose position was purged refuses to start (the changes in between are lost).
Health shows how many bytes of binary log lie beyond the handled position.
"""

from __future__ import annotations

import datetime
import random
import re
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from wrappers.capture.base import OutboxRow
from wrappers.capture.common import check_tables, reason, shown
from wrappers.capture.log import LogRead, LogTransaction
from wrappers.capture.types import wire_value
from wrappers.errors import WrapperError
from wrappers.schema import SourceSchema

REQUIRED = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}
STATUS_EVERY_SECONDS = 1.0
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
    """Reads the binary log of ``engine``'s server for the tables of its database (``log.LogReader``)."""

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
            # built for each read's two connections (a quarter second each)
            **({str(k): v for k, v in url.query.items() if str(k).startswith("ssl")} or {"ssl_disabled": True}),
        }
        self._columns = {name: table.columns for name, table in schema.tables.items()}
        self._server_id = random.randint(1 << 20, (1 << 31) - 1)  # a replica's id, unique among the server's
        with engine.connect() as conn:
            file = str(conn.exec_driver_sql("SHOW MASTER STATUS").one()[0])
        found = _FILE.match(file)
        assert found is not None
        self._base = found.group(1)
        self._status: dict[str, Any] = {}
        self._status_at = 0.0
        self._last_commit: float | None = None

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
        transactions = self._decode(after, target) if 0 < after < target else []
        if transactions:
            self._last_commit = transactions[-1].committed_at
        through = max(after, target)
        self._refresh_status(conn, through)
        return LogRead(transactions, through)

    def _decode(self, after: int, target: int) -> list[LogTransaction]:
        """The transactions with rows of captured tables between positions ``after`` and ``target``."""
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import QueryEvent, RotateEvent, XidEvent
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        file, offset = file_and_offset(after, self._base)
        stream = BinLogStreamReader(
            connection_settings=self._connection,
            server_id=self._server_id,
            resume_stream=True,
            log_file=file,
            log_pos=offset,
            blocking=False,
            # not is_mariadb: that switches the library to GTID positions, and ignores log_file/log_pos
            only_events=[QueryEvent, RotateEvent, XidEvent, WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
            only_schemas=[self._database],
            enable_logging=False,
        )
        out: list[LogTransaction] = []
        rows: list[OutboxRow] = []
        problems: list[str] = []
        current = file
        try:
            for event in stream:
                if isinstance(event, RotateEvent):
                    current = event.next_binlog
                    continue
                end = position(current, event.packet.log_pos)
                if end > target:
                    break
                if isinstance(event, XidEvent) or (isinstance(event, QueryEvent) and event.query == "COMMIT"):
                    if end > after and (rows or problems):
                        if problems:
                            raise WrapperError(f"transaction ending at {current}:{event.packet.log_pos}: {problems[0]}")
                        out.append(
                            LogTransaction(str(getattr(event, "xid", end)), end, tuple(rows), float(event.timestamp))
                        )
                    rows, problems = [], []
                elif isinstance(event, QueryEvent):
                    self._query(event, problems)
                    if problems and end > after and not rows:  # DDL commits on its own, with no Xid
                        raise WrapperError(f"statement ending at {current}:{event.packet.log_pos}: {problems[0]}")
                elif event.schema == self._database and event.table in self._columns:
                    self._rows(event, rows, problems)
        except WrapperError:
            raise
        except Exception as exc:
            raise WrapperError(f"cannot read the binary log from {file}:{offset}: {type(exc).__name__}: {exc}") from exc
        finally:
            stream.close()
        return out

    def _query(self, event: Any, problems: list[str]) -> None:
        schema = event.schema.decode() if isinstance(event.schema, bytes) else str(event.schema)
        truncated = _TRUNCATE.match(str(event.query))
        if schema == self._database and truncated and truncated.group(1) in self._columns:
            problems.append(
                f"TRUNCATE of {truncated.group(1)} cannot be captured from the log (it holds no rows); delete rows "
                "with DELETE, or register the source again to reload the views"
            )

    def _rows(self, event: Any, rows: list[OutboxRow], problems: list[str]) -> None:
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


def reader(engine: sa.Engine, schema: SourceSchema, slot: str) -> MariaLog:
    return MariaLog(engine, schema, slot)
