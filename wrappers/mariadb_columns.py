"""A MariaDB result set read as Arrow columns: the rows of a relation snapshot without a
Python object per value.

PyMySQL, pure Python, spends about 4 µs of CPU on each row of three columns: it reads each
row packet into an object, then each value through a few method calls and a converter. A
snapshot of a million rows spent most of its time there. Here the statement is run by
PyMySQL as usual (its unbuffered cursor, ``stream_results``: the server streams the rows
and nothing holds them all), which also reads the column definitions; the row packets
(MariaDB's text protocol) are then read from the connection's socket in blocks, framed in
a loop that only notes where each row starts, and cut into columns with numpy, a column
at a time for all the rows of a batch. Each column is an Arrow binary array of the exact
bytes PyMySQL would have converted, and becomes its wire form:

* integers (PyMySQL's ``int``) into an int64 column, and floating point (``float``) into a
  float64 one, are parsed by Arrow from the same decimal text: the same numbers (both
  parse correctly rounded; a value beyond int64 is refused, as before);
* text in the connection's UTF-8 into a string column is checked as UTF-8 by Arrow;
* any other column (decimals, dates, binary strings, flags, JSON text) goes value by value
  through PyMySQL's own decoding and converter, then ``wire_value``, as before.

A row packet holds, per column, a length-encoded string (one length byte below 251, 251
for NULL, 252/253/254 for a two-, three- or eight-byte length after it); the result ends
with an EOF packet (0xFE, shorter than 9 bytes: PyMySQL does not ask for
``CLIENT_DEPRECATE_EOF``), or an error packet (0xFF). Once the EOF packet is read, the
result and the connection are left as PyMySQL leaves them after its last row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from contract.relation_snapshot import JSON_KEY, SnapshotStreamError, encode_column
from wrappers.capture.types import wire_value

_READ_BYTES = 1 << 18
_BATCH_BYTES = 1 << 26
"""A batch ends after this many bytes of rows even short of its rows: values may be large."""
_MAX_PACKET = 0xFFFFFF  # a packet this long continues in the next one
_NULL, _TWO, _THREE, _EIGHT = 251, 252, 253, 254
_UTF8 = ("utf8", "utf8mb4", "utf-8")


def readable(cursor: Any) -> bool:
    """Whether ``cursor`` is a PyMySQL unbuffered cursor in the middle of its result set,
    which ``batches`` can read."""
    result = getattr(cursor, "_result", None)
    return (
        type(cursor).__module__.startswith("pymysql")
        and result is not None
        and getattr(result, "unbuffered_active", False)
        and hasattr(getattr(cursor, "connection", None), "_rfile")
    )


def batches(cursor: Any, schema: pa.Schema, rows_per_batch: int) -> Iterator[list[pa.Array]]:
    """The rest of ``cursor``'s result set, in arrays of ``schema``'s fields (one per
    column of the result, in its order), about ``rows_per_batch`` rows at a time."""
    import pymysql

    result = cursor._result
    conn = result.connection
    if len(result.converters) != len(schema):
        raise SnapshotStreamError(f"the result has {len(result.converters)} columns, the snapshot {len(schema)}")
    columns = [_column(f, encoding, converter) for f, (encoding, converter) in zip(schema, result.converters)]
    ended = False
    try:
        buffer = bytearray()
        framed = 0  # bytes of ``buffer`` cut into whole row packets
        starts: list[int] = []  # where each framed row's payload starts
        while True:
            end = len(buffer)
            while framed + 4 <= end and len(starts) < rows_per_batch and framed < _BATCH_BYTES:
                length = buffer[framed] | buffer[framed + 1] << 8 | buffer[framed + 2] << 16
                after = framed + 4 + length
                if after > end:
                    break
                if length == _MAX_PACKET:  # a row of 16 MiB or more, in several packets
                    joined = _long_row(buffer, framed, end)
                    if joined is None:
                        break
                    payload, after = joined
                    buffer[framed:after] = bytes(4) + payload  # one contiguous payload, as ``_cut`` reads it
                    starts.append(framed + 4)
                    framed += 4 + len(payload)
                    end = len(buffer)
                    continue
                first = buffer[framed + 4] if length else 0
                if first == 0xFF:
                    result.unbuffered_active = False
                    pymysql.protocol.MysqlPacket(bytes(buffer[framed + 4 : after]), conn.encoding).raise_for_error()
                if first == 0xFE and length < 9:
                    eof = pymysql.protocol.MysqlPacket(bytes(buffer[framed + 4 : after]), conn.encoding)
                    result._check_packet_is_eof(eof)  # its warning count and more-results flag
                    conn._next_seq_id = (buffer[framed + 3] + 1) % 256
                    result.unbuffered_active = False  # as PyMySQL leaves its result after the last row
                    result.connection = None
                    result.rows = None
                    ended = True
                    break
                starts.append(framed + 4)
                framed = after
            if starts and (ended or len(starts) >= rows_per_batch or framed >= _BATCH_BYTES):
                data = np.frombuffer(bytes(buffer[:framed]), np.uint8)
                yield [
                    convert(values) for convert, values in zip(columns, _cut(data, starts, len(columns)), strict=True)
                ]
                del buffer[:framed]
                framed, starts = 0, []
                continue  # frame what is left before reading more
            if ended:
                return
            buffer += _read(conn)
    finally:
        if not ended:  # an error, or the reader abandoned: the rest of the rows cannot be skipped
            result.unbuffered_active = False
            conn._force_close()


def _read(conn: Any) -> bytes:
    """What the server has sent next: PyMySQL's own lost-connection error if nothing."""
    import pymysql

    try:
        chunk = conn._rfile.read1(_READ_BYTES)
    except OSError as exc:
        conn._force_close()
        raise pymysql.err.OperationalError(2013, f"Lost connection to MySQL server during query ({exc})") from exc
    if not chunk:
        conn._force_close()
        raise pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query")
    return chunk


