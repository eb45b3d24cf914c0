"""Filtering and projecting captured rows with the manager's Interest."""

from __future__ import annotations

import pytest

from contract.schemas import Interest, RelationInterest
from wrappers.capture.base import OutboxRow
from wrappers.errors import InvalidRequest
from wrappers.interest import ChangeFilter
from wrappers.quarantine import DEFAULT_MAX_VALUE_BYTES, Fitness
from wrappers.schema import SourceSchema, TableSchema

SCHEMA = SourceSchema(
    {
        "r": TableSchema("r", ("id", "b", "v"), ("INTEGER", "INTEGER", "TEXT"), ("id",)),
        "s": TableSchema("s", ("x",), ("TEXT",), ()),
    }
)
FIT = Fitness("src", SCHEMA, "sqlite", DEFAULT_MAX_VALUE_BYTES)


def col(name: str, rel: str = "r") -> dict:
    return {"col": [rel, name]}


def interest(columns: list[str], *where: dict | None, **others: RelationInterest) -> Interest:
    return Interest(relations={"r": RelationInterest(columns=columns, where=list(where)), **others})


def row(i: int, b: int | None, v: str | None) -> dict:
    return {"id": i, "b": b, "v": v}


def signed(changes: list) -> list[tuple]:
    return [(c.relation, c.sign, c.row) for c in changes]


def test_without_interest_everything_ships_in_full() -> None:
    rows = [
        OutboxRow(1, "r", "I", None, row(1, 2, "a")),
        OutboxRow(2, "r", "U", row(1, 2, "a"), row(1, 3, "a")),
        OutboxRow(3, "s", "D", {"x": "q"}, None),
    ]
    assert signed(ChangeFilter.build(None, SCHEMA).changes(rows, FIT)) == [
        ("r", 1, row(1, 2, "a")),
        ("r", -1, row(1, 2, "a")),
        ("r", 1, row(1, 3, "a")),
        ("s", -1, {"x": "q"}),
    ]


def test_filter_and_project() -> None:
    gt5 = {"op": ">", "args": [col("b"), {"lit": 5}]}
    like_x = {"op": "like", "args": [col("v")], "pattern": "x%"}
    f = ChangeFilter.build(interest(["id", "v"], gt5, like_x), SCHEMA)
    rows = [
        OutboxRow(1, "r", "I", None, row(1, 9, "a")),  # b > 5
        OutboxRow(2, "r", "I", None, row(2, 1, "X")),  # LIKE is case-sensitive: dropped
        OutboxRow(3, "r", "I", None, row(3, None, None)),  # unknown is not true: dropped
        OutboxRow(4, "r", "U", row(1, 9, "a"), row(1, 8, "a")),  # projection unchanged: dropped
        OutboxRow(5, "r", "U", row(1, 8, "a"), row(1, 1, "a")),  # leaves the filter: -old only
        OutboxRow(6, "r", "D", row(4, 1, "xy"), None),
        OutboxRow(7, "s", "I", None, {"x": "q"}),  # s is not in the interest
        OutboxRow(8, "r", "I", None, {"id": 5, "b": 7}),  # a column missing from the JSON is NULL
    ]
    assert signed(f.changes(rows, FIT)) == [
        ("r", 1, {"id": 1, "v": "a"}),
        ("r", -1, {"id": 1, "v": "a"}),
        ("r", -1, {"id": 4, "v": "xy"}),
        ("r", 1, {"id": 5, "v": None}),
    ]
    everything = ChangeFilter.build(interest(["b"], None), SCHEMA)
    assert signed(everything.changes(rows[:1], FIT)) == [("r", 1, {"b": 9})]
    assert ChangeFilter.build(interest(["id"]), SCHEMA).changes(rows, FIT) == []  # no predicate holds


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (Interest(relations={"t": RelationInterest(columns=["id"], where=[None])}), "unknown relation 't'"),
        (interest(["id", "zz"], None), "no column 'zz'"),
        (interest(["id"], {"op": "=", "args": [col("zz"), {"lit": 1}]}), "no column 'zz'"),
        (interest(["id"], {"op": "=", "args": [col("x", "s"), {"lit": 1}]}), "reads column 'x' of 's'"),
        (interest(["id"], {"op": "frobnicate", "args": []}), "malformed predicate"),
        (interest(["id"], {"col": "b"}), "malformed predicate"),
    ],
)
def test_unknown_names_are_rejected(bad: Interest, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        ChangeFilter.build(bad, SCHEMA)
