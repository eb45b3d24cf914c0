"""Subquery statements with binary-collated text columns (``query._Binary``) are compiled once
per shape on PostgreSQL and then reused from SQLAlchemy's compiled cache, with the same
answers; shapes that differ only in the collated column do not share compiled SQL."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from contract.expr import Cmp, Col, to_wire
from contract.schemas import Subquery
from tests.capture_support import run_sql
from wrappers import query
from wrappers.capture import dialect_for
from wrappers.schema import SourceSchema

pytestmark = pytest.mark.servers

ROWS = [(1, "ab", "x"), (2, "AB", "y"), (3, "ab", "z")]
ON = to_wire(Cmp("=", Col("$key", "k0"), Col("r", "id")))


def _compiled_selects(engine: sa.Engine) -> list[Any]:
    """The compiled form of every subquery SELECT run on ``engine`` from now on."""
    seen: list[Any] = []

    def record(_conn: Any, _cursor: Any, statement: str, _params: Any, context: Any, _many: bool) -> None:
        if statement.lstrip().startswith("SELECT") and 'COLLATE "C"' in statement:
            seen.append(context.compiled)

    sa.event.listen(engine, "before_cursor_execute", record)
    return seen


def _answer(engine: sa.Engine, schema: SourceSchema, keys: list[list[Any]], column: str) -> list[list[Any]]:
    subquery = Subquery(relation="r", alias="r", keys=keys, on=ON, select=[column])
    prepared = query.prepare(subquery, schema, engine.dialect.name)
    dialect = dialect_for(str(engine.url))
    conn = dialect.begin_snapshot(engine)
    try:
        return sorted(query.evaluate(conn, prepared))
    finally:
        conn.close()


def test_a_shape_is_compiled_once_and_answers_stay_the_same(pg_url: str) -> None:
    run_sql(pg_url, "CREATE TABLE r (id INT PRIMARY KEY, a VARCHAR(10), b VARCHAR(10))")
    run_sql(pg_url, "INSERT INTO r VALUES " + ", ".join(f"({i}, '{a}', '{b}')" for i, a, b in ROWS))
    engine = dialect_for(pg_url).open_engine(pg_url)
    try:
        schema = SourceSchema.reflect(engine, ["r"])
        compiled = _compiled_selects(engine)
        assert _answer(engine, schema, [[1], [2], [3]], "a") == [[0, "ab", 1], [1, "AB", 1], [2, "ab", 1]]
        assert _answer(engine, schema, [[3], [2]], "a") == [[0, "ab", 1], [1, "AB", 1]]
        assert len(compiled) == 2 and compiled[1] is compiled[0]  # the second evaluation reused the first's SQL
        # Another collated column: a shape of its own, compiled on its own, with its own answers.
        assert _answer(engine, schema, [[1], [2]], "b") == [[0, "x", 1], [1, "y", 1]]
        assert _answer(engine, schema, [[3]], "b") == [[0, "z", 1]]
        assert compiled[2] is not compiled[0] and compiled[3] is compiled[2]
    finally:
        engine.dispose()


def test_collated_columns_are_told_apart_by_the_cache(pg_url: str) -> None:
    """Statements that differ only in the column under the collation get their own SQL (in
    subqueries the key table's name differs too, which would hide a cache key without it)."""
    run_sql(pg_url, "CREATE TABLE r (id INT PRIMARY KEY, a VARCHAR(10), b VARCHAR(10))")
    run_sql(pg_url, "INSERT INTO r VALUES " + ", ".join(f"({i}, '{a}', '{b}')" for i, a, b in ROWS))
    engine = dialect_for(pg_url).open_engine(pg_url)
    r = sa.table("r", sa.column("id"), sa.column("a"), sa.column("b"))
    try:
        with engine.connect() as conn:
            for column, expected in (("a", ["AB", "ab", "ab"]), ("b", ["x", "y", "z"]), ("a", ["AB", "ab", "ab"])):
                collated = query._Binary(r.c[column], "C")
                assert (
                    conn.execute(sa.select(collated).select_from(r).order_by(collated)).scalars().all() == expected
                ), column
    finally:
        engine.dispose()
