"""The optional second pass: remove useless delete-insert pairs from a change stream.

A *useless delete-insert pair* reports the same key as deleted and inserted (section 1.1
of Labio & Garcia-Molina). The window algorithm produces them for records displaced
further than its aging buffer. They do no harm when deletes are sent first, but each costs
messages. The second pass sorts the (usually small) change stream by key, spilling to disk
past the memory budget, and replaces every pair by what it means:

* nothing, when the deleted record and the inserted record are identical;
* an update, when they differ (or when the delete does not carry the old values).

>>> changes = [Change.delete((1,), ("a",)), Change.delete((2,), ("b",)),
...            Change.insert((1,), ("a",)), Change.insert((2,), ("B",)), Change.insert((3,), ("c",))]
>>> remove_useless_pairs(changes).to_list()
[Change(kind='update', key=(2,), old=('b',), new=('B',)), Change(kind='insert', key=(3,), old=None, new=('c',))]
>>> useless_pairs(changes)
[(1,), (2,)]
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from wrappers.differential.errors import SnapshotError
from wrappers.differential.messages import DELETE, INSERT, UPDATE, Change, ChangeList
from wrappers.differential.spill import DEFAULT_BUDGET, IOStats, MemoryBudget, SpillList, external_sort, without_gc

__all__ = ["extra_messages", "remove_useless_pairs", "useless_pairs"]

_RANK = {DELETE: 0, UPDATE: 1, INSERT: 2}
_CHANGE_BYTES = 200.0  # nominal size of a change (a key and one or two rests)


@without_gc
def remove_useless_pairs(
    changes: Iterable[Change],
    *,
    budget: MemoryBudget | None = None,
    spill_dir: str | os.PathLike[str] | None = None,
    stats: IOStats | None = None,
) -> ChangeList:
    """The changes without useless delete-insert pairs, in sending order (deletes first,
    then updates and inserts, each in key order). Keys must be mutually comparable."""
    budget = budget or DEFAULT_BUDGET
    stats = stats if stats is not None else IOStats()
    cap = budget.capacity(_CHANGE_BYTES)
    items = ((c.key, _RANK[c.kind], i, c.kind, c.old, c.new) for i, c in enumerate(changes))
    try:
        ordered = external_sort(items, capacity=cap, directory=spill_dir, stats=stats)
        dels = SpillList(cap, spill_dir, stats)
        others = SpillList(cap, spill_dir, stats)

        def emit(item: tuple[Any, ...]) -> None:
            key, _, _, kind, old, new = item
            (dels if kind == DELETE else others).append(Change(kind, key, old, new))

        prev: tuple[Any, ...] | None = None
        for item in ordered:
            if prev is not None:
                if prev[3] == DELETE and item[3] == INSERT and prev[0] == item[0]:
                    old, new = prev[4], item[5]
                    if old is None or old != new:
                        others.append(Change(UPDATE, item[0], old, new))
                    prev = None
                    continue
                emit(prev)
            prev = item
        if prev is not None:
            emit(prev)
    except TypeError as exc:
        raise SnapshotError(f"keys of the changes cannot be ordered ({exc})") from None
    return ChangeList(dels, others)


def useless_pairs(changes: Iterable[Change]) -> list[tuple[Any, ...]]:
    """Keys reported both as deleted and as inserted (in memory), in order of the inserts."""
    deleted = set()
    inserted = []
    for c in changes:
        if c.kind == DELETE:
            deleted.add(c.key)
        elif c.kind == INSERT:
            inserted.append(c.key)
    return [k for k in inserted if k in deleted]


def extra_messages(changes: Iterable[Change], exact: Iterable[Change]) -> int:
    """How many more messages ``changes`` has than the exact differential ``exact``.

    A useless pair for an unchanged record costs 2 extra messages, for an updated one 1.

    >>> extra_messages([Change.delete((1,)), Change.insert((1,), ("a",))], [])
    2
    """
    return sum(1 for _ in changes) - sum(1 for _ in exact)
