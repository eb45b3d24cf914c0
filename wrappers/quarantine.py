"""Rows the views cannot take, left out the same way everywhere the wrapper shows a relation.

A dynamically typed source (SQLite, and the SQLite replica of the other capture methods)
can hold text in a REAL column, a blob in an INTEGER one, or 2 in a BOOLEAN one; any source
can hold a text far larger than an update may be. Shipped, such a value fails the view's
store (a Spark DOUBLE column cannot take text) or the manager's size limit, and the source
stalls behind it. So a row is *unfit* when a value of any of its columns does not fit the
column's declared type, or is larger than ``max_value_bytes``, and an unfit row is treated
as absent from the relation:

* captured changes: an unfit old or new row is dropped from its update (``RowCheck``), the
  rest of the transaction ships, and the drop is counted (``Quarantine``);
* subquery answers (the initial load is one): unfit rows are filtered out in the source's
  own SQL (``fit_clause``), by the same rules.

Both paths apply one rule, so views stay exact relative to "the source minus its unfit
rows": an UPDATE that repairs a value arrives as a delete of the unfit row (dropped) and an
insert of the fit one (shipped). Every column of the relation is checked, not only those
the views read: the rule must not change when a view is defined or dropped, or a new view
could hide a row that older views already hold (its later delete would then be dropped).

What fits each type family (``wrappers.capture.types``), checked on SQLite only (PostgreSQL
and MariaDB enforce their column types themselves):

==========  ===================================  ==========================================
family      captured value (JSON)                SQLite ``typeof``
==========  ===================================  ==========================================
integer     an integer                           integer
float       a number (an integer becomes float)  integer, real
numeric     a number                             integer, real
boolean     0 or 1                               integer 0 or 1
text, date  a string (blobs travel as hex)       text, blob
==========  ===================================  ==========================================

NULL always fits; an untyped column takes anything. Sizes count UTF-8 bytes of text (and of
a blob's hex form) on every dialect.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from warehouse.store.types import spark_type
from wrappers.capture.types import Family, family_of
from wrappers.schema import SourceSchema, TableSchema

log = logging.getLogger(__name__)

DEFAULT_MAX_VALUE_BYTES = 16 * 1024 * 1024
LOG_EVERY_SECONDS = 60.0
PREVIEW_CHARS = 60

# The family a view's store gives a type that the wrapper's own families do not cover (a
# SQLite column declared STRING has numeric affinity, but the store makes it a Spark STRING).
_STORE_FAMILIES: dict[str, Family] = {"BIGINT": "integer", "DOUBLE": "float", "STRING": "text", "BOOLEAN": "boolean"}

_PYTHON_TYPES: dict[Family, tuple[type, ...]] = {
    "integer": (int,),
    "float": (int, float),
    "numeric": (int, float),
    "boolean": (int,),
    "text": (str,),
    "date": (str,),
}
_SQLITE_TYPES: dict[Family, tuple[str, ...]] = {
    "integer": ("integer",),
    "float": ("integer", "real"),
    "numeric": ("integer", "real"),
    "boolean": ("integer",),
    "text": ("text", "blob"),
    "date": ("text", "blob"),
}
_KINDS = {str: "text", int: "integer", float: "real", bool: "boolean"}
# PostgreSQL's to_jsonb writes a non-finite double precision or numeric as a JSON string.
_POSTGRESQL_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def checked_family(type_name: str) -> Family | None:
    """The family whose values a column of declared type ``type_name`` must hold; None: any."""
    family = family_of(type_name)
    if family is None:
        family = _STORE_FAMILIES.get(spark_type(type_name) or "")
    return family


class Unfit(Exception):
    """A row the views cannot take, and why (for the quarantine's report)."""

    def __init__(self, relation: str, column: str | None, value: Any, why: str) -> None:
        super().__init__(f"{relation}.{column} = {preview(value)}: {why}" if column is not None else f"{relation}: {why}")
        self.relation = relation
        self.column = column
        self.value = value
        self.why = why


def preview(value: Any) -> str:
    """A short, printable form of ``value`` for logs and health."""
    text = repr(value)
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + f"… ({len(text)} characters)"


def utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class _Rule:
    column: str
    family: Family
    accepts: tuple[type, ...]


class RowCheck:
    """The captured-change half of the rule for one relation (see the module docstring).

    >>> table = TableSchema("items", ("id", "val", "flag"), ("INTEGER", "REAL", "BOOLEAN"), ("id",))
    >>> check = RowCheck(table, "sqlite", max_value_bytes=100)
    >>> check({"id": 1, "val": 3, "flag": 1})
    {'id': 1, 'val': 3.0, 'flag': 1}
    >>> check({"id": 2, "val": "oops", "flag": 0})
    Traceback (most recent call last):
    ...
    wrappers.quarantine.Unfit: items.val = 'oops': a text value in a column declared REAL
    """

    def __init__(self, table: TableSchema, dialect: str, max_value_bytes: int) -> None:
        self.relation = table.name
        self._max_bytes = max_value_bytes
        self._fast_chars = max_value_bytes // 4  # no text this short can exceed the limit
        self._types = dict(zip(table.columns, table.types))
        families = {c: checked_family(t) for c, t in self._types.items()}
        self._rules: tuple[_Rule, ...] = ()
        self._postgresql_numbers: tuple[str, ...] = ()
        if dialect == "sqlite":
            self._rules = tuple(_Rule(c, f, _PYTHON_TYPES[f]) for c, f in families.items() if f is not None)
        elif dialect == "postgresql":
            self._postgresql_numbers = tuple(c for c, f in families.items() if f in ("float", "numeric"))

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with values in their wire form (an integer of a float column as a float,
        PostgreSQL's non-finite numbers as floats); Unfit if the views cannot take it."""
        for column in self._postgresql_numbers:
            value = row.get(column)
            if type(value) is str and value in _POSTGRESQL_NON_FINITE:
                row[column] = _POSTGRESQL_NON_FINITE[value]
        for rule in self._rules:
            value = row.get(rule.column)
            if value is None:
                continue
            if type(value) not in rule.accepts:
                kind = _KINDS.get(type(value), type(value).__name__)
                raise Unfit(self.relation, rule.column, value, f"a {kind} value in a column declared {self._declared(rule.column)}")
            if rule.family == "float" and type(value) is int:
                row[rule.column] = float(value)
            elif rule.family == "boolean" and value not in (0, 1):
                raise Unfit(self.relation, rule.column, value, f"{value} in a column declared {self._declared(rule.column)} (0 or 1)")
        for column, value in row.items():
            if type(value) is str and len(value) > self._fast_chars and utf8_size(value) > self._max_bytes:
                raise Unfit(self.relation, column, value, f"{utf8_size(value)} bytes, above --max-value-bytes {self._max_bytes}")
        return row

    def _declared(self, column: str) -> str:
        return self._types[column]


def fit_clause(
    table: TableSchema, dialect: str, max_value_bytes: int, column: Callable[[str], Any]
) -> sa.ColumnElement[bool] | None:
    """The subquery half of the rule: a condition true exactly for the fit rows of ``table``,
    in ``dialect``'s SQL (``column`` gives a column's expression; None: every row fits).

    It agrees with ``RowCheck`` value by value: SQLite ``typeof`` for the type families,
    and text sizes in UTF-8 bytes (PostgreSQL counts the database's encoding, UTF-8 unless
    it was created otherwise)."""
    limit = sa.literal(max_value_bytes)
    conditions: list[sa.ColumnElement[bool]] = []
    for name, type_name in zip(table.columns, table.types):
        value = column(name)
        family = checked_family(type_name)
        if dialect == "sqlite":
            kind = sa.func.typeof(value)
            if family is not None:
                fits = kind.in_(("null", *_SQLITE_TYPES[family]))
                if family == "boolean":
                    fits = sa.or_(kind == "null", sa.and_(kind == "integer", value.in_((0, 1))))
                conditions.append(fits)
            size = sa.case(
                (kind == "text", sa.func.length(sa.cast(value, sa.LargeBinary))),
                (kind == "blob", 2 * sa.func.length(value)),
                else_=0,
            )
            conditions.append(size <= limit)
        elif family in ("text", "date"):
            conditions.append(sa.func.coalesce(sa.func.octet_length(value), 0) <= limit)
    return sa.and_(*conditions) if conditions else None


@dataclass
class _Count:
    rows: int = 0
    logged_at: float = -math.inf
    unlogged: int = 0


class Quarantine:
    """How many captured rows were left out, per relation, and the last reason. Logged at
    most once per relation every ``log_every`` seconds (with the count in between)."""

    def __init__(self, source: str, log_every: float = LOG_EVERY_SECONDS) -> None:
        self._source = source
        self._log_every = log_every
        self._counts: dict[str, _Count] = {}
        self._last: dict[str, Any] | None = None

    def note(self, problem: Unfit) -> None:
        count = self._counts.setdefault(problem.relation, _Count())
        count.rows += 1
        count.unlogged += 1
        now = time.time()
        self._last = {
            "relation": problem.relation,
            "column": problem.column,
            "value": preview(problem.value) if problem.column is not None else None,
            "reason": problem.why,
            "at": now,
        }
        if now - count.logged_at >= self._log_every:
            log.warning(
                "source %s: left a row of %s out of its update (%d since the last report): %s",
                self._source, problem.relation, count.unlogged, problem,
            )  # fmt: skip
            count.logged_at, count.unlogged = now, 0

    def status(self) -> dict[str, Any]:
        return {
            "rows": sum(c.rows for c in self._counts.values()),
            "by_relation": {relation: c.rows for relation, c in self._counts.items()},
            "last": self._last,
        }


class Fitness:
    """The rule for every relation of one source (its dialect, its size limit), applied to
    captured rows, with the quarantine that counts what it left out."""

    def __init__(self, source: str, schema: SourceSchema, dialect: str, max_value_bytes: int) -> None:
        self.max_value_bytes = max_value_bytes
        self.quarantine = Quarantine(source)
        self._checks = {name: RowCheck(table, dialect, max_value_bytes) for name, table in schema.tables.items()}

    def __call__(self, relation: str, row: dict[str, Any] | None) -> dict[str, Any] | None:
        """Captured ``row`` of ``relation`` in its wire form, or None (counted) if it is unfit."""
        if row is None:
            return None
        try:
            return self._checks[relation](row)
        except Unfit as problem:
            self.quarantine.note(problem)
            return None

    def unreadable(self, relation: str, reason: str) -> None:
        """Count a captured change the wrapper could not even read (its JSON is malformed)."""
        self.quarantine.note(Unfit(relation, None, None, reason))
