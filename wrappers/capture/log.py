"""Log capture: changes read from the database's own change log (``--capture log``).

A *log reader* (``pg_log`` for PostgreSQL) decodes the committed transactions of the
captured tables from the log, in commit order, each with the *position* just after its
commit (an integer that grows along the log). The wrapper turns them into updates and
records, durably and with the same SQLite transaction, the position it has handled the
log through (``WrapperState.captured_through``); a restart resumes after it, so nothing is
lost or captured twice. The reader confirms a position to the server (which may then
release the log before it) only once every update up to it is acknowledged.

Reads happen inside a read transaction of the source (a *snapshot*), for the watermark
handshake (docs/design.md, invariant 3): a read captures the longest prefix of the log
whose transactions are all visible in that snapshot, and stops before the first one that
is not. A subquery's read must capture *exactly* the transactions its snapshot sees; when
the snapshot sees a transaction that commits after one it does not see (visibility order
is not always log order), the read raises ``SnapshotRace`` and the subquery takes another
snapshot (``docs/capture.md`` has the argument).

The log is streamed (``log_stream``): a transaction arriving wakes the wrapper's ship loop,
which polls at once (``PollPacing``), so a transaction is captured about as soon as it is
visible, not at the next poll. Polls of a quiet log are spaced out: each takes a snapshot
of the source for nothing. That costs subqueries nothing either: their own reads capture
what their snapshots see.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa

from wrappers.capture.base import OutboxRow
from wrappers.capture.log_rows import TransactionRows
from wrappers.errors import WrapperError


class SnapshotRace(WrapperError):
    """The snapshot sees a transaction that committed after one it does not see yet: no
    prefix of the log matches it. Taking a new snapshot a moment later resolves it."""


class Rows(Protocol):
    """A transaction's rows: a tuple, or ``log_rows.TransactionRows`` (spilled to disk past a
    bound), read by iterating, from the start each time."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[OutboxRow]: ...


@dataclass(frozen=True)
class LogTransaction:
    """One committed source transaction read from the log (its rows of captured tables)."""

    xid: str
    end: int  # the log position just after its commit: resuming there skips it
    rows: Rows
    committed_at: float

    def close(self) -> None:
        """Let go of its rows' file, if they spilled to one (``log_rows``)."""
        if isinstance(self.rows, TransactionRows):
            self.rows.close()


@dataclass(frozen=True)
class LogRead:
    """What one read found: ``transactions`` to capture, in log order, and the position the
    log is handled through (at least the last transaction's end; beyond it where the log
    holds nothing more for the captured tables that the snapshot sees). ``more``: the
    stream already holds transactions beyond them (committed after the snapshot, or not
    visible in it yet), which the next poll should take soon."""

    transactions: list[LogTransaction]
    through: int
    more: bool = False


IDLE_AFTER_EMPTY_POLLS = 4
"""Polls in a row that find nothing before polls are spaced out (a busy log never is)."""

IDLE_POLL_MAX_SECONDS = 0.4
"""The longest time between two polls of a quiet log. A transaction arriving from the log
makes the next poll due at once, so this delays nothing: what is left for a poll of a quiet
log to do is to record how far the log is handled."""

RETRY_SECONDS = 0.001
"""After a read that left transactions behind (the stream holds transactions its snapshot
did not see yet), the next poll comes this soon, twice as late after each further one, up
to the poll interval."""