def _long_row(buffer: bytearray, at: int, end: int) -> tuple[bytes, int] | None:
    """A row sent in several packets (each of the maximal length but the last): its payload
    and where it ends in ``buffer``; None if it has not all arrived."""
    parts = []
    while True:
        if at + 4 > end:
            return None
        length = buffer[at] | buffer[at + 1] << 8 | buffer[at + 2] << 16
        if at + 4 + length > end:
            return None
        parts.append(bytes(buffer[at + 4 : at + 4 + length]))
        at += 4 + length
        if length < _MAX_PACKET:
            return b"".join(parts), at


def _cut(data: np.ndarray, starts: list[int], width: int) -> Iterator[pa.BinaryArray]:
    """The ``width`` columns of the rows whose payloads start at ``starts`` in ``data``, as
    binary arrays of their values' bytes (NULL where the row has NULL)."""
    at = np.array(starts, np.int64)
    rows = len(at)
    for _ in range(width):
        head = data[at].astype(np.int64)
        null = head == _NULL
        length = np.where(null, 0, head)
        prefix = np.ones(rows, np.int64)
        long = head > _NULL
        if long.any():
            for marker, size in ((_TWO, 2), (_THREE, 3), (_EIGHT, 8)):
                which = np.flatnonzero(head == marker)
                if which.size:
                    value = np.zeros(which.size, np.int64)
                    for byte in range(size):
                        value |= data[at[which] + 1 + byte].astype(np.int64) << (8 * byte)
                    length[which] = value
                    prefix[which] = 1 + size
        start = at + prefix
        offsets = np.zeros(rows + 1, np.int64)
        np.cumsum(length, out=offsets[1:])
        total = int(offsets[-1])
        values = data[np.repeat(start - offsets[:-1], length) + np.arange(total)]
        nulls = int(np.count_nonzero(null))
        validity = pa.py_buffer(np.packbits(~null, bitorder="little")) if nulls else None
        offsets32 = pa.py_buffer(offsets.astype(np.int32))  # a batch's bytes fit 32 bits
        yield pa.Array.from_buffers(pa.binary(), rows, [validity, offsets32, pa.py_buffer(values)], nulls)
        at = start + length


def _column(
    field: pa.Field, encoding: str | None, converter: Callable[[str], Any] | None
) -> Callable[[pa.Array], pa.Array]:
    """How a column's bytes become ``field``'s array: parsed by Arrow where that gives what
    PyMySQL's decoding and converter give, else value by value through them."""
    json = bool(field.metadata) and JSON_KEY in field.metadata
    if not json and encoding == "ascii" and field.type == pa.int64() and converter is int:
        return lambda values: _parsed(field, values, pa.int64())
    if not json and encoding == "ascii" and field.type == pa.float64() and converter is float:
        return lambda values: _parsed(field, values, pa.float64())
    if not json and field.type == pa.string() and encoding in _UTF8 and converter is None:
        return lambda values: _parsed(field, values, pa.string())

    def each(values: pa.Array) -> pa.Array:
        decoded = []
        for value in values.to_pylist():
            if value is not None:
                if encoding is not None:
                    value = value.decode(encoding)
                if converter is not None:
                    value = converter(value)
            decoded.append(wire_value(value))
        return encode_column(field, decoded)

    return each


def _parsed(field: pa.Field, values: pa.Array, type_: pa.DataType) -> pa.Array:
    """The bytes as text (checked as UTF-8), parsed into ``type_`` unless it is text."""
    try:
        text = pc.cast(values, pa.string())
        return text if type_ == pa.string() else pc.cast(text, type_)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SnapshotStreamError(f"column {field.name!r}: a value does not fit {field.type}: {exc}") from exc
