"""``wire_values``: a row's values in their wire form, the plain ones told by their exact type."""

from __future__ import annotations

import datetime
import enum
from decimal import Decimal

from wrappers.capture.types import wire_value, wire_values


class Level(enum.IntEnum):
    HIGH = 3


def test_wire_values_is_wire_value_of_each() -> None:
    values = [
        0, -1, 2**70, 1.5, -0.0, float("inf"), float("nan"), "", "é", None, True, False,
        Decimal("2"), Decimal("2.50"), Decimal("-Infinity"), Decimal("NaN"),
        datetime.date(2026, 11, 29), datetime.datetime(2026, 11, 29, 1, 2, 3),
        b"\x00\xff", bytearray(b"ab"), memoryview(b"c"), Level.HIGH,
    ]  # fmt: skip
    assert repr(wire_values(values)) == repr([wire_value(v) for v in values])
    assert [type(v) for v in wire_values([Decimal("2"), True, Level.HIGH])] == [int, bool, Level]
