"""The analysts' API: read-only Spark SQL over the views, and verification of a view.

``POST /v1/query`` runs one SELECT over the views as analysts see them (as of each view's
watermark, bag semantics), in the analysts' query process (``warehouse/analysts``): a Spark
application of its own, apart from the one that maintains the views, with its own limits on
time, concurrency (per token and overall) and result size. The statement is parsed with
sqlglot (Spark dialect) and refused with a 400 naming the problem unless it is:

* exactly one query: a SELECT, or SELECTs combined with UNION / INTERSECT / EXCEPT, with
  optional WITH (common table expressions), subqueries, joins, GROUP BY, window functions,
  ORDER BY, LIMIT, LATERAL VIEW, PIVOT, TABLESAMPLE;
* reading only registered views (by their plain name) and the query's own CTEs: no
  ``db.table`` names, no ``parquet.`/path``` or other file paths, no store tables
  (``pvm_zlog_*``, ``pvm_base_*``), no table-valued functions. A name counts as a CTE only
  where that CTE is in scope, as Spark resolves it: in the body of the query whose ``WITH``
  defines it (subqueries included) and in the later CTEs of that ``WITH``; anywhere else it
  must be a view. ``WITH RECURSIVE`` is refused, and so are CTEs named like store tables;
* calling only functions of an allow-list (``ALLOWED_FUNCTIONS``: aggregates, window
  functions, arithmetic, string, date, conditional, cast, collection and JSON functions).
  Reflective, file-reading, environment and session functions (``reflect``, ``java_method``,
  ``input_file_name``, ``current_user``, ``xpath``…) and functions that build values of any
  size (``sequence``, ``repeat``, ``space``, ``array_repeat``) are not on it;
* free of DDL, DML, commands, ``SET``, ``CACHE``, ``SELECT … INTO``, hints and ``${…}``
  variable substitution;
* free of bare words that Spark reads as environment functions where no column of that name
  is in scope (``NILADIC_WORDS``: ``user`` is ``current_user()``, even quoted as ```user```):
  a column so named is read qualified (``v.user``);
* within the bounds of ``warehouse/sql_bounds.py``, checked on the tokens before sqlglot
  parses anything: at most ``MAX_QUERY_TOKENS`` tokens, nested at most 25 levels (sqlglot
  recurses per level); not in pipe syntax (``FROM v |> WHERE …``).

What runs is the statement regenerated from the checked syntax tree, never the text as sent,
so the check and the execution cannot disagree on what the statement is. It is generated
with nested ``WITH`` clauses kept where they are (sqlglot's Spark generator would otherwise
hoist them to the top, changing which names they hide), then parsed and checked once more:
what Spark receives is itself a statement that passes the check. Results are
limited to ``limit`` rows and the process's result size (``truncated`` tells whether there
were more); a query running longer than the timeout (``pvm serve --query-timeout``, default
``QUERY_TIMEOUT_S``) is cancelled, and the process is restarted if its work goes on
regardless. A busy process answers 429, a starting one 503, both with ``Retry-After``.

``POST /v1/views/{name}/verify`` recomputes the view from its sources and compares it with
the store as of the watermark (``warehouse/verify.py``); the recomputation and the comparison
run in the analysts' query process too, at most ``--max-verifications`` at once (429 beyond).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from functools import partial
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError

from api.auth import Principal
from warehouse import sql_bounds
from warehouse.analysts.messages import PinnedView
from warehouse.analysts.supervisor import (
    AnalystError,
    AnalystProcess,
    AnalystsBusy,
    AnalystsUnavailable,
    QueryRefused,
    QueryTimedOut,
)
from warehouse.errors import Refused, Unsupported
from warehouse.manager import Manager
from warehouse.store.base import BASE_PREFIX, CONSISTENT_DB, ZLOG_PREFIX

MAX_QUERY_ROWS = 10_000
MAX_VIEW_SCANS = 256
QUERY_TIMEOUT_S = 120.0

router = APIRouter(tags=["analyst"])


class QueryIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "sql": "SELECT region, count(*) AS orders FROM order_details GROUP BY region ORDER BY orders DESC",
                    "limit": 100,
                }
            ]
        },
    )
    sql: str = Field(
        min_length=1,
        max_length=100_000,
        examples=["SELECT region, count(*) AS orders FROM order_details GROUP BY region ORDER BY orders DESC"],
    )
    limit: int = Field(default=1000, ge=1, le=MAX_QUERY_ROWS, description="rows returned at most")


class QueryOut(BaseModel):
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool = Field(description="the query had more rows than limit")


class VerifyIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"max_differences": 20}]})
    max_differences: int = Field(default=20, ge=0, le=10_000, description="rows listed at most, per kind")


class QueryRejected(ValueError):
    """An analyst statement outside what the query endpoint runs; the message says why."""


# -- the check -----------------------------------------------------------------------------------

ALLOWED_FUNCTIONS = frozenset(
    [
        "count",
        "sum",
        "avg",
        "mean",
        "min",
        "max",
        "count_if",
        "any_value",
        "first",
        "first_value",
        "last",
        "last_value",
        "stddev",
        "stddev_pop",
        "stddev_samp",
        "std",
        "variance",
        "var_pop",
        "var_samp",
        "approx_count_distinct",
        "approx_percentile",
        "percentile",
        "percentile_approx",
        "percentile_cont",
        "percentile_disc",
        "median",
        "mode",
        "collect_list",
        "collect_set",
        "array_agg",
        "corr",
        "covar_pop",
        "covar_samp",
        "bool_and",
        "bool_or",
        "every",
        "some",
        "any",
        "max_by",
        "min_by",
        "listagg",
        "string_agg",
        "row_number",
        "rank",
        "dense_rank",
        "percent_rank",
        "cume_dist",
        "ntile",
        "lag",
        "lead",
        "nth_value",
        "coalesce",
        "nvl",
        "nvl2",
        "ifnull",
        "nullif",
        "if",
        "iff",
        "greatest",
        "least",
        "isnull",
        "isnotnull",
        "nanvl",
        "zeroifnull",
        "nullifzero",
        "cast",
        "try_cast",
        "int",
        "bigint",
        "smallint",
        "tinyint",
        "double",
        "float",
        "string",
        "boolean",
        "date",
        "timestamp",
        "decimal",
        "abs",
        "round",
        "bround",
        "floor",
        "ceil",
        "ceiling",
        "sqrt",
        "cbrt",
        "pow",
        "power",
        "exp",
        "ln",
        "log",
        "log2",
        "log10",
        "log1p",
        "sign",
        "signum",
        "mod",
        "pmod",
        "rand",
        "random",
        "pi",
        "e",
        "degrees",
        "radians",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "atan2",
        "sinh",
        "cosh",
        "tanh",
        "positive",
        "negative",
        "div",
        "try_add",
        "try_subtract",
        "try_multiply",
        "try_divide",
        "width_bucket",
        "hypot",
        "upper",
        "ucase",
        "lower",
        "lcase",
        "length",
        "len",
        "char_length",
        "character_length",
        "octet_length",
        "bit_length",
        "substring",
        "substr",
        "left",
        "right",
        "trim",
        "ltrim",
        "rtrim",
        "btrim",
        "concat",
        "concat_ws",
        "replace",
        "translate",
        "instr",
        "locate",
        "position",
        "lpad",
        "rpad",
        "initcap",
        "reverse",
        "split",
        "split_part",
        "startswith",
        "endswith",
        "contains",
        "like",
        "ilike",
        "rlike",
        "regexp",
        "regexp_like",
        "regexp_extract",
        "regexp_extract_all",
        "regexp_replace",
        "regexp_count",
        "regexp_substr",
        "format_string",
        "printf",
        "format_number",
        "ascii",
        "chr",
        "char",
        "soundex",
        "levenshtein",
        "md5",
        "sha",
        "sha1",
        "sha2",
        "crc32",
        "hash",
        "xxhash64",
        "hex",
        "unhex",
        "base64",
        "unbase64",
        "to_char",
        "to_number",
        "try_to_number",
        "overlay",
        "find_in_set",
        "substring_index",
        "current_date",
        "current_timestamp",
        "now",
        "curdate",
        "current_timezone",
        "date_add",
        "date_sub",
        "dateadd",
        "datediff",
        "date_diff",
        "add_months",
        "months_between",
        "date_format",
        "date_trunc",
        "trunc",
        "to_date",
        "to_timestamp",
        "try_to_timestamp",
        "unix_timestamp",
        "from_unixtime",
        "to_unix_timestamp",
        "unix_seconds",
        "unix_millis",
        "timestamp_seconds",
        "timestamp_millis",
        "year",
        "quarter",
        "month",
        "day",
        "dayofmonth",
        "dayofweek",
        "dayofyear",
        "weekday",
        "weekofyear",
        "hour",
        "minute",
        "second",
        "last_day",
        "next_day",
        "make_date",
        "make_timestamp",
        "extract",
        "date_part",
        "datepart",
        "timestampadd",
        "timestampdiff",
        "from_utc_timestamp",
        "to_utc_timestamp",
        "array",
        "array_contains",
        "array_distinct",
        "array_except",
        "array_intersect",
        "array_join",
        "array_max",
        "array_min",
        "array_position",
        "array_remove",
        "array_sort",
        "array_union",
        "arrays_overlap",
        "arrays_zip",
        "size",
        "cardinality",
        "element_at",
        "try_element_at",
        "explode",
        "explode_outer",
        "posexplode",
        "posexplode_outer",
        "inline",
        "inline_outer",
        "flatten",
        "slice",
        "sort_array",
        "struct",
        "named_struct",
        "map",
        "map_keys",
        "map_values",
        "map_from_arrays",
        "transform",
        "filter",
        "exists",
        "forall",
        "aggregate",
        "reduce",
        "zip_with",
        "get",
        "stack",
        "get_json_object",
        "json_tuple",
        "from_json",
        "to_json",
    ]
)

# Syntax that is not a function call although sqlglot models it as one.
_SYNTAX = (exp.Case, exp.Connector)

# Every other node of the tree must be one of these: the syntax of read-only queries. Anything
# else (DDL, DML, commands, SET, CACHE, SELECT … INTO, hints, TRANSFORM … USING scripts, …)
# is refused, including constructs a later sqlglot version may add.
_QUERY_SYNTAX: tuple[type[exp.Expr], ...] = tuple(
    getattr(exp, name)
    for name in [
        "Select",
        "Union",
        "Intersect",
        "Except",
        "Subquery",
        "From",
        "Join",
        "Where",
        "Group",
        "Having",
        "Qualify",
        "Order",
        "Ordered",
        "Limit",
        "Offset",
        "With",
        "CTE",
        "TableAlias",
        "Table",
        "Identifier",
        "Column",
        "Star",
        "Alias",
        "Aliases",
        "Literal",
        "Boolean",
        "Null",
        "Paren",
        "Tuple",
        "Neg",
        "Not",
        "And",
        "Or",
        "Xor",
        "EQ",
        "NEQ",
        "NullSafeEQ",
        "NullSafeNEQ",
        "LT",
        "LTE",
        "GT",
        "GTE",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "IntDiv",
        "Mod",
        "DPipe",
        "BitwiseAnd",
        "BitwiseOr",
        "BitwiseXor",
        "BitwiseNot",
        "BitwiseLeftShift",
        "BitwiseRightShift",
        "Like",
        "ILike",
        "SimilarTo",
        "In",
        "Between",
        "Is",
        "Distinct",
        "Window",
        "WindowSpec",
        "Lateral",
        "Pivot",
        "PivotAlias",
        "TableSample",
        "Values",
        "Interval",
        "IntervalSpan",
        "Var",
        "DataType",
        "DataTypeParam",
        "Bracket",
        "Dot",
        "Lambda",
        "Filter",
        "Cube",
        "Rollup",
        "GroupingSets",
        "Cluster",
        "Distribute",
        "Sort",
        "Any",
        "All",
        "If",
        "Case",
        "Kwarg",
        "PropertyEQ",
        "Slice",
        "Escape",
        "RespectNulls",
        "IgnoreNulls",
        "HavingMax",
        "Placeholder",
        "Parameter",
        "HexString",
        "WithinGroup",
    ]
    if hasattr(exp, name)
) + tuple(  # the parsed path argument of get_json_object
    getattr(exp, name) for name in dir(exp) if name.startswith("JSONPath") and isinstance(getattr(exp, name), type)
)

# Words Spark resolves as a function when no column of that name is in scope, quoted or not
# (Spark 4's literal functions: user, current_user, session_user, current_date,
# current_timestamp, current_time, current_path, grouping__id), and environment words other
# versions may add. Only a bare column reference is refused: a qualified one (v.user) is
# always a column, and sqlglot reads the allowed ones (current_date) as function calls.
NILADIC_WORDS = frozenset(
    [
        "user",
        "current_user",
        "session_user",
        "system_user",
        "current_role",
        "current_path",
        "current_database",
        "current_catalog",
        "current_schema",
        "current_date",
        "current_timestamp",
        "current_time",
        "current_timezone",
        "localtimestamp",
        "localtime",
        "grouping__id",
    ]
)
MAX_QUERY_TOKENS = 5_000  # sqlglot checks such a statement in ~0.25 s

_TABLE_ARGS = frozenset({"this", "alias", "pivots", "sample", "joins", "laterals"})
_STORE_PREFIXES = (ZLOG_PREFIX, BASE_PREFIX)
_CALL = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def check_query(sql: str, views: Collection[str]) -> str:
    """The Spark SQL to run for analyst statement ``sql`` over the registered ``views``;
    QueryRejected naming the first problem otherwise."""
    known = {v.lower(): v for v in views}
    try:
        tree = _parse_query(sql)
        _check_tree(tree, known)
        out = _generate(tree)
        # What runs is ``out``: check it too, and that it is what it says it is (a fixpoint of
        # parsing and generating), so that no rewrite of the generator slips past the check.
        again = _parse_query(out)
        _check_tree(again, known)
        if _generate(again) != out:
            raise QueryRejected("the statement does not survive regeneration unchanged; simplify it")
        scans = view_scans(again)
        if scans > MAX_VIEW_SCANS:
            raise QueryRejected(
                f"the statement reads views {scans} times once its WITH clauses are expanded (at most "
                f"{MAX_VIEW_SCANS}): Spark would plan every copy; simplify it"
            )
    except RecursionError:
        raise QueryRejected(str(sql_bounds.too_deep())) from None
    if "${" in out:
        raise QueryRejected("variable substitution (${…}) is not allowed")
    return out


def query_views(sql: str, views: Collection[str]) -> list[str]:
    """The views a checked statement reads as published (a CTE of the same name in scope
    hides a view; ``pvm_consistent.<view>`` is read at the cut over all views already).

    >>> query_views("WITH a AS (SELECT * FROM b) SELECT * FROM a JOIN c ON a.x = c.x", ["a", "b", "C"])
    ['C', 'b']
    >>> query_views("SELECT * FROM pvm_consistent.a JOIN pvm_consistent.b USING (x)", ["a", "b"])
    []
    """
    known = {v.lower(): v for v in views}
    tree = _parse_query(sql)
    found = {
        known[table.name.lower()]
        for table in tree.find_all(exp.Table)
        if table.name.lower() in known and not consistent_read(table) and table.name.lower() not in ctes_in_scope(table)
    }
    return sorted(found)


async def pinned_views(manager: Manager, analysts: AnalystProcess, sql: str) -> dict[str, PinnedView]:
    """The views a checked statement reads, each as of its order in their consistent cut
    (docs/protocol.md, 'Consistent reads across views'), from the files its store record
    names; none for a statement over one view, which is read as published. Conflict
    (retryable) while the views have no state in common yet. The statement is parsed on the
    analysts' check threads, as its check was; the cut is taken on the event loop, where
    the views' maintenance state changes."""
    names = await analysts.check(query_views, sql, list(manager.views))
    if len(names) < 2:
        return {}
    return manager.pinned(names)


