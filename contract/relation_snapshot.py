"""The relation snapshot stream (version 1): one relation of a view, as of a watermark, in
Arrow record batches.

A view's initial load in the Spark store asks each wrapper for its relations whole:
``POST /v1/snapshot`` with a ``RelationSnapshot`` body. The wrapper takes the snapshot,
ships every change visible in it (the subquery handshake, docs/design.md invariant 3) and
answers with an Arrow IPC stream (media type ``SNAPSHOT_MEDIA_TYPE``):

* the schema's metadata carries ``pvm.snapshot`` (the format version, ``"1"``) and
  ``pvm.watermark`` (the source's last seq the snapshot reflects), and may carry
  ``pvm.rows_estimate``: what the source's statistics say the relation holds before its
  predicate, for the load's progress (an estimate: the stream may hold fewer rows or more);
* one field per selected column, named after it, in the order asked, typed by the family
  of the column's declared type (``arrow_type``): int64, float64, string or bool, and for
  every other declared type the value's exact JSON text (field metadata ``pvm.json``), as
  the Spark store keeps untyped view columns;
* record batches of rows, each row of weight one, after the local predicate;
* last, a batch of no rows whose custom metadata holds ``pvm.end`` = the number of rows
  sent. A stream that ends without it was cut short (the wrapper died, the connection
  broke): the reader raises ``TruncatedSnapshot`` and keeps nothing of it.

Rows never travel whole: the wrapper encodes a batch at a time, the manager writes each
batch to Parquet as it arrives.

>>> import io
>>> schema = snapshot_schema(["id", "note", "price"], ["INTEGER", "TEXT", "NUMERIC(5,2)"], watermark=7)
>>> sink = io.BytesIO()
>>> writer = SnapshotWriter(sink, schema)
>>> writer.write_rows([(1, "a", 2.5), (2, None, 3)])
>>> writer.close()
>>> reader = SnapshotReader(io.BytesIO(sink.getvalue()))
>>> reader.watermark, [b.num_rows for b in reader.batches()], reader.rows, reader.rows_estimate
(7, [2], 2, None)
>>> reader.schema.field("price").type, reader.schema.field("price").metadata
(DataType(string), {b'pvm.json': b'1'})
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import IO, Any, Protocol

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from contract.column_types import spark_type

SNAPSHOT_VERSION = "1"
SNAPSHOT_MEDIA_TYPE = "application/vnd.apache.arrow.stream"
VERSION_KEY = b"pvm.snapshot"
WATERMARK_KEY = b"pvm.watermark"
JSON_KEY = b"pvm.json"
END_KEY = b"pvm.end"
ESTIMATE_KEY = b"pvm.rows_estimate"
ROWS_PER_BATCH = 10_000
"""Rows a wrapper encodes into one record batch: a few MiB at most for the usual widths."""

_ARROW = {"BIGINT": pa.int64(), "DOUBLE": pa.float64(), "STRING": pa.string(), "BOOLEAN": pa.bool_()}


class RelationSnapshot(BaseModel):
    """Every row of ``relation`` that satisfies ``where`` (a ``contract.expr`` expression in its
    JSON form, columns named ``[alias, column]``), projected to ``select``."""

    model_config = ConfigDict(extra="forbid")
    relation: str = Field(min_length=1, max_length=200)
    alias: str = Field(min_length=1, max_length=200)
    where: dict[str, Any] | None = None
    select: list[str] = Field(min_length=1, max_length=1000)


class Readable(Protocol):
    """Where a stream is read from: a file, or the bytes of an HTTP response as they arrive."""

    def read(self, size: int = -1, /) -> bytes: ...


class SnapshotStreamError(ValueError):
    """A snapshot stream that breaks the format: a wrong version, schema or value."""


class TruncatedSnapshot(ConnectionError):
    """A snapshot stream that ended before its end marker: the wrapper died or the
    connection broke. Retried like any lost connection; nothing of it is kept."""


def arrow_type(declared: str | None) -> pa.DataType:
    """The Arrow type a column of this declared SQL type travels in; string (its values' JSON
    text) for the types the Spark store keeps untyped.

    >>> [str(arrow_type(t)) for t in ("INTEGER", "VARCHAR(3)", "REAL", "BOOLEAN", "DATE", "")]
    ['int64', 'string', 'double', 'bool', 'string', 'string']
    """
    typed = spark_type(declared)
    return _ARROW[typed] if typed is not None else pa.string()


def snapshot_schema(
    columns: Sequence[str], declared: Sequence[str | None], watermark: int, rows_estimate: int | None = None
) -> pa.Schema:
    """The stream's schema for these columns (of these declared types) as of ``watermark``;
    ``rows_estimate``: the relation's size as the source estimates it, if it does."""
    fields = [
        pa.field(c, arrow_type(t), metadata=None if spark_type(t) is not None else {JSON_KEY: b"1"})
        for c, t in zip(columns, declared, strict=True)
    ]
    metadata = {VERSION_KEY: SNAPSHOT_VERSION.encode(), WATERMARK_KEY: str(watermark).encode()}
    if rows_estimate is not None:
        metadata[ESTIMATE_KEY] = str(rows_estimate).encode()
    return pa.schema(fields, metadata=metadata)


def json_text(value: Any) -> str | None:
    """A wire value as the exact JSON text an untyped Spark view column holds (the same text
    ``json.dumps(value, ensure_ascii=False)`` gives; non-finite floats as ``NaN`` and
    ``Infinity``).

    >>> json_text(1), json_text(1.0), json_text("é"), json_text(True), json_text(None), json_text(float("nan"))
    ('1', '1.0', '"é"', 'true', None, 'NaN')
    """
    return None if value is None else json.dumps(value, ensure_ascii=False)


