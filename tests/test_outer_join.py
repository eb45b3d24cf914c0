"""LEFT JOIN pieces: first-principles recomputation, and the SQL a verification recomputes
with (the whole path: tests/test_oracle.py and tests/test_outer_join_end_to_end.py)."""

from __future__ import annotations

from contract.zset import ZSet
from warehouse.recompute import recompute
from warehouse.sql_views import parse_view
from warehouse.verify import spark_select

TABLES = {("shop", "orders"): ("id", "customer"), ("crm", "customers"): ("id", "name", "country")}
SQL = "SELECT o.id, c.name FROM shop.orders o LEFT JOIN crm.customers c ON o.customer = c.id AND c.country = 'FR'"


def plan():
    return parse_view(SQL, lambda s, t: TABLES.get((s, t)), "v")


def test_recomputation_extends_rows_without_partner_with_nulls() -> None:
    contents = {
        ("shop", "orders"): ZSet({(1, 10): 2, (2, 20): 1, (3, None): 1, (4, 40): 1}),
        ("crm", "customers"): ZSet({(10, "ann", "FR"): 1, (10, "amy", "FR"): 1, (20, "bob", "DE"): 1}),
    }
    assert recompute(plan(), contents, TABLES) == ZSet(
        {
            (1, "ann"): 2,  # two partners, the order twice: four rows in all
            (1, "amy"): 2,
            (2, None): 1,  # its customer fails the ON clause's own condition
            (3, None): 1,  # NULL matches nothing
            (4, None): 1,  # no such customer
        }
    )


def test_the_recomputation_sql_keeps_the_left_join() -> None:
    sql = spark_select(plan(), {("shop", "orders"): "verify_relation_0", ("crm", "customers"): "verify_relation_1"})
    assert (
        "FROM verify_relation_0 AS o LEFT JOIN verify_relation_1 AS c ON o.customer = c.id AND c.country = 'FR'" in sql
    )
