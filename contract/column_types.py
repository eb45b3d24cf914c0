"""Spark SQL column types of a view, from the SQL types its sources declare.

Wrappers report each column's declared type as the source database spells it (``INTEGER``,
``VARCHAR(40)``, ``DOUBLE PRECISION``, ``TINYINT(1)``, or nothing at all for an untyped
SQLite column). The common scalar families map to a Spark type; everything else (decimals,
dates, times, binary, JSON, unknown) stays untyped and is stored as exact JSON text, since
values travel as JSON scalars and a lossy conversion would make the view differ from its
sources.

>>> [spark_type(t) for t in ["INTEGER", "varchar(20)", "DOUBLE PRECISION", "BOOLEAN", "NUMERIC(10, 2)", ""]]
['BIGINT', 'STRING', 'DOUBLE', 'BOOLEAN', None, None]
"""

from __future__ import annotations

import re

_INTEGER = {
    "INT",
    "INTEGER",
    "BIGINT",
    "SMALLINT",
    "TINYINT",
    "MEDIUMINT",
    "INT2",
    "INT4",
    "INT8",
    "SERIAL",
    "BIGSERIAL",
    "SMALLSERIAL",
}
_FLOAT = {"REAL", "FLOAT", "DOUBLE", "DOUBLE PRECISION", "FLOAT4", "FLOAT8", "BINARY_DOUBLE", "BINARY_FLOAT"}
_TEXT = {
    "TEXT",
    "VARCHAR",
    "CHAR",
    "CHARACTER",
    "CHARACTER VARYING",
    "NVARCHAR",
    "NCHAR",
    "STRING",
    "CLOB",
    "NTEXT",
    "TINYTEXT",
    "MEDIUMTEXT",
    "LONGTEXT",
    "VARCHAR2",
    "NVARCHAR2",
    "CITEXT",
    "NAME",
}
_BOOLEAN = {"BOOLEAN", "BOOL", "BIT"}

_PARAMS = re.compile(r"\([^)]*\)")


def is_array_type(sql_type: str) -> bool:
    """Whether a declared type holds arrays (``INTEGER[]``, ``INT ARRAY``): lists, whatever
    the family of their elements.

    >>> [is_array_type(t) for t in ("INTEGER[]", "VARCHAR(20)[]", "INT ARRAY", "ARRAY<INT>", "INTEGER")]
    [True, True, True, True, False]
    """
    text = sql_type.upper().strip()
    return text.endswith(("]", " ARRAY")) or text.startswith("ARRAY")


def spark_type(sql_type: str | None) -> str | None:
    """The Spark SQL type for a declared source column type; None where the values are kept
    as JSON text (unknown, empty, an array, or a family without a lossless Spark equivalent
    here)."""
    if not sql_type or is_array_type(sql_type):
        return None
    text = sql_type.upper()
    width = _PARAMS.search(text)
    name = " ".join(_PARAMS.sub(" ", text).replace("UNSIGNED", " ").replace("ZEROFILL", " ").split())
    if name in _BOOLEAN:
        # BIT(n) with n > 1 is a bit string, not a flag
        return "BOOLEAN" if name != "BIT" or width is None or width.group(0) == "(1)" else None
    if name in _INTEGER:
        # BIGINT UNSIGNED reaches 2**64 - 1, beyond Spark's BIGINT
        return None if name == "BIGINT" and "UNSIGNED" in text else "BIGINT"
    if name in _FLOAT:
        return "DOUBLE"
    if name in _TEXT or name.startswith(("VARCHAR", "CHARACTER")):
        return "STRING"
    return None