def view_scans(tree: exp.Expr) -> int:
    """How many times the statement reads a view once every CTE reference is replaced by the
    CTE's query, as Spark's analyzer does: a chain of CTEs that each read the one before twice
    doubles the plan at every step, and planning it holds a Spark driver for good.

    >>> import sqlglot
    >>> chain = "WITH c0 AS (SELECT id FROM v), " + ", ".join(
    ...     f"c{i} AS (SELECT id FROM c{i-1} UNION ALL SELECT id FROM c{i-1})" for i in range(1, 6))
    >>> view_scans(sqlglot.parse_one(chain + " SELECT * FROM c5", dialect="spark"))
    32
    """
    memo: dict[int, int] = {}

    def scans(node: exp.Expr) -> int:
        total = 0
        for table in node.find_all(exp.Table):
            if _inside_cte(table, node):
                continue  # a CTE's reads count where the CTE is read, not where it is written
            cte = _cte_of(table)
            if cte is None:
                total += 1
            else:
                if id(cte) not in memo:
                    memo[id(cte)] = 0  # a reference to itself (refused as recursion) counts once
                    memo[id(cte)] = scans(cte.this)
                total += memo[id(cte)]
        return total

    return scans(tree)


def _inside_cte(table: exp.Table, top: exp.Expr) -> bool:
    """Whether ``table`` sits in a CTE definition below ``top``."""
    node = table.parent
    while node is not None and node is not top:
        if isinstance(node, exp.CTE):
            return True
        node = node.parent
    return False


