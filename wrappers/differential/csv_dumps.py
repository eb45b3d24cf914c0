"""CSV dumps: reading one as a snapshot (``CsvSnapshot``) and writing one (``write_csv``).

A dump has a header line naming the columns; pointers are the byte offsets of its rows.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any, BinaryIO

from wrappers.differential.errors import SnapshotError
from wrappers.differential.record_schema import Key, Record, Rest, Schema, key_columns
from wrappers.differential.snapshot import Snapshot
from wrappers.differential.spill import IOStats

__all__ = ["CsvSnapshot", "write_csv"]


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
        self.schema = Schema(tuple(columns), key_columns(key), type_names)
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
