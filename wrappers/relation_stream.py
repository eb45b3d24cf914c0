"""A relation snapshot as an Arrow stream (``contract.relation_snapshot``), batch by batch.

The statement runs in the snapshot's own transaction and thread with a server-side cursor
(``stream_results``): the database hands out ``ROWS_PER_BATCH`` rows at a time, each batch
is encoded to Arrow IPC bytes in that thread, and the bytes go to the HTTP response before
the next batch is fetched. Neither the wrapper nor the database client ever holds the
relation whole.

SQLAlchemy runs the statement (binding its parameters), but the rows are read from the
driver's cursor itself: SQLAlchemy's row objects cost four times the driver's fetch, and
add nothing here, since no column of a scan has a result processor (``query_table`` is
untyped; SQLite's ``CAST`` to float converts in SQL). PyMySQL's rows, slow to build in pure
Python, are not built at all: its result set is read as Arrow columns
(``wrappers.mariadb_columns``).

The stream's schema carries the relation's size as the database's statistics estimate it
(``estimated_rows``), so the manager can tell how far a load is: PostgreSQL's
``pg_class.reltuples`` and MariaDB's ``information_schema.TABLES.TABLE_ROWS`` cost nothing
but may be off (until ``ANALYZE``, or by InnoDB's sampling); SQLite keeps no such figure,
and counting its table in the snapshot is cheap next to reading it.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Generator, Sequence
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from contract.relation_snapshot import ROWS_PER_BATCH, SnapshotWriter, encode_column, snapshot_schema
from wrappers import mariadb_columns
from wrappers.capture.types import AS_IS, wire_values
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
        self._conn = conn
        self._result = conn.execution_options(stream_results=True).execute(statement)
        # PyMySQL's reader takes the rows off the socket: cut short, it drops the connection
        self._drops_connection = mariadb_columns.readable(self._result.cursor)
        self._batches = column_batches(self._result.cursor, _read_ahead(self._result), schema, ROWS_PER_BATCH)
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
        arrays = next(self._batches, None)
        if arrays is not None:
            self._writer.write_arrays(arrays)
        else:
            self._result.close()
            self._writer.close()
            self.done = True
        return self._take()

    def close(self) -> None:
        """End the statement before its last row (the stream failed or was abandoned)."""
        self._batches.close()
        self._result.close()
        if self._drops_connection:
            self._conn.invalidate()


def _read_ahead(result: sa.CursorResult[Any]) -> list[Sequence[Any]]:
    """The driver's rows SQLAlchemy has taken from the cursor already: with
    ``stream_results`` it reads one row ahead into its buffer as the statement runs."""
    strategy = result.cursor_strategy
    if type(strategy).__name__ == "CursorFetchStrategy":
        return []  # reads from the cursor as asked: nothing ahead
    buffer = getattr(strategy, "_rowbuffer", None)
    if buffer is None:  # rows would be lost without a word
        raise RuntimeError(f"SQLAlchemy's {type(strategy).__name__} keeps its rows read ahead where not looked for")
    rows = list(buffer)
    buffer.clear()
    return rows


def column_batches(
    cursor: Any, first: Sequence[Sequence[Any]], schema: pa.Schema, rows_per_batch: int
) -> Generator[list[pa.Array]]:
    """The rows of a driver's cursor (its statement executed; ``first``: rows already taken
    from it) in arrays of ``schema``'s fields, about ``rows_per_batch`` rows at a time."""
    if first:
        yield [encode_column(f, _wire(column)) for f, column in zip(schema, zip(*first), strict=True)]
    if mariadb_columns.readable(cursor):
        yield from mariadb_columns.batches(cursor, schema, rows_per_batch)
        return
    while rows := cursor.fetchmany(rows_per_batch):
        yield [encode_column(f, _wire(column)) for f, column in zip(schema, zip(*rows), strict=True)]


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


def _wire(column: Sequence[Any]) -> Sequence[Any]:
    """A fetched column in wire form: converted value by value only if some value needs it
    (decimals, dates, bytes), which most columns of most batches do not."""
    if AS_IS.issuperset(map(type, column)):  # in C: a generator here cost a third of the stream
        return column
    return wire_values(column)


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
