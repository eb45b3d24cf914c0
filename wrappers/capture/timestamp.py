"""Timestamp capture (Carnes's TS, and TDI with a delete flag) for sources that allow no triggers.

Each captured table has a last-modified column that every writer sets (a timestamp, or a
counter that only grows); TDI adds a delete-flag column that writers set instead of
deleting. A poll reads, in one source snapshot, the rows whose timestamp is at or above a
*bound* (and those whose timestamp is NULL), compares them with the wrapper's replica
(``wrappers.replica``: "the copy" that gives the old values) and applies the differences to
it in one transaction; the replica's own capture ships them as one update.

Subqueries are answered from the replica, not from the live source. The live source is
ahead of the shipped updates in ways a poll cannot see (deletes under TS, rows whose
timestamp fell behind the bound), so a live snapshot would reflect changes that no update
with seq <= watermark describes, breaking invariant 3. The replica reflects exactly the
shipped updates, so the views stay a consistent (if, under TS, incomplete) image of the
source, the image the shipped updates describe.

The bound is the largest timestamp seen by a poll at least ``settle_seconds`` ago, so a row
is still seen when its transaction commits up to ``settle_seconds`` after it stamped the
row (timestamps are taken when a row is written, not when its transaction commits). Rows
read again are compared with the replica and produce nothing if unchanged.

What this cannot see (also in ``pvm wrapper --help`` and docs/capture.md):

* TS sees no deletes: a deleted row stays in the replica, and so in the views.
* TS reports a primary-key change as an insert of the new key; the old key stays.
  TDI reports it correctly when writers flag the old row deleted and insert the new one.
* A row whose transaction commits more than ``settle_seconds`` after stamping it, or that
  is stamped with a value below the bound (a clock set back), is missed until written again.
* Flagged rows are never purged by the wrapper: purging them is the application's job, and
  a row purged before any poll saw its flag is a delete TDI cannot see either.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from wrappers.capture.base import CaptureDialect
from wrappers.capture.types import wire_value
from wrappers.replica import Replica, RowChange
from wrappers.schema import TableSchema

_TRUE_FLAGS = {"t", "true", "y", "yes", "1"}


@dataclass(frozen=True)
class TimestampOptions:
    column: str
    delete_flag: str | None = None
    settle_seconds: float = 5.0


def is_deleted(flag: Any) -> bool:
    """A delete flag is set when it is true, a non-zero number or T/TRUE/Y/YES/1 (any case)."""
    if flag is None:
        return False
    if isinstance(flag, str):
        return flag.strip().lower() in _TRUE_FLAGS
    return bool(flag)


class TimestampCapture:
    """Feeds a replica from a source by reading last-modified timestamps."""

    def __init__(
        self,
        dialect: CaptureDialect,
        engine: sa.Engine,
        tables: Sequence[TableSchema],
        replica: Replica,
        options: TimestampOptions,
    ) -> None:
        self._dialect = dialect
        self._engine = engine
        self._tables = tables
        self._replica = replica
        self._options = options
        self._bounds: dict[str, Any] = _decode_bounds(replica.meta("timestamp_bounds"))
        self._seen: dict[str, collections.deque[tuple[float, Any]]] = {t.name: collections.deque() for t in tables}

    def _select(self, table: TableSchema, bound: Any) -> sa.Select:
        extra = [self._options.column] + ([self._options.delete_flag] if self._options.delete_flag else [])
        t = sa.table(table.name, *(sa.column(c) for c in (*table.columns, *extra)))
        statement = sa.select(*(t.c[c] for c in (*table.columns, *extra)))
        if bound is not None:
            stamp = t.c[self._options.column]
            statement = statement.where(sa.or_(stamp >= sa.bindparam("bound", bound), stamp.is_(None)))
        return statement

    def _read(self, conn: sa.Connection, table: TableSchema, bound: Any) -> list[tuple[dict[str, Any], Any, bool]]:
        """``(row in wire form, its timestamp, deleted?)`` of the rows at or above ``bound``."""
        width = len(table.columns)
        out = []
        for values in conn.execute(self._select(table, bound)):
            row = {c: wire_value(v) for c, v in zip(table.columns, values[:width])}
            deleted = self._options.delete_flag is not None and is_deleted(values[width + 1])
            out.append((row, values[width], deleted))
        return out

    def load(self) -> None:
        """Copy the source's live (unflagged) rows into an empty replica, in one snapshot."""
        conn = self._dialect.begin_snapshot(self._engine)
        try:
            rows = {t.name: [row for row, _, deleted in self._read(conn, t, None) if not deleted] for t in self._tables}
        finally:
            conn.close()
        self._replica.load(rows)

    def pull(self) -> bool:
        """Apply what changed at the source since the bound to the replica (one transaction);
        whether any row changed (the bound alone is metadata, which no capture sees)."""
        conn = self._dialect.begin_snapshot(self._engine)
        try:
            read = {t.name: self._read(conn, t, self._bounds.get(t.name)) for t in self._tables}
        finally:
            conn.close()
        now = time.monotonic()
        changes: list[RowChange] = []
        bounds = dict(self._bounds)
        for table in self._tables:
            changes.extend(self._differences(table, read[table.name]))
            stamps = [stamp for _, stamp, _ in read[table.name] if stamp is not None]
            if stamps:
                self._seen[table.name].append((now, max(stamps)))
            bound = self._settled(table.name, now)
            if bound is not None and (bounds.get(table.name) is None or bound > bounds[table.name]):
                bounds[table.name] = bound
        # The bound moves only with the changes read below it: both in one replica transaction.
        self._replica.apply(changes, {"timestamp_bounds": _encode_bounds(bounds)})
        self._bounds = bounds
        return bool(changes)

    def _differences(self, table: TableSchema, rows: list[tuple[dict[str, Any], Any, bool]]) -> list[RowChange]:
        keys = [tuple(row[c] for c in table.primary_key) for row, _, _ in rows]
        current = self._replica.rows(table.name, keys)
        out = []
        for key, (row, _, deleted) in zip(keys, rows):
            old = current.get(key)
            key_map = dict(zip(table.primary_key, key))
            if deleted:
                if old is not None:
                    out.append(RowChange(table.name, "delete", key=key_map))
            elif old is None:
                out.append(RowChange(table.name, "insert", row=row))
            elif old != row:
                out.append(RowChange(table.name, "update", key=key_map, row=row))
        return out

    def _settled(self, table: str, now: float) -> Any:
        """The largest timestamp seen at least ``settle_seconds`` ago (None if none was)."""
        seen = self._seen[table]
        settled = None
        while seen and seen[0][0] <= now - self._options.settle_seconds:
            _, stamp = seen.popleft()
            if settled is None or stamp > settled:
                settled = stamp
        return settled


# -- bounds in the replica's metadata ---------------------------------------------------------
def _encode(value: Any) -> dict[str, Any]:
    if isinstance(value, datetime.datetime):
        return {"datetime": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"date": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"decimal": str(value)}
    return {"value": value}


def _decode(item: dict[str, Any]) -> Any:
    if "datetime" in item:
        return datetime.datetime.fromisoformat(item["datetime"])
    if "date" in item:
        return datetime.date.fromisoformat(item["date"])
    if "decimal" in item:
        return decimal.Decimal(item["decimal"])
    return item["value"]


def _encode_bounds(bounds: dict[str, Any]) -> str:
    return json.dumps({table: _encode(v) for table, v in bounds.items()})


def _decode_bounds(text: str | None) -> dict[str, Any]:
    return {table: _decode(item) for table, item in json.loads(text).items()} if text else {}