class PollPacing:
    """When the next poll reads the log, apart from the polls a transaction arriving from the
    log starts at once (``Wrapper._arrived``): soon when a read left some behind (``more``),
    every poll interval while reads find transactions; after ``IDLE_AFTER_EMPTY_POLLS`` polls in a row found none,
    twice as long after each further empty one, up to ``IDLE_POLL_MAX_SECONDS``. Any read
    that finds a transaction (a poll's or a subquery's) makes the next poll due at once.

    >>> pacing = PollPacing(0.05)
    >>> for _ in range(IDLE_AFTER_EMPTY_POLLS):
    ...     pacing.read(0.0, found=False, poll=True)
    >>> pacing.due(0.09), pacing.due(0.1)
    (False, True)
    >>> for _ in range(10):
    ...     pacing.read(1.0, found=False, poll=True)
    >>> pacing.due(1.39), pacing.due(1.4), round(pacing.wait(1.0, 1.0), 3)
    (False, True, 0.4)
    >>> pacing.read(2.0, found=False, poll=True, more=True)
    >>> pacing.due(2.0), pacing.due(2.001)
    (False, True)
    >>> pacing.read(2.001, found=False, poll=True, more=True)
    >>> round(pacing.wait(2.001, 1.0), 3)
    0.002
    >>> pacing.read(2.1, found=True, poll=False)
    >>> pacing.due(2.1)
    True
    """

    def __init__(self, poll_interval: float) -> None:
        self._interval = poll_interval
        self._empty_polls = 0
        self._retries = 0
        self._next_at = 0.0

    def due(self, now: float) -> bool:
        return now >= self._next_at

    def wait(self, now: float, longest: float) -> float:
        """Seconds until the next poll is due, at most ``longest``."""
        return min(longest, max(0.0, self._next_at - now))

    def read(self, now: float, *, found: bool, poll: bool, more: bool = False) -> None:
        """A read at ``now`` found transactions (``found``) or not; ``poll``: a poll's read
        (a subquery's read that finds nothing says nothing about how busy the log is);
        ``more``: it left transactions behind that a later snapshot will see."""
        if more:
            self._empty_polls = 0
            self._next_at = now + min(self._interval, RETRY_SECONDS * 2 ** min(self._retries, 16))
            self._retries += 1
            return
        self._retries = 0
        if found:
            self._empty_polls, self._next_at = 0, 0.0
        elif poll:
            self._empty_polls += 1
            beyond = self._empty_polls - IDLE_AFTER_EMPTY_POLLS
            if beyond >= 0:
                wait = min(self._interval * 2 ** min(beyond + 1, 16), max(IDLE_POLL_MAX_SECONDS, self._interval))
                self._next_at = now + wait


class LogReader(Protocol):
    def read(self, conn: sa.Connection, after: int, *, exact: bool) -> LogRead:
        """The transactions after position ``after`` visible in ``conn``'s snapshot that form
        a prefix of the log; with ``exact``, SnapshotRace unless they are *all* the
        transactions the snapshot sees beyond ``after``."""
        ...

    def confirm(self, position: int) -> None:
        """Every update up to ``position`` is acknowledged: the server may release the log before it."""
        ...

    def check_position(self, captured_through: int) -> None:
        """WrapperError if the log cannot resume at ``captured_through`` (the slot or the
        log was re-created since the state was written)."""
        ...

    def status(self) -> dict[str, Any]:
        """What health shows: the log retained for the wrapper, the capture lag."""
        ...

    def on_transaction(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from another thread) whenever a transaction of the captured
        tables arrives from the log, so that it is captured without waiting for a poll."""
        ...

    def close(self) -> None:
        """Stop reading the log (its connection and thread)."""
        ...


def visible_prefix(
    transactions: Iterable[LogTransaction], visible: Callable[[str], bool], *, exact: bool
) -> tuple[list[LogTransaction], bool]:
    """The transactions (in log order) before the first one ``visible`` says the snapshot
    does not see, and whether there was none such; with ``exact``, SnapshotRace if a
    transaction after that first hidden one is visible.

    >>> t = [LogTransaction(x, i, (), 0.0) for i, x in enumerate("abcd")]
    >>> prefix, complete = visible_prefix(t, lambda x: x != "c", exact=False)
    >>> [x.xid for x in prefix], complete
    (['a', 'b'], False)
    >>> prefix, complete = visible_prefix(t, lambda x: True, exact=True)
    >>> [x.xid for x in prefix], complete
    (['a', 'b', 'c', 'd'], True)
    >>> visible_prefix(t, lambda x: x != "c", exact=True)
    Traceback (most recent call last):
    ...
    wrappers.capture.log.SnapshotRace: the snapshot sees transaction d but not c, which committed before it
    """
    prefix: list[LogTransaction] = []
    hidden: LogTransaction | None = None
    for transaction in transactions:
        if hidden is None:
            if visible(transaction.xid):
                prefix.append(transaction)
                continue
            hidden = transaction
            if not exact:
                break
        elif visible(transaction.xid):
            raise SnapshotRace(
                f"the snapshot sees transaction {transaction.xid} but not {hidden.xid}, which committed before it"
            )
    return prefix, hidden is None
