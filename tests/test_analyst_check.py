"""What the analysts' SQL endpoint accepts and refuses (``api.analyst.check_query``): pure
parsing, no Spark. CTE names count only where Spark would resolve them to the CTE; anywhere
else a name must be a registered view, so a CTE cannot smuggle in a store table or any other
table of the session catalog."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sqlglot

from api.analyst import QueryRejected, check_query
from contract.column_types import spark_type
from warehouse.store.base import BASE_PREFIX, VERSIONS_DB, ZLOG_PREFIX

VIEWS = ["order_details", "customers_v"]

ACCEPTED = [
    "SELECT lpad(customer, 12, '.'), rpad(region, 8), format_string('%08d|%-10s', qty, customer) FROM order_details",
    "SELECT region, count(*) AS n FROM order_details WHERE qty > 1 GROUP BY region ORDER BY n DESC",
    "WITH big AS (SELECT * FROM order_details WHERE qty > 3) SELECT customer, sum(qty) FROM big GROUP BY customer",
    "SELECT customer FROM order_details UNION ALL SELECT name FROM customers_v",
    "SELECT o.*, row_number() OVER (PARTITION BY region ORDER BY qty DESC) AS rk FROM order_details o",
    "SELECT upper(customer), coalesce(qty, 0), CAST(price AS STRING), date_format(current_date(), 'yyyy') FROM ORDER_DETAILS",
    "SELECT * FROM order_details WHERE customer IN (SELECT name FROM customers_v) LIMIT 5",
    # every view at the cut over all views (docs/protocol.md, 'Consistent reads across views')
    "SELECT o.customer, c.name FROM pvm_consistent.order_details o JOIN PVM_CONSISTENT.customers_v c ON o.customer = c.name",
]

# CTEs used within their scope, as Spark resolves them
ACCEPTED_CTES = [
    # a later CTE reads an earlier one
    "WITH a AS (SELECT * FROM order_details), b AS (SELECT customer FROM a) SELECT * FROM b",
    # the body's subqueries see the WITH of their enclosing query
    "WITH big AS (SELECT * FROM order_details WHERE qty > 3) SELECT * FROM customers_v WHERE name IN (SELECT customer FROM big)",
    # a WITH in a derived table, used inside it
    "SELECT o.customer, x.name FROM order_details o JOIN (WITH c AS (SELECT name FROM customers_v) SELECT name FROM c) x ON o.customer = x.name",
    # an outer CTE seen from a nested WITH's CTE
    "WITH a AS (SELECT * FROM order_details) SELECT * FROM (WITH b AS (SELECT * FROM a) SELECT * FROM b) t",
    # a CTE inside a CTE, used there
    "WITH a AS (WITH inner_c AS (SELECT * FROM order_details) SELECT * FROM inner_c) SELECT * FROM a",
    # a WITH over a set operation covers both branches
    "WITH c AS (SELECT customer FROM order_details) SELECT * FROM c UNION ALL SELECT * FROM c",
    # a CTE shadowing a view name is read instead of the view (harmless either way)
    "WITH order_details AS (SELECT 1 AS qty) SELECT qty FROM order_details",
    # Spark resolves CTE names case-insensitively
    "WITH Big AS (SELECT * FROM order_details) SELECT * FROM BIG",
    # a view named inside a CTE that a nested WITH shadows: lexical scope, the view
    "WITH t AS (SELECT * FROM customers_v) SELECT * FROM (WITH customers_v AS (SELECT 1 AS name) SELECT * FROM t) u",
]

REJECTED = [
    ("DROP VIEW order_details", "only a SELECT"),
    ("INSERT INTO order_details SELECT * FROM order_details", "only a SELECT"),
    ("CREATE TABLE t AS SELECT * FROM order_details", "only a SELECT"),
    ("SET spark.sql.ansi.enabled=false", "only a SELECT"),
    ("SELECT 1; SELECT 2", "exactly one statement"),
    ("SELECT * FROM parquet.`/etc/passwd`", "file paths"),
    ("SELECT * FROM `/tmp/views/x/zlog/v0`", "unknown view"),
    ("SELECT * FROM csv.`/tmp/x.csv`", "file paths"),
    ("SELECT * FROM global_temp.order_details", "qualified names"),
    ("SELECT * FROM pvm_consistent.__pvm_state", "unknown view"),
    ("SELECT * FROM pvm_consistent.some_table", "unknown view"),
    ("SELECT * FROM spark_catalog.pvm_consistent.order_details", "qualified names"),
    ("SELECT * FROM pvm_zlog_order_details", "unknown view"),
    ("SELECT * FROM pvm_base_order_details", "unknown view"),
    ("SELECT * FROM some_table", "unknown view"),
    ("SELECT * FROM range(10)", "in FROM is not allowed"),
    ("SELECT * FROM read_files('/tmp')", "in FROM is not allowed"),
    ("SELECT reflect('java.lang.Runtime', 'getRuntime')", "function reflect"),
    ("SELECT java_method('java.lang.System', 'getenv', 'HOME')", "function java_method"),
    ("SELECT input_file_name() FROM order_details", "function input_file_name"),
    ("SELECT current_user()", "function CURRENT_USER"),
    ("SELECT sequence(1, 1000000000)", "function SEQUENCE"),
    # text of any size fills the query process's heap and ends it for every analyst
    ("SELECT length(lpad(customer, 2147483647, 'y')) FROM order_details", "LPAD builds text of 2147483647"),
    ("SELECT rpad(customer, 1048577) FROM order_details", "RPAD builds text of 1048577"),
    ("SELECT lpad(customer, CAST('2147483647' AS INT)) FROM order_details", "must be an integer literal"),
    ("SELECT format_string('%2000000000d', 1) FROM order_details", "FORMAT_STRING builds text"),
    ("SELECT printf(customer, 1) FROM order_details", "must be a string literal"),
    ("SELECT TRANSFORM(customer) USING 'cat' FROM order_details", "TRANSFORM"),
    ("SELECT /*+ REPARTITION(1000) */ * FROM order_details", "hints"),
    ("SELECT customer INTO t FROM order_details", "INTO"),
    ("SELECT '${spark.sql.warehouse.dir}' FROM order_details", "substitution"),
    ("EXPLAIN SELECT * FROM order_details", "only a SELECT"),
    ("SELECT * FROM", "could not parse"),
]

# CTE names used outside their scope: there Spark reads a table of that name
REJECTED_CTES = [
    # the audit's case: the JOIN is outside the derived table whose WITH defines the name
    (
        "SELECT * FROM order_details UNION ALL SELECT * FROM (WITH secret AS (SELECT 1 AS a) "
        "SELECT a FROM secret) JOIN secret",
        "unknown view 'secret' (a CTE named 'secret' exists, but it is not in scope here)",
    ),
    # a CTE of one derived table referenced in a sibling one
    (
        "SELECT * FROM (WITH c AS (SELECT name FROM customers_v) SELECT name FROM c) x "
        "JOIN (SELECT name FROM c) y ON x.name = y.name",
        "unknown view 'c'",
    ),
    # a CTE of a subquery expression referenced by the enclosing query
    ("SELECT * FROM secret WHERE 1 IN (WITH secret AS (SELECT 1 AS a) SELECT a FROM secret)", "unknown view 'secret'"),
    ("SELECT (WITH s AS (SELECT 1 AS a) SELECT a FROM s) AS one FROM s", "unknown view 's'"),
    # a CTE nested in another CTE's definition, referenced by the body
    ("WITH a AS (WITH hidden AS (SELECT 1 AS x) SELECT x FROM hidden) SELECT * FROM hidden", "unknown view 'hidden'"),
    # a CTE referenced before its definition, or by itself (no recursion)
    ("WITH a AS (SELECT * FROM b), b AS (SELECT * FROM order_details) SELECT * FROM a", "unknown view 'b'"),
    ("WITH t AS (SELECT * FROM t) SELECT * FROM t", "unknown view 't'"),
    # a CTE shadowing a view name does not make another name legal outside its scope
    (
        "SELECT * FROM (WITH order_details AS (SELECT 1 AS a), secret AS (SELECT 2 AS a) "
        "SELECT * FROM order_details) x JOIN secret",
        "unknown view 'secret'",
    ),
    # the second UNION branch has its own WITH: the first branch cannot see it
    ("SELECT * FROM c UNION ALL (WITH c AS (SELECT 1 AS a) SELECT a FROM c)", "unknown view 'c'"),
    ("WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT * FROM r", "WITH RECURSIVE"),
    # store table names are refused even as CTE names
    (
        "SELECT * FROM order_details UNION ALL SELECT * FROM (WITH pvm_zlog_order_details AS (SELECT 1 AS a) "
        "SELECT a FROM pvm_zlog_order_details) JOIN pvm_zlog_order_details",
        "pvm_zlog_order_details",
    ),
    ("WITH pvm_base_x AS (SELECT 1 AS a) SELECT * FROM pvm_base_x", "store table"),
]


@pytest.mark.parametrize("sql", ACCEPTED + ACCEPTED_CTES)
def test_check_accepts_read_only_selects_over_views(sql: str) -> None:
    out = check_query(sql, VIEWS)
    assert out.upper().startswith(("SELECT", "WITH"))
    assert check_query(out, VIEWS) == out  # what runs passes the check and is a fixpoint


@pytest.mark.parametrize("sql, reason", REJECTED + REJECTED_CTES)
def test_check_refuses_everything_else_naming_why(sql: str, reason: str) -> None:
    with pytest.raises(QueryRejected) as info:
        check_query(sql, VIEWS)
    assert reason in str(info.value), str(info.value)


def test_the_audit_statement_is_refused() -> None:
    sql = (
        "SELECT * FROM v UNION ALL SELECT * FROM (WITH pvm_zlog_v AS (SELECT 1 AS a) "
        "SELECT a FROM pvm_zlog_v) JOIN pvm_zlog_v"
    )
    with pytest.raises(QueryRejected, match="pvm_zlog_v"):
        check_query(sql, ["v"])


def test_store_names_are_refused_by_the_stores_own_constants_without_pyspark() -> None:
    """The check takes the store's table names from ``warehouse/store/base.py``, not from
    the Spark store, whose import would load pyspark into every process of the API."""
    for prefix in (ZLOG_PREFIX, BASE_PREFIX):
        with pytest.raises(QueryRejected, match="store table"):
            check_query(f"WITH {prefix}x AS (SELECT 1 AS a) SELECT a FROM {prefix}x", VIEWS)
    with pytest.raises(QueryRejected, match="qualified names"):  # the version tables
        check_query(f"SELECT * FROM {VERSIONS_DB}.zlog_0_order_details", VIEWS)
    probe = "import sys, api.analyst; print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'))"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM order_details WHERE customer IN (WITH c AS (SELECT name FROM customers_v) SELECT name FROM c)",
        "WITH a AS (SELECT * FROM (WITH z AS (SELECT name FROM customers_v) SELECT * FROM z) AS t) SELECT * FROM a",
        "SELECT * FROM customers_v WHERE name IN (WITH customers_v AS (SELECT 'x' AS name) SELECT name FROM customers_v)",
    ],
)
def test_nested_with_clauses_stay_where_they_were_written(sql: str) -> None:
    """sqlglot's Spark generator hoists nested WITHs to the top, which changes what names
    mean (the last statement would read the CTE instead of the view in the outer query);
    what runs keeps them nested."""
    out = check_query(sql, VIEWS)
    assert sqlglot.parse_one(out, dialect="spark") == sqlglot.parse_one(sql, dialect="spark")
    assert out == sql


def test_spark_types_from_source_types() -> None:
    assert [spark_type(t) for t in ("INTEGER", "TEXT", "REAL", "BOOLEAN", "DATE", "")] == [
        "BIGINT",
        "STRING",
        "DOUBLE",
        "BOOLEAN",
        None,
        None,
    ]
