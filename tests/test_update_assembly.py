"""A read's rows into updates, a part at a time (``wrappers.update_assembly``).

Against the rule updates always followed (a transaction is never split; consecutive ones
merge while the update stays within ``rows_per_update`` rows; an update of exactly one known
transaction names it), written as it was when a read was held whole: for random reads, the
updates recorded are the rule's, their parts are within the limits, and capture never held
more than one part's changes.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from contract.schemas import Change
from wrappers.capture.base import OutboxRow
from wrappers.parts import HeldChanges, PartLimits
from wrappers.state import WrapperState
from wrappers.update_assembly import Assembly


def changes_of(rows: Sequence[OutboxRow]) -> list[Change]:
    """0, 1 or 2 changes per row, by its id (filtered away, an insert, an update)."""
    return [Change(relation="r", sign=1, row={"id": r.id, "i": i}) for r in rows for i in range(r.id % 3)]


def reference(transactions: list[list[OutboxRow]], rows_per_update: int) -> list[list[list[OutboxRow]]]:
    """The transactions of each update, by the rule as it was applied to a whole read."""
    if any(t[0].txid is None for t in transactions):
        return [transactions] if transactions else []
    updates: list[list[list[OutboxRow]]] = []
    update: list[list[OutboxRow]] = []
    for transaction in transactions:
        if update and sum(map(len, update)) + len(transaction) > rows_per_update:
            updates.append(update)
            update = []
        update.append(transaction)
    return updates + ([update] if update else [])


def capture(state: WrapperState, rows: list[OutboxRow], limits: PartLimits, held: HeldChanges) -> None:
    """What the wrapper's capture does with a read's rows."""
    reading = iter(rows)
    with Assembly(state, changes_of, limits, held, keep_ids=True) as assembly:
        while batch := list(itertools.islice(reading, assembly.room())):
            for txid, run in itertools.groupby(batch, key=lambda row: row.txid):
                taken = list(run)
                assembly.add(taken, txid, max(row.id for row in taken))
        assembly.finish()


@settings(max_examples=100, deadline=None)
@example(sizes=[2, 3, 1], known=True, changes=10, part_bytes=8 << 20)  # one that fits exactly, merged
@example(sizes=[1, 30, 2, 2], known=True, changes=10, part_bytes=8 << 20)  # one held back, then alone
@given(
    sizes=st.lists(st.integers(1, 40), max_size=12),
    known=st.booleans(),
    changes=st.integers(2, 30),
    part_bytes=st.sampled_from([60, 300, 8 << 20]),
)
def test_updates_follow_the_rule_and_capture_holds_one_part(
    sizes: list[int], known: bool, changes: int, part_bytes: int
) -> None:
    limits = PartLimits(changes=changes, bytes=part_bytes)
    ids = itertools.count(1)
    transactions = [
        [OutboxRow(next(ids), "r", "I", None, {}, f"t{t}" if known else None) for _ in range(size)]
        for t, size in enumerate(sizes)
    ]
    expected = [  # the changes and transactions of each update with changes (others get no seq)
        (want, update)
        for update in reference(transactions, limits.rows_per_update)
        if (want := changes_of([r for t in update for r in t]))
    ]
    held = HeldChanges()
    with tempfile.TemporaryDirectory() as tmp:
        state = WrapperState(Path(tmp), "s", limits)
        try:
            capture(state, [r for t in transactions for r in t], limits, held)
            heads = state.pending(1000)
            recorded = [[c for i in range(h.parts) for c in state.part(h.seq, i)] for h in heads]
            parts = [state.part(h.seq, i) for h in heads for i in range(h.parts)]
            assert recorded == [want for want, _ in expected]
            assert [h.txid for h in heads] == [
                update[0][0].txid if len(update) == 1 else None for _, update in expected
            ]
            assert [h.changes for h in heads] == [len(r) for r in recorded]
            assert [h.seq for h in heads] == list(range(1, len(heads) + 1)) and state.last_seq == len(heads)
            assert state.captured_through == sum(sizes)
            assert set(state.captured_ids) == set(range(1, sum(sizes) + 1))  # every row, filtered ones too
            for part in parts:
                assert 1 <= len(part) <= limits.changes
                text = b"[" + b",".join(c.model_dump_json().encode() for c in part) + b"]"
                assert len(part) == 1 or len(text) <= limits.bytes
        finally:
            state.close()
    assert held.now == 0 and held.peak <= limits.changes
