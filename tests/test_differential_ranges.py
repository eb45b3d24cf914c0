"""Range checksums (ID/RCS), the distance metric, and the second pass."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wrappers.differential import (
    Change,
    KeyRange,
    RangeChecksumCopy,
    SnapshotError,
    apply_changes,
    plan_ranges,
    range_sum,
    remove_useless_pairs,
    snapshot_distance,
)
from wrappers.differential.distance import critical_displacement_bytes, displacement_stats
from wrappers.differential.range_checksums import source_checksums
from wrappers.differential.second_pass import extra_messages, useless_pairs


class Source:
    """A queryable table at the source: counts range queries that ship rows."""

    def __init__(self, rows):
        self.table = dict(rows)
        self.shipped: list[KeyRange] = []
        self.probed: list[KeyRange] = []

    def local(self, r):
        return [(k, v) for k, v in self.table.items() if k in r]

    def source_sum(self, r):
        self.probed.append(r)
        return range_sum(self.local(r))

    def fetch(self, r):
        self.shipped.append(r)
        return self.local(r)


def exact(old, new):
    a, b = dict(old), dict(new)
    return {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


@given(
    n=st.integers(0, 60),
    per=st.integers(1, 9),
    edits=st.lists(st.tuples(st.sampled_from(["ins", "del", "upd"]), st.integers(-5, 70)), max_size=12),
)
@settings(max_examples=80, deadline=None)
def test_only_changed_ranges_are_shipped_and_the_diff_is_exact(n, per, edits):
    rows = [((i,), (f"v{i}",)) for i in range(0, 2 * n, 2)]
    src = Source(rows)
    copy = RangeChecksumCopy(rows, rows_per_range=per)
    old = dict(rows)
    for op, k in edits:
        key = (k,)
        if op == "ins" and key not in src.table:
            src.table[key] = ("new",)
        elif op == "del":
            src.table.pop(key, None)
        elif op == "upd" and key in src.table:
            src.table[key] = ("upd",)
    ranges_before = list(copy.ranges)
    changed_keys = exact(old, src.table)
    result = copy.refresh(src.source_sum, src.fetch)
    # every range is probed once; exactly the ranges holding a changed key are shipped
    assert src.probed == ranges_before
    touched = [r for r in ranges_before if any(k in r for k in changed_keys)]
    assert src.shipped == touched == result.changed
    assert result.rows_shipped == sum(len([k for k in src.table if k in r]) for r in touched)
    # the changes are the exact differential, deletes first, and the copy is the table now
    changes = list(result.changes)
    assert {c.key for c in changes} == changed_keys
    assert apply_changes(dict(old), changes) == src.table
    assert dict(copy.records()) == src.table
    assert list(copy.records()) == sorted(src.table.items())
    # a second refresh ships nothing
    src.shipped.clear()
    assert len(copy.refresh(src.source_sum, src.fetch).changes) == 0 and src.shipped == []


def test_unchanged_ranges_are_never_fetched_with_a_sql_like_source():
    rows = [((i,), (i * 10,)) for i in range(1000)]
    src = Source(rows)
    copy = RangeChecksumCopy(rows, rows_per_range=100)
    src.table[(505,)] = (-1,)
    src.table[(2000,)] = (1,)  # beyond the last boundary: the open-ended last range
    result = copy.refresh(source_checksums(src.local), src.fetch)
    assert len(src.shipped) == 2
    assert sorted((c.kind, c.key) for c in result.changes) == [("insert", (2000,)), ("update", (505,))]


def test_ranges_grow_and_split_and_replan():
    rows = [((i,), ("x",)) for i in range(10)]
    src = Source(rows)
    copy = RangeChecksumCopy(rows, rows_per_range=5)
    assert len(copy.ranges) == 2
    for i in range(100, 130):
        src.table[(i,)] = ("y",)
    copy.refresh(src.source_sum, src.fetch)
    assert len(copy.ranges) > 2 and max(len(copy.rows(i)) for i in range(len(copy.ranges))) <= 10
    assert dict(copy.records()) == src.table
    copy.replan(rows_per_range=20)
    assert len(copy.ranges) == 2 and dict(copy.records()) == src.table
    assert len(copy.refresh(src.source_sum, src.fetch).changes) == 0


def test_bad_range_answers_raise_snapshot_error():
    rows = [((i,), ("x",)) for i in range(10)]
    copy = RangeChecksumCopy(rows, rows_per_range=5)
    with pytest.raises(SnapshotError, match="outside the requested range"):
        copy.refresh(lambda r: range_sum([]), lambda r: [((99,), ("x",))] if r.hi is not None else [])
    copy = RangeChecksumCopy(rows, rows_per_range=5)
    with pytest.raises(SnapshotError, match="duplicate key"):
        copy.refresh(lambda r: range_sum([]), lambda r: [((1,), ("a",)), ((1,), ("b",))] if r.lo is None else [])
    with pytest.raises(SnapshotError, match="strictly increasing"):
        plan_ranges([(2,), (1,)], 1)


def test_key_range_sql_predicate_for_composite_keys():
    sql, params = KeyRange(("a", 1), None).sql_predicate(["region", "id"])
    assert sql == "(region, id) >= (:lo0, :lo1)" and params == {"lo0": "a", "lo1": 1}


# -- distance ---------------------------------------------------------------------------------
def test_distance_hand_checked_examples():
    assert snapshot_distance([], []) == 0.0
    assert snapshot_distance([1, 2, 3, 4], [1, 2, 3, 4]) == 0.0
    assert snapshot_distance([1, 2, 3, 4], [4, 3, 2, 1]) == 1.0  # |0-3|+|1-2|+|2-1|+|3-0| = 8 over 16/2
    assert snapshot_distance([1, 2, 3, 4], [2, 1, 3, 4]) == 2 / 8
    # unmatched records count only in the normaliser: max(4, 2)**2 / 2 = 8
    assert snapshot_distance([1, 2, 3, 4], [5, 1]) == 1 / 8
    # symmetric
    assert snapshot_distance([1, 2, 3], [3, 1, 2]) == snapshot_distance([3, 1, 2], [1, 2, 3]) == 4 / 4.5
    s = displacement_stats("abcd", "badc")
    assert (s.matched, s.total, s.maximum, s.average) == (4, 4, 1, 1.0)
    assert critical_displacement_bytes(0.24, 650_000, 150) / 2**20 == pytest.approx(11.16, abs=0.01)


# -- second pass ------------------------------------------------------------------------------
def test_second_pass_removes_pairs_and_keeps_the_rest():
    changes = [
        Change.delete((1,), ("a",)),
        Change.delete((2,), ("b",)),
        Change.delete((3,), None),  # old values unknown: the pair becomes an update
        Change.delete((4,), ("d",)),
        Change.update((5,), ("e",), ("E",)),
        Change.insert((1,), ("a",)),
        Change.insert((2,), ("B",)),
        Change.insert((3,), ("c",)),
        Change.insert((6,), ("f",)),
    ]
    out = remove_useless_pairs(changes).to_list()
    assert out == [
        Change.delete((4,), ("d",)),
        Change.update((2,), ("b",), ("B",)),
        Change.update((3,), None, ("c",)),
        Change.update((5,), ("e",), ("E",)),
        Change.insert((6,), ("f",)),
    ]
    assert useless_pairs(changes) == [(1,), (2,), (3,)]
    assert extra_messages(changes, out) == 4
    start = {(1,): ("a",), (2,): ("b",), (3,): ("c0",), (4,): ("d",), (5,): ("e",)}
    assert apply_changes(dict(start), changes) == apply_changes(dict(start), out)
