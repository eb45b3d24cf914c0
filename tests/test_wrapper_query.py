"""ProcessQuery: the SQL join of keys with a relation equals warehouse.join.local_join."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from contract.expr import And, Arith, Cmp, Col, Expr, IsNull, Like, Lit, compile_filter, to_wire
from contract.schemas import KEY_RELATION, Subquery
from contract.zset import ZSet
from warehouse.join import extend, local_join
from warehouse.plan import SweepStep
from wrappers import query
from wrappers.capture import sqlite as capture
from wrappers.errors import InvalidRequest
from wrappers.schema import SourceSchema

COLS = ("id", "b", "v")
ROWS = [
    (1, 1, "xa"),
    (2, 1, "Xa"),
    (3, 2, "xb"),
    (4, 2, "xb"),
    (5, None, "xc"),
    (6, 3, None),
    (7, 3, "y"),
    (8, 1, "xa"),
]


@pytest.fixture()
def source(tmp_path: Path) -> Iterator[tuple[sa.Engine, SourceSchema]]:
    path = tmp_path / "src.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE r (id INTEGER PRIMARY KEY, b INTEGER, v TEXT)")
        db.executemany("INSERT INTO r VALUES (?, ?, ?)", ROWS)
    engine = capture.open_engine(f"sqlite:///{path}")
    yield engine, SourceSchema.reflect(engine, ["r"])
    engine.dispose()


def key(j: int) -> Col:
    return Col(KEY_RELATION, f"k{j}")


def r(name: str) -> Col:
    return Col("r", name)


def run(source: tuple[sa.Engine, SourceSchema], subquery: Subquery) -> list[list]:
    engine, schema = source
    prepared = query.prepare(subquery, schema)
    conn = capture.begin_snapshot(engine)
    try:
        return query.evaluate(conn, prepared)
    finally:
        conn.close()


def check(source, keys: list[tuple], on: Expr | None, where: Expr | None, select: list[str]) -> list[list]:
    """Answer the subquery over HTTP-shaped input and compare with local_join in Python."""
    subquery = Subquery(
        relation="r",
        alias="r",
        keys=[list(k) for k in keys],
        on=to_wire(on) if on is not None else None,
        where=to_wire(where) if where is not None else None,
        select=select,
    )
    answer = run(source, subquery)
    layout = tuple(key(j) for j in range(len(keys[0]) if keys else 0))
    step = SweepStep(0, layout, layout, on)
    partial = ZSet.from_rows(keys)
    rel_cols = tuple(r(c) for c in COLS)
    relation = ZSet.from_rows(ROWS).filter(compile_filter(where, {c: i for i, c in enumerate(rel_cols)}))
    picked = [len(layout) + COLS.index(c) for c in select]
    expected = local_join(partial, step, relation, rel_cols).map_rows(
        lambda row: row[: len(layout)] + tuple(row[i] for i in picked)
    )
    got = extend(partial, step, keys, [(row[0], tuple(row[1:-1]), row[-1]) for row in answer])
    assert got == expected
    return answer


def test_equi_join_with_local_predicate(source) -> None:
    answer = check(source, [(1,), (2,), (3,), (None,), (9,)], Cmp("=", key(0), r("b")), Like(r("v"), "x%"), ["v"])
    assert sorted(answer) == [[0, "xa", 2], [1, "xb", 2]]  # counts of equal rows; LIKE is case-sensitive


def test_two_key_columns_arithmetic_and_nulls(source) -> None:
    on = And((Cmp("=", Arith("+", r("b"), Lit(1)), key(0)), Cmp("<", key(1), r("id"))))
    check(source, [(2, 1), (3, 3), (4, 0), (None, 0)], on, IsNull(r("v"), negated=True), ["id", "v"])


def test_cross_join_and_empty_keys(source) -> None:
    answer = check(source, [()], None, Cmp(">=", r("b"), Lit(2)), ["b"])
    assert sorted(answer) == [[0, 2, 2], [0, 3, 2]]
    assert check(source, [], Cmp("=", key(0), r("b")), None, ["id"]) == []


def test_values_are_bound_never_spliced(source) -> None:
    nasty = "x'); DROP TABLE r; --"
    check(source, [(nasty,)], Cmp("=", key(0), r("v")), Like(r("v"), nasty), ["id"])
    engine, _ = source
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM r")).scalar_one() == len(ROWS)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"relation": "t"}, "unknown relation 't'"),
        ({"select": ["id", "nope"]}, "no column 'nope'"),
        ({"on": {"op": "=", "args": [{"col": ["$key", "k0"]}, {"col": ["r", "nope"]}]}}, "no column 'nope'"),
        ({"where": {"op": "is_null", "args": [{"col": ["r", "nope"]}]}}, "no column 'nope'"),
        ({"on": {"op": "=", "args": [{"col": ["$key", "k1"]}, {"col": ["r", "b"]}]}}, "unknown key column 'k1'"),
        ({"on": {"op": "=", "args": [{"col": ["s", "b"]}, {"col": ["r", "b"]}]}}, "unknown relation 's'"),
        ({"alias": "$key"}, "reserved"),
        ({"where": {"op": "like", "args": [{"col": ["r", "v"]}]}}, "malformed where"),
    ],
)
def test_unknown_names_are_rejected(source, change: dict, message: str) -> None:
    body = {"relation": "r", "alias": "r", "keys": [[1]], "on": None, "where": None, "select": ["id"], **change}
    with pytest.raises(InvalidRequest, match=message):
        query.prepare(Subquery.model_validate(body), source[1])


def test_no_selected_column_counts_per_key(source) -> None:
    """An outer join's partner counts: one ``[key index, count]`` per key with partners."""
    answer = check(source, [(1,), (2,), (9,), (None,)], Cmp("=", key(0), r("b")), None, [])
    assert sorted(answer) == [[0, 3], [1, 2]]


def test_one_snapshot_answers_several_subqueries_of_one_shape(source) -> None:
    """Subqueries sharing a handshake run one after the other in one snapshot
    (wrappers/shared_handshake.py): each drops its key table, so the next can make it."""
    engine, schema = source
    on = Cmp("=", key(0), r("b"))
    conn = capture.begin_snapshot(engine)
    try:
        answers = [
            query.evaluate(
                conn, query.prepare(Subquery(relation="r", alias="r", keys=[[b]], on=to_wire(on), select=[]), schema)
            )
            for b in (1, 2, 1)
        ]
    finally:
        conn.close()
    assert [sum(row[-1] for row in answer) for answer in answers] == [3, 2, 3]
