"""The window algorithm (Labio & Garcia-Molina, section 4, Fig. 5 and 6).

Both snapshots are read exactly once, side by side, ``input_records`` at a time into an
*input buffer* each. Each round:

1. records of input buffer 1 are matched against input buffer 2 and *aging buffer* 2; the
   remaining records of input buffer 2 against aging buffer 1 (matches with a different
   rest are updates; matched records leave the buffers);
2. unmatched records enter their aging buffer, a hash table with an embedded *aging queue*
   (oldest at the head). When an aging buffer is full, the oldest record is *displaced*:
   from aging buffer 1 it is reported as a delete, from aging buffer 2 as an insert.

At the end the aging buffers' remaining records are deletes and inserts. IO is
``|F1| + |F2|`` whatever the sizes, but a record whose partner is further away than the
aging buffer holds is reported as a delete *and* an insert: a useless delete-insert pair
(an *extra message*), harmless because all deletes are sent before inserts. Once the
aging buffer covers the displacement of records between the snapshots (see
``distance.displacement_stats``; a buffer of the maximum displacement plus two input
buffers suffices), the output is exact. ``second_pass=True`` removes the pairs afterwards
(``second_pass.remove_useless_pairs``).

Duplicate keys are detected when they meet in a window (the algorithm holds no more than
its buffers); the outer-join algorithms detect all of them. Duplicates further apart come
out as a second insert (or update) of the key, or as an insert of a key the old snapshot
has and that was matched: a caller that holds the old snapshot's keys can tell them from
the output, as snapshot capture does against its replica
(``wrappers.capture.differencing.SnapshotCapture._check_keys``).

>>> old = [((1,), ("a",)), ((2,), ("b",)), ((3,), ("c",)), ((4,), ("d",))]
>>> new = [((2,), ("b",)), ((1,), ("a",)), ((4,), ("D",)), ((5,), ("e",))]
>>> r = window_diff(old, new, input_records=1, aging_records=4)
>>> [(c.kind, c.key) for c in r.changes]
[('delete', (3,)), ('update', (4,)), ('insert', (5,))]
>>> far = window_diff(old, list(reversed(old)), input_records=1, aging_records=1)
>>> len(far.changes) > 0, len(window_diff(old, list(reversed(old)), input_records=1, aging_records=4).changes)
(True, 0)
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from itertools import islice
from typing import Any

from wrappers.differential.errors import SnapshotError
from wrappers.differential.memory_snapshots import as_snapshot
from wrappers.differential.messages import DELETE, INSERT, UPDATE, Change, ChangeList, DiffResult, DiffStats
from wrappers.differential.record_schema import Record, check_compatible
from wrappers.differential.record_sizes import estimate_record_bytes
from wrappers.differential.snapshot import Snapshot
from wrappers.differential.spill import DEFAULT_BUDGET, IOStats, MemoryBudget, SpillList, without_gc

__all__ = ["DEFAULT_AGING_RECORDS", "DEFAULT_INPUT_RECORDS", "window_diff"]

DEFAULT_INPUT_RECORDS = 128
DEFAULT_AGING_RECORDS = 65536
_MISSING = object()


@without_gc
def window_diff(
    old: Snapshot | Iterable[Record],
    new: Snapshot | Iterable[Record],
    *,
    input_records: int = DEFAULT_INPUT_RECORDS,
    aging_records: int | None = None,
    aging_bytes: int | None = None,
    second_pass: bool = False,
    budget: MemoryBudget | None = None,
    spill_dir: str | os.PathLike[str] | None = None,
    stats: IOStats | None = None,
) -> DiffResult:
    """Difference two snapshots with the window algorithm; see the module docstring.

    The aging buffers hold ``aging_records`` records each, or as many as fit in
    ``aging_bytes`` nominal bytes (estimated from the first input buffer); the default is
    ``DEFAULT_AGING_RECORDS``. ``budget`` bounds the change lists kept in memory. The
    result has no ``state``.
    """
    if not isinstance(input_records, int) or input_records < 1:
        raise ValueError(f"input_records must be a positive integer, got {input_records!r}")
    if aging_records is not None and aging_bytes is not None:
        raise ValueError("give aging_records or aging_bytes, not both")
    stats = stats if stats is not None else IOStats()
    budget = budget or DEFAULT_BUDGET
    old_snap = as_snapshot(old, "old snapshot")
    new_snap = as_snapshot(new, "new snapshot")
    check_compatible(old_snap.schema, new_snap.schema, old_snap.name, new_snap.name)

    it1 = old_snap.scan(stats)
    head = list(islice(it1, input_records))  # the first input buffer, to size things by
    rb = estimate_record_bytes(head)
    if aging_records is None:
        aging_records = max(1, int(aging_bytes // rb)) if aging_bytes is not None else DEFAULT_AGING_RECORDS
    if not isinstance(aging_records, int) or aging_records < 1:
        raise ValueError(f"aging_records must be a positive integer, got {aging_records!r}")
    it2 = new_snap.scan(stats)
    cap = aging_records
    change_cap = budget.capacity(rb)

    dels = SpillList(change_cap, spill_dir, stats)
    others = SpillList(change_cap, spill_dir, stats)
    add_del = dels.append
    add_other = others.append
    # An aging buffer is a dict: a hash table whose insertion order is the aging queue
    # (oldest first). Displacing the oldest records walks the table from its start, past
    # the slots of records already gone; rebuilding it now and then keeps that walk short.
    ab1: dict[Any, Any] = {}
    ab2: dict[Any, Any] = {}
    pop1, pop2 = ab1.pop, ab2.pop
    put1, put2 = ab1.setdefault, ab2.setdefault
    gone1 = gone2 = 0  # records displaced since the table was last rebuilt
    rebuild = max(1024, cap // 4)
    missing = _MISSING
    n = input_records
    n1 = n2 = 0
    displaced_deletes = displaced_inserts = 0

    ib1 = head
    del head
    while True:
        ib2 = list(islice(it2, n))
        if not ib1 and not ib2:
            break
        n1 += len(ib1)
        n2 += len(ib2)
        # (5) input buffer 1 against aging buffer 2; the unmatched records join aging buffer 1
        # at its young end right away, so that (4)+(6) below are one probe: input buffer 2
        # against input buffer 1 and aging buffer 1. Displacement waits for the end of the
        # round (7), which is what the paper's order of steps amounts to.
        for k, b in ib1:
            b2 = pop2(k, missing)
            if b2 is missing:
                if put1(k, b) is not b:
                    raise SnapshotError(f"duplicate key {k!r} in the {old_snap.name}")
            elif b2 != b:
                add_other(Change(UPDATE, k, b, b2))
        for k, b2 in ib2:
            b1 = pop1(k, missing)
            if b1 is missing:
                if put2(k, b2) is not b2:
                    raise SnapshotError(f"duplicate key {k!r} in the {new_snap.name}")
            elif b1 != b2:
                add_other(Change(UPDATE, k, b1, b2))
        # (7), (8): the oldest records are displaced when an aging buffer is over capacity
        if len(ab1) > cap:
            excess = len(ab1) - cap
            for dk in list(islice(ab1, excess)):
                add_del(Change(DELETE, dk, pop1(dk), None))
            displaced_deletes += excess
            gone1 += excess
            if gone1 >= rebuild:
                ab1 = dict(ab1)
                pop1, put1, gone1 = ab1.pop, ab1.setdefault, 0
        if len(ab2) > cap:
            excess = len(ab2) - cap
            for dk in list(islice(ab2, excess)):
                add_other(Change(INSERT, dk, None, pop2(dk)))
            displaced_inserts += excess
            gone2 += excess
            if gone2 >= rebuild:
                ab2 = dict(ab2)
                pop2, put2, gone2 = ab2.pop, ab2.setdefault, 0
        ib1 = list(islice(it1, n))  # (9), (10): refill the input buffers

    for k, b in ab1.items():
        add_del(Change(DELETE, k, b, None))
    for k, b in ab2.items():
        add_other(Change(INSERT, k, None, b))

    changes = ChangeList(dels, others)
    removed = 0
    if second_pass:
        from wrappers.differential.second_pass import remove_useless_pairs

        before = len(changes)
        changes = remove_useless_pairs(changes, budget=budget, spill_dir=spill_dir, stats=stats)
        removed = before - len(changes)
    st = DiffStats(
        "window",
        old_records=n1,
        new_records=n2,
        io=stats,
        in_memory=not (dels.spilled or others.spilled),
        details={
            "input_records": n,
            "aging_records": cap,
            "displaced_deletes": displaced_deletes,
            "displaced_inserts": displaced_inserts,
            "messages_removed_by_second_pass": removed,
        },
    )
    return DiffResult(changes, None, st)
