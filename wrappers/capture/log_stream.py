"""A database's change log read as it is written: one connection, a background thread, a buffer.

Log capture reads the log the server pushes (PostgreSQL: the streaming replication
protocol of a logical slot, ``pg_stream``; MariaDB: a replica's blocking binary log dump,
``maria_log``), not by asking for it on every read. A ``LogStream`` runs the server's
connection (a ``LogSource``) in a thread of its own and keeps what it delivers:

* the transactions of the captured tables, decoded, in log order (``Streamed``), until a
  read says the wrapper's state has captured them (``transactions(after)`` forgets those
  ending at or before ``after``, which the state has durably recorded);
* the *position* it has read through: every transaction committing before it has been
  delivered. A read compares it with its snapshot's position (``wait_until``).

A read therefore costs no decoding and no connection of its own: it takes its snapshot's
position, waits until the stream has passed it (a subquery's read; usually it has), and
takes the buffered transactions up to it. And a transaction arriving calls the wrapper
back (``on_transaction``), so that the ship loop captures it at once instead of at its next
poll.

The stream holds nothing the server forgets: PostgreSQL's slot is confirmed only through
acknowledged updates (feedback on the same connection), MariaDB's binary log stays where it
is. A connection that fails ends the stream; the next read starts a new one from its own
``after`` (the state's position), so a failure costs a reconnection, never a transaction.
Memory is bounded: past ``MAX_BUFFERED_ROWS`` rows the thread stops reading (the server
holds the rest) until reads take them, unless a read is waiting for a position beyond; and
a transaction keeps at most ``log_rows.SPILL_ROWS`` of its rows in memory, the rest in a
temporary file, closed when the transaction is forgotten or the stream stops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from wrappers.capture.log import LogTransaction
from wrappers.errors import WrapperError

log = logging.getLogger(__name__)

MAX_BUFFERED_ROWS = 100_000
"""Rows the stream keeps before it stops reading until reads take them (two updates' worth)."""

CLOSE_SECONDS = 5.0
"""How long ``close`` waits for the thread to let go of its connection."""

START_SECONDS = 30.0
"""How long a read waits for a new stream to begin (connecting, and the server starting to send)."""


@dataclass(frozen=True)
class Streamed:
    """A committed transaction of the captured tables as the stream delivered it: ``commit``
    is where its commit lies in the log (compared with a snapshot's position by the reader),
    ``problem`` why it cannot be shipped (a TRUNCATE, a table changed in the source)."""

    transaction: LogTransaction
    commit: int
    problem: str | None = None


class Feed(Protocol):
    """What a ``LogSource`` delivers into, from the stream's thread."""

    def started(self) -> None:
        """The server has begun to send the log."""
        ...

    def transaction(self, item: Streamed) -> None:
        """A committed transaction of the captured tables (returns once there is room for it)."""
        ...

    def reached(self, position: int) -> None:
        """Every transaction committing before ``position`` has been delivered."""
        ...


class LogSource(Protocol):
    """One connection to the server's log."""

    def run(self, after: int, feed: Feed) -> None:
        """Read the log from ``after`` (or from where the server keeps the wrapper's
        position, which is never beyond it) into ``feed`` until ``stop``; raise if it fails."""
        ...

    def stop(self) -> None:
        """From another thread: make ``run`` return soon."""
        ...


class LogStream:
    """The log of one source, read by a ``LogSource`` from ``connect()`` in a thread."""

    def __init__(self, connect: Callable[[], LogSource], name: str) -> None:
        self._connect = connect
        self._name = name
        self._changed = threading.Condition()
        self._items: list[Streamed] = []
        self._rows = 0
        self._position = 0
        self._floor = 0  # items ending at or before it are forgotten (or were never read)
        self._wanted = 0  # a read waits for this position: read on past MAX_BUFFERED_ROWS
        self._error: BaseException | None = None
        self._started = False
        self._source: LogSource | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._on_transaction: Callable[[], None] = lambda: None

    # -- the reader's side (one read at a time: the wrapper's capture lock) ---------------------
    def on_transaction(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the stream's thread) whenever a transaction arrives."""
        self._on_transaction = callback

    def ensure(self, after: int) -> None:
        """Have a stream running that delivers every transaction ending after ``after``: start
        one (from ``after``) if there is none, if the last one failed (its failure was
        logged), or if it already forgot transactions after ``after`` (a read going back:
        tests do, the wrapper never). WrapperError if a new one fails to begin."""
        with self._changed:
            running = self._thread is not None and self._thread.is_alive() and self._error is None
            if running and after >= self._floor:
                return
        self._stop()
        if self._closed:
            raise WrapperError(f"{self._name}: the log stream is closed")
        with self._changed:
            for item in self._items:
                item.transaction.close()
            self._items, self._rows, self._error, self._started = [], 0, None, False
            self._position = self._floor = self._wanted = after
            source = self._source = self._connect()
        self._thread = threading.Thread(target=self._run, args=(source, after), name=f"pvm-log-{self._name}")
        self._thread.daemon = True  # never keeps the process alive; close() stops it first
        self._thread.start()
        deadline = time.monotonic() + START_SECONDS
        with self._changed:
            while not self._started:
                self._raise_failure()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WrapperError(f"{self._name}: the log stream did not begin within {START_SECONDS:.0f} s")
                self._changed.wait(left)

    @property
    def position(self) -> int:
        with self._changed:
            return self._position

    def wait_until(self, position: int, timeout: float) -> bool:
        """Wait until the stream has read through ``position`` (False after ``timeout`` s);
        WrapperError if the stream failed."""
        deadline = time.monotonic() + timeout
        with self._changed:
            self._wanted = max(self._wanted, position)
            self._changed.notify_all()
            while self._position < position:
                self._raise_failure()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def transactions(self, after: int) -> list[Streamed]:
        """Forget what ends at or before ``after`` (the state holds it), and return the rest
        in log order: every transaction ending after ``after`` that commits before
        ``position`` (and possibly some beyond it)."""
        with self._changed:
            kept = [item for item in self._items if item.transaction.end > after]
            if len(kept) != len(self._items):
                for item in self._items:
                    if item.transaction.end <= after:
                        item.transaction.close()
                self._items, self._rows = kept, sum(len(item.transaction.rows) for item in kept)
                self._changed.notify_all()
            self._floor = max(self._floor, after)
            return list(kept)

    def close(self) -> None:
        self._closed = True
        self._stop()
        with self._changed:
            for item in self._items:
                item.transaction.close()
            self._items, self._rows = [], 0

    def _raise_failure(self) -> None:
        if self._error is not None:
            if isinstance(self._error, WrapperError):
                raise WrapperError(str(self._error)) from self._error
            raise WrapperError(f"{self._name}: reading the log failed: {self._error}") from self._error

    def _stop(self) -> None:
        with self._changed:
            thread, source = self._thread, self._source
            self._thread = self._source = None  # whatever its thread still delivers is ignored
            self._changed.notify_all()  # a full buffer's wait ends
        if source is not None:
            source.stop()
        if thread is not None:
            thread.join(CLOSE_SECONDS)
            if thread.is_alive():
                log.warning("%s: the log stream's thread did not stop within %.0f s", self._name, CLOSE_SECONDS)

    # -- the stream's thread -----------------------------------------------------------------------
    def _run(self, source: LogSource, after: int) -> None:
        feed = _Feed(self, source)
        try:
            source.run(after, feed)
        except BaseException as exc:
            with self._changed:
                if self._source is source:  # not stopped on purpose
                    log.warning("%s: the log stream ended: %s", self._name, exc)
                    self._error = exc
                    self._changed.notify_all()
            return
        with self._changed:
            if self._source is source:
                self._error = WrapperError("the server ended the log stream")
                self._changed.notify_all()


class _Feed:
    """A stream's ``Feed``: appends, advances, and holds the thread while the buffer is full."""

    def __init__(self, stream: LogStream, source: LogSource) -> None:
        self._stream = stream
        self._source = source

    def started(self) -> None:
        s = self._stream
        with s._changed:
            if s._source is self._source:
                s._started = True
                s._changed.notify_all()

    def transaction(self, item: Streamed) -> None:
        s = self._stream
        with s._changed:
            while s._rows >= MAX_BUFFERED_ROWS and s._wanted <= s._position and s._source is self._source:
                s._changed.wait(1.0)
            if s._source is not self._source:
                return  # stopped: a new stream (if any) delivers it again
            s._items.append(item)
            s._rows += len(item.transaction.rows)
            s._changed.notify_all()
        s._on_transaction()

    def reached(self, position: int) -> None:
        s = self._stream
        with s._changed:
            if position > s._position and s._source is self._source:
                s._position = position
                s._changed.notify_all()
