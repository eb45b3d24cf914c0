"""``wrappers.capture.log_stream``: the buffer between a log's connection and the reads, with
a scripted source in place of a server (the servers' streams run in test_capture_pg_log.py
and test_capture_maria_log.py)."""

from __future__ import annotations

import threading
import time

import pytest

from wrappers.capture import log_stream
from wrappers.capture.base import OutboxRow
from wrappers.capture.log import LogTransaction
from wrappers.capture.log_stream import Feed, LogStream, Streamed
from wrappers.errors import WrapperError


def item(end: int, rows: int = 1) -> Streamed:
    transaction = LogTransaction(
        str(end), end, tuple(OutboxRow(i, "r", "I", None, {"id": i}) for i in range(rows)), 0.0
    )
    return Streamed(transaction, end - 1)


class Scripted:
    """A source that delivers ``items`` (then its position past the last), then waits for
    ``stop``; or fails with ``fail`` once it has delivered them."""

    def __init__(self, items: list[Streamed], fail: str | None = None, begin: bool = True) -> None:
        self.items = items
        self.fail = fail
        self.begin = begin
        self.after: int | None = None
        self.stopped = threading.Event()
        self.delivered = threading.Event()

    def run(self, after: int, feed: Feed) -> None:
        self.after = after
        if not self.begin:
            raise WrapperError("the server refused the stream")
        feed.started()
        for streamed in self.items:
            if streamed.transaction.end > after:
                feed.transaction(streamed)
                feed.reached(streamed.transaction.end)
        self.delivered.set()
        if self.fail is not None:
            raise WrapperError(self.fail)
        self.stopped.wait(10)

    def stop(self) -> None:
        self.stopped.set()


def stream_of(*sources: Scripted) -> tuple[LogStream, list[Scripted]]:
    started: list[Scripted] = []
    queue = list(sources)

    def connect() -> Scripted:
        started.append(queue.pop(0))
        return started[-1]

    return LogStream(connect, "test"), started


def test_reads_take_what_arrived_and_forget_what_the_state_holds() -> None:
    arrivals: list[int] = []
    stream, started = stream_of(Scripted([item(10), item(20), item(30)]))
    stream.on_transaction(lambda: arrivals.append(1))
    try:
        stream.ensure(5)
        assert stream.wait_until(30, 5) and stream.position == 30
        assert [s.transaction.end for s in stream.transactions(5)] == [10, 20, 30]
        assert len(arrivals) == 3  # each arrival called back
        assert [s.transaction.end for s in stream.transactions(20)] == [30]  # 10 and 20 forgotten
        assert not stream.wait_until(31, 0.05)  # nothing beyond: False after the timeout
        stream.ensure(20)
        assert len(started) == 1  # still the same stream
    finally:
        stream.close()
    assert started[0].stopped.is_set()
    with pytest.raises(WrapperError, match="closed"):
        stream.ensure(30)


def test_a_read_going_back_or_a_failed_stream_starts_a_new_one() -> None:
    first = Scripted([item(10), item(20)])
    again = Scripted([item(10), item(20)], fail="connection lost")
    third = Scripted([item(10), item(20), item(40)])
    stream, started = stream_of(first, again, third)
    try:
        stream.ensure(0)
        assert stream.wait_until(20, 5)
        stream.transactions(20)  # forgets both
        stream.ensure(10)  # goes back: a new stream from 10
        assert started == [first, again] and again.after == 10
        again.delivered.wait(5)
        with pytest.raises(WrapperError, match="connection lost"):
            stream.wait_until(40, 5)  # a read waiting for a failed stream fails
        stream.ensure(20)  # the failure was reported: a new stream from 20
        assert started[-1] is third and third.after == 20
        assert stream.wait_until(40, 5)
        assert [s.transaction.end for s in stream.transactions(20)] == [40]
    finally:
        stream.close()


def test_a_stream_that_cannot_begin_fails_the_read() -> None:
    stream, _ = stream_of(Scripted([], begin=False))
    with pytest.raises(WrapperError, match="the server refused the stream"):
        stream.ensure(0)
    stream.close()


def test_a_full_buffer_stops_reading_until_a_read_takes_it_or_waits_beyond(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_stream, "MAX_BUFFERED_ROWS", 4)
    stream, _ = stream_of(Scripted([item(10, rows=3), item(20, rows=2), item(30, rows=2), item(40, rows=2)]))
    try:
        stream.ensure(0)
        deadline = time.monotonic() + 5
        while stream.position < 20:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.1)
        assert stream.position == 20  # 5 rows buffered: the source waits
        stream.transactions(10)  # 2 rows left: room again
        assert stream.wait_until(30, 5)
        time.sleep(0.1)
        assert stream.position == 30  # full again (4 rows)
        assert stream.wait_until(40, 5)  # a read waiting beyond the buffer lets it read on
        assert [s.transaction.end for s in stream.transactions(10)] == [20, 30, 40]
    finally:
        stream.close()
