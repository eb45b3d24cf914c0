"""A relation snapshot as an Arrow stream (``contract.relation_snapshot``), batch by batch.

The statement runs in the snapshot's own transaction and thread with a server-side cursor
(``stream_results``): the database hands out ``ROWS_PER_BATCH`` rows at a time, each batch
is encoded to Arrow IPC bytes in that thread, and the bytes go to the HTTP response before
the next batch is fetched. Neither the wrapper nor the database client ever holds the
relation whole.

The stream's schema carries the relation's size as the database's statistics estimate it
(``estimated_rows``), so the manager can tell how far a load is: PostgreSQL's
``pg_class.reltuples`` and MariaDB's ``information_schema.TABLES.TABLE_ROWS`` cost nothing
but may be off (until ``ANALYZE``, or by InnoDB's sampling); SQLite keeps no such figure,
and counting its table in the snapshot is cheap next to reading it.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Sequence
from typing import Any

import sqlalchemy as sa

from contract.relation_snapshot import ROWS_PER_BATCH, SnapshotWriter, snapshot_schema
from wrappers.capture.types import wire_value
from wrappers.snapshot import Snapshot


class _Encoder:
    """The open cursor and the stream writer of one snapshot, used from its thread only."""

    def __init__(
        self,
        conn: sa.Connection,
        statement: sa.Select,
        table: str,
        columns: Sequence[str],
        types: Sequence[str],
        watermark: int,
    ) -> None:
        self._sink = io.BytesIO()
        schema = snapshot_schema(columns, types, watermark, estimated_rows(conn, table))
        self._writer = SnapshotWriter(self._sink, schema)
        self._result = conn.execution_options(stream_results=True, yield_per=ROWS_PER_BATCH).execute(statement)
        self.done = False

    def _take(self) -> bytes:
        data = self._sink.getvalue()
        self._sink.seek(0)
        self._sink.truncate(0)
        return data

    def header(self) -> bytes:
        return self._take()

    def next_chunk(self) -> bytes:
        """The next batch's bytes; after the last, the end marker (and ``done``)."""
        rows = self._result.fetchmany(ROWS_PER_BATCH)
        if rows:
            self._writer.write_columns([_wire(column) for column in zip(*rows)])
        else:
            self._result.close()
            self._writer.close()
            self.done = True
        return self._take()

    def close(self) -> None:
        self._result.close()


def estimated_rows(conn: sa.Connection, table: str) -> int | None:
    """The rows of ``table`` as the database estimates them; None where it has no figure (a
    PostgreSQL table never analyzed, a dialect without statistics). Read in the snapshot's
    transaction: none of these statements fails for a table the snapshot reads."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        sql = "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(:name)"
    elif dialect in ("mysql", "mariadb"):
        sql = "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :name"
    elif dialect == "sqlite":
        sql = f"SELECT COUNT(*) FROM {conn.dialect.identifier_preparer.quote(table)}"
    else:
        return None
    found = conn.execute(sa.text(sql), {"name": table}).scalar()
    return int(found) if found is not None and int(found) >= 0 else None


_PLAIN = frozenset({int, float, str, bool, type(None)})
"""Types a driver hands out that are their own wire form."""


def _wire(column: Sequence[Any]) -> Sequence[Any]:
    """A fetched column in wire form: converted value by value only if some value needs it
    (decimals, dates, bytes), which most columns of most batches do not."""
    if all(type(v) in _PLAIN for v in column):
        return column
    return [wire_value(v) for v in column]


async def stream(
    snapshot: Snapshot,
    statement: sa.Select,
    table: str,
    columns: Sequence[str],
    types: Sequence[str],
    watermark: int,
) -> AsyncIterator[bytes]:
    """The stream's bytes, a batch at a time; the snapshot is closed when the stream ends,
    fails or is abandoned by the client."""
    try:
        encoder = await snapshot.run(lambda conn: _Encoder(conn, statement, table, columns, types, watermark))
        try:
            yield encoder.header()
            while not encoder.done:
                yield await snapshot.run(lambda _: encoder.next_chunk())
        finally:
            if not encoder.done:
                await snapshot.run(lambda _: encoder.close())
    finally:
        snapshot.close()
