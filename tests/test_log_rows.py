"""``wrappers.capture.log_rows``: a transaction read from a log keeps a bounded number of its
rows in memory and the rest in a temporary file, read back in order as often as needed, and
the file goes once the stream forgets the transaction."""

from __future__ import annotations

import os
import threading

import pytest

from wrappers.capture import log_rows
from wrappers.capture.base import OutboxRow
from wrappers.capture.log import LogTransaction
from wrappers.capture.log_rows import RowsBuilder
from wrappers.capture.log_stream import Feed, LogStream, Streamed


def row(i: int) -> OutboxRow:
    return OutboxRow(i, "r", "U", {"id": i, "v": "old"}, {"id": i, "v": "new " * 10})


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_large_transaction_keeps_a_bounded_number_of_rows_in_memory() -> None:
    builder = RowsBuilder(spill_rows=1_000, chunk_rows=100)
    most = 0
    for i in range(25_050):
        builder.append(row(i))
        most = max(most, len(builder._rows))
    rows = builder.finish()
    assert most == 999 and len(rows) == 25_050 and rows.spilled == 25_000
    assert [r.id for r in rows] == list(range(25_050))
    assert [r.new for r in rows][-1] == {"id": 25_049, "v": "new " * 10}
    assert sum(1 for _ in rows) == 25_050  # read again from the start
    rows.close()


def test_a_small_transaction_stays_in_memory() -> None:
    files = open_files()
    builder = RowsBuilder()
    for i in range(log_rows.SPILL_ROWS - 1):
        builder.append(row(i))
    rows = builder.finish()
    assert rows.spilled == 0 and len(rows) == log_rows.SPILL_ROWS - 1 and open_files() == files


class Once:
    """A log source that delivers ``items`` and then waits to be stopped."""

    def __init__(self, items: list[Streamed]) -> None:
        self.items = items
        self.stopped = threading.Event()

    def run(self, after: int, feed: Feed) -> None:
        feed.started()
        for streamed in self.items:
            feed.transaction(streamed)
            feed.reached(streamed.transaction.end)
        self.stopped.wait(10)

    def stop(self) -> None:
        self.stopped.set()


def spilled(end: int, count: int) -> Streamed:
    builder = RowsBuilder(spill_rows=10, chunk_rows=5)
    for i in range(count):
        builder.append(row(i))
    return Streamed(LogTransaction(str(end), end, builder.finish(), 0.0), end - 1)


@pytest.mark.parametrize("how", ["forgotten by a read", "stream closed"])
def test_a_spilled_transactions_file_goes_with_it(how: str) -> None:
    files = open_files()
    items = [spilled(10, 100), spilled(20, 100)]
    assert open_files() == files + 2  # one file each
    stream = LogStream(lambda: Once(items), "test")
    stream.ensure(0)
    assert stream.wait_until(20, 5)
    first, second = stream.transactions(0)
    assert [r.id for r in first.transaction.rows] == list(range(100))
    if how == "forgotten by a read":
        assert [s.transaction.end for s in stream.transactions(10)] == [20]  # the state holds the first
        assert open_files() == files + 1
        assert [r.id for r in second.transaction.rows] == list(range(100))
    stream.close()
    assert open_files() == files
