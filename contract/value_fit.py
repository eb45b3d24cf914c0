"""Whether a wire value fits a column's declared type: the one rule both sides apply.

A column's declared type (as its source spells it) falls into a *family*, or into none
(untyped, or a type this service keeps as exact JSON text). A value fits a family when its
kind on the wire (after ``contract.schemas.decode_value``: a non-finite float is a float)
is one the family takes:

==========  ==================================================================
family      fits
==========  ==================================================================
integer     an integer in signed 64 bits (the store's BIGINT)
float       a number, non-finite ones included (an integer becomes a float)
numeric     a number
boolean     a boolean, or the integer 0 or 1
text, date  a string
==========  ==================================================================

NULL always fits, and a column without a family takes anything. A boolean is not a
number here: the store's BIGINT refuses it, and a source's integer never arrives as one.

>>> unfit_reason("integer", "INTEGER", 7) is None, unfit_reason("integer", "INTEGER", None) is None
(True, True)
>>> unfit_reason("integer", "INTEGER", 2.5)
'a real value in a column declared INTEGER'
>>> unfit_reason("boolean", "BOOLEAN", 2)
'the integer 2 in a column declared BOOLEAN (0 or 1)'

Two families can apply to one column, and the sides check them differently:

* the **view family** (``view_family``) is what the view's store column needs (a Spark
  DOUBLE cannot take text). The manager refuses an update holding a value that does not
  fit it (``warehouse.receiver``), since the store would fail the view on it;
* the **source family** (``source_family``) is the source's own type, which can be
  narrower: a ``NUMERIC`` is kept as JSON text by the view but holds numbers, a MariaDB
  ``TINYINT(1)`` is a BIGINT in the view but a flag in the source. A wrapper holds a value
  to both (``capture_families``) and leaves out a row that does not fit
  (``wrappers.quarantine``); where a server enforces its types itself, it ships them as
  they are, and they fit the view family.

So everything a wrapper ships fits the manager's check: what fits both families fits the
view's.

>>> view_family("DOUBLE PRECISION"), source_family("NUMERIC(10, 2)"), view_family("NUMERIC(10, 2)")
('float', 'numeric', None)
>>> capture_families("TINYINT(1)"), capture_families("STRING"), capture_families("")
(('boolean', 'integer'), ('text',), ())
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from contract.column_types import is_array_type, spark_type
from contract.schemas import INT64_MAX

Family = Literal["integer", "float", "numeric", "boolean", "text", "date"]

INT64_MIN = -INT64_MAX - 1

# The family of each Spark type a view column can have (contract.column_types).
_VIEW_TYPE_FAMILIES: dict[str, Family] = {
    "BIGINT": "integer",
    "DOUBLE": "float",
    "STRING": "text",
    "BOOLEAN": "boolean",
}

# The Python types of the wire values each family takes (exact types: bool is no int here).
_FITTING_KINDS: dict[Family, frozenset[type]] = {
    "integer": frozenset({int}),
    "float": frozenset({int, float}),
    "numeric": frozenset({int, float}),
    "boolean": frozenset({bool, int}),
    "text": frozenset({str}),
    "date": frozenset({str}),
}
# The (family, kind) pairs whose values are checked one by one, beyond their kind.
_VALUE_CHECKED: frozenset[tuple[Family, type]] = frozenset({("integer", int), ("boolean", int)})

_KIND_NAMES: dict[type, str] = {
    type(None): "null",
    bool: "boolean",
    int: "integer",
    float: "real",
    str: "text",
    dict: "object",
    list: "array",
}


@functools.lru_cache(maxsize=1024)
def source_family(type_name: str | None) -> Family | None:
    """The family of a source's declared type name (``str(sqlalchemy type)``, read with
    SQLite-like affinity rules so that one reading serves every dialect); None if none.

    >>> [source_family(t) for t in ("BIGINT", "TINYINT(1)", "DECIMAL(8,2)", "DOUBLE", "VARCHAR(20)", "DATE", "BLOB")]
    ['integer', 'boolean', 'numeric', 'float', 'text', 'date', None]

    An array (PostgreSQL's ``INTEGER[]``) holds lists, not its elements' family:

    >>> source_family("INTEGER[]"), source_family("VARCHAR(20)[]"), source_family("INT ARRAY")
    (None, None, None)
    """
    name = (type_name or "").upper()
    if is_array_type(name):
        return None
    if name.startswith(("BOOL", "TINYINT(1)")):
        return "boolean"
    if "INT" in name and "INTERVAL" not in name and "POINT" not in name:
        return "integer"
    if name.startswith(("NUMERIC", "DECIMAL")):
        return "numeric"
    if name.startswith(("REAL", "FLOAT", "DOUBLE")):
        return "float"
    if any(word in name for word in ("CHAR", "TEXT", "CLOB")) and "BINARY" not in name:
        return "text"
    if name == "DATE":
        return "date"
    return None


@functools.lru_cache(maxsize=1024)
def view_family(type_name: str | None) -> Family | None:
    """The family a view's store column of a source column declared ``type_name`` needs;
    None where the view keeps any value (as JSON text).

    >>> [view_family(t) for t in ("INTEGER", "TINYINT(1)", "REAL", "BOOLEAN", "TEXT", "DATE", "BIGINT UNSIGNED")]
    ['integer', 'integer', 'float', 'boolean', 'text', None, None]
    """
    return _VIEW_TYPE_FAMILIES.get(spark_type(type_name) or "")


def store_type_family(store_type: str | None) -> Family | None:
    """The family of a view column's store type (``spark_type``'s answer); None: any value.

    >>> store_type_family("DOUBLE"), store_type_family(None)
    ('float', None)
    """
    return _VIEW_TYPE_FAMILIES.get(store_type or "")


@functools.lru_cache(maxsize=1024)
def capture_families(type_name: str | None) -> tuple[Family, ...]:
    """The families a wrapper holds a captured value of a column declared ``type_name`` to:
    the source's own (where it has one) and the view's, without repeats; () takes anything."""
    return tuple(dict.fromkeys(f for f in (source_family(type_name), view_family(type_name)) if f is not None))


def kind_fits(family: Family, kind: type) -> bool:
    """Whether values of Python type ``kind`` can fit ``family`` (NULL always does).

    >>> kind_fits("float", int), kind_fits("integer", bool), kind_fits("text", type(None))
    (True, False, True)
    """
    return kind is type(None) or kind in _FITTING_KINDS[family]


def value_checked(family: Family, kind: type) -> bool:
    """Whether a value of a kind that fits ``family`` must still be checked itself (the
    integer of a boolean is 0 or 1, that of an integer fits 64 bits)."""
    return (family, kind) in _VALUE_CHECKED


def kind_name(value: Any) -> str:
    """What kind of value ``value`` is, in the wire's words (never the value itself).

    >>> kind_name("oops"), kind_name(1.5), kind_name(True), kind_name({"a": 1}), kind_name(b"x")
    ('text', 'real', 'boolean', 'object', 'bytes')
    """
    return _KIND_NAMES.get(type(value), type(value).__name__)


def unfit_reason(family: Family | None, declared: str, value: Any) -> str | None:
    """Why ``value`` does not fit a column of ``family`` declared ``declared`` (the family's
    type as the source spells it, for the message), or None if it fits.

    >>> unfit_reason("float", "REAL", "oops")
    'a text value in a column declared REAL'
    >>> unfit_reason("text", "TEXT", 12)
    'an integer value in a column declared TEXT'
    >>> unfit_reason("float", "REAL", float("nan")) is None, unfit_reason("boolean", "BOOLEAN", True) is None
    (True, True)
    >>> unfit_reason("integer", "BIGINT", 2**64)
    'an integer beyond 64 bits in a column declared BIGINT'
    >>> unfit_reason(None, "", {"any": "thing"}) is None
    True
    """
    if family is None or value is None:
        return None
    kind = type(value)
    if kind not in _FITTING_KINDS[family]:
        name = kind_name(value)
        return f"{'an' if name[0] in 'aeiou' else 'a'} {name} value in a column declared {declared}"
    if kind is int:
        if family == "boolean" and value not in (0, 1):
            return f"the integer {value} in a column declared {declared} (0 or 1)"
        if family == "integer" and not INT64_MIN <= value <= INT64_MAX:
            return f"an integer beyond 64 bits in a column declared {declared}"
    return None
