"""Wire schemas between wrappers and manager, shared by both sides.

Rows travel as JSON objects (updates) or arrays in a declared column order (subqueries).
Values are JSON scalars: integers, floats, strings, booleans and null. JSON has no
infinities and no NaN, so a non-finite float travels as a tagged object (``Scalar``):

>>> Change(relation="r", sign=1, row={"x": float("inf"), "y": 2.5}).model_dump_json()
'{"relation":"r","sign":1,"row":{"x":{"$float":"Infinity"},"y":2.5}}'
>>> Change.model_validate_json('{"relation":"r","sign":-1,"row":{"x":{"$float":"NaN"}}}').row["x"] is NAN
True
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, model_validator

FLOAT_TAG = "$float"
"""The member of the object that carries a non-finite float: ``{"$float": "NaN" | "Infinity" | "-Infinity"}``."""

NAN = float("nan")
"""The one NaN object every decoded NaN is. NaN != NaN, and Python hashes NaN by identity:
a Z-set row holding a fresh NaN object would never meet (and cancel) the row of its delete,
while tuples and dicts compare identical objects as equal."""

_NON_FINITE: dict[str, float] = {"NaN": NAN, "Infinity": math.inf, "-Infinity": -math.inf}


def encode_value(value: Any) -> Any:
    """``value`` as it travels in JSON: a non-finite float as its tagged object, else itself."""
    if type(value) is float and not math.isfinite(value):
        return {FLOAT_TAG: "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"}
    return value


def decode_value(value: Any) -> Any:
    """A value received in JSON: a tagged object as its float, every NaN as ``NAN``; an
    object that is not a tagged float is refused (ValueError, a 422 in a request)."""
    if type(value) is float:
        return NAN if value != value else value
    if type(value) is dict:
        if len(value) == 1 and isinstance(tag := value.get(FLOAT_TAG), str) and tag in _NON_FINITE:
            return _NON_FINITE[tag]
        raise ValueError(
            'a value is a JSON scalar, or {"$float": "NaN" | "Infinity" | "-Infinity"} for a non-finite float'
        )
    return value


_DECODE = BeforeValidator(decode_value)
_ENCODE = PlainSerializer(encode_value, when_used="json", return_type=Any)

Scalar = Annotated[int | float | str | bool | None, _DECODE, _ENCODE]
"""One value of a row, as the wire carries it (see ``encode_value``, ``decode_value``)."""

AnyValue = Annotated[Any, _DECODE, _ENCODE]
"""A value of a subquery answer: the wrapper's own output, decoded without a type check
(on the manager's hot path: about a quarter cheaper than ``Scalar``)."""


def dumps_wire_json(value: Any) -> str:
    """``json.dumps`` with non-finite floats tagged (for JSON stored outside pydantic models).
    Every update the manager logs goes through here: a value without a non-finite float (all
    but a few) is dumped as it is, and only one that ``json.dumps`` refuses is walked to tag
    them (walking every value first took a third of the logging's time).

    >>> dumps_wire_json({"x": [float("-inf"), 1]}), dumps_wire_json({"x": [2.5, None]})
    ('{"x": [{"$float": "-Infinity"}, 1]}', '{"x": [2.5, null]}')
    """
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:  # a non-finite float somewhere
        return json.dumps(_tag_non_finite(value), allow_nan=False)


def loads_wire_json(text: str | bytes) -> Any:
    """``json.loads`` that decodes tagged floats, and every NaN to ``NAN``.

    >>> loads_wire_json('[{"$float": "NaN"}, NaN, {"k": 1}]')[:2] == [NAN, NAN]
    True
    """
    return json.loads(text, object_hook=_untag, parse_constant=_NON_FINITE.__getitem__)


def _tag_non_finite(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _tag_non_finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_tag_non_finite(v) for v in value]
    return encode_value(value)


def _untag(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and isinstance(tag := obj.get(FLOAT_TAG), str) and tag in _NON_FINITE:
        return _NON_FINITE[tag]
    return obj


INT64_MAX = 2**63 - 1  # integers on the wire fit signed 64 bits (the catalog's and Spark's BIGINT)
MAX_CHANGES_PER_UPDATE = 100_000
MAX_UPDATES_PER_POST = 1_000
MAX_SUBQUERY_KEYS = 200_000
MAX_KEY_COLUMNS = 1_000
MAX_SELECT_COLUMNS = 1_000

CAPTURE_METHODS = ("trigger", "log", "timestamp", "application", "snapshot")
"""How a wrapper can capture its source's changes (``wrappers.capture.METHODS``); a source is
registered with the one its wrapper runs, which the wrapper reports in its health."""

WRAPPER_URL_PATTERN = r"^https?://[^\s/]+(/[^\s]*)?$"
"""A wrapper's HTTP address (``pvm wrapper run --port``), as a source is registered with it."""


def wrapper_url_problem(url: str, named: str) -> str | None:
    """Why ``url`` cannot be a wrapper's address, naming where it was given (``named``: the
    command's option or the API's field), or None. The usual mistakes are a bare host:port
    and the source database's URL (which only the wrapper is given): the message says what
    goes where, so ``pvm source add`` and ``POST /v1/sources`` refuse them in the same words."""
    if re.fullmatch(WRAPPER_URL_PATTERN, url):
        return None
    did_you_mean = f" (did you mean 'http://{url}'?)" if re.fullmatch(r"[^\s/]+:\d+", url) else ""  # host:port
    shown = url if len(url) <= 100 else url[:100] + "…"
    return (
        f"{named} is the wrapper's HTTP address (e.g. http://127.0.0.1:8101), not {shown!r}{did_you_mean}; "
        "the source database's URL goes to the wrapper (`pvm wrapper run --url`)"
    )


class Change(BaseModel):
    """One row inserted (+1) or deleted (-1) in one relation. An SQL UPDATE is -old, +new."""

    model_config = ConfigDict(extra="forbid")
    relation: str = Field(min_length=1, max_length=200, examples=["orders"])
    sign: Literal[1, -1] = Field(examples=[1])
    row: dict[str, Scalar] = Field(examples=[{"id": 7, "customer": 3, "amount": 12.5}])


MAX_PARTS_PER_UPDATE = 1_000_000
"""The most parts one update may be shipped in (a bound on ``UpdatePart.index``)."""


class UpdatePart(BaseModel):
    """Which part of an update a message carries, for an update larger than one message
    (more than ``MAX_CHANGES_PER_UPDATE`` changes): every part carries the update's seq and
    txid, parts go in order from index 0, and the manager assembles them into one update,
    released to the views only once the ``last`` part arrived (docs/api.md, Shipping updates)."""

    model_config = ConfigDict(extra="forbid")
    index: int = Field(ge=0, lt=MAX_PARTS_PER_UPDATE, description="0, 1, 2, … in order", examples=[0])
    last: bool = Field(description="whether this part completes the update", examples=[False])


class Update(BaseModel):
    """The changes of one committed source transaction (or of several consecutive ones), or,
    with ``part``, one part of them: an update of any size travels as one seq."""

    model_config = ConfigDict(extra="forbid")
    seq: int = Field(ge=1, le=INT64_MAX, description="gap-free, 1, 2, 3, … in shipping order", examples=[1])
    changes: list[Change] = Field(max_length=MAX_CHANGES_PER_UPDATE)
    txid: str | None = Field(default=None, description="source transaction id, where exposed")
    captured_at: float | None = Field(default=None, description="unix time the wrapper captured it")
    part: UpdatePart | None = Field(
        default=None, description="one part of a larger update (absent: the whole update); alone in its batch"
    )


class UpdateBatch(BaseModel):
    """Several updates of one source in one message (Carnes: pack, ack, resend until acked)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "source": "shop",
                    "updates": [
                        {
                            "seq": 41,
                            "txid": "7301",
                            "captured_at": 1764400000.5,
                            "changes": [
                                {"relation": "orders", "sign": -1, "row": {"id": 7, "customer_id": 3, "qty": 2}},
                                {"relation": "orders", "sign": 1, "row": {"id": 7, "customer_id": 3, "qty": 4}},
                            ],
                        }
                    ],
                }
            ]
        },
    )
    source: str = Field(min_length=1, max_length=100, examples=["shop"])
    updates: list[Update] = Field(max_length=MAX_UPDATES_PER_POST)


class Ack(BaseModel):
    """Everything with seq <= ``through`` is durable; ``held`` are durable but wait for a gap;
    ``parts``, only in the answer to a part that is not the last: how many parts of its update
    the manager has staged (in its catalog: they outlive a restart). A wrapper goes on from
    the part the manager names (``PartRefusal`` when it refuses one)."""

    through: int = Field(ge=0, le=INT64_MAX)
    held: list[int] = []
    parts: int | None = Field(default=None, ge=0, examples=[3])


class PartRefusal(BaseModel):
    """The body of the 409 refusing a part that does not continue what the manager holds of
    its update (out of order, of another seq, of a seq complete already): ``detail`` says
    why, and ``through``, ``held`` and ``parts`` say what the manager holds, as an ``Ack``
    does, ``parts`` counting the parts of the refused part's update staged (0: none of it).
    The wrapper goes on from part ``parts``, or is done if ``through`` covers the seq.

    This extends v1 compatibly: a manager before it answers ``{"detail": …}`` alone (the
    three members are then None or empty), and a wrapper starts the update again from part 0;
    a wrapper before it reads the status only.
    """

    detail: str
    through: int | None = Field(default=None, ge=0, le=INT64_MAX)
    held: list[int] = []
    parts: int | None = Field(default=None, ge=0, examples=[2])


class Subquery(BaseModel):
    """Join the distinct ``keys`` of a partial result with ``relation`` inside the source.

    ``on`` reads key column j of the partial result as ``{"col": ["$key", "k<j>"]}`` and the
    relation's columns as ``{"col": [alias, column]}``; ``where`` is the relation's local
    predicate. Expressions use the JSON form of ``contract.expr``. When more subqueries
    wait than the source answers at once, the smallest ``priority`` goes first: the manager
    sends the time its maintenance unit started, so the oldest unit is served first.

    ``at_least``: the answer may come from any exact snapshot whose watermark is at least
    this seq and whose updates through it the manager holds, an older one than the
    request included (docs/protocol.md, "Answers from a standing snapshot"). Absent, from
    a snapshot taken after the request arrived.
    """

    model_config = ConfigDict(extra="forbid")
    relation: str = Field(min_length=1, max_length=200)
    alias: str = Field(min_length=1, max_length=200)
    keys: list[Annotated[list[Scalar], Field(max_length=MAX_KEY_COLUMNS)]] = Field(
        max_length=MAX_SUBQUERY_KEYS, description=f"rows of the same width, at most {MAX_KEY_COLUMNS} columns"
    )
    on: dict[str, Any] | None = None
    where: dict[str, Any] | None = None
    select: list[str] = Field(
        max_length=MAX_SELECT_COLUMNS,
        description="the relation's columns to answer with; none: one count per key (an outer join's partner counts)",
    )
    priority: float = Field(default=0.0, allow_inf_nan=False)
    at_least: int | None = Field(
        default=None,
        ge=0,
        le=INT64_MAX,
        description="the least watermark the answer may have (absent: a snapshot taken after the request arrived)",
    )

    @model_validator(mode="after")
    def _keys_of_one_width(self) -> Subquery:
        widths = {len(key) for key in self.keys}
        if len(widths) > 1:
            raise ValueError(f"all keys must have the same number of columns, got {sorted(widths)[:10]}")
        return self


class SubqueryAnswer(BaseModel):
    """``rows`` are ``[key index, *selected values, count]``: the join as of ``watermark``,
    which covers exactly the updates with seq <= watermark (docs/design.md, invariant 3)."""

    watermark: int = Field(ge=0, le=INT64_MAX)
    rows: list[list[AnyValue]]
    elapsed_ms: float | None = None


class RelationInterest(BaseModel):
    """What the views need of one relation: a change is shipped only if some predicate in
    ``where`` holds for it (``None`` in the list means: every row), projected to ``columns``."""

    model_config = ConfigDict(extra="forbid")
    columns: list[str]
    where: list[dict[str, Any] | None]


class Interest(BaseModel):
    """The union of every view's needs, per relation (table name)."""

    model_config = ConfigDict(extra="forbid")
    relations: dict[str, RelationInterest]


class InterestAck(BaseModel):
    """Every update with seq > ``boundary`` is filtered and projected with the new interest."""

    boundary: int = Field(ge=0, le=INT64_MAX)


KEY_RELATION = "$key"
