"""A logical slot read with PostgreSQL's streaming replication protocol (a ``LogSource``).

psycopg 3 has no replication API, but its libpq layer (``psycopg.pq``) has what the
protocol needs: a connection with ``replication=database``, ``START_REPLICATION SLOT …
LOGICAL`` (which puts it in COPY BOTH mode) and the copy data calls. The server then sends
(``CopyData``):

* ``w`` XLogData: a ``pgoutput`` message, as ``pg_logical_slot_peek_binary_changes`` gives
  it, after a 24-byte header; a whole transaction at its commit, in commit order;
* ``k`` keepalive: the position the server has decoded the log through (``sentPtr``),
  sent whenever it has caught up with the flushed WAL and the position the client last
  reported is behind it, and a flag asking for a reply.

The client sends standby status updates (``r``) with the position it has *flushed*, which
for a logical slot is its confirmed position: the wrapper reports only what its reader
confirmed (acknowledged updates), so the server never releases WAL of an unacknowledged
update. Reporting no more than that also keeps the keepalives coming: the server pings
each time it has caught up beyond the reported position, which is how a read learns that
the stream has passed its snapshot's position (``LogStream.wait_until``).
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Protocol

from psycopg import pq

from wrappers.capture import pgoutput
from wrappers.capture.log_stream import Feed, Streamed
from wrappers.errors import WrapperError

STATUS_EVERY_SECONDS = 10.0
"""Status updates at least this often: well within the server's wal_sender_timeout (60 s by default)."""

_XLOG_DATA_HEADER = 1 + 8 + 8 + 8  # 'w', start, end, send time
_KEEPALIVE = struct.Struct(">QqB")  # position, send time, reply requested
_STATUS = struct.Struct(">cQQQqB")  # 'r', written, flushed, applied, client time, reply requested
_EPOCH_MICROSECONDS = pgoutput.POSTGRES_EPOCH * 1_000_000


class Decoder(Protocol):
    """What the stream's ``pgoutput`` messages mean to the reader: ``message`` returns the
    transaction a Commit completes (None if it holds no captured row and no problem)."""

    def message(self, message: pgoutput.Message) -> Streamed | None: ...


class PgReplication:
    """One replication connection streaming slot ``slot`` (publication of the same name);
    ``confirmed()``: the position the server may release the log before."""

    def __init__(self, conninfo: str, slot: str, decoder: Decoder, confirmed: Callable[[], int], describe: str) -> None:
        self._conninfo = conninfo
        self._slot = slot
        self._decoder = decoder
        self._confirmed = confirmed
        self._describe = describe
        self._wake_read, self._wake_write = socket.socketpair()  # stop() and nudge() interrupt the wait
        self._wake_write.setblocking(False)
        self._stopped = False
        self._reported = 0

    def nudge(self) -> None:
        """From another thread: send the confirmed position now, not at the next status update."""
        try:
            self._wake_write.send(b"n")
        except OSError:
            pass  # closed (the stream has ended), or nudged often enough already

    def stop(self) -> None:
        self._stopped = True
        self.nudge()

    def run(self, after: int, feed: Feed) -> None:
        """Stream from the slot's confirmed position (never beyond ``after``: the wrapper
        confirms only what it captured) until ``stop``."""
        conn = pq.PGconn.connect(self._conninfo.encode())
        try:
            if conn.status != pq.ConnStatus.OK:
                raise WrapperError(
                    f"{self._describe}: cannot open a replication connection: {_text(conn.error_message)}"
                )
            result = conn.exec_(
                f"START_REPLICATION SLOT {self._slot} LOGICAL 0/0 "
                f"(proto_version '1', publication_names '{self._slot}')".encode()
            )
            if result.status != pq.ExecStatus.COPY_BOTH:
                message = _text(result.error_message)
                if result.error_field(pq.DiagnosticField.SQLSTATE) == b"55006":
                    raise WrapperError(f"replication slot {self._slot!r} is in use by another process: {message}")
                raise WrapperError(f"{self._describe}: cannot stream replication slot {self._slot!r}: {message}")
            conn.nonblocking = 1
            feed.started()
            self._loop(conn, feed)
            self._status(conn)  # stopped: the last confirmation goes before the connection does
        finally:
            conn.finish()
            self._wake_read.close()
            self._wake_write.close()

    def _loop(self, conn: pq.abc.PGconn, feed: Feed) -> None:
        status_at = 0.0
        while not self._stopped:
            size, data = conn.get_copy_data(1)
            if size > 0:
                self._handle(conn, bytes(data), feed)
                continue
            if size == -1:
                result = conn.get_result()
                ended = _text(result.error_message) if result is not None else ""
                raise WrapperError(f"{self._describe}: the server ended the replication stream {ended}".strip())
            now = time.monotonic()
            if now - status_at >= STATUS_EVERY_SECONDS or self._confirmed() > self._reported:
                self._status(conn)
                status_at = now
            ready, _, _ = select.select([conn.socket, self._wake_read], [], [], STATUS_EVERY_SECONDS)
            if self._wake_read in ready:
                self._wake_read.recv(4096)
            conn.consume_input()

    def _handle(self, conn: pq.abc.PGconn, data: bytes, feed: Feed) -> None:
        kind = data[:1]
        if kind == b"w":
            message = pgoutput.decode(data[_XLOG_DATA_HEADER:])
            item = self._decoder.message(message)
            if item is not None:
                feed.transaction(item)
            if isinstance(message, pgoutput.Commit):
                feed.reached(message.end_lsn)
        elif kind == b"k":
            position, _, reply = _KEEPALIVE.unpack_from(data, 1)
            feed.reached(position)
            if reply:
                self._status(conn)

    def _status(self, conn: pq.abc.PGconn) -> None:
        """Report the confirmed position as written, flushed and applied (0, before any
        confirmation, reports nothing: the server keeps the slot where it is)."""
        confirmed = self._confirmed()
        clock = int(time.time() * 1_000_000) - _EPOCH_MICROSECONDS
        conn.put_copy_data(_STATUS.pack(b"r", confirmed, confirmed, confirmed, clock, 0))
        while conn.flush():  # 1 while some of it is still to be sent
            select.select([], [conn.socket], [], 1.0)
        self._reported = confirmed


def _text(message: bytes | None) -> str:
    return (message or b"").decode(errors="replace").strip()
