"""The laws aggregate maintenance rests on (docs/aggregates.md), for any body Z-sets.

* ``encode`` is linear up to reading: the stored rows of ``a`` plus those of ``b`` read as
  the view of ``a + b``. Effects committed in any order, and any prefix of them read as of
  W, give the view of the body's sum: signed commits carry over to aggregates.
* Reading agrees with SQL: for a bag (positive weights), the view read from the stored rows
  equals the aggregate computed straight from the bag (``evaluate``), NULLs included.
* Deleting a group's extreme needs nothing but the stored rows: MIN/MAX after a delete
  equal those of the remaining bag.

Values come from small domains with NULLs so that groups collide, cancel and empty often.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from contract.expr import Cmp, Lit
from contract.zset import ZSet
from warehouse.aggregate import Call, Summary, distinct, encode, evaluate, position, totals, visible

VALUES = st.one_of(st.none(), st.integers(0, 3))
GROUPED = Summary(
    groups=1,
    calls=(
        Call("count", None),
        Call("count", 1),
        Call("sum", 1),
        Call("avg", 1),
        Call("min", 1),
        Call("max", 2),
        Call("min", 2),
    ),
    outputs=tuple((f"c{i}", i) for i in range(8)),
    names=("g", "x", "y"),
)
GLOBAL = Summary(
    0, (Call("count", None), Call("sum", 0), Call("max", 1)), (("n", 0), ("s", 1), ("m", 2)), ("x", "y"), grouped=False
)
HAVING = Summary(
    1, (Call("sum", 1), Call("count", None)), (("g", 0), ("s", 1)), ("g", "x"), having=Cmp(">", position(2), Lit(1))
)
SUMMARIES = [GROUPED, GLOBAL, HAVING, distinct(["a", "b"])]


def bags(width: int) -> st.SearchStrategy[ZSet]:
    return st.dictionaries(st.tuples(*[VALUES] * width), st.integers(1, 3), max_size=8).map(ZSet)


def width(s: Summary) -> int:
    return len(s.names)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_reading_the_stored_rows_is_sql(data) -> None:
    for s in SUMMARIES:
        bag = data.draw(bags(width(s)))
        assert visible(s, encode(s, bag)) == evaluate(s, bag)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_effects_in_any_order_read_as_their_sum(data) -> None:
    """A bag changed by three signed effects: every order of the commits, and every
    prefix, reads as the view of the body so far."""
    for s in SUMMARIES:
        start = data.draw(bags(width(s)))
        effects = [start]
        state = start.copy()
        for _ in range(3):  # deletes of present rows and inserts: the body stays a bag
            present = sorted(state.rows(), key=repr)
            removed = data.draw(st.lists(st.sampled_from(present), max_size=2, unique=True)) if present else []
            change = ZSet(dict.fromkeys(removed, -1)) + data.draw(bags(width(s)))
            state = state + change
            effects.append(change)
        encoded = [encode(s, e) for e in effects]
        for order in itertools.permutations(encoded):
            assert visible(s, sum(order, ZSet())) == evaluate(s, state)
        running = ZSet()
        prefix = ZSet()
        for effect, stored in zip(effects, encoded):
            running = running + effect
            prefix = prefix + stored
            assert visible(s, prefix) == evaluate(s, running)


def test_a_deleted_extreme_is_replaced_from_the_stored_multiset() -> None:
    s = GROUPED
    body = ZSet({("g", 1, 9): 1, ("g", 3, 5): 2, ("g", None, 7): 1})
    stored = encode(s, body) + encode(s, ZSet({("g", 1, 9): -1}))  # MIN(x) 1 and MAX(y) 9 go
    (row,) = visible(s, stored).rows()
    assert row == ("g", 3, 2, 6, 3.0, 3, 7, 5)
    group = totals(s, stored)[("g",)]
    assert group.values == [{3: 2}, {5: 2, 7: 1}]  # the multisets: 1 and 9 are gone, NULLs never kept


def test_an_emptied_group_disappears_and_a_global_row_stays() -> None:
    assert (
        visible(GROUPED, encode(GROUPED, ZSet({("g", 1, 1): 1})) + encode(GROUPED, ZSet({("g", 1, 1): -1}))) == ZSet()
    )
    assert visible(GLOBAL, encode(GLOBAL, ZSet())) == ZSet({(0, None, None): 1})
    assert visible(GLOBAL, encode(GLOBAL, ZSet({(None, None): 2}))) == ZSet({(2, None, None): 1})


def test_a_change_stores_rows_for_the_changed_groups_only() -> None:
    """O(changed groups): one summary row per changed group, one multiset row per changed value."""
    stored = encode(GROUPED, ZSet({("a", 1, 2): 1, ("a", 3, 2): -1}))
    assert len(stored) == 1 + 2 + 0  # a's summary row; x values 1 and 3 change; y's 2 cancels
