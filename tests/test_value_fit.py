"""One rule of "does this wire value fit its column" (``contract.value_fit``), seen from both
sides: whatever a wrapper lets through, the manager's receiver takes."""

from __future__ import annotations

import math

import pytest

from contract.schemas import NAN
from warehouse.catalog.db import RelationInfo
from warehouse.manager import _typed_columns
from warehouse.receiver import PlainUpdate, ReceiveError, Receiver, RelationShape
from wrappers.quarantine import RowCheck, Unfit
from wrappers.schema import TableSchema

DECLARED = (
    "INTEGER", "BIGINT", "SMALLINT", "INT UNSIGNED", "BIGINT UNSIGNED", "SERIAL", "TINYINT(1)", "BOOLEAN", "BOOL",
    "BIT", "REAL", "DOUBLE PRECISION", "FLOAT", "BINARY_DOUBLE", "NUMERIC(10, 2)", "DECIMAL", "TEXT",
    "VARCHAR(40)", "CHARACTER VARYING", "STRING", "NAME", "DATE", "BLOB", "JSON", "",
)  # fmt: skip
# Values a wrapper can meet in a SQLite source or replica (where it checks them): its integers
# are 64-bit, which is why the wrapper does not check the rule's bound on them again.
VALUES = (
    None, 0, 1, 2, -1, 2**63 - 1, -(2**63), 1.5, 2.0, NAN, math.inf, True, False, "", "x", "1.5", "NaN", b"\x00",
)  # fmt: skip


def received(declared: str, value: object) -> str | None:
    """The receiver's verdict on one value of a column declared ``declared``: None if taken."""
    columns, typed = _typed_columns(RelationInfo("s", "r", ("c",), (declared,), ()))
    update = PlainUpdate(1, [{"relation": "r", "sign": 1, "row": {"c": value}}])
    try:
        Receiver._validate("s", update, {"r": RelationShape(columns, set(), typed)})
    except ReceiveError as refused:
        return str(refused)
    return None


@pytest.mark.parametrize("declared", DECLARED)
def test_what_a_wrapper_ships_the_manager_takes(declared):
    check = RowCheck(TableSchema("r", ("c",), (declared,), ()), "sqlite", max_value_bytes=1 << 20)
    shipped = 0
    for value in VALUES:
        try:
            wire = check({"c": value})["c"]
        except Unfit:
            continue
        shipped += 1
        assert received(declared, wire) is None, (declared, value)
    assert shipped >= 2  # NULL, and something of its type


def test_integers_beyond_64_bits_fit_no_integer_column():
    assert "an integer beyond 64 bits in a column declared BIGINT" in received("BIGINT", 2**63)
    assert "an integer beyond 64 bits" in received("INTEGER", -(2**63) - 1)
    assert received("NUMERIC(30)", 2**70) is None  # kept as exact JSON by the view


@pytest.mark.parametrize(
    ("declared", "value"),
    [("INTEGER", 2.5), ("INTEGER", "7"), ("INTEGER", True), ("REAL", "1.5"), ("BOOLEAN", 2), ("TEXT", 3)],
)
def test_the_manager_refuses_what_a_wrapper_leaves_out(declared, value):
    check = RowCheck(TableSchema("r", ("c",), (declared,), ()), "sqlite", max_value_bytes=1 << 20)
    with pytest.raises(Unfit) as left_out:
        check({"c": value})
    refused = received(declared, value)
    assert refused is not None and refused.endswith(
        f"column 'c': {left_out.value.why}, which a view cannot store (a wrapper leaves such rows out of its "
        "updates: docs/capture.md)"
    )
