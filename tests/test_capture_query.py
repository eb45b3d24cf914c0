"""Subqueries on PostgreSQL and MariaDB agree with the manager's Python reading of the same
predicates (contract.expr), and values read by a subquery equal the captured ones."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from contract.expr import Between, Cmp, Col, Expr, Like, Lit, Not, compile_filter, to_wire
from contract.schemas import Subquery
from tests.capture_support import run_sql
from wrappers import query
from wrappers.capture import dialect_for
from wrappers.errors import InvalidRequest
from wrappers.schema import SourceSchema

pytestmark = pytest.mark.servers

TEXTS = ["abc", "Abc", "ABC", "abc ", "a\\c", "a%c", "b", "B", "é", "z", "", None]
ROWS = [(i, i % 3, v) for i, v in enumerate(TEXTS)]
KEY_ON_V = Cmp("=", Col("$key", "k0"), Col("r", "v"))
KEY_ON_K = Cmp("=", Col("$key", "k0"), Col("r", "k"))


@pytest.fixture(params=["postgresql", "mariadb"])
def source(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    url = request.getfixturevalue("pg_url" if request.param == "postgresql" else "maria_url")
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY, k INT, v VARCHAR(10), n NUMERIC(8, 2), d DATE)")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO r (id, k, v) VALUES (:id, :k, :v)"), [{"id": i, "k": k, "v": v} for i, k, v in ROWS]
        )
    engine.dispose()
    dialect = dialect_for(url)
    engine = dialect.open_engine(url)
    yield dialect, engine
    engine.dispose()


def answer(dialect, engine: sa.Engine, keys: list[list], on: Expr, where: Expr | None, select: list[str]) -> dict:
    subquery = Subquery(
        relation="r", alias="r", keys=keys, on=to_wire(on), where=to_wire(where) if where else None, select=select
    )
    prepared = query.prepare(subquery, SourceSchema.reflect(engine, ["r"]), engine.dialect.name)
    conn = dialect.begin_snapshot(engine)
    try:
        return {tuple(row[:-1]): row[-1] for row in query.evaluate(conn, prepared)}
    finally:
        conn.close()


def expected(keys: list[list], on: Expr, where: Expr | None, select: list[str]) -> dict:
    """The same subquery in Python, over ROWS."""
    layout = {Col("r", "id"): 0, Col("r", "k"): 1, Col("r", "v"): 2, Col("$key", "k0"): 3}
    joins, keeps = compile_filter(on, layout), compile_filter(where, layout)
    out: dict = {}
    for i, (key,) in enumerate(keys):
        for row in ROWS:
            full = (*row, key)
            if joins(full) and keeps(full):
                picked = (i, *(row[["id", "k", "v"].index(c)] for c in select))
                out[picked] = out.get(picked, 0) + 1
    return out


@pytest.mark.parametrize(
    "where",
    [
        Like(Col("r", "v"), "a%"),
        Like(Col("r", "v"), "a\\%"),
        Like(Col("r", "v"), "a_c"),
        Like(Col("r", "v"), "%c", negated=True),
        Cmp("=", Col("r", "v"), Lit("abc")),
        Cmp("<", Col("r", "v"), Lit("b")),
        Cmp(">", Col("r", "v"), Lit("z")),
        Between(Col("r", "v"), Lit("B"), Lit("b")),
        Not(Cmp("<>", Col("r", "v"), Lit("B"))),
    ],
    ids=["like", "like-backslash", "like-underscore", "not-like", "eq", "lt", "gt-non-ascii", "between", "not-ne"],
)
def test_predicates_agree_with_python(source, where: Expr) -> None:  # type: ignore[no-untyped-def]
    keys = [[0], [1], [2]]
    assert answer(*source, keys, KEY_ON_K, where, ["id", "v"]) == expected(keys, KEY_ON_K, where, ["id", "v"])


def test_text_keys_match_exactly_and_group_apart(source) -> None:  # type: ignore[no-untyped-def]
    keys = [["abc"], ["ABC"], ["b"], ["zz"], [None]]
    assert answer(*source, keys, KEY_ON_V, None, ["v"]) == expected(keys, KEY_ON_V, None, ["v"])
    grouped = answer(*source, [[0], [1], [2]], KEY_ON_K, None, ["v"])
    assert sum(grouped.values()) == len(ROWS) and all(count == 1 for count in grouped.values())


def test_captured_and_answered_values_are_the_same(source) -> None:  # type: ignore[no-untyped-def]
    dialect, engine = source
    dialect.install(engine, ["r"])
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE r SET n = 12.50, d = '2024-02-29' WHERE id = 1")
        conn.exec_driver_sql("UPDATE r SET n = 7 WHERE id = 2")
    conn = dialect.begin_snapshot(engine)
    captured = {row.new["id"]: row.new for row in dialect.read_outbox(conn, 0)}
    conn.close()
    answered = answer(
        dialect, engine, [[1], [2]], Cmp("=", Col("$key", "k0"), Col("r", "id")), None, ["id", "k", "v", "n", "d"]
    )
    assert {tuple(captured[i][c] for c in ("id", "k", "v", "n", "d")) for i in (1, 2)} == {key[1:] for key in answered}
    assert {key[4:] for key in answered} == {(12.5, "2024-02-29"), (7, None)}


def test_keys_that_cannot_match_a_column_are_refused(source) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequest, match="k0 holds 'x', which cannot be compared with a integer column"):
        answer(*source, [["x"]], KEY_ON_K, None, ["id"])


def test_a_subquery_selecting_no_column_counts_partners_per_key(source) -> None:
    """What an outer join asks for the partner counts of its keys: one row per key with a
    partner, ``[key index, count]``; a key without one (or NULL) has no row."""
    dialect, engine = source
    keys = [[0], [1], [2], [7], [None]]
    got = answer(dialect, engine, keys, KEY_ON_K, Cmp("<>", Col("r", "v"), Lit("b")), [])
    assert got == expected(keys, KEY_ON_K, Cmp("<>", Col("r", "v"), Lit("b")), [])
    assert set(got) == {(0,), (1,), (2,)} and sum(got.values()) == 10  # 11 non-NULL v, "b" is out


def test_one_snapshot_answers_several_subqueries_of_one_shape_even_after_a_refused_one(source) -> None:
    """Subqueries that share a handshake are evaluated one after the other in one snapshot
    (wrappers/shared_handshake.py): each leaves the transaction as it found it, its key
    table gone, and a refused one (in PostgreSQL, a failed statement aborts the whole
    transaction) does not spoil the next."""
    dialect, engine = source
    schema = SourceSchema.reflect(engine, ["r"])

    def prepared(keys: list[list]) -> query.PreparedQuery:
        subquery = Subquery(relation="r", alias="r", keys=keys, on=to_wire(KEY_ON_K), select=["id"])
        return query.prepare(subquery, schema, engine.dialect.name)

    conn = dialect.begin_snapshot(engine)
    try:
        first = query.evaluate(conn, prepared([[0], [1]]))
        with pytest.raises(InvalidRequest):
            query.evaluate(conn, prepared([["x"]]))
        second = query.evaluate(conn, prepared([[2]]))
    finally:
        conn.close()
    assert {tuple(r[:-1]) for r in first} == {(k, row[0]) for k in (0, 1) for row in ROWS if row[1] == k}
    assert {tuple(r[:-1]) for r in second} == {(0, row[0]) for row in ROWS if row[1] == 2}
