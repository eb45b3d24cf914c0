"""Which column types a wrapper can ship, and the one wire form of each value.

A value reaches the manager on two paths: captured (JSON written by a trigger, or a row the
wrapper read itself) and answered (a subquery result). Both must give the same scalar, or
the manager would see two different rows where the source has one. The wire forms:

* integers and booleans as JSON numbers / booleans, floating point as JSON numbers;
* NUMERIC/DECIMAL as an integer when it has no fractional digits, else a float (what
  ``json.loads`` makes of the number a trigger writes);
* text as text, DATE as ISO text ``YYYY-MM-DD`` (which orders like the dates themselves).

Other types (timestamps, intervals, binary, JSON, arrays, UUID, …) are refused when capture
is installed: shipping them would need a text form whose comparisons agree with the
source's, which this wrapper does not promise. The type *family* of a column is read from
its reflected type name with SQLite-like affinity rules (``contract.value_fit.source_family``,
which the manager reads too), so the same rules serve every dialect and the subquery builder.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterable
from typing import Any

from contract.value_fit import source_family
from wrappers.errors import WrapperError

SUPPORTED = "integers, floating point, NUMERIC/DECIMAL, BOOLEAN, character strings and DATE"


def check_shippable(table: str, columns: Iterable[tuple[str, str]]) -> None:
    """WrapperError naming every ``(column, type name)`` of ``table`` no family covers."""
    bad = [f"{name} ({type_name or 'no type'})" for name, type_name in columns if source_family(type_name) is None]
    if bad:
        raise WrapperError(
            f"table {table!r} has column(s) the wrapper cannot ship: {', '.join(bad)}; supported: {SUPPORTED}"
        )


AS_IS = frozenset({int, float, str, bool, type(None)})
"""Types a driver hands out that are their own wire form: most values of most rows, told by
one lookup of their exact type where ``wire_value`` makes several ``isinstance`` checks."""


def wire_values(values: Iterable[Any]) -> list[Any]:
    """``wire_value`` of each of ``values``, in order.

    >>> wire_values([1, "a", None, 2.5, True, decimal.Decimal("1.50"), datetime.date(2026, 1, 2)])
    [1, 'a', None, 2.5, True, 1.5, '2026-01-02']
    """
    return [v if type(v) in AS_IS else wire_value(v) for v in values]


def wire_value(value: Any) -> Any:
    """``value`` as a database driver returned it, in its wire form (see the module docstring)."""
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return float(value)
        exponent = value.as_tuple().exponent
        assert isinstance(exponent, int)  # only NaN and infinities have a letter exponent
        return int(value) if exponent >= 0 else float(value)
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex().upper()  # SQLite sources only: what its capture triggers ship
    return value
