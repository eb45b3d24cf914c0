"""Decoding PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1).

Log capture of PostgreSQL (``pg_log``) streams these messages from its slot
(``pg_stream``: each XLogData message of the replication protocol carries one). Only what the
wrapper needs is decoded: transaction boundaries (xid, commit and end positions, commit
time), relation descriptions, row changes and TRUNCATE. Values arrive in their text output
form (``'t'``), or as NULL (``'n'``), or as "unchanged TOAST value, not sent" (``'u'``).

>>> b = decode(bytes.fromhex("42" "0000000001d9eea0" "0002d5b3a5b5c000" "000002db"))
>>> (b.xid, b.final_lsn)
(731, 31059616)
>>> decode(bytes.fromhex("49" "00004004" "4e" "0002" "74" "00000001" "31" "6e"))
Change(op='I', relid=16388, old=None, new=('1', None))
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

UNCHANGED: Final = "\x00pvm-unchanged-toast"
"""Stands for a TOAST value the message left out because the update did not change it."""

POSTGRES_EPOCH = 946_684_800  # 2000-01-01 in Unix seconds: commit times count from it


class DecodeError(ValueError):
    """A message that is not valid pgoutput protocol 1."""


@dataclass(frozen=True)
class Begin:
    final_lsn: int  # where the transaction's commit record starts
    committed_at: float  # Unix seconds
    xid: int


@dataclass(frozen=True)
class Commit:
    commit_lsn: int
    end_lsn: int  # just after the commit record: the position to resume after
    committed_at: float


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int


@dataclass(frozen=True)
class Relation:
    relid: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default (key), 'n' nothing, 'f' full, 'i' an index
    columns: tuple[Column, ...]


Tuple = tuple[str | None, ...]


@dataclass(frozen=True)
class Change:
    op: str  # 'I', 'U' or 'D'
    relid: int
    old: Tuple | None  # the whole old row with REPLICA IDENTITY FULL, else key columns (others None) or nothing
    new: Tuple | None


@dataclass(frozen=True)
class Truncate:
    relids: tuple[int, ...]


@dataclass(frozen=True)
class Other:
    """A message the wrapper has no use for (type, origin, logical message)."""

    kind: str


Message = Begin | Commit | Relation | Change | Truncate | Other


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise DecodeError(f"message ends after {len(self.data)} bytes, {self.at + n} needed")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def int8(self) -> int:
        return int(self.take(1)[0])

    def int16(self) -> int:
        return int(struct.unpack(">h", self.take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self.take(4))[0])

    def uint32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def uint64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def timestamp(self) -> float:
        return int(struct.unpack(">q", self.take(8))[0]) / 1e6 + POSTGRES_EPOCH

    def string(self) -> str:
        end = self.data.find(b"\x00", self.at)
        if end < 0:
            raise DecodeError("unterminated string")
        out = self.data[self.at : end].decode()
        self.at = end + 1
        return out

    def tuple(self) -> Tuple:
        values: list[str | None] = []
        for _ in range(self.int16()):
            kind = self.take(1)
            if kind == b"n":
                values.append(None)
            elif kind == b"u":
                values.append(UNCHANGED)
            elif kind == b"t":
                values.append(self.take(self.int32()).decode())
            else:
                raise DecodeError(f"unknown tuple value kind {kind!r}")
        return tuple(values)


def decode(data: bytes) -> Message:
    """One pgoutput message; DecodeError if it is malformed."""
    r = _Reader(bytes(data))
    kind = r.take(1)
    if kind == b"B":
        return Begin(r.uint64(), r.timestamp(), r.uint32())
    if kind == b"C":
        r.int8()  # flags, unused
        return Commit(r.uint64(), r.uint64(), r.timestamp())
    if kind == b"R":
        relid, namespace, name, identity = r.uint32(), r.string(), r.string(), chr(r.int8())
        columns = []
        for _ in range(r.int16()):
            r.int8()  # flags: 1 if part of the key
            column_name, type_oid = r.string(), r.uint32()
            r.int32()  # type modifier
            columns.append(Column(column_name, type_oid))
        return Relation(relid, namespace, name, identity, tuple(columns))
    if kind == b"I":
        relid = r.uint32()
        if r.take(1) != b"N":
            raise DecodeError("an insert without its new row")
        return Change("I", relid, None, r.tuple())
    if kind == b"U":
        relid = r.uint32()
        marker = r.take(1)
        old = None
        if marker in (b"K", b"O"):
            old = r.tuple()
            marker = r.take(1)
        if marker != b"N":
            raise DecodeError("an update without its new row")
        return Change("U", relid, old, r.tuple())
    if kind == b"D":
        relid = r.uint32()
        if r.take(1) not in (b"K", b"O"):
            raise DecodeError("a delete without its old row")
        return Change("D", relid, r.tuple(), None)
    if kind == b"T":
        count = r.int32()
        r.int8()  # options (CASCADE, RESTART IDENTITY)
        return Truncate(tuple(r.uint32() for _ in range(count)))
    if kind in (b"Y", b"O", b"M"):
        return Other(kind.decode())
    raise DecodeError(f"unknown message kind {kind!r}")
