"""Snapshots of ``<key, rest>`` records, read from memory, CSV dumps or Parquet files.

A *snapshot* is a set of records ``(key, rest)``: ``key`` is a tuple of the key columns'
values, ``rest`` a tuple of the other columns' values, both in the order the ``Schema``
gives. The physical order of records is whatever the dump has; the algorithms do not
assume any order (the window algorithm only works *better* when matching records are
near each other).

Readers:

* ``MemorySnapshot`` over a list of ``(key, rest)`` pairs (``from_rows`` builds one from
  whole rows and column names);
* ``CsvSnapshot`` over a CSV dump with a header line;
* ``ParquetSnapshot`` over a Parquet file (pyarrow is imported only when one is opened);
* ``RecordSnapshot`` over a ``spill.RecordFile`` of records (how a wrapper keeps a
  snapshot it read from a database: Python values exactly, no text round trip).

Each reader can ``scan`` its records, ``scan_with_pointers`` (a pointer is a byte offset
in a CSV dump, a row number in a Parquet file, an index in memory) and ``fetch`` records by
pointer, which is what the ``<K,b,p>`` compression format needs.

Bad input raises ``SnapshotError`` with the file and line: a record whose arity does not
match the schema, a file that is missing, truncated (no final line terminator, an
unterminated quoted field, a cut Parquet footer) or not decodable. Schema and key changes
between two snapshots are caught by ``check_compatible``; duplicate keys by the
algorithms (they are the ones who see keys meet).

>>> snap = from_rows([(1, "ann", 10), (2, "bob", 20)], columns=("id", "name", "bal"), key=("id",))
>>> list(snap)
[((1,), ('ann', 10)), ((2,), ('bob', 20))]
>>> snap.schema.rest_columns
('name', 'bal')
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain, islice
from typing import Any, BinaryIO

from wrappers.differential.errors import SnapshotError
from wrappers.differential.spill import IOStats, RecordFile, SpillError

__all__ = [
    "CsvSnapshot",
    "Key",
    "MemorySnapshot",
    "ParquetSnapshot",
    "Record",
    "RecordSnapshot",
    "Rest",
    "Schema",
    "Snapshot",
    "SnapshotError",
    "as_snapshot",
    "check_compatible",
    "estimate_record_bytes",
    "from_rows",
    "key_bytes",
    "open_snapshot",
    "peek",
    "record_bytes",
    "write_csv",
    "write_parquet",
    "write_records",
]

Key = tuple[Any, ...]
Rest = tuple[Any, ...]
Record = tuple[Key, Rest]


# -- schema ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Schema:
    """Column names, key columns and (optionally) column type names of a snapshot.

    >>> s = Schema(("id", "name"), key=("id",))
    >>> s.key_index, s.rest_index, s.rest_columns
    ((0,), (1,), ('name',))
    >>> s.split((7, "x")), s.join((7,), ("x",))
    (((7,), ('x',)), (7, 'x'))
    """

    columns: tuple[str, ...]
    key: tuple[str, ...]
    types: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        columns = tuple(self.columns)
        key = (self.key,) if isinstance(self.key, str) else tuple(self.key)
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "key", key)
        if self.types is not None:
            object.__setattr__(self, "types", tuple(self.types))
            if len(self.types) != len(columns):
                raise SnapshotError(f"schema has {len(columns)} columns but {len(self.types)} types")
        if len(set(columns)) != len(columns):
            dups = sorted({c for c in columns if columns.count(c) > 1})
            raise SnapshotError(f"duplicate column name(s) {dups}")
        if not key:
            raise SnapshotError("a snapshot needs at least one key column")
        missing = [k for k in key if k not in columns]
        if missing:
            raise SnapshotError(f"key column(s) {missing} not among the columns {list(columns)}")
        if len(set(key)) != len(key):
            raise SnapshotError(f"key column listed twice in {list(key)}")

    @classmethod
    def for_arity(cls, key_arity: int, rest_arity: int) -> Schema:
        """A schema with generated names ``k1..``, ``c1..`` for unnamed in-memory records.

        >>> Schema.for_arity(1, 2).columns
        ('k1', 'c1', 'c2')
        """
        keys = tuple(f"k{i + 1}" for i in range(key_arity))
        return cls(keys + tuple(f"c{i + 1}" for i in range(rest_arity)), keys)

    @property
    def key_index(self) -> tuple[int, ...]:
        """Positions of the key columns, in key order."""
        return tuple(self.columns.index(k) for k in self.key)

    @property
    def rest_index(self) -> tuple[int, ...]:
        """Positions of the other columns, in column order."""
        keys = set(self.key)
        return tuple(i for i, c in enumerate(self.columns) if c not in keys)

    @property
    def rest_columns(self) -> tuple[str, ...]:
        """Names of the non-key columns, in ``rest`` order."""
        return tuple(self.columns[i] for i in self.rest_index)

    @property
    def key_is_prefix(self) -> bool:
        """Whether the key columns are the first columns, in order (the fast path)."""
        return self.key_index == tuple(range(len(self.key)))

    def split(self, row: Sequence[Any]) -> Record:
        """A whole row (values in column order) as ``(key, rest)``."""
        return tuple(row[i] for i in self.key_index), tuple(row[i] for i in self.rest_index)

    def join(self, key: Key, rest: Rest) -> tuple[Any, ...]:
        """``(key, rest)`` back to a whole row in column order."""
        row: list[Any] = [None] * len(self.columns)
        for i, v in zip(self.key_index, key, strict=True):
            row[i] = v
        for i, v in zip(self.rest_index, rest, strict=True):
            row[i] = v
        return tuple(row)


def _key_columns(key: Sequence[str] | str) -> tuple[str, ...]:
    """``key`` as a tuple of column names; a single name may be given as a string.

    >>> _key_columns("id"), _key_columns(["a", "b"])
    (('id',), ('a', 'b'))
    """
    return (key,) if isinstance(key, str) else tuple(key)


def check_compatible(
    old: Schema | None, new: Schema | None, old_name: str = "old snapshot", new_name: str = "new snapshot"
) -> Schema | None:
    """Raise ``SnapshotError`` if two snapshots cannot be differenced: key or schema changed.

    Types are compared only when both sides know them. ``None`` (an empty in-memory
    snapshot given without a schema) is compatible with anything. Returns the schema the
    result has (the new one if known).

    >>> a = Schema(("id", "x"), ("id",))
    >>> check_compatible(a, Schema(("id", "x"), ("id",))) == a
    True
    >>> check_compatible(a, Schema(("id", "x", "y"), ("id",)))
    Traceback (most recent call last):
    ...
    wrappers.differential.errors.SnapshotError: schema changed: old snapshot has columns ['id', 'x'] but new snapshot has ['id', 'x', 'y']
    """
    if old is None or new is None:
        return new if new is not None else old
    if old.key != new.key:
        raise SnapshotError(f"key changed: {old_name} has key {list(old.key)} but {new_name} has {list(new.key)}")
    if old.columns != new.columns:
        raise SnapshotError(
            f"schema changed: {old_name} has columns {list(old.columns)} but {new_name} has {list(new.columns)}"
        )
    if old.types is not None and new.types is not None and old.types != new.types:
        diffs = [f"{c}: {a} -> {b}" for c, a, b in zip(old.columns, old.types, new.types, strict=True) if a != b]
        raise SnapshotError(
            f"schema changed: column types differ between {old_name} and {new_name} ({', '.join(diffs)})"
        )
    return new


# -- nominal sizes --------------------------------------------------------------------------
def _value_bytes(v: Any) -> int:
    t = type(v)
    if t is str or t is bytes:
        return len(v)
    if t is int or t is float:
        return 8
    if v is None or t is bool:
        return 1
    return len(str(v))


def key_bytes(key: Key) -> int:
    """Nominal size of a key in a dump: its values plus one separator each.

    >>> key_bytes(("00001234",))
    9
    """
    return sum(_value_bytes(v) for v in key) + len(key)


def record_bytes(record: Record) -> int:
    """Nominal size of a record in a dump (strings by length, numbers as 8 bytes).

    >>> record_bytes((("k1",), ("abc", 5)))
    16
    """
    key, rest = record
    return key_bytes(key) + key_bytes(rest)


def estimate_record_bytes(sample: Iterable[Record], default: float = 100.0) -> float:
    """Average nominal record size of a sample (``default`` if it is empty).

    >>> estimate_record_bytes([(("a",), ("bc",)), (("d",), ("efgh",))])
    6.0
    """
    sizes = [record_bytes(r) for r in sample]
    return sum(sizes) / len(sizes) if sizes else default


def peek(iterable: Iterable[Any], n: int) -> tuple[list[Any], Iterator[Any]]:
    """The first ``n`` items and an iterator over all items (the peeked ones included).

    >>> head, it = peek(iter(range(5)), 2)
    >>> head, list(it)
    ([0, 1], [0, 1, 2, 3, 4])
    """
    it = iter(iterable)
    head = list(islice(it, n))
    return head, chain(head, it)


# -- the reader interface -------------------------------------------------------------------
class Snapshot:
    """A re-readable source of ``(key, rest)`` records with a ``schema``.

    Subclasses implement ``scan``; those that can fetch by pointer also implement
    ``scan_with_pointers`` and ``fetch``.
    """

    schema: Schema | None  # None only for an empty in-memory snapshot given without one
    name: str = "snapshot"
    nbytes: int | None = None  # size of the dump in bytes, if it is a file
    supports_pointers: bool = False

    def scan(self, stats: IOStats | None = None) -> Iterator[Record]:
        """The records in physical order (bytes read are added to ``stats``)."""
        raise NotImplementedError

    def scan_with_pointers(self, stats: IOStats | None = None) -> Iterator[tuple[Key, Rest, int]]:
        """``(key, rest, pointer)`` in physical order; ``fetch`` accepts the pointers."""
        raise SnapshotError(
            f"{self.name}: records cannot be fetched by pointer (the <K,b,p> format needs a file or a list)"
        )

    def fetch(self, pointers: Iterable[int], stats: IOStats | None = None) -> Iterator[tuple[int, Record]]:
        """``(pointer, record)`` for each distinct pointer, in pointer order."""
        raise SnapshotError(
            f"{self.name}: records cannot be fetched by pointer (the <K,b,p> format needs a file or a list)"
        )

    def __iter__(self) -> Iterator[Record]:
        return self.scan()


def _bad_record(name: str, i: int, rec: Any, schema: Schema) -> SnapshotError:
    return SnapshotError(
        f"{name}: record {i} is {rec!r}; expected (key, rest) tuples of "
        f"{len(schema.key)} and {len(schema.columns) - len(schema.key)} values"
    )


def _infer_schema(first: Any, name: str) -> Schema:
    try:
        key, rest = first
    except (TypeError, ValueError):
        raise SnapshotError(f"{name}: record 0 is {first!r}; expected a (key, rest) pair of tuples") from None
    if not isinstance(key, tuple) or not isinstance(rest, tuple) or not key:
        raise SnapshotError(f"{name}: record 0 is {first!r}; expected a (key, rest) pair of tuples")
    return Schema.for_arity(len(key), len(rest))


def _validated(records: Iterable[Any], schema: Schema | None, name: str) -> Iterator[Record]:
    if schema is None:
        return
    nk = len(schema.key)
    nr = len(schema.columns) - nk
    for i, rec in enumerate(records):
        try:
            key, rest = rec
        except (TypeError, ValueError):
            raise _bad_record(name, i, rec, schema) from None
        if type(key) is not tuple or type(rest) is not tuple:
            if not (isinstance(key, tuple) and isinstance(rest, tuple)):
                raise _bad_record(name, i, rec, schema)
            key, rest = tuple(key), tuple(rest)
        if len(key) != nk or len(rest) != nr:
            raise _bad_record(name, i, rec, schema)
        yield key, rest


class MemorySnapshot(Snapshot):
    """Records held in a list; pointers are list indexes.

    >>> s = MemorySnapshot([((1,), ("a",)), ((2,), ("b",))])
    >>> s.schema.columns
    ('k1', 'c1')
    >>> list(s.fetch([1]))
    [(1, ((2,), ('b',)))]
    """

    supports_pointers = True

    def __init__(
        self, records: Iterable[Record], schema: Schema | None = None, name: str = "in-memory snapshot"
    ) -> None:
        self._records = records if isinstance(records, list) else list(records)
        self.name = name
        if schema is None and self._records:
            schema = _infer_schema(self._records[0], name)
        self.schema = schema

    def __len__(self) -> int:
        return len(self._records)

    def scan(self, stats: IOStats | None = None) -> Iterator[Record]:
        return _validated(self._records, self.schema, self.name)

    def scan_with_pointers(self, stats: IOStats | None = None) -> Iterator[tuple[Key, Rest, int]]:
        for i, (key, rest) in enumerate(self.scan(stats)):
            yield key, rest, i

    def fetch(self, pointers: Iterable[int], stats: IOStats | None = None) -> Iterator[tuple[int, Record]]:
        records = self._records
        for p in sorted(set(pointers)):
            if not 0 <= p < len(records):
                raise SnapshotError(f"{self.name}: pointer {p} is outside the snapshot ({len(records)} records)")
            key, rest = records[p]
            yield p, (tuple(key), tuple(rest))


class _IterSnapshot(Snapshot):
    """A one-shot iterable of records: scanned once, no pointers."""

    def __init__(self, records: Iterable[Record], name: str = "record stream") -> None:
        head, self._it = peek(records, 1)
        self.name = name
        self.schema = _infer_schema(head[0], name) if head else None
        self._used = False

    def scan(self, stats: IOStats | None = None) -> Iterator[Record]:
        if self._used:
            raise SnapshotError(f"{self.name}: a one-shot record stream can be read only once")
        self._used = True
        return _validated(self._it, self.schema, self.name)


class RecordSnapshot(Snapshot):
    """Records kept in a sealed ``RecordFile`` (written with ``write_records``); no pointers.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "t.rec")
    >>> write_records(p, [((1,), ("a",)), ((2,), ("b",))])
    2
    >>> list(RecordSnapshot(p, Schema(("id", "v"), ("id",))))
    [((1,), ('a',)), ((2,), ('b',))]
    """

    def __init__(self, path: str | os.PathLike[str], schema: Schema) -> None:
        self.path = os.fspath(path)
        self.name = self.path
        self.schema = schema
        try:
            self._file = RecordFile.open(self.path)
        except SpillError as exc:
            raise SnapshotError(str(exc)) from None
        self.nbytes = self._file.nbytes

    def __len__(self) -> int:
        return len(self._file)

    def scan(self, stats: IOStats | None = None) -> Iterator[Record]:
        try:
            yield from _validated(self._file.read(stats), self.schema, self.name)
        except SpillError as exc:
            raise SnapshotError(str(exc)) from None


def write_records(path: str | os.PathLike[str], records: Iterable[Record]) -> int:
    """Write records to a ``RecordFile`` at ``path`` (kept); returns the count."""
    out = RecordFile(path=path, keep=True)
    try:
        out.extend((tuple(k), tuple(r)) for k, r in records)
        out.seal()
    except BaseException:
        out.delete()
        raise
    return len(out)


def as_snapshot(obj: Snapshot | Iterable[Record], name: str = "snapshot") -> Snapshot:
    """``obj`` itself if it is a ``Snapshot``; a list or tuple of records as a
    ``MemorySnapshot``; any other iterable as a one-shot stream.

    >>> as_snapshot([((1,), ())]).schema.columns
    ('k1',)
    >>> as_snapshot([]).schema is None
    True
    """
    if isinstance(obj, Snapshot):
        return obj
    if isinstance(obj, (list, tuple)):
        return MemorySnapshot(list(obj), name=name)
    if isinstance(obj, (str, bytes, os.PathLike)):
        raise TypeError(f"{name}: a path is not a snapshot; open it with open_snapshot(path, key=...)")
    return _IterSnapshot(obj, name=name)


def from_rows(
    rows: Iterable[Sequence[Any]], columns: Sequence[str], key: Sequence[str] | str, name: str = "in-memory snapshot"
) -> MemorySnapshot:
    """A ``MemorySnapshot`` from whole rows in column order.

    >>> from_rows([("x", 1)], columns=("name", "id"), key="id").scan().__next__()
    ((1,), ('x',))
    """
    schema = Schema(tuple(columns), _key_columns(key))
    n = len(schema.columns)
    kidx, ridx = schema.key_index, schema.rest_index
    records = []
    for i, row in enumerate(rows):
        if len(row) != n:
            raise SnapshotError(f"{name}: row {i} has {len(row)} values; expected {n} ({list(schema.columns)})")
        records.append((tuple(row[j] for j in kidx), tuple(row[j] for j in ridx)))
    return MemorySnapshot(records, schema, name)


# -- CSV ------------------------------------------------------------------------------------
def _open_binary(path: str) -> BinaryIO:
    try:
        return open(path, "rb", buffering=1 << 20)
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read the dump ({exc.strerror or exc})") from None


class CsvSnapshot(Snapshot):
    """A CSV dump with a header line naming the columns.

    Values are strings unless ``types`` maps a column to a converter (``int``, ``float``,
    ...). The dump must end with a line terminator; a last line without one, an
    unterminated quoted field or a row with the wrong number of fields is reported as a
    truncated or malformed dump. Pointers are byte offsets of the rows.

    >>> import tempfile, os, pathlib
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "s.csv")
    >>> _ = pathlib.Path(p).write_text("id,name\\n2,bob\\n1,ann\\n")
    >>> snap = CsvSnapshot(p, key=["id"], types={"id": int})
    >>> list(snap)
    [((2,), ('bob',)), ((1,), ('ann',))]
    >>> [(p, r) for p, r in snap.fetch([k for *_, k in snap.scan_with_pointers()][1:])]
    [(14, ((1,), ('ann',)))]
    """

    supports_pointers = True
    schema: Schema  # read from the header, so always known

    def __init__(
        self,
        path: str | os.PathLike[str],
        key: Sequence[str] | str,
        *,
        types: Mapping[str, Callable[[str], Any]] | None = None,
        delimiter: str = ",",
        encoding: str = "utf-8",
    ) -> None:
        self.path = os.fspath(path)
        self.name = self.path
        self.delimiter = delimiter
        self.encoding = encoding
        with _open_binary(self.path) as f:
            header = f.readline()
        if not header:
            raise SnapshotError(f"{self.path}: empty dump (no header line)")
        if not header.endswith(b"\n"):
            raise SnapshotError(f"{self.path}: truncated dump (the header line has no line terminator)")
        try:
            text = header.decode(encoding).rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise SnapshotError(f"{self.path}: line 1: not valid {encoding} ({exc.reason})") from None
        columns = next(csv.reader([text], delimiter=delimiter))
        types = dict(types or {})
        unknown = [c for c in types if c not in columns]
        if unknown:
            raise SnapshotError(f"{self.path}: types given for unknown column(s) {unknown}")
        type_names = tuple(getattr(types.get(c, str), "__name__", "custom") for c in columns)
        self.schema = Schema(tuple(columns), _key_columns(key), type_names)
        self._header_len = len(header)
        self._converters = [types.get(c) for c in columns]
        self._typed = any(c is not None for c in self._converters)
        try:
            self.nbytes = os.path.getsize(self.path)
        except OSError:
            self.nbytes = None

    # parsing ---------------------------------------------------------------------------
    def _quoted(self, line: bytes, f: BinaryIO, lineno: int) -> tuple[list[str], bytes]:
        buf = line
        while buf.count(b'"') % 2:
            more = f.readline()
            if not more:
                raise SnapshotError(
                    f"{self.path}: line {lineno}: truncated dump (unterminated quoted field at end of file)"
                )
            buf += more
        text = buf.decode(self.encoding)
        if text.endswith("\r\n"):
            text = text[:-2]
        elif text.endswith("\n"):
            text = text[:-1]
        try:
            rows = list(csv.reader([text], delimiter=self.delimiter, strict=True))
        except csv.Error as exc:
            raise SnapshotError(f"{self.path}: line {lineno}: malformed CSV ({exc})") from None
        return (rows[0] if rows else []), buf

    def _convert(self, fields: list[str], lineno: int) -> list[Any]:
        out: list[Any] = []
        for value, conv, col in zip(fields, self._converters, self.schema.columns, strict=True):
            if conv is None:
                out.append(value)
                continue
            try:
                out.append(conv(value))
            except (TypeError, ValueError) as exc:
                raise SnapshotError(
                    f"{self.path}: line {lineno}: column {col!r}: cannot convert {value!r} ({exc})"
                ) from None
        return out

    def _wrong_arity(self, fields: list[str], lineno: int, line: bytes = b"\n") -> SnapshotError:
        if not line.endswith(b"\n"):
            return SnapshotError(f"{self.path}: line {lineno}: truncated dump (the last line has no line terminator)")
        return SnapshotError(
            f"{self.path}: line {lineno}: {len(fields)} field(s), expected {len(self.schema.columns)} "
            f"(truncated or malformed dump)"
        )

    def _rows(self, stats: IOStats | None) -> Iterator[tuple[Key, Rest, int]]:
        """The general reader: quotes, converters, any key position, pointers."""
        schema = self.schema
        ncols = len(schema.columns)
        kidx, ridx = schema.key_index, schema.rest_index
        sep = self.delimiter
        enc = self.encoding
        f = _open_binary(self.path)
        pos = 0
        line = b"\n"
        lineno = 1
        try:
            with f:
                header = f.readline()
                if len(header) != self._header_len:
                    raise SnapshotError(f"{self.path}: the dump changed while it was being read (header differs)")
                pos = len(header)
                while True:
                    nxt = f.readline()
                    if not nxt:
                        break
                    line = nxt
                    lineno += 1
                    start = pos
                    if b'"' in line:
                        fields, line = self._quoted(line, f, lineno)
                    else:
                        fields = line.rstrip(b"\r\n").decode(enc).split(sep)
                    pos += len(line)
                    if len(fields) != ncols:
                        if not line.strip():
                            continue
                        raise self._wrong_arity(fields, lineno, line)
                    if self._typed:
                        fields = self._convert(fields, lineno)
                    yield tuple([fields[i] for i in kidx]), tuple([fields[i] for i in ridx]), start
        except UnicodeDecodeError as exc:
            raise SnapshotError(f"{self.path}: line {lineno}: not valid {enc} ({exc.reason})") from None
        except OSError as exc:
            raise SnapshotError(f"{self.path}: read error at line {lineno} ({exc.strerror or exc})") from None
        finally:
            if stats is not None:
                stats.read(pos)
        if not line.endswith(b"\n"):
            raise SnapshotError(f"{self.path}: line {lineno}: truncated dump (the last line has no line terminator)")

    def _fast(self, stats: IOStats | None) -> Iterator[Record]:
        """The common case: key columns first, untyped. Falls back per line for quotes."""
        nk = len(self.schema.key)
        ncols = len(self.schema.columns)
        sep = self.delimiter
        enc = self.encoding
        f = _open_binary(self.path)
        line = b"\n"
        lineno = 1
        try:
            with f:
                header = f.readline()
                if len(header) != self._header_len:
                    raise SnapshotError(f"{self.path}: the dump changed while it was being read (header differs)")
                try:
                    for lineno, line in enumerate(f, 2):
                        if b'"' in line:
                            fields, line = self._quoted(line, f, lineno)
                        else:
                            fields = line.rstrip(b"\r\n").decode(enc).split(sep)
                        if len(fields) != ncols:
                            if not line.strip():
                                continue
                            raise self._wrong_arity(fields, lineno, line)
                        yield tuple(fields[:nk]), tuple(fields[nk:])
                finally:
                    if stats is not None:
                        stats.read(f.tell())
        except UnicodeDecodeError as exc:
            raise SnapshotError(f"{self.path}: line {lineno}: not valid {enc} ({exc.reason})") from None
        except OSError as exc:
            raise SnapshotError(f"{self.path}: read error at line {lineno} ({exc.strerror or exc})") from None
        if not line.endswith(b"\n"):
            raise SnapshotError(f"{self.path}: line {lineno}: truncated dump (the last line has no line terminator)")

    def _fast_pointers(self, stats: IOStats | None) -> Iterator[tuple[Key, Rest, int]]:
        """``_fast`` with the byte offset of each row."""
        nk = len(self.schema.key)
        ncols = len(self.schema.columns)
        sep = self.delimiter
        enc = self.encoding
        f = _open_binary(self.path)
        line = b"\n"
        lineno = 1
        pos = 0
        try:
            with f:
                header = f.readline()
                if len(header) != self._header_len:
                    raise SnapshotError(f"{self.path}: the dump changed while it was being read (header differs)")
                pos = len(header)
                for lineno, line in enumerate(f, 2):
                    start = pos
                    if b'"' in line:
                        fields, line = self._quoted(line, f, lineno)
                    else:
                        fields = line.rstrip(b"\r\n").decode(enc).split(sep)
                    pos += len(line)
                    if len(fields) != ncols:
                        if not line.strip():
                            continue
                        raise self._wrong_arity(fields, lineno, line)
                    yield tuple(fields[:nk]), tuple(fields[nk:]), start
        except UnicodeDecodeError as exc:
            raise SnapshotError(f"{self.path}: line {lineno}: not valid {enc} ({exc.reason})") from None
        except OSError as exc:
            raise SnapshotError(f"{self.path}: read error at line {lineno} ({exc.strerror or exc})") from None
        finally:
            if stats is not None:
                stats.read(pos)
        if not line.endswith(b"\n"):
            raise SnapshotError(f"{self.path}: line {lineno}: truncated dump (the last line has no line terminator)")

    def scan(self, stats: IOStats | None = None) -> Iterator[Record]:
        if self.schema.key_is_prefix and not self._typed:
            return self._fast(stats)
        return ((k, r) for k, r, _ in self._rows(stats))

    def scan_with_pointers(self, stats: IOStats | None = None) -> Iterator[tuple[Key, Rest, int]]:
        if self.schema.key_is_prefix and not self._typed:
            return self._fast_pointers(stats)
        return self._rows(stats)

    def fetch(self, pointers: Iterable[int], stats: IOStats | None = None) -> Iterator[tuple[int, Record]]:
        kidx, ridx = self.schema.key_index, self.schema.rest_index
        ncols = len(self.schema.columns)
        f = _open_binary(self.path)
        with f:
            for p in sorted(set(pointers)):
                if p < self._header_len:
                    raise SnapshotError(f"{self.path}: pointer {p} points into the header")
                f.seek(p)
                line = f.readline()
                if not line:
                    raise SnapshotError(f"{self.path}: pointer {p} is past the end (the dump changed?)")
                try:
                    if b'"' in line:
                        fields, line = self._quoted(line, f, 0)
                    else:
                        fields = line.rstrip(b"\r\n").decode(self.encoding).split(self.delimiter)
                except UnicodeDecodeError as exc:
                    raise SnapshotError(f"{self.path}: byte {p}: not valid {self.encoding} ({exc.reason})") from None
                if stats is not None:
                    stats.read(len(line))
                if len(fields) != ncols:
                    raise SnapshotError(f"{self.path}: byte {p}: {len(fields)} field(s), expected {ncols}")
                if self._typed:
                    fields = self._convert(fields, 0)
                yield p, (tuple([fields[i] for i in kidx]), tuple([fields[i] for i in ridx]))


def write_csv(path: str | os.PathLike[str], schema: Schema, records: Iterable[Record]) -> int:
    """Write records as a CSV dump with a header; returns the number of records.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "a.csv")
    >>> write_csv(p, Schema(("id", "v"), ("id",)), [(("1",), ("x,y",))])
    1
    >>> open(p).read()
    'id,v\\n1,"x,y"\\n'
    """
    n = 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        # csv quotes a line break only if it is in the line terminator: a bare "\r" would go
        # out unquoted, and a reader takes it for the end of the line. Such rows (rare) are
        # written with every field quoted.
        quoted = csv.writer(f, lineterminator="\n", quoting=csv.QUOTE_ALL)
        w.writerow(schema.columns)
        if schema.key_is_prefix:
            rows = (k + r for k, r in records)
        else:
            rows = (schema.join(k, r) for k, r in records)
        for block in iter(lambda: list(islice(rows, 8192)), []):
            if any(_has_return(row) for row in block):
                for row in block:
                    (quoted if _has_return(row) else w).writerow(row)
            else:
                w.writerows(block)
            n += len(block)
    return n


def _has_return(row: Sequence[Any]) -> bool:
    return any(isinstance(v, str) and "\r" in v for v in row)


# -- Parquet --------------------------------------------------------------------------------
def _arrow() -> tuple[Any, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


class ParquetSnapshot(Snapshot):
    """A Parquet file; pointers are row numbers.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "s.parquet")
    >>> write_parquet(p, Schema(("id", "v"), ("id",)), [((1,), ("a",)), ((2,), ("b",))])
    2
    >>> snap = ParquetSnapshot(p, key="id")
    >>> list(snap), snap.schema.types
    ([((1,), ('a',)), ((2,), ('b',))], ('int64', 'string'))
    """

    supports_pointers = True
    schema: Schema  # read from the file's metadata, so always known

    def __init__(self, path: str | os.PathLike[str], key: Sequence[str] | str, *, batch_rows: int = 65536) -> None:
        self.path = os.fspath(path)
        self.name = self.path
        self.batch_rows = batch_rows
        _pa, _ = _arrow()
        pf = self._open()
        try:
            arrow_schema = pf.schema_arrow
            self._row_groups = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
        finally:
            pf.close()
        columns = tuple(arrow_schema.names)
        self.schema = Schema(columns, _key_columns(key), tuple(str(t) for t in arrow_schema.types))
        self._ordered = [columns[i] for i in self.schema.key_index] + list(self.schema.rest_columns)
        try:
            self.nbytes = os.path.getsize(self.path)
        except OSError:
            self.nbytes = None

    def _open(self) -> Any:
        pa, pq = _arrow()
        try:
            return pq.ParquetFile(self.path)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise SnapshotError(f"{self.path}: unreadable or truncated Parquet file ({exc})") from None

    def _batches(self, stats: IOStats | None) -> Iterator[list[list[Any]]]:
        pa, _ = _arrow()
        pf = self._open()
        try:
            for batch in pf.iter_batches(batch_size=self.batch_rows, columns=self._ordered):
                yield [col.to_pylist() for col in batch.columns]
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise SnapshotError(f"{self.path}: unreadable or truncated Parquet file ({exc})") from None
        finally:
            pf.close()
            if stats is not None and self.nbytes:
                stats.read(self.nbytes)

    def scan(self, stats: IOStats | None = None) -> Iterator[Record]:
        nk = len(self.schema.key)
        nr = len(self.schema.columns) - nk
        for cols in self._batches(stats):
            n = len(cols[0]) if cols else 0
            keys = zip(*cols[:nk], strict=True)
            rests = zip(*cols[nk:], strict=True) if nr else (() for _ in range(n))
            yield from zip(keys, rests)

    def scan_with_pointers(self, stats: IOStats | None = None) -> Iterator[tuple[Key, Rest, int]]:
        for i, (key, rest) in enumerate(self.scan(stats)):
            yield key, rest, i

    def fetch(self, pointers: Iterable[int], stats: IOStats | None = None) -> Iterator[tuple[int, Record]]:
        pa, _ = _arrow()
        wanted = sorted(set(pointers))
        total = sum(self._row_groups)
        if wanted and not (wanted[0] >= 0 and wanted[-1] < total):
            raise SnapshotError(f"{self.path}: pointer outside the file's {total} rows (the file changed?)")
        nk = len(self.schema.key)
        pf = self._open()
        try:
            start = 0
            i = 0
            for g, rows in enumerate(self._row_groups):
                end = start + rows
                local = []
                while i < len(wanted) and wanted[i] < end:
                    local.append(wanted[i] - start)
                    i += 1
                if local:
                    table = pf.read_row_group(g, columns=self._ordered).take(local)
                    if stats is not None:
                        stats.read(pf.metadata.row_group(g).total_byte_size)
                    cols = [c.to_pylist() for c in table.columns]
                    for j, p in enumerate(local):
                        row = [c[j] for c in cols]
                        yield p + start, (tuple(row[:nk]), tuple(row[nk:]))
                start = end
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise SnapshotError(f"{self.path}: unreadable or truncated Parquet file ({exc})") from None
        finally:
            pf.close()


def write_parquet(
    path: str | os.PathLike[str], schema: Schema, records: Iterable[Record], *, row_group_rows: int = 65536
) -> int:
    """Write records to a Parquet file (types inferred by pyarrow); returns the count."""
    pa, pq = _arrow()
    rows = [schema.join(k, r) for k, r in records]
    columns: list[Sequence[Any]] = list(zip(*rows, strict=True)) if rows else [[] for _ in schema.columns]
    table = pa.table({name: list(col) for name, col in zip(schema.columns, columns, strict=True)})
    pq.write_table(table, path, row_group_size=row_group_rows)
    return len(rows)


def open_snapshot(
    path: str | os.PathLike[str],
    key: Sequence[str] | str,
    *,
    format: str | None = None,
    types: Mapping[str, Callable[[str], Any]] | None = None,
) -> Snapshot:
    """Open a dump by extension (``.csv``, ``.parquet``/``.pq``) or explicit ``format``.

    >>> open_snapshot("x.txt", key="id")
    Traceback (most recent call last):
    ...
    wrappers.differential.errors.SnapshotError: x.txt: unknown dump format (use format='csv' or 'parquet')
    """
    p = os.fspath(path)
    fmt = format or {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}.get(os.path.splitext(p)[1].lower())
    if fmt == "csv":
        return CsvSnapshot(p, key, types=types)
    if fmt == "parquet":
        if types:
            raise SnapshotError(f"{p}: types= applies only to CSV dumps (Parquet files carry their types)")
        return ParquetSnapshot(p, key)
    raise SnapshotError(f"{p}: unknown dump format (use format='csv' or 'parquet')")
