"""Aggregate and DISTINCT views in SQL (warehouse.sql_aggregates through parse_view)."""

from __future__ import annotations

import pytest

from contract.expr import Cmp, Col, Lit
from contract.zset import ZSet
from warehouse.aggregate import Call, evaluate
from warehouse.sql_views import ViewDefinitionError, parse_view

TABLES: dict[tuple[str, str], tuple[str, ...]] = {
    ("shop", "orders"): ("id", "customer", "amount", "status"),
    ("crm", "customers"): ("id", "name", "country"),
}


def parse(sql: str):
    return parse_view(sql, lambda s, t: TABLES.get((s, t)), name="v")


def test_group_by_with_every_aggregate_and_aliases() -> None:
    plan = parse(
        "SELECT c.country, COUNT(*) AS n, COUNT(o.amount), SUM(o.amount) AS revenue, AVG(o.amount), "
        "MIN(o.amount), MAX(o.amount) FROM shop.orders o JOIN crm.customers c ON o.customer = c.id "
        "GROUP BY c.country"
    )
    s = plan.summary
    assert s is not None and s.grouped
    assert s.output_names == ("country", "n", "count_amount", "revenue", "avg_amount", "min_amount", "max_amount")
    # the body: the group, then the aggregates' argument, shipped like any view's columns
    assert [o.column for o in plan.outputs] == [Col("c", "country"), Col("o", "amount")]
    assert s.calls == (
        Call("count", None),
        Call("count", 1),
        Call("sum", 1),
        Call("avg", 1),
        Call("min", 1),
        Call("max", 1),
    )
    assert [r.columns for r in plan.relations] == [("customer", "amount"), ("id", "country")]


def test_aggregate_without_group_by_is_one_row_over_an_empty_body() -> None:
    plan = parse("SELECT COUNT(*), SUM(amount), MIN(amount) FROM shop.orders")
    assert plan.summary is not None and not plan.summary.grouped
    assert evaluate(plan.summary, ZSet()) == ZSet({(0, None, None): 1})


def test_having_reads_groups_aggregates_and_aliases() -> None:
    plan = parse(
        "SELECT status, SUM(amount) AS total FROM shop.orders GROUP BY status "
        "HAVING COUNT(*) > 1 AND total > 10 AND status <> 'x'"
    )
    s = plan.summary
    assert s is not None and s.calls == (Call("sum", 1), Call("count", None))  # COUNT(*) is hidden
    assert s.output_names == ("status", "total")
    body = ZSet({("a", 6): 2, ("b", 50): 1, ("x", 9): 2, ("c", 1): 2})
    assert evaluate(s, body) == ZSet({("a", 12): 1})
    assert s.having_sql == "f2 > 1 AND f1 > 10 AND f0 <> 'x'"


def test_distinct_is_set_semantics_of_the_body() -> None:
    plan = parse("SELECT DISTINCT status FROM shop.orders")
    assert plan.summary is not None and plan.summary.output_names == ("status",)
    assert evaluate(plan.summary, ZSet({("a",): 3, ("b",): -1})) == ZSet({("a",): 1})


def test_group_by_without_aggregates_is_distinct() -> None:
    plan = parse("SELECT status FROM shop.orders GROUP BY status")
    assert plan.summary is not None
    assert evaluate(plan.summary, ZSet({("a",): 3})) == ZSet({("a",): 1})


def test_plain_views_have_no_summary() -> None:
    assert parse("SELECT id FROM shop.orders WHERE amount > 1").summary is None
    assert parse("SELECT id FROM shop.orders WHERE amount > 1").relations[0].where == Cmp(
        ">", Col("orders", "amount"), Lit(1)
    )


REJECTED = [
    ("SELECT status, amount FROM shop.orders GROUP BY status", "column amount is selected but neither in GROUP BY"),
    ("SELECT amount, COUNT(*) FROM shop.orders", "column amount is selected but neither in GROUP BY"),
    ("SELECT COUNT(*) FROM shop.orders GROUP BY amount + 1", r"GROUP BY amount \+ 1 is not a column"),
    ("SELECT COUNT(*) FROM shop.orders GROUP BY ROLLUP (status)", "is not a column"),
    ("SELECT status FROM shop.orders GROUP BY status HAVING amount > 1", "HAVING reads amount"),
    ("SELECT SUM(MAX(amount)) FROM shop.orders", "nested aggregates"),
    ("SELECT SUM(amount + 1) FROM shop.orders", r"the argument of SUM must be a column, not amount \+ 1"),
    ("SELECT COUNT(DISTINCT amount) FROM shop.orders", r"COUNT\(DISTINCT …\) is not supported"),
    ("SELECT SUM(*) FROM shop.orders", r"SUM\(\*\) is not supported"),
    ("SELECT STDDEV(amount) FROM shop.orders", "aggregate STDDEV is not supported; COUNT, SUM, AVG, MIN and MAX are"),
    ("SELECT * FROM shop.orders GROUP BY status", r"\* cannot be selected with GROUP BY"),
    ("SELECT id FROM shop.orders WHERE SUM(amount) > 1", "aggregate SUM is not allowed here"),
    ("SELECT DISTINCT status, COUNT(*) FROM shop.orders GROUP BY status", "DISTINCT together with GROUP BY"),
    ("SELECT SUM(amount) + 1 FROM shop.orders", "aggregate SUM is not allowed here"),
    ("SELECT status, COUNT(*) AS status FROM shop.orders GROUP BY status", "duplicate output column name status"),
    ("SELECT SUM(amount) OVER (PARTITION BY status) FROM shop.orders", "window functions are not supported: views"),
    ("SELECT id FROM shop.orders WHERE id IN (SELECT id FROM crm.customers)", "subqueries are not supported: views"),
    ("SELECT id FROM shop.orders UNION SELECT id FROM crm.customers", "UNION is not supported: views are select"),
    ("WITH RECURSIVE x AS (SELECT id FROM shop.orders) SELECT id FROM x", "WITH"),
    ("SELECT DISTINCT ON (status) status FROM shop.orders", "DISTINCT ON is not supported"),
]


@pytest.mark.parametrize(("sql", "match"), REJECTED, ids=[sql for sql, _ in REJECTED])
def test_rejected(sql: str, match: str) -> None:
    with pytest.raises(ViewDefinitionError, match=match):
        parse(sql)
