"""What the Spark store calls things: its bookkeeping columns, its tables, and which view and
column names it accepts.

Per view, the store keeps a base and a z-log table under fixed names (``BASE_PREFIX`` and
``ZLOG_PREFIX`` in ``warehouse/store/base.py``), which compaction moves, and one table per
version of each (``version_table``), which never moves.
"""

from __future__ import annotations

import re

from warehouse.store.base import BASE_PREFIX, CONSISTENT_PREFIX, VERSIONS_DB, ZLOG_PREFIX, StoreError

__all__ = ["ORDER", "RESERVED_WORDS", "WEIGHT", "check_columns", "check_view_name", "version_table"]

WEIGHT = "_w"
ORDER = "_order"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# Spark SQL's reserved keywords under ``spark.sql.ansi.enforceReservedKeywords=true``
# (``SELECT keyword FROM sql_keywords() WHERE reserved`` with that setting on). A view named
# after one of them breaks analysts' queries as soon as a deployment turns enforcement on.
RESERVED_WORDS = frozenset(
    [
        "ALL",
        "AND",
        "ANY",
        "AS",
        "AUTHORIZATION",
        "BOTH",
        "CALL",
        "CASE",
        "CAST",
        "CHECK",
        "COLLATE",
        "COLLATION",
        "COLLATIONS",
        "COLUMN",
        "CONSTRAINT",
        "CREATE",
        "CROSS",
        "CURRENT_DATE",
        "CURRENT_PATH",
        "CURRENT_SCHEMA",
        "CURRENT_TIME",
        "CURRENT_TIMESTAMP",
        "CURRENT_USER",
        "DISTINCT",
        "ELSE",
        "END",
        "ESCAPE",
        "EXCEPT",
        "EXECUTE",
        "FALSE",
        "FETCH",
        "FILTER",
        "FOR",
        "FOREIGN",
        "FROM",
        "FULL",
        "GRANT",
        "GROUP",
        "HAVING",
        "IN",
        "INNER",
        "INTERSECT",
        "INTO",
        "IS",
        "JOIN",
        "LATERAL",
        "LEADING",
        "LEFT",
        "LOCALTIME",
        "NATURAL",
        "NOT",
        "NULL",
        "OFFSET",
        "ON",
        "ONLY",
        "OR",
        "ORDER",
        "OUTER",
        "OVERLAPS",
        "PRIMARY",
        "RECURSIVE",
        "REFERENCES",
        "RIGHT",
        "SELECT",
        "SESSION_USER",
        "SOME",
        "SQL",
        "TABLE",
        "THEN",
        "TIME",
        "TO",
        "TRAILING",
        "UNION",
        "UNIQUE",
        "UNKNOWN",
        "USER",
        "USING",
        "WHEN",
        "WHERE",
        "WITH",
        "WITHIN",
    ]
)


def check_view_name(view: str) -> None:
    if not _IDENTIFIER.match(view):
        raise StoreError(f"view name {view!r} is not an identifier [A-Za-z_][A-Za-z0-9_]*")
    if view.upper() in RESERVED_WORDS:
        raise StoreError(f"view name {view!r} is a reserved Spark SQL keyword")
    if view.lower().startswith((ZLOG_PREFIX, BASE_PREFIX, CONSISTENT_PREFIX)):
        raise StoreError(f"view name {view!r} collides with the store's own table names")


def check_columns(columns: tuple[str, ...]) -> None:
    if not columns:
        raise StoreError("a view needs at least one column")
    seen: set[str] = set()
    for name in columns:
        if not _IDENTIFIER.match(name):
            raise StoreError(f"column name {name!r} is not an identifier")
        if name.lower() in (WEIGHT, ORDER):
            raise StoreError(f"column name {name!r} is reserved for the store")
        if name.lower() in seen:  # Spark resolves column names case-insensitively
            raise StoreError(f"duplicate column {name!r}")
        seen.add(name.lower())


def version_table(view: str, kind: str, version: int) -> str:
    """The table over version ``version`` of a view's ``kind`` ("base" or "zlog") files:
    unlike the stable tables, it is never moved, so a query that names it reads one version
    from its planning to its end."""
    return f"{VERSIONS_DB}.{kind}_{version}_{view}"
