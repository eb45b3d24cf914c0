"""Non-finite floats on the wire: tagged in JSON, plain floats on both sides, and every NaN
one object, so that a row's insert and delete still cancel in a Z-set."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from contract.expr import Cmp, Col, Lit, compile_filter
from contract.schemas import (
    NAN,
    Change,
    Subquery,
    SubqueryAnswer,
    Update,
    UpdateBatch,
    dumps_wire_json,
    loads_wire_json,
)
from contract.zset import ZSet
from warehouse.catalog.db import Catalog, NewUpdate, content_digest

NON_FINITE = [math.inf, -math.inf, float("nan")]


def shipped(row: dict) -> dict:
    """``row`` as the manager's receiver sees it after a wrapper shipped it."""
    batch = UpdateBatch(source="s", updates=[Update(seq=1, changes=[Change(relation="r", sign=1, row=row)])])
    return UpdateBatch.model_validate_json(batch.model_dump_json()).updates[0].changes[0].row


@pytest.mark.parametrize(("value", "spelled"), list(zip(NON_FINITE, ["Infinity", "-Infinity", "NaN"])))
def test_a_non_finite_float_travels_tagged_and_arrives_as_a_float(value: float, spelled: str) -> None:
    text = Change(relation="r", sign=1, row={"x": value}).model_dump_json()
    assert text == f'{{"relation":"r","sign":1,"row":{{"x":{{"$float":"{spelled}"}}}}}}'  # not null, as before
    got = shipped({"x": value, "y": 1.5})["x"]
    assert type(got) is float and (got is NAN if value != value else got == value)


def test_insert_and_delete_of_a_non_finite_row_cancel_in_a_z_set() -> None:
    """Each NaN decoded separately would be a different dict key (Python hashes NaN by
    identity): the delete would not meet the insert."""
    z = ZSet()
    for sign in (1, -1):
        row = shipped({"id": 1, "a": float("nan"), "b": math.inf, "c": -math.inf})
        z.add(tuple(row.values()), sign)
    assert z.is_empty()
    fresh = ZSet({(float("nan"),): 1})
    fresh.add((float("nan"),), -1)
    assert len(fresh) == 2  # what the canonical NaN avoids


def test_subquery_answers_and_keys_carry_non_finite_floats() -> None:
    answer = SubqueryAnswer(watermark=3, rows=[[0, float("nan"), math.inf, 1]])
    back = SubqueryAnswer.model_validate_json(answer.model_dump_json())
    assert back.rows[0][1] is NAN and back.rows[0][2] == math.inf
    request = Subquery(relation="r", alias="r", keys=[[-math.inf], [float("nan")]], select=[])
    keys = Subquery.model_validate_json(request.model_dump_json()).keys
    assert keys[0] == [-math.inf] and keys[1][0] is NAN


@pytest.mark.parametrize(
    "value",
    [{"$float": "nan"}, {"$float": "Infinity", "x": 1}, {"other": 1}, {"$float": 1.0}, [1, 2]],
)
def test_other_objects_are_refused(value: object) -> None:
    with pytest.raises(ValidationError):
        Change.model_validate({"relation": "r", "sign": 1, "row": {"x": value}})


def test_the_catalog_keeps_non_finite_floats_and_gives_back_one_nan(tmp_path) -> None:
    """Logged updates are JSON in the catalog: tagged there too (PostgreSQL's JSON type has no
    NaN), and read back, after a restart, with the same NaN object as freshly received rows."""
    text = dumps_wire_json([{"row": {"a": float("nan"), "b": -math.inf}}])
    assert text == '[{"row": {"a": {"$float": "NaN"}, "b": {"$float": "-Infinity"}}}]'
    assert loads_wire_json(text)[0]["row"]["a"] is NAN
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    try:
        catalog.add_source("s", "http://127.0.0.1:1", "trigger", [])
        changes = [{"relation": "r", "sign": 1, "row": {"a": float("nan"), "b": math.inf}}]
        catalog.append_updates("s", [NewUpdate(1, changes, None, None, content_digest(changes))])
        (entry,) = catalog.log_entries("s", 0)
        assert entry.changes[0]["row"]["a"] is NAN and entry.changes[0]["row"]["b"] == math.inf
    finally:
        catalog.close()


def test_nan_compares_as_in_postgresql_and_spark() -> None:
    """Equal to itself and above every number: the order of the engines that hold NaN, so a
    predicate reads the same in the manager, the wrapper's filter and the source."""
    layout = {Col("r", "x"): 0}

    def holds(op: str, literal: object) -> list[bool]:
        keep = compile_filter(Cmp(op, Col("r", "x"), Lit(literal)), layout)  # type: ignore[arg-type]
        return [keep((v,)) for v in (NAN, math.inf, 1.0)]

    assert holds(">", 1e308) == [True, True, False]
    assert holds("=", NAN) == [True, False, False]
    assert holds("<>", NAN) == [False, True, True]
    assert holds("<", math.inf) == [False, False, True]
    assert holds("=", "text") == [False, False, False]


@pytest.mark.parametrize(
    ("number", "taken"), [(-(2**63), True), (2**63 - 1, True), (-(2**63) - 1, False), (2**63, False)]
)
def test_the_batch_parser_takes_every_64_bit_integer_and_no_other(number: int, taken: bool) -> None:
    from fastapi import HTTPException

    from api.ingest import read_batch

    body = json.dumps(
        {"source": "s", "updates": [{"seq": 1, "changes": [{"relation": "R", "sign": 1, "row": {"k": number}}]}]}
    )
    if taken:
        [update] = read_batch(body.encode()).updates
        assert update.changes[0]["row"]["k"] == number
    else:
        with pytest.raises(HTTPException) as refused:
            read_batch(body.encode())
        assert refused.value.status_code == 422 and "signed 64 bits" in refused.value.detail
