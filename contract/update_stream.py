"""The update stream (version 1): an ``UpdateBatch`` as one Arrow IPC stream, the columnar
body of ``POST /v1/updates`` beside the JSON one.

A wrapper sends it with the content type ``UPDATE_STREAM_CONTENT_TYPE``
(``application/vnd.apache.arrow.stream; version=1``) for a batch of at least
``ARROW_FROM_CHANGES`` changes, where it is cheaper than JSON for both sides (docs/benchmarks.md,
"Rows on the wire"); it carries exactly what the JSON body does:

* the schema's metadata: ``pvm.updates`` = ``"1"`` (the format version) and ``pvm.batch``,
  the batch without its changes, as JSON: ``{"source": …, "updates": [{"seq": …, "txid": …,
  "captured_at": …, "part": …, "changes": N}, …]}``, each update's ``changes`` being how many
  changes it has (``txid``, ``captured_at`` and ``part`` as in JSON, ``part`` left out of a
  whole update);
* two fields: ``sign`` (int8, 1 or -1) and ``row``, a dense union with one member per row
  *shape* (a relation and the columns of its rows, in their order): the member is named after
  the relation and is a struct of those columns. A batch holds at most ``MAX_SHAPES`` shapes
  (a wrapper sends a batch with more as JSON);
* each column of a shape is typed by the wire values it holds: int64 (integers), float64
  (floats, NaN and the infinities as themselves), string, bool, or null (a column of NULLs
  only); a column whose values are of several kinds (SQLite hands out 1 and 1.5 from one
  column) or do not fit (an integer beyond 64 bits) is a string of each value's JSON text
  (field metadata ``pvm.json`` = ``"1"``), the text the JSON body would carry;
* the rows of the record batches are the changes of the batch's updates, in order: the first
  ``changes`` rows are the first update's, the next ones the second's, and so on. A row's
  relation is its union member's name, its row the member's struct (every column of the
  shape, NULL included).

Decoded values are the JSON body's exactly (``1`` stays an integer, ``1.0`` a float, every
NaN is ``contract.schemas.NAN``), so a seq sent once as JSON and once as a stream has one
content digest.

>>> from contract.schemas import Change, Update
>>> update = Update(seq=3, txid="9", changes=[
...     Change(relation="orders", sign=-1, row={"id": 7, "qty": 2, "note": None}),
...     Change(relation="orders", sign=1, row={"id": 7, "qty": 4.5, "note": "x"})])
>>> stream = read_update_stream(encode_update_batch("shop", [update]))
>>> stream.header["updates"]
[{'seq': 3, 'txid': '9', 'captured_at': None, 'changes': 2}]
>>> stream.changes()[1]
{'relation': 'orders', 'sign': 1, 'row': {'id': 7, 'qty': 4.5, 'note': 'x'}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from contract.schemas import INT64_MAX, NAN, Update, dumps_wire_json, loads_wire_json

UPDATE_STREAM_VERSION = "1"
UPDATE_STREAM_MEDIA_TYPE = "application/vnd.apache.arrow.stream"
UPDATE_STREAM_CONTENT_TYPE = f"{UPDATE_STREAM_MEDIA_TYPE}; version={UPDATE_STREAM_VERSION}"
VERSION_KEY = b"pvm.updates"
BATCH_KEY = b"pvm.batch"
JSON_KEY = b"pvm.json"
MAX_SHAPES = 128
"""Row shapes one stream holds at most: a dense union's type codes are 0 to 127."""
ARROW_FROM_CHANGES = 100
"""The changes from which a wrapper sends a batch as a stream: below, JSON is cheaper end to
end (the stream's schema and buffers are a fixed cost of a few hundred microseconds)."""
DECODE_SLICE = 5_000
"""Rows turned into Python values per call: about a millisecond without the GIL given up."""

_TYPED: dict[type, pa.DataType] = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}
_ALLOWED = (pa.int64(), pa.float64(), pa.string(), pa.bool_(), pa.null())


class UpdateStreamBroken(ValueError):
    """A body that is not a whole Arrow IPC stream: not one at all, malformed buffers, or cut
    short (a 400 in a request)."""


