"""PostgreSQL subqueries bind their keys as arrays (``unnest``) instead of writing a TEMP table,
so a subquery creates nothing in the system catalogs, and they answer exactly as the TEMP
table does, for every key family, NULL keys, more keys than a statement takes parameters,
and the mixes an array cannot carry (which keep the TEMP table)."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
from typing import Any

import pytest
import sqlalchemy as sa

from contract.expr import And, Cmp, Col, Expr, Lit, to_wire
from contract.schemas import Subquery
from tests.capture_support import run_sql
from wrappers import query
from wrappers.capture import dialect_for
from wrappers.schema import SourceSchema

pytestmark = pytest.mark.servers

COLUMNS = {
    "i": "BIGINT",
    "f": "DOUBLE PRECISION",
    "n": "NUMERIC(12, 3)",
    "b": "BOOLEAN",
    "t": "VARCHAR(10)",
    "d": "DATE",
}
ROWS = [
    (1, 1, 1.5, "1.500", True, "abc", "2020-01-02"),
    (2, 2, 2.0, "2.000", False, "Abc", "1999-12-31"),
    (3, 3, 0.1, "0.100", None, "abc ", "2020-01-02"),
    (4, None, None, None, True, "b", None),
    (5, 5, 2.0, "7.000", False, "é", "2024-02-29"),
]


@pytest.fixture
def source(pg_url: str):
    run_sql(pg_url, "CREATE TABLE r (id INT PRIMARY KEY, " + ", ".join(f"{c} {t}" for c, t in COLUMNS.items()) + ")")
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO r VALUES (:id, :i, :f, :n, :b, :t, :d)"),
            [dict(zip(["id", *COLUMNS], row)) for row in ROWS],
        )
    engine.dispose()
    dialect = dialect_for(pg_url)
    engine = dialect.open_engine(pg_url)
    yield dialect, engine, SourceSchema.reflect(engine, ["r"])
    engine.dispose()


def prepared(schema: SourceSchema, keys: list[list[Any]], on: Expr, select: list[str]) -> query.PreparedQuery:
    subquery = Subquery(relation="r", alias="r", keys=keys, on=to_wire(on), select=select)
    return query.prepare(subquery, schema, "postgresql")


def answers(dialect: Any, engine: sa.Engine, prepared_query: query.PreparedQuery) -> tuple[list, list, list[str]]:
    """The answer through arrays, through the TEMP table, and every statement the first ran."""
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    temp_table = dataclasses.replace(prepared_query, shape=dataclasses.replace(prepared_query.shape, arrays=None))
    conn = dialect.begin_snapshot(engine)
    try:
        sa.event.listen(engine, "before_cursor_execute", record)
        through_arrays = sorted(query.evaluate(conn, prepared_query), key=repr)
        sa.event.remove(engine, "before_cursor_execute", record)
        through_table = sorted(query.evaluate(conn, temp_table), key=repr)
    finally:
        conn.close()
    return through_arrays, through_table, statements


def evaluated(dialect: Any, engine: sa.Engine, prepared_query: query.PreparedQuery) -> tuple[list, list[str]]:
    """The answer as the wrapper gives it, and every statement that ran for it."""
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    conn = dialect.begin_snapshot(engine)
    try:
        return sorted(query.evaluate(conn, prepared_query)), statements
    finally:
        conn.close()
        sa.event.remove(engine, "before_cursor_execute", record)


def created_tables(statements: list[str]) -> list[str]:
    return [s for s in statements if "CREATE" in s.upper() or "INSERT" in s.upper()]


@pytest.mark.parametrize(
    ("column", "keys"),
    [
        ("i", [[1], [3], [None], [99]]),
        ("f", [[1.5], [2], [0.1], [None]]),  # a float column takes integers as floats
        ("n", [[1.5], [0.1], [7.0]]),
        ("n", [[2], [7], [None]]),
        ("b", [[True], [False], [None]]),
        ("t", [["abc"], ["ABC"], ["abc "], ["é"], [None]]),  # compared under the binary collation
        ("d", [["2020-01-02"], ["2024-02-29"], ["1999-12-31"]]),
    ],
    ids=["integer", "float", "numeric-floats", "numeric-integers", "boolean", "text", "date"],
)
def test_keys_bound_as_arrays_answer_as_the_temp_table(source, column: str, keys: list[list[Any]]) -> None:
    dialect, engine, schema = source
    through_arrays, through_table, statements = answers(
        dialect, engine, prepared(schema, keys, Cmp("=", Col("$key", "k0"), Col("r", column)), ["id", column])
    )
    assert through_arrays == through_table
    assert through_arrays, "every family's keys match some row"
    assert created_tables(statements) == [], "the keys went through arrays, not a table"
    assert any("unnest(" in s for s in statements)


def test_a_key_column_of_nulls_only_matches_nothing(source) -> None:
    dialect, engine, schema = source
    on = Cmp("=", Col("$key", "k0"), Col("r", "t"))
    through_arrays, through_table, statements = answers(dialect, engine, prepared(schema, [[None], [None]], on, ["id"]))
    assert through_arrays == through_table == []
    assert created_tables(statements) == []


def test_several_key_columns_and_a_literal_compared_with_a_text_key(source) -> None:
    dialect, engine, schema = source
    on = And(
        (
            Cmp("=", Col("$key", "k0"), Col("r", "i")),
            Cmp("=", Col("$key", "k1"), Col("r", "t")),
            Cmp("<", Col("$key", "k1"), Lit("b")),  # "C" orders upper case first, as the TEMP table's column
        )
    )
    keys: list[list[Any]] = [[1, "abc"], [2, "Abc"], [3, "abc "], [5, "é"], [1, "ABC"]]
    through_arrays, through_table, statements = answers(dialect, engine, prepared(schema, keys, on, ["id"]))
    assert through_arrays == through_table == [[0, 1, 1], [1, 2, 1], [2, 3, 1]]
    assert created_tables(statements) == []
    # Under a linguistic default collation "é" < "b" would hold for an uncollated key; the
    # test database's default (C.UTF-8) orders by code point, so the answers cannot tell.
    # The key column itself must be compared under "C", as the TEMP table declared it.
    assert any('.k1 COLLATE "C")' in s and "unnest(" in s for s in statements)


@pytest.mark.parametrize(
    ("column", "keys", "expected"),
    [
        ("n", [[2], [1.5], [None]], [[0, 2, 1], [1, 1, 1]]),
        ("b", [[1], [0]], [[0, 1, 1], [0, 4, 1], [1, 2, 1], [1, 5, 1]]),
    ],
    ids=["numeric-integers-and-floats", "boolean-integers"],
)
def test_values_an_array_cannot_carry_keep_the_temp_table(source, column: str, keys: list[list[Any]], expected) -> None:
    dialect, engine, schema = source
    on = Cmp("=", Col("$key", "k0"), Col("r", column))
    subquery = prepared(schema, keys, on, ["id"])
    answered, statements = evaluated(dialect, engine, subquery)
    assert any(s.lstrip().upper().startswith("CREATE TEMPORARY TABLE") for s in statements)
    assert answered == expected


def test_more_keys_than_a_statement_takes_parameters(source) -> None:
    """70,000 keys: a PostgreSQL statement takes at most 65,535 parameters, an array any
    number of values."""
    dialect, engine, schema = source
    keys = [[k] for k in range(70_000)]
    subquery = prepared(schema, keys, Cmp("=", Col("$key", "k0"), Col("r", "i")), ["id"])
    answered, statements = evaluated(dialect, engine, subquery)
    assert answered == [[1, 1, 1], [2, 2, 1], [3, 3, 1], [5, 5, 1]]
    assert created_tables(statements) == [], "the keys went through arrays, not a table"


def test_a_subquery_leaves_the_system_catalogs_as_they_were(source) -> None:
    """No row is written to ``pg_class`` by a hundred subqueries in one snapshot, not even
    one rolled back (the transaction's own statistics count those), while the TEMP table
    writes some per subquery."""
    dialect, engine, schema = source
    subquery = prepared(schema, [[1], [2]], Cmp("=", Col("$key", "k0"), Col("r", "i")), ["id", "t"])
    temp_table = dataclasses.replace(subquery, shape=dataclasses.replace(subquery.shape, arrays=None))
    written = "SELECT pg_stat_get_xact_tuples_inserted('pg_catalog.pg_class'::regclass)"
    conn = dialect.begin_snapshot(engine)
    try:
        for _ in range(100):
            assert sorted(query.evaluate(conn, subquery)) == [[0, 1, "abc", 1], [1, 2, "Abc", 1]]
        assert conn.exec_driver_sql(written).scalar_one() == 0
        query.evaluate(conn, temp_table)
        assert conn.exec_driver_sql(written).scalar_one() > 0  # the check can see what a TEMP table writes
    finally:
        conn.close()


def test_date_and_decimal_values_come_back_in_their_wire_forms(source) -> None:
    dialect, engine, schema = source
    through_arrays, through_table, statements = answers(
        dialect, engine, prepared(schema, [["2020-01-02"]], Cmp("=", Col("$key", "k0"), Col("r", "d")), ["n", "d"])
    )
    assert created_tables(statements) == []
    assert through_arrays == through_table
    assert len(through_arrays) == 2
    assert not any(isinstance(v, (datetime.date, decimal.Decimal)) for row in through_arrays for v in row)