def _cte_of(table: exp.Table) -> exp.CTE | None:
    """The CTE a table reference resolves to, as Spark scopes it (see ``ctes_in_scope``), or
    None for a view."""
    name = table.name.lower()
    child: exp.Expr = table
    node = table.parent
    while node is not None:
        if isinstance(node, exp.With):
            position = next((i for i, cte in enumerate(node.expressions) if cte is child), 0)
            for cte in reversed(node.expressions[:position]):
                if cte.alias_or_name.lower() == name:
                    return cte
        else:
            clause = _with_of(node)
            if clause is not None and clause is not child:
                for cte in reversed(clause.expressions):
                    if cte.alias_or_name.lower() == name:
                        return cte
        child, node = node, node.parent
    return None


def _parse_query(sql: str) -> exp.Query:
    try:
        statements = [s for s in sql_bounds.parse(sql, "spark", max_tokens=MAX_QUERY_TOKENS) if s is not None]
    except sql_bounds.SqlTooComplex as error:
        raise QueryRejected(str(error)) from None
    except SqlglotError as error:
        raise QueryRejected(f"could not parse the statement: {str(error).splitlines()[0]}") from None
    except Exception as error:  # sqlglot failing on odd input is still the statement's problem
        raise QueryRejected(f"could not parse the statement ({type(error).__name__}: {error})"[:500]) from None
    if not statements:
        raise QueryRejected("the statement is empty")
    if len(statements) > 1:
        raise QueryRejected(f"send exactly one statement (found {len(statements)})")
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        kind = "a command" if isinstance(tree, exp.Command) else type(tree).__name__.upper()
        raise QueryRejected(f"only a SELECT query is allowed, not {kind}")
    return tree


