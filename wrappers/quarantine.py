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

Whether a captured value fits its column is ``contract.value_fit``'s rule, the one the
manager applies to every update it receives: a value fits the family of its source's
declared type and that of its view column (``capture_families``). Checked on SQLite only
(PostgreSQL and MariaDB enforce their column types themselves):

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
a blob's hex form) on every dialect: a wrapper's own limit, which the manager does not know.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from contract.schemas import NAN
from contract.value_fit import (
    Family,
    capture_families,
    kind_fits,
    source_family,
    unfit_reason,
    value_checked,
    view_family,
)
from wrappers.schema import SourceSchema, TableSchema

log = logging.getLogger(__name__)

DEFAULT_MAX_VALUE_BYTES = 16 * 1024 * 1024
LOG_EVERY_SECONDS = 60.0
PREVIEW_CHARS = 60
PLANS_PER_RELATION = 256

_SQLITE_TYPES: dict[Family, tuple[str, ...]] = {
    "integer": ("integer",),
    "float": ("integer", "real"),
    "numeric": ("integer", "real"),
    "boolean": ("integer",),
    "text": ("text", "blob"),
    "date": ("text", "blob"),
}
# PostgreSQL's to_jsonb writes a non-finite double precision or numeric as a JSON string.
_POSTGRESQL_NON_FINITE = {"NaN": NAN, "Infinity": math.inf, "-Infinity": -math.inf}


def checked_family(type_name: str) -> Family | None:
    """The narrowest family whose values a column of declared type ``type_name`` must hold:
    the source's own, else the view's; None: any. What fits it fits every one of the
    column's ``capture_families`` (for ``TINYINT(1)``, 0 and 1 are integers too)."""
    return source_family(type_name) or view_family(type_name)


class Unfit(Exception):
    """A row the views cannot take, and why (for the quarantine's report)."""

    def __init__(self, relation: str, column: str | None, value: Any, why: str) -> None:
        super().__init__(
            f"{relation}.{column} = {preview(value)}: {why}" if column is not None else f"{relation}: {why}"
        )
        self.relation = relation
        self.column = column
        self.value = value
        self.why = why


def preview(value: Any) -> str:
    """A short, printable form of ``value`` for logs and health.

    >>> preview("x" * 100)
    "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx… (100 characters)"
    """
    if isinstance(value, str) and len(value) > PREVIEW_CHARS:
        return repr(value[:PREVIEW_CHARS])[: PREVIEW_CHARS - 3] + f"… ({len(value)} characters)"
    return repr(value)


def utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class _Plan:
    """What to do with a row whose values have given Python types (positions in the row)."""

    unfit: tuple[int, Family] | None = None  # the first value whose type does not fit, and the family
    checked: tuple[tuple[int, Family], ...] = ()  # values to check themselves (a boolean's 0 or 1, …)
    to_float: tuple[int, ...] = ()  # integers of float columns
    non_finite: tuple[int, ...] = ()  # PostgreSQL's "NaN", "Infinity", "-Infinity" texts
    texts: tuple[int, ...] = ()  # sizes to check