_CONVERTED = (pa.bool_(), pa.float64())
"""The types whose wire values may need a conversion (``_typed``); the others go as they are."""


def _typed(value: Any, type_: pa.DataType) -> Any:
    """A wire value in its column's Arrow type: sources without a boolean type hand out 0 and
    1; SQLite may hand out an integer from a float column."""
    if value is None:
        return None
    if type_ == pa.bool_() and type(value) is int and value in (0, 1):
        return bool(value)
    if type_ == pa.float64() and type(value) is int:
        return float(value)
    return value


def encode_batch(
    schema: pa.Schema, rows: Sequence[Sequence[Any]], weights: Sequence[int] | None = None
) -> pa.RecordBatch:
    """Rows of wire values as one record batch of ``schema``; with ``weights``, a last
    column ``_w`` (the manager's compensation rows). SnapshotStreamError if a value does not
    fit its column."""
    return encode_columns(schema, [[row[i] for row in rows] for i in range(len(schema))], weights)


def encode_columns(
    schema: pa.Schema, columns: Sequence[Sequence[Any]], weights: Sequence[int] | None = None
) -> pa.RecordBatch:
    """``encode_batch`` for values already in columns (what a wrapper fetches, transposed)."""
    arrays = [encode_column(f, values) for f, values in zip(schema, columns, strict=True)]
    names = list(schema.names)
    if weights is not None:
        arrays.append(pa.array(weights, pa.int64()))
        names.append("_w")
    return pa.RecordBatch.from_arrays(arrays, names=names)


def encode_column(field: pa.Field, values: Sequence[Any]) -> pa.Array:
    """One column of wire values as an array of ``field`` (of a snapshot schema);
    SnapshotStreamError if a value does not fit it."""
    if field.metadata and JSON_KEY in field.metadata:
        return pa.array([json_text(v) for v in values], pa.string())
    if field.type in _CONVERTED:
        values = [_typed(v, field.type) for v in values]
    try:
        return pa.array(values, field.type)
    except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
        raise SnapshotStreamError(f"column {field.name!r}: a value does not fit {field.type}: {exc}") from exc


class SnapshotWriter:
    """Writes a snapshot stream to ``sink``: rows in batches, then the end marker."""

    def __init__(self, sink: IO[bytes] | pa.NativeFile, schema: pa.Schema) -> None:
        self.schema = schema
        self.rows = 0
        self._writer = pa.ipc.new_stream(sink, schema)
        self._batch_schema = schema.remove_metadata()

    def write_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._writer.write_batch(encode_batch(self.schema, rows))
            self.rows += len(rows)

    def write_arrays(self, arrays: Sequence[pa.Array]) -> None:
        """One batch of rows given as arrays of the schema's fields (``encode_column``)."""
        if arrays and len(arrays[0]):
            self._writer.write_batch(pa.RecordBatch.from_arrays(list(arrays), schema=self._batch_schema))
            self.rows += len(arrays[0])

    def close(self) -> None:
        """The end marker, then the IPC end of stream: only now is the stream complete."""
        empty = pa.RecordBatch.from_arrays(
            [pa.array([], f.type) for f in self.schema], schema=self.schema.remove_metadata()
        )
        self._writer.write_batch(empty, custom_metadata={END_KEY: str(self.rows).encode()})
        self._writer.close()


class _Source:
    """A ``Readable`` as the file object pyarrow wraps (it asks whether it is closed)."""

    closed = False

    def __init__(self, source: Readable) -> None:
        self.read = source.read


class SnapshotReader:
    """Reads a snapshot stream from ``source``; ``batches`` raises ``TruncatedSnapshot`` if
    the end marker never comes, and SnapshotStreamError if the stream is not one."""

    def __init__(self, source: Readable) -> None:
        try:
            self._reader = pa.ipc.open_stream(pa.PythonFile(_Source(source), mode="r"))
        except (pa.ArrowInvalid, OSError) as exc:
            raise TruncatedSnapshot(f"the snapshot stream broke before its schema: {exc}") from exc
        meta = self._reader.schema.metadata or {}
        if meta.get(VERSION_KEY) != SNAPSHOT_VERSION.encode():
            raise SnapshotStreamError(
                f"snapshot stream version {meta.get(VERSION_KEY, b'(none)').decode(errors='replace')!r}; "
                f"this manager reads version {SNAPSHOT_VERSION}"
            )
        try:
            self.watermark = int(meta[WATERMARK_KEY])
        except (KeyError, ValueError) as exc:
            raise SnapshotStreamError("the snapshot stream names no watermark") from exc
        estimate = meta.get(ESTIMATE_KEY, b"")
        self.rows_estimate: int | None = int(estimate) if estimate.isdigit() else None
        self.schema: pa.Schema = self._reader.schema
        self.rows = 0
        self.complete = False

    def batches(self) -> Iterator[pa.RecordBatch]:
        while True:
            try:
                batch, custom = self._reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                raise TruncatedSnapshot(
                    f"the snapshot stream ended after {self.rows} rows without its end marker"
                ) from None
            except (pa.ArrowInvalid, OSError) as exc:
                raise TruncatedSnapshot(f"the snapshot stream broke after {self.rows} rows: {exc}") from exc
            if custom is not None and END_KEY in custom:
                if int(custom[END_KEY]) != self.rows or batch.num_rows:
                    raise TruncatedSnapshot(f"the snapshot stream sent {self.rows} rows but says {custom[END_KEY]!r}")
                self.complete = True
                return
            self.rows += batch.num_rows
            yield batch