def _generate(tree: exp.Expr) -> str:
    """Spark SQL for ``tree`` with every ``WITH`` where it was written. Spark 3+ takes nested
    CTEs; sqlglot's Spark generator hoists them to the top (for Spark 2), which would change
    their scope: a hoisted CTE hides a same-named view in the whole statement, and one hoisted
    behind a CTE that reads it leaves that read to resolve to a table."""
    generator = Dialect.get_or_raise("spark").generator()
    # sqlglot types this as a class constant of a slotted base; the Spark generator has a __dict__
    generator.EXPRESSIONS_WITHOUT_NESTED_CTES = set()  # type: ignore[misc]
    return generator.generate(tree, copy=True)


def _check_tree(tree: exp.Expr, views: dict[str, str]) -> None:
    defined = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for node in tree.walk():
        if isinstance(node, exp.Column):
            _check_column(node)
        if isinstance(node, exp.Table):
            _check_table(node, views, defined)
        elif isinstance(node, exp.Func) and not isinstance(node, _SYNTAX):
            _check_function(node)
        elif type(node) not in _QUERY_SYNTAX:
            raise QueryRejected(f"{_construct(node)} not allowed: only a read-only SELECT over views is")
        if isinstance(node, exp.Select):
            for clause, label in (("into", "SELECT … INTO"), ("hint", "query hints")):
                if node.args.get(clause):
                    raise QueryRejected(f"{label} not allowed: only a read-only SELECT over views is")
        elif isinstance(node, exp.With) and node.args.get("recursive"):
            raise QueryRejected("WITH RECURSIVE not allowed: only a read-only SELECT over views is")
        elif isinstance(node, exp.CTE) and node.alias_or_name.lower().startswith(_STORE_PREFIXES):
            raise QueryRejected(f"CTE name {node.alias_or_name!r} is not allowed: it is a store table's name")