class RowCheck:
    """The captured-change half of the rule for one relation (see the module docstring).

    A row's value types mostly repeat, so what they call for is worked out once per
    combination of types (a bounded cache) and a row costs a few C-level passes.

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
        self._columns = table.columns
        self._types = table.types
        self._families = tuple(capture_families(t) for t in table.types)
        self._non_finite_columns = tuple(checked_family(t) in ("float", "numeric") for t in table.types)
        self._dialect = dialect
        self._max_bytes = max_value_bytes
        self._fast_chars = max_value_bytes // 4  # no text this short can exceed the limit
        self._plan = functools.lru_cache(maxsize=PLANS_PER_RELATION)(self._make_plan)

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        """``row`` with values in their wire form (an integer of a float column as a float,
        PostgreSQL's non-finite numbers as floats); Unfit if the views cannot take it."""
        # Any: the plan, chosen by the values' types, says which value is of which type
        values: tuple[Any, ...] = tuple(map(row.get, self._columns))
        plan = self._plan(tuple(map(type, values)))
        if plan.unfit is not None:
            i, family = plan.unfit
            why = unfit_reason(family, self._types[i], values[i])
            assert why is not None  # the plan found this value's type unfit for the family
            raise Unfit(self.relation, self._columns[i], values[i], why)
        for i, family in plan.checked:
            if (why := unfit_reason(family, self._types[i], values[i])) is not None:
                raise Unfit(self.relation, self._columns[i], values[i], why)
        for i in plan.to_float:
            row[self._columns[i]] = float(values[i])
        for i in plan.non_finite:
            if values[i] not in _POSTGRESQL_NON_FINITE:
                raise Unfit(
                    self.relation, self._columns[i], values[i], f"a text value in a column declared {self._types[i]}"
                )
            row[self._columns[i]] = _POSTGRESQL_NON_FINITE[values[i]]
        for i in plan.texts:
            if len(values[i]) > self._fast_chars and (size := utf8_size(values[i])) > self._max_bytes:
                raise Unfit(
                    self.relation,
                    self._columns[i],
                    values[i],
                    f"{size} bytes, above --max-value-bytes {self._max_bytes}",
                )
        return row

    def _make_plan(self, kinds: tuple[type, ...]) -> _Plan:
        checked, to_float, non_finite, texts = [], [], [], []
        for i, (kind, families) in enumerate(zip(kinds, self._families)):
            if kind is str:
                texts.append(i)
            if kind is type(None) or not families:
                continue
            if self._dialect == "postgresql":
                if kind is str and self._non_finite_columns[i]:
                    non_finite.append(i)
            elif self._dialect == "sqlite":
                for family in families:
                    if not kind_fits(family, kind):
                        return _Plan(unfit=(i, family))
                    # SQLite's integers are 64-bit: the rule's bound holds for them already, and
                    # checking it would cost every integer of every row.
                    if value_checked(family, kind) and family != "integer":
                        checked.append((i, family))
                if "float" in families and kind is int:
                    to_float.append(i)
        return _Plan(None, tuple(checked), tuple(to_float), tuple(non_finite), tuple(texts))


def fit_clause(
    table: TableSchema, dialect: str, max_value_bytes: int, column: Callable[[str], Any], affinities: bool = True
) -> sa.ColumnElement[bool] | None:
    """The subquery half of the rule: a condition true exactly for the fit rows of ``table``,
    in ``dialect``'s SQL (``column`` gives a column's expression; None: every row fits).

    It agrees with ``RowCheck`` value by value: SQLite ``typeof`` for the type families,
    and text sizes in UTF-8 bytes (PostgreSQL counts the database's encoding, UTF-8 unless
    it was created otherwise). With ``affinities`` (a SQLite source, whose columns have the
    declared types' affinities, not the replica's untyped ones), what SQLite guarantees is
    not checked again: an INTEGER PRIMARY KEY holds integers, a TEXT-affinity column only
    text, blobs and NULL. That halves the checks' cost on a typical table."""
    conditions = [
        condition
        for name, type_name in zip(table.columns, table.types)
        if (
            condition := _fits(
                column(name), type_name, _stored(table, name, type_name, dialect, affinities), max_value_bytes
            )
        )
        is not None
    ]
    return sa.and_(*conditions) if conditions else None


def _stored(table: TableSchema, name: str, type_name: str, dialect: str, affinities: bool) -> str:
    """What a column can hold beyond its family's check: ``rowid`` (integers only), ``text``
    (a TEXT-affinity column: text, blobs, NULL), ``server`` (types enforced) or ``any``."""
    if dialect != "sqlite":
        return "server"
    if not affinities:
        return "any"
    if table.primary_key == (name,) and type_name.upper() == "INTEGER":
        return "rowid"
    upper = type_name.upper()  # SQLite's affinity rules, in their order
    return "text" if "INT" not in upper and any(word in upper for word in ("CHAR", "CLOB", "TEXT")) else "any"


def _fits(value: Any, type_name: str, stored: str, max_value_bytes: int) -> sa.ColumnElement[bool] | None:
    """Whether one column's value fits, with at most one ``typeof`` call per value."""
    family = checked_family(type_name)
    if stored == "server":  # only text can grow large (a date's ISO text cannot)
        return sa.func.coalesce(sa.func.octet_length(value), 0) <= max_value_bytes if family == "text" else None
    if stored == "rowid":
        return None
    size = sa.func.length(sa.cast(value, sa.LargeBinary))  # bytes of a text or a blob
    if stored == "text" and family in ("text", "date", None):
        # Mostly one length(): short enough as text and as a blob's hex form, else text within the limit.
        return sa.or_(
            sa.func.coalesce(size, 0) <= max_value_bytes // 2,
            sa.and_(size <= max_value_bytes, sa.func.typeof(value) == "text"),
        )
    kind = sa.func.typeof(value)
    if family in ("integer", "float", "numeric"):
        return kind.in_(("null", *_SQLITE_TYPES[family]))
    if family == "boolean":
        return sa.case({"null": True, "integer": value.in_((0, 1))}, value=kind, else_=False) == sa.true()
    sized = {
        "null": True,
        "text": size <= max_value_bytes,
        "blob": sa.func.length(value) <= max_value_bytes // 2,  # shipped as hex: two characters a byte
    }
    return sa.case(sized, value=kind, else_=family is None) == sa.true()  # text, date: no numbers


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
