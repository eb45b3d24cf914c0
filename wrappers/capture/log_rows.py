"""The rows of one transaction read from a log, in memory up to a bound and on disk beyond.

A log delivers a transaction row by row between its begin and its commit, and a source
transaction may change millions of rows. The stream's decoder collects them in a
``RowsBuilder``: the first ``SPILL_ROWS`` stay in memory; past them, rows go to an anonymous
temporary file (``tempfile.TemporaryFile``: created unlinked, readable by this process only,
gone when closed or when the process dies, so a crash leaves nothing behind) in pickled
chunks of ``CHUNK_ROWS``, and at most one chunk is in memory. ``finish`` at the commit gives
the transaction's ``TransactionRows``, which the wrapper reads a chunk at a time into the
parts of its update (``wrappers.update_assembly``), as many times as reads need (a read may
see a transaction that its snapshot does not show yet, and take it later).

>>> from wrappers.capture.base import OutboxRow
>>> builder = RowsBuilder(spill_rows=4, chunk_rows=2)
>>> for i in range(7):
...     builder.append(OutboxRow(i, "r", "I", None, {"id": i}))
>>> rows = builder.finish()
>>> len(rows), rows.spilled, [row.id for row in rows]  # 0-3 spilled at the fourth, then 4-5
(7, 6, [0, 1, 2, 3, 4, 5, 6])
>>> [row.id for row in rows] == list(range(7))  # read again from the start
True
>>> rows.close()
"""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Iterator
from typing import IO

from wrappers.capture.base import OutboxRow

SPILL_ROWS = 10_000
"""Rows of one transaction kept in memory; past them, its rows go to a temporary file."""

CHUNK_ROWS = 1_000
"""Rows written to (and read back from) the temporary file at once."""


class TransactionRows:
    """A transaction's rows, in order: ``len``, iteration (from the start, each time), and
    ``close`` to remove the file of a spilled one (closing also happens when it is freed)."""

    def __init__(self, tail: list[OutboxRow], file: IO[bytes] | None = None, chunks: int = 0, spilled: int = 0) -> None:
        self._tail = tail
        self._file = file
        self._chunks = chunks
        self.spilled = spilled
        """Rows in the file, read back a chunk at a time."""

    def __len__(self) -> int:
        return self.spilled + len(self._tail)

    def __iter__(self) -> Iterator[OutboxRow]:
        if self._file is not None:
            self._file.seek(0)
            for _ in range(self._chunks):
                chunk: list[OutboxRow] = pickle.load(self._file)  # this process wrote it
                yield from chunk
        yield from self._tail

    def __eq__(self, other: object) -> bool:
        """The same rows in the same order (reading a spilled one back)."""
        if not isinstance(other, TransactionRows | tuple | list):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # equal by content, which a file does not fix

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class RowsBuilder:
    """Collects a transaction's rows as the log delivers them (see the module's docstring)."""

    def __init__(self, spill_rows: int | None = None, chunk_rows: int | None = None) -> None:
        self._spill_rows = SPILL_ROWS if spill_rows is None else spill_rows  # read now: tests lower them
        self._chunk_rows = CHUNK_ROWS if chunk_rows is None else chunk_rows
        self._rows: list[OutboxRow] = []
        self._file: IO[bytes] | None = None
        self._chunks = 0
        self._spilled = 0

    def __len__(self) -> int:
        return self._spilled + len(self._rows)

    def append(self, row: OutboxRow) -> None:
        self._rows.append(row)
        if len(self._rows) >= (self._chunk_rows if self._file is not None else self._spill_rows):
            self._spill()

    def finish(self) -> TransactionRows:
        """The rows collected (the builder is spent)."""
        rows = TransactionRows(self._rows, self._file, self._chunks, self._spilled)
        self._rows, self._file = [], None
        return rows

    def _spill(self) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="pvm-log-rows-")  # kept open: it is the storage
        for start in range(0, len(self._rows), self._chunk_rows):
            pickle.dump(self._rows[start : start + self._chunk_rows], self._file, protocol=pickle.HIGHEST_PROTOCOL)
            self._chunks += 1
        self._spilled += len(self._rows)
        self._rows = []
