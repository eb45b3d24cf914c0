"""One read's captured rows into updates, written to the wrapper's state a part at a time.

A read (of the outbox, or of the log) hands over its rows in order, a run at a time, each run
of one source transaction; ``Assembly`` turns them into changes (the Interest's filter and
the fit check, ``ChangeFilter.changes``), cuts those into parts (``wrappers.parts``) and
writes each part to the state as soon as it is full (``WrapperState.write_part``), and
records an update (``WrapperState.record``) as soon as it is complete. Its rules are those
updates always had:

* a source transaction is never split: all its rows are in one update;
* consecutive transactions are merged while the update stays within
  ``PartLimits.rows_per_update`` rows (one part); a larger transaction is an update alone;
* an update names its transaction (``txid``) when it holds exactly one whose id is known.

Deciding whether a transaction joins the update before it needs its size, which a read
learns only at its end. So a transaction that follows others is held back (its changes,
*tentative*) while it still fits: once it no longer does, the update before it is recorded
and the transaction starts the next one, its held changes first; if it ends while it fits,
it is merged. The update's own rows are few enough then, and the transaction's at most what
is left of one part: with the update's buffered part, ``Assembly`` holds at most
``PartLimits.changes`` changes, provided the read hands over no more rows at a time than
``room`` says (an outbox or log row makes at most two changes).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Sequence

from contract.schemas import Change
from wrappers.capture.base import OutboxRow
from wrappers.parts import HeldChanges, Part, PartCutter, PartLimits, UpdateHead
from wrappers.state import WrapperState

ChangesOf = Callable[[Sequence[OutboxRow]], list[Change]]

TAKE_ROWS = 1_000
"""The most rows a read hands over at a time (``Assembly.room``)."""


class UpdateWriter:
    """The update being captured: its changes cut into parts and written to the state as the
    parts fill, under the seq it gets once recorded (the next one)."""

    def __init__(self, state: WrapperState, limits: PartLimits, held: HeldChanges, keep_ids: bool) -> None:
        state.drop_unrecorded()  # parts of a capture that failed before it recorded its update
        self._state = state
        self._held = held
        self._cutter = PartCutter(limits)
        self.seq = state.last_seq + 1
        self.parts = self.changes = self.bytes = 0
        self.rows = 0  # captured rows (outbox or log rows) in it so far
        self.through = 0  # the largest outbox id, or the log position after its last transaction
        self.ids: array[int] | None = array("q") if keep_ids else None  # its outbox ids, where not in commit order
        self.transactions: set[str | None] = set()

    @property
    def buffered(self) -> int:
        return self._cutter.buffered

    def add(self, changes: list[Change]) -> None:
        """Take ``changes`` (held by the caller: ``HeldChanges.hold``) after those added before;
        the changes of every part filled meanwhile are written and no longer held."""
        before = self._cutter.buffered + len(changes)
        for part in self._cutter.add(changes):
            self._write(part)
        self._held.release(before - self._cutter.buffered)

    def cut_part(self) -> None:
        """Write what is buffered as a part now (it frees the buffer for a held transaction)."""
        before = self._cutter.buffered
        part = self._cutter.cut()
        if part is not None:
            self._write(part)
            self._held.release(before)

    def discard(self) -> None:
        """Let go of the buffered changes: the capture failed (its parts are dropped with the
        next update's, ``WrapperState.drop_unrecorded``)."""
        self._held.release(self._cutter.buffered)
        self._cutter = PartCutter(self._cutter.limits)

    def note(self, rows: int, through: int, ids: Sequence[int] | array[int], transaction: str | None) -> None:
        """``rows`` captured rows of ``transaction``, up to outbox id or log position ``through``."""
        self.rows += rows
        self.through = max(self.through, through)
        if self.ids is not None:
            self.ids.extend(ids)
        self.transactions.add(transaction)

    def record(self) -> int | None:
        """Write the last part and record the update (None, and no seq, if every row was
        filtered away: its rows are still marked captured); its seq."""
        self.cut_part()
        head = None
        if self.changes:
            txid = next(iter(self.transactions)) if len(self.transactions) == 1 else None
            head = UpdateHead(self.seq, txid, time.time(), self.parts, self.changes, self.bytes)
        return self._state.record(head, self.through, self.ids if self.ids is not None else ())

    def _write(self, part: Part) -> None:
        self._state.write_part(self.seq, self.parts, part.text)
        self.parts += 1
        self.changes += part.changes
        self.bytes += len(part.text)


class Assembly:
    """The updates of one read (see the module's docstring). Feed it runs of rows with
    ``add``, at most ``room()`` rows at a time, and end with ``finish``; ``seqs`` are the
    updates recorded. Used as a context manager, it lets go of what it holds when the read
    fails midway."""

    def __init__(
        self, state: WrapperState, changes_of: ChangesOf, limits: PartLimits, held: HeldChanges, keep_ids: bool
    ) -> None:
        self._state = state
        self._changes_of = changes_of
        self._limits = limits
        self._held = held
        self._keep_ids = keep_ids
        self._writer: UpdateWriter | None = None
        self._transaction: str | None = None
        self._started = False  # whether a transaction was begun
        self._direct = True  # whether the transaction goes straight into the update
        self._rows = 0  # its rows so far
        self._through = 0
        self._tentative: list[Change] = []  # its changes, held back while it may still be merged
        self._tentative_ids: array[int] = array("q")
        self.seqs: list[int] = []

    def __enter__(self) -> Assembly:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.discard()
            self._writer = None
        self._held.release(len(self._tentative))
        self._tentative = []

    def room(self) -> int:
        """How many rows ``add`` may take next: their changes keep what is held within one
        part, and they are at most ``TAKE_ROWS`` (rows and their changes are Python objects,
        a part's buffered changes compact JSON text)."""
        writer = self._writer
        free = self._limits.changes - len(self._tentative) - (writer.buffered if writer is not None else 0)
        if free < 2 and writer is not None:
            writer.cut_part()
            free = self._limits.changes - len(self._tentative)
        return min(max(1, free // 2), TAKE_ROWS)

    def add(self, rows: Sequence[OutboxRow], transaction: str | None, through: int) -> None:
        """``rows`` of source ``transaction``, which capture stands after at outbox id or log
        position ``through``; rows of another transaction than the last call's end that one."""
        if not self._started or transaction != self._transaction:
            self._end_transaction()
            self._begin(transaction)
        changes = self._changes_of(rows)
        self._held.hold(len(changes))
        self._rows += len(rows)
        self._through = max(self._through, through)
        writer = self._writer
        assert writer is not None
        if self._direct:
            writer.add(changes)
            writer.note(len(rows), through, [r.id for r in rows] if self._keep_ids else (), transaction)
            return
        self._tentative.extend(changes)
        if self._keep_ids:
            self._tentative_ids.extend(r.id for r in rows)
        if writer.rows + self._rows > self._limits.rows_per_update:  # it no longer fits: it starts an update
            self._record(writer)
            self._writer = UpdateWriter(self._state, self._limits, self._held, self._keep_ids)
            self._place()
            self._direct = True

    def finish(self) -> None:
        """The read is over: record the update being captured."""
        self._end_transaction()
        if self._writer is not None:
            self._record(self._writer)
            self._writer = None

    def _begin(self, transaction: str | None) -> None:
        if self._writer is None:
            self._writer = UpdateWriter(self._state, self._limits, self._held, self._keep_ids)
        self._transaction, self._started = transaction, True
        self._direct = self._writer.rows == 0  # alone in its update so far: nothing to decide
        self._rows, self._through = 0, 0

    def _end_transaction(self) -> None:
        """The transaction read last ended within the update: merged into it."""
        if self._started and not self._direct:
            self._place()

    def _place(self) -> None:
        """Hand the held transaction, so far, to the update being captured."""
        assert self._writer is not None
        changes, self._tentative = self._tentative, []
        self._writer.add(changes)
        self._writer.note(self._rows, self._through, self._tentative_ids, self._transaction)
        self._tentative_ids = array("q")

    def _record(self, writer: UpdateWriter) -> None:
        seq = writer.record()
        if seq is not None:
            self.seqs.append(seq)