_LABELS = {
    "querytransform": "TRANSFORM … USING (scripts)",
    "into": "SELECT … INTO",
    "hint": "query hints",
    "command": "commands",
}


def _construct(node: exp.Expr) -> str:
    key = node.key.lower()
    return _LABELS.get(key, key.upper())


def _with_of(node: exp.Expr) -> exp.With | None:
    """The WITH clause attached to ``node`` (a query), if any."""
    for value in node.args.values():
        if isinstance(value, exp.With):
            return value
    return None


def ctes_in_scope(table: exp.Table) -> set[str]:
    """Lower-cased names of the CTEs a table reference can mean, as Spark scopes them: those
    of every enclosing query's WITH, where the reference sits in a CTE definition only the
    CTEs defined before it in that WITH (no recursion)."""
    names: set[str] = set()
    child: exp.Expr = table
    node = table.parent
    while node is not None:
        if isinstance(node, exp.With):
            position = next((i for i, cte in enumerate(node.expressions) if cte is child), 0)
            names.update(cte.alias_or_name.lower() for cte in node.expressions[:position])
        else:
            clause = _with_of(node)
            if clause is not None and clause is not child:
                names.update(cte.alias_or_name.lower() for cte in clause.expressions)
        child, node = node, node.parent
    return names


def _check_table(table: exp.Table, views: dict[str, str], defined: set[str]) -> None:
    if not isinstance(table.this, exp.Identifier):
        raise QueryRejected(f"{table.this.sql(dialect='spark')} in FROM is not allowed: name a view")
    written = table.sql(dialect="spark")
    if consistent_read(table):
        if table.name.lower() in views:
            return
        shown = ", ".join(sorted(views.values())) or "none yet"
        raise QueryRejected(f"unknown view {written!r}: {CONSISTENT_DB}. names a view ({shown})")
    if table.args.get("db") or table.args.get("catalog"):
        raise QueryRejected(
            f"{written}: qualified names and file paths are not allowed; name a view, or {CONSISTENT_DB}.<view>"
        )
    extra = sorted(k for k, v in table.args.items() if v and k not in _TABLE_ARGS)
    if extra:
        raise QueryRejected(f"{written}: {', '.join(extra)} not allowed on a table reference")
    name = table.name.lower()
    if name in views or name in ctes_in_scope(table):
        return
    shown = ", ".join(sorted(views.values())) or "none yet"
    hint = f" (a CTE named {table.name!r} exists, but it is not in scope here)" if name in defined else ""
    raise QueryRejected(f"unknown view {table.name!r}{hint}: queries may read only views ({shown})")