class UpdateStreamInvalid(ValueError):
    """A readable stream that is not an update batch of this version: another version, a
    wrong schema, a value out of the wire's range (a 422 in a request). ``change``: the
    index, among all the batch's changes, of the change at fault, and ``field`` its member
    (``("sign",)``, ``("row", column)``); None when the fault is not one change's."""

    def __init__(self, message: str, change: int | None = None, field: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.change = change
        self.field = field


# -- encoding (the wrapper) ---------------------------------------------------------------------
def encode_update_batch(source: str, updates: Sequence[Update]) -> bytes | None:
    """The batch of ``source``'s ``updates`` as an update stream; None if its changes have
    more row shapes than a stream holds (``MAX_SHAPES``): it goes as JSON then."""
    shapes: dict[tuple[str, tuple[str, ...]], int] = {}
    members: list[list[dict[str, Any]]] = []
    codes: list[int] = []
    offsets: list[int] = []
    signs: list[int] = []
    for update in updates:
        for change in update.changes:
            row = change.row
            code = shapes.get(key := (change.relation, tuple(row)))
            if code is None:
                if len(shapes) == MAX_SHAPES:
                    return None
                code = shapes[key] = len(members)
                members.append([])
            codes.append(code)
            offsets.append(len(members[code]))
            signs.append(change.sign)
            members[code].append(row)
    children = [_struct(columns, rows) for (_, columns), rows in zip(shapes, members, strict=True)]
    union = pa.UnionArray.from_dense(
        pa.array(codes, pa.int8()),
        pa.array(offsets, pa.int32()),
        children,
        field_names=[relation for relation, _ in shapes],
    )
    header = {
        "source": source,
        "updates": [
            {
                "seq": u.seq,
                "txid": u.txid,
                "captured_at": u.captured_at,
                **({} if u.part is None else {"part": u.part.model_dump()}),
                "changes": len(u.changes),
            }
            for u in updates
        ],
    }
    metadata = {VERSION_KEY: UPDATE_STREAM_VERSION.encode(), BATCH_KEY: dumps_wire_json(header).encode()}
    batch = pa.RecordBatch.from_arrays([pa.array(signs, pa.int8()), union], names=["sign", "row"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema.with_metadata(metadata)) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _struct(columns: tuple[str, ...], rows: list[dict[str, Any]]) -> pa.StructArray:
    """The rows of one shape as a struct of typed columns (``_column``)."""
    if not columns:  # rows without columns (a relation none of whose columns a view needs)
        return pa.array([{}] * len(rows), pa.struct([]))
    arrays, fields = [], []
    for name in columns:
        array, as_json = _column([row[name] for row in rows])
        arrays.append(array)
        fields.append(pa.field(name, array.type, metadata={JSON_KEY: b"1"} if as_json else None))
    return pa.StructArray.from_arrays(arrays, fields=fields)


def _column(values: list[Any]) -> tuple[pa.Array, bool]:
    """Wire values as the column they travel in, and whether it is their JSON text."""
    kinds = {type(v) for v in values}
    kinds.discard(type(None))
    if not kinds:
        return pa.nulls(len(values)), False
    if len(kinds) == 1 and (typed := _TYPED.get(kinds.pop())) is not None:
        try:
            return pa.array(values, typed), False
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            pass  # an integer beyond 64 bits, a string that is not UTF-8: their JSON text
    return pa.array([None if v is None else json.dumps(v) for v in values], pa.string()), True


# -- decoding (the manager) ---------------------------------------------------------------------
@dataclass(frozen=True)
class _Shape:
    relation: str
    columns: tuple[str, ...]
    as_json: tuple[bool, ...]
    floats: tuple[bool, ...]


class UpdateStream:
    """An update stream being read: ``header`` (``pvm.batch``, parsed but not validated),
    then ``changes()``. UpdateStreamBroken and UpdateStreamInvalid as their docstrings say."""

    def __init__(self, body: bytes) -> None:
        try:
            self._reader = pa.ipc.open_stream(pa.py_buffer(body))
        except (pa.ArrowException, OSError) as exc:
            raise UpdateStreamBroken(f"not an Arrow IPC stream: {_first_line(exc)}") from None
        meta = self._reader.schema.metadata or {}
        version = meta.get(VERSION_KEY)
        if version != UPDATE_STREAM_VERSION.encode():
            shown = "(none)" if version is None else version.decode(errors="replace")[:20]
            raise UpdateStreamInvalid(
                f"update stream version {shown!r} (schema metadata {VERSION_KEY.decode()}); "
                f"this manager reads version {UPDATE_STREAM_VERSION}"
            )
        try:
            self.header: Any = loads_wire_json(meta[BATCH_KEY])
        except (KeyError, ValueError):
            raise UpdateStreamInvalid(
                f"the stream's schema metadata holds no JSON {BATCH_KEY.decode()} (the batch without its changes)"
            ) from None
        try:
            self._shapes = _shapes(self._reader.schema)
        except UnicodeDecodeError:
            raise UpdateStreamInvalid("a name in the stream's schema is not UTF-8") from None

    def changes(self) -> list[dict[str, Any]]:
        """Every change of the stream, as ``{"relation", "sign", "row"}`` dicts in order."""
        out: list[dict[str, Any]] = []
        while True:
            try:
                batch = self._reader.read_next_batch()
                batch.validate(full=True)  # offsets, UTF-8, union codes: before any value is read
            except StopIteration:
                return out
            except (pa.ArrowException, OSError) as exc:
                raise UpdateStreamBroken(f"the stream broke after {len(out)} changes: {_first_line(exc)}") from None
            self._decode(batch, out)

    def _decode(self, batch: pa.RecordBatch, out: list[dict[str, Any]]) -> None:
        if batch.num_rows == 0:
            return  # (pyarrow 26 crashes reading the absent type codes of an empty union)
        start = len(out)
        signs = batch.column(0)
        wrong = pc.invert(pc.fill_null(pc.is_in(signs, pa.array([1, -1], pa.int8())), False))
        if pc.any(wrong).as_py():
            at = pc.index(wrong, True).as_py()
            raise UpdateStreamInvalid("a change's sign is 1 or -1", start + at, ("sign",))
        union = batch.column(1)
        codes = union.type_codes
        rows: list[Iterator[dict[str, Any]]] = []
        for k, shape in enumerate(self._shapes):
            member = union.field(k)
            these = pc.filter(union.offsets, pc.equal(codes, k))
            if len(these) != len(member) or not _counts_up(these):
                raise UpdateStreamInvalid(
                    f"the row union's member {k} ({shape.relation!r}) is not laid out in change order "
                    "(its offsets must be 0, 1, 2, … and cover it)"
                )
            if member.null_count:
                at = _position(codes, k, pc.index(pc.is_null(member), True).as_py())
                raise UpdateStreamInvalid("a change's row is null, not an object", start + at, ("row",))
            rows.append(iter(_rows(shape, member, start, codes, k)))
        relations = [shape.relation for shape in self._shapes]
        for first in range(0, batch.num_rows, DECODE_SLICE):
            slice_codes = codes.slice(first, DECODE_SLICE).to_pylist()
            slice_signs = signs.slice(first, DECODE_SLICE).to_pylist()
            out.extend(
                {"relation": relations[c], "sign": s, "row": next(rows[c])}
                for c, s in zip(slice_codes, slice_signs, strict=True)
            )


def read_update_stream(body: bytes) -> UpdateStream:
    """The update stream in ``body``, its schema checked (see ``UpdateStream``)."""
    return UpdateStream(body)


def _shapes(schema: pa.Schema) -> list[_Shape]:
    """The row shapes of a stream's schema; UpdateStreamInvalid unless it is the format's."""
    expected = "two fields, sign (int8) and row (a dense union of structs)"
    if schema.names != ["sign", "row"] or schema.field(0).type != pa.int8():
        raise UpdateStreamInvalid(f"the stream's schema is {_schema_text(schema)}; an update stream has {expected}")
    union = schema.field(1).type
    if not pa.types.is_union(union) or union.mode != "dense" or list(union.type_codes) != list(range(len(union))):
        raise UpdateStreamInvalid(
            f"the stream's row field is {union}; it is a dense union with type codes 0, 1, 2, … ({expected})"
        )
    shapes = []
    for member in union:
        if not 1 <= len(member.name) <= 200:
            raise UpdateStreamInvalid(f"a relation's name has 1 to 200 characters, not {len(member.name)}")
        if not pa.types.is_struct(member.type):
            raise UpdateStreamInvalid(f"relation {member.name!r}: its rows are {member.type}, not a struct")
        columns = list(member.type)
        names = tuple(c.name for c in columns)
        if len(set(names)) != len(names):
            raise UpdateStreamInvalid(f"relation {member.name!r}: a row names a column twice ({', '.join(names)})")
        for c in columns:
            if c.type not in _ALLOWED:
                raise UpdateStreamInvalid(
                    f"relation {member.name!r}, column {c.name!r}: a column is int64, float64, string, bool or null, "
                    f"not {c.type}"
                )
        as_json = tuple(
            bool(c.metadata and c.metadata.get(JSON_KEY) == b"1") and c.type == pa.string() for c in columns
        )
        floats = tuple(c.type == pa.float64() for c in columns)
        shapes.append(_Shape(member.name, names, as_json, floats))
    return shapes


def _rows(shape: _Shape, member: pa.StructArray, start: int, codes: pa.Array, code: int) -> list[dict[str, Any]]:
    """The rows of one union member as dicts of wire values, a slice of columns at a time."""
    n = len(member)
    if not shape.columns:
        return [{} for _ in range(n)]
    columns: list[list[Any]] = []
    for i, (name, as_json, is_float) in enumerate(zip(shape.columns, shape.as_json, shape.floats, strict=True)):
        array = member.field(i)
        values: list[Any] = []
        for first in range(0, n, DECODE_SLICE):
            values.extend(array.slice(first, DECODE_SLICE).to_pylist())
        if is_float and pc.any(pc.is_nan(array)).as_py():
            values = [NAN if v is not None and v != v else v for v in values]  # one NaN object (contract.schemas)
        elif as_json:
            for j, text in enumerate(values):
                if text is not None:
                    try:
                        values[j] = _json_value(text)
                    except ValueError as exc:
                        raise UpdateStreamInvalid(
                            f"column {name!r} of relation {shape.relation!r}: {exc}",
                            start + _position(codes, code, j),
                            ("row", name),
                        ) from None
        columns.append(values)
    names = shape.columns
    return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def _json_value(text: str) -> Any:
    """A JSON-text column's value: a JSON scalar whose integer fits signed 64 bits."""
    value = loads_wire_json(text)
    kind = type(value)
    if kind is int and not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ValueError(f"the integer {text[:40]} does not fit in signed 64 bits")
    if kind is float and math.isinf(value) and "Infinity" not in text:
        raise ValueError(f"the number {text[:40]} is beyond a float's range")
    if kind not in (int, float, str, bool):
        raise ValueError(f"a value is a JSON scalar, not {text[:40]}")
    return value


def _position(codes: pa.Array, code: int, j: int) -> int:
    """The row of the batch that holds union member ``code``'s ``j``-th row (laid out in
    change order, checked before its rows are read)."""
    return int(pc.indices_nonzero(pc.equal(codes, code))[j].as_py())


def _counts_up(offsets: pa.Array) -> bool:
    """Whether ``offsets`` are 0, 1, 2, …"""
    if len(offsets) == 0:
        return True
    if offsets[0].as_py() != 0:
        return False
    steps = pc.pairwise_diff(offsets).slice(1)
    return len(steps) == 0 or bool(pc.all(pc.equal(steps, 1)).as_py())


def _schema_text(schema: pa.Schema) -> str:
    text = ", ".join(f"{f.name} ({f.type})" for f in schema)
    return text if len(text) <= 200 else text[:200] + "…"


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]
