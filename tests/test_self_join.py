"""A table read under two aliases, piece by piece: what the wrapper ships of it, what a
verification reads of it and the SQL it recomputes with (the whole path is tested in
tests/test_self_join_end_to_end.py and tests/test_oracle.py)."""

from __future__ import annotations

from contract.expr import Cmp, Col, Lit, Or, compile_filter
from contract.zset import ZSet
from warehouse.catalog.db import LogEntry
from warehouse.deltas import DeltaExtractor
from warehouse.sql_views import parse_view
from warehouse.verify import spark_select

TABLES = {("hr", "emp"): ("id", "name", "boss", "salary"), ("hr", "dept"): ("id", "title")}
SQL = (
    "SELECT e.name, m.name AS boss_name FROM hr.emp e JOIN hr.emp m ON e.boss = m.id "
    "WHERE e.salary < 50 AND m.salary >= 20"
)


def plan():
    return parse_view(SQL, lambda s, t: TABLES.get((s, t)), "bosses")


def test_the_table_is_read_once_for_both_aliases() -> None:
    (read,) = plan().table_reads
    assert (read.source, read.table, read.alias, read.positions) == ("hr", "emp", "e", (0, 1))
    assert read.columns == ("name", "boss", "salary", "id")
    # a row matters if either alias's local predicate holds, written over the first alias
    assert read.where == Or((Cmp("<", Col("e", "salary"), Lit(50)), Cmp(">=", Col("e", "salary"), Lit(20))))


def test_a_change_is_a_change_of_every_position_that_reads_it() -> None:
    extract = DeltaExtractor(plan())
    rows = [
        {"id": 1, "name": "ann", "boss": 1, "salary": 30},  # both aliases keep it
        {"id": 2, "name": "bob", "boss": 1, "salary": 10},  # e only
        {"id": 3, "name": "cat", "boss": 1, "salary": 70},  # m only
    ]
    entry = LogEntry(1, "hr", 1, [{"relation": "emp", "sign": 1, "row": r} for r in rows], None, 0.0)
    update = extract(entry)
    assert update is not None
    assert update.deltas == {
        0: ZSet({("ann", 1, 30): 1, ("bob", 1, 10): 1}),
        1: ZSet({(1, "ann", 30): 1, (3, "cat", 70): 1}),
    }
    # what a verification rolls back: the union of columns, rows either alias keeps
    read = plan().table_reads[0]
    changes = extract.table_changes(entry, "emp")
    assert changes == ZSet({("ann", 1, 30, 1): 1, ("bob", 1, 10, 2): 1, ("cat", 1, 70, 3): 1})
    keep = compile_filter(read.where, {Col("e", c): i for i, c in enumerate(read.columns)})
    assert all(keep(row) for row in changes.rows())
    assert extract.needed_columns("hr", "emp") == read.columns
    assert extract.complete(entry)
    partial = {"id": 4, "name": "dan", "boss": 1}  # no salary: position 0 and 1 both need it
    assert not extract.complete(LogEntry(2, "hr", 2, [{"relation": "emp", "sign": 1, "row": partial}], None, 0.0))


def test_the_recomputation_sql_reads_one_temporary_view_under_both_aliases() -> None:
    sql = spark_select(plan(), {("hr", "emp"): "verify_relation_0"})
    assert "FROM verify_relation_0 AS e JOIN verify_relation_0 AS m ON e.boss = m.id" in sql