def consistent_read(table: exp.Table) -> bool:
    """Whether ``table`` is ``pvm_consistent.<name>``: a view read at the consistent cut over
    all views (docs/protocol.md, 'Consistent reads across views').

    >>> import sqlglot
    >>> [consistent_read(t) for t in sqlglot.parse_one("SELECT * FROM pvm_consistent.a, b, x.c").find_all(exp.Table)]
    [True, False, False]
    """
    db = table.args.get("db")
    return (
        isinstance(db, exp.Identifier)
        and db.name.lower() == CONSISTENT_DB
        and not table.args.get("catalog")
        and isinstance(table.this, exp.Identifier)
    )


def _check_column(column: exp.Column) -> None:
    if not column.table and column.name.lower() in NILADIC_WORDS:
        raise QueryRejected(
            f"{column.name!r} alone means Spark's {column.name.lower()}() wherever no column of that name is in scope; "
            f"to read a column named {column.name!r}, qualify it with its view or alias (v.{column.name})"
        )


MAX_BUILT_CHARS = 1 << 20
"""The longest text a pad or a format width may build: one value of ``lpad(x, 2147483647)``
fills a JVM's heap, ends the query process for every analyst and takes 20 s to recover."""
_FORMAT_WIDTH = re.compile(r"%[-#+ 0,(<]*(\d*)(?:\.(\d+))?")


def _check_built_size(node: exp.Func) -> None:
    """Refuse text built to a size no answer could carry: a pad's length and a format's widths
    must be integer literals of at most ``MAX_BUILT_CHARS`` (a computed one could be anything).

    >>> import sqlglot
    >>> _check_built_size(sqlglot.parse_one("lpad(name, 12, '0')", dialect="spark"))
    >>> _check_built_size(sqlglot.parse_one("lpad(name, 2147483647, 'y')", dialect="spark"))
    Traceback (most recent call last):
    ...
    api.analyst.QueryRejected: LPAD builds text of 2147483647 characters; at most 1048576
    >>> _check_built_size(sqlglot.parse_one("format_string('%2000000000d', 1)", dialect="spark"))
    Traceback (most recent call last):
    ...
    api.analyst.QueryRejected: FORMAT_STRING builds text of 2000000000 characters; at most 1048576
    """
    if isinstance(node, exp.Pad):
        sizes, what = [node.args.get("expression")], "the length of LPAD and RPAD"
    elif isinstance(node, exp.Format) or (
        isinstance(node, exp.Anonymous) and node.name.lower() in ("printf", "format_string")
    ):
        pattern = node.this if isinstance(node, exp.Format) else (node.expressions or [None])[0]
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise QueryRejected("the format of FORMAT_STRING and PRINTF must be a string literal")
        widths = [int(n) for m in _FORMAT_WIDTH.finditer(pattern.this) for n in m.groups() if n]
        sizes, what = [exp.Literal.number(w) for w in widths], "a format's widths"
    else:
        return
    for size in sizes:
        if not (isinstance(size, exp.Literal) and size.is_int):
            raise QueryRejected(f"{what} must be an integer literal")
        if int(size.this) > MAX_BUILT_CHARS:
            name = "LPAD" if node.args.get("is_left") else "RPAD" if isinstance(node, exp.Pad) else "FORMAT_STRING"
            raise QueryRejected(f"{name} builds text of {int(size.this)} characters; at most {MAX_BUILT_CHARS}")


def _check_function(node: exp.Func) -> None:
    _check_built_size(node)
    if isinstance(node, exp.Anonymous):
        name = node.name if isinstance(node.this, str) else node.this.sql()
    else:
        match = _CALL.match(node.sql(dialect="spark"))
        name = match.group(1) if match else node.sql_name()  # CURRENT_DATE, a RLIKE b, …
    if name.lower() not in ALLOWED_FUNCTIONS:
        raise QueryRejected(f"function {name} is not allowed in analyst queries")


# -- running it ----------------------------------------------------------------------------------


def _manager(request: Request) -> Manager:
    return request.app.state.manager


def who(request: Request) -> str:
    """Whose request it is, for the per-token limits (the router authenticated it)."""
    principal: Principal | None = getattr(request.state, "principal", None)
    return "an unknown token" if principal is None else principal.describe()


def analysts_of(manager: Manager) -> AnalystProcess:
    """The analysts' query process of the manager; 501 without one (the in-process store)."""
    if manager.analysts is None:
        raise Unsupported("analyst SQL needs the Spark view store (pvm serve --store spark)")
    return manager.analysts


ANALYST_STATUSES: dict[type[AnalystError], int] = {
    AnalystsUnavailable: 503,  # starting or restarting: ask again (Retry-After)
    AnalystsBusy: 429,  # over a limit, or suspended (Retry-After)
    QueryTimedOut: 400,
    QueryRefused: 400,
}


def analyst_status(exc: AnalystError) -> int:
    """The HTTP status of an analysts' refusal or failure: its kind's, the nearest one up.

    >>> from warehouse.analysts.supervisor import AnalystSuspended
    >>> analyst_status(AnalystSuspended("suspended", retry_after=30.0))
    429
    """
    return next((ANALYST_STATUSES[k] for k in type(exc).__mro__ if k in ANALYST_STATUSES), 400)


def analyst_error(exc: AnalystError) -> HTTPException:
    """The HTTP answer to analysts' work the query process refused or could not do."""
    headers = None if exc.retry_after is None else {"Retry-After": str(int(exc.retry_after))}
    return HTTPException(status_code=analyst_status(exc), detail=str(exc), headers=headers)


@router.post(
    "/v1/query",
    response_model=QueryOut,
    summary="Run a read-only SQL query over the views",
    description="One SELECT (set operations and WITH allowed) whose every table is a registered view, "
    "evaluated in Spark SQL over the views as of their watermarks; a statement over several views reads them "
    "at one consistent cut, a state of their sources all of them show (409 with `Retry-After` while there is "
    "none yet). Anything else (DDL, DML, file paths, "
    "other tables, functions outside the allow-list) is refused with 400 naming what is wrong. "
    "501 with the in-process store. Needs an analyst or admin token.",
    responses={
        200: {
            "content": {
                "application/json": {
                    "example": {
                        "columns": ["region", "orders"],
                        "rows": [["north", 212], ["west", 198]],
                        "truncated": False,
                    }
                }
            }
        },
        400: {"content": {"application/json": {"example": {"detail": "table 'pvm_zlog_order_details' is not a view"}}}},
        401: {"content": {"application/json": {"example": {"detail": "missing bearer token"}}}},
        403: {"content": {"application/json": {"example": {"detail": "this needs the analyst or admin role"}}}},
        409: {
            "content": {
                "application/json": {
                    "example": {
                        "detail": "view(s) 'late' cannot be read at one state of source(s) 'shop' with the others "
                        "yet: their oldest readable state is ahead of what the others have reached; ask again once "
                        "the views have caught up"
                    }
                }
            },
            "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}},
        },
        501: {"content": {"application/json": {"example": {"detail": "queries need the Spark view store"}}}},
    },
)
async def query(body: QueryIn, request: Request) -> QueryOut:
    """One read-only SELECT over the views (as of their watermarks, or of their consistent
    cut when it reads several), run by the analysts' query process (``warehouse/analysts``),
    never in the process that maintains the views."""
    manager = _manager(request)
    analysts = analysts_of(manager)
    views = list(manager.views)
    try:  # admitted first, then checked on the analysts' own threads, then run
        result = await analysts.query(
            body.sql,
            body.limit,
            who(request),
            check=partial(check_query, views=views),
            pin=partial(pinned_views, manager, analysts),
        )
    except QueryRejected as exc:
        raise Refused(str(exc)) from exc
    except AnalystError as exc:
        raise analyst_error(exc) from exc
    return QueryOut(columns=result.columns, rows=result.rows, truncated=result.truncated)


@router.post(
    "/v1/views/{name}/verify",
    summary="Verify a view against its sources",
    description="Snapshots of the sources shipped by the wrappers, moved back to the view's cut at its "
    "watermark with the logged updates, recomputed in Spark SQL and compared with the view as of W, both in "
    "the analysts' query process (it reads the stored view from the store's files: no store lock is held "
    "and maintenance is not slowed). `equal` says whether they match; `missing`/`extra` list differing rows. "
    "At most `pvm serve --max-verifications` (default 1) run at once over all views, one per view: more are "
    "refused with 429 and `Retry-After`. Needs an analyst or admin token.",
    responses={
        200: {
            "content": {
                "application/json": {
                    "example": {
                        "view": "order_details",
                        "columns": ["order_id", "customer", "qty"],
                        "watermark": 200,
                        "equal": True,
                        "engine": "spark",
                        "expected_rows": 817,
                        "stored_rows": 817,
                        "missing_total": 0,
                        "extra_total": 0,
                        "missing": [],
                        "extra": [],
                        "sources": [],
                    }
                }
            }
        },
        404: {"content": {"application/json": {"example": {"detail": "unknown view 'nope'"}}}},
        409: {"content": {"application/json": {"example": {"detail": "view 'v' is still initializing"}}}},
        429: {
            "content": {
                "application/json": {
                    "example": {
                        "detail": "1 verification(s) already running ('orders' (12 s)), the most this manager runs "
                        "at once (pvm serve --max-verifications, now 1); ask again once one has answered"
                    }
                }
            },
            "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}},
        },
    },
)
async def verify(name: str, request: Request, body: VerifyIn | None = None) -> dict[str, Any]:
    """Recompute the view from its sources and compare it with the view as of its watermark;
    ``equal`` says whether they match, ``missing``/``extra`` list differing rows."""
    from warehouse.verify import verify_view

    manager = _manager(request)
    try:
        report = await verify_view(manager, name, (body or VerifyIn()).max_differences, who(request))
    except AnalystError as exc:
        raise analyst_error(exc) from exc
    return report.to_dict()
