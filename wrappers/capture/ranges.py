"""Range-checksum capture: Carnes's ID/RCS for large tables that can be queried.

The wrapper's replica is the remote copy. Its metadata holds the auxiliary table of every
relation: the key ranges, and for each the checksum the *source* computed over it. Every
interval, in one read snapshot of the source::

    for each table, for each range r:
        s = the source's checksum of r       # one aggregate query: two numbers come back
        if s != kept[r]:
            rows = the source's rows of r     # only changed ranges are shipped
            changes += diff(the replica's rows of r, rows)
            kept[r] = s                       # split r if it grew past 2 * rows_per_range
    replica.apply(changes, ranges and checksums)   # one transaction: shipped as one update
                                                   # (the ranges only if they changed)

A range checksum is the row count and the sum of a 60-bit hash of every row, computed by
the database itself (PostgreSQL's and MariaDB's ``md5``; for SQLite an aggregate the
wrapper registers). It does not depend on row order; a changed range goes unnoticed with
probability about ``2**-60``. Checksums are only ever compared with checksums of the same
database, so each dialect may compute its own.

Keys must be integer columns, so that a range means the same in the source and in the
replica (text keys would compare under the source's collation). Ranges are half-open,
the first unbounded below and the last above (``differential.range_checksums.KeyRange``),
so new keys at either end are always covered. Subqueries are answered from the replica,
as for the other snapshot methods, so invariant 3 holds the same way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from contract.value_fit import source_family
from wrappers.capture.base import CaptureDialect
from wrappers.capture.differencing import row_changes
from wrappers.capture.types import wire_value
from wrappers.differential import ChangeList, SnapshotError
from wrappers.differential.partitioned_hash import diff_in_memory
from wrappers.differential.range_checksums import KeyRange, RangePlanner, ranges_between, split_range
from wrappers.differential.record_schema import Record
from wrappers.errors import InvalidRequest, WrapperError
from wrappers.replica import Replica, RowChange
from wrappers.schema import SourceSchema, TableSchema

log = logging.getLogger(__name__)

_META = "range_checksums"
_HASH_MOD = 1 << 60


@dataclass
class TableRanges:
    """The auxiliary table of one relation: lower bounds of ranges 1..n-1 and n checksums."""

    bounds: list[tuple[int, ...]]
    sums: list[str]

    def ranges(self) -> list[KeyRange]:
        return ranges_between(self.bounds)


class RangeCapture:
    """Feeds a replica from a live database by range checksums."""

    def __init__(
        self,
        dialect: CaptureDialect,
        engine: sa.Engine,
        schema: SourceSchema,
        replica: Replica,
        interval: float,
        rows_per_range: int,
    ) -> None:
        if rows_per_range < 1:
            raise WrapperError("rows per range must be at least 1")
        for table in schema.tables.values():
            bad = [c for c in table.primary_key if source_family(table.types[table.columns.index(c)]) != "integer"]
            if bad:
                raise WrapperError(
                    f"range-checksum capture needs integer key columns; {table.name!r} is keyed by "
                    f"{', '.join(bad)} ({', '.join(table.types[table.columns.index(c)] for c in bad)}): "
                    "use another --algorithm"
                )
        self._dialect = dialect
        self._engine = engine
        self._schema = schema
        self._replica = replica
        self._interval = interval
        self._rows_per_range = rows_per_range
        self._checksum = _checksum_sql(engine)
        stored = json.loads(replica.meta(_META) or "{}")
        self._ranges = {
            t: TableRanges([tuple(b) for b in r["bounds"]], list(r["sums"])) for t, r in stored.items()
        }  # fmt: skip
        self._next_at = 0.0
        self._status: dict[str, Any] = {
            "snapshots": 0, "last_snapshot_at": None, "last_changes": {}, "algorithms": {},
            "ranges": {t: len(r.sums) for t, r in self._ranges.items()}, "ranges_shipped": 0, "rows_shipped": 0,
            "last_error": None,
        }  # fmt: skip

    def status(self) -> dict[str, Any]:
        return dict(self._status)

    # -- the first copy -------------------------------------------------------------------------
    def load(self) -> None:
        """Load an empty replica with every table, plan its ranges and take their checksums,
        all in one read snapshot of the source."""
        conn = self._dialect.begin_snapshot(self._engine)
        try:
            plans = {t: RangePlanner(self._rows_per_range) for t in self._schema.tables}
            rows = {name: self._rows_planning(conn, table, plans[name]) for name, table in self._schema.tables.items()}
            self._replica.load(rows)  # consumes the generators, which feed ``plans``
            ranges = {
                name: TableRanges(plans[name].bounds, [self._sum(conn, table, r) for r in plans[name].ranges()])
                for name, table in self._schema.tables.items()
            }  # fmt: skip
        except InvalidRequest as exc:
            raise SnapshotError(f"the first copy cannot be loaded: {exc}") from exc
        finally:
            conn.close()
        self._replica.apply([], self._meta(ranges))
        self._ranges = ranges
        self._status.update(
            snapshots=1, last_snapshot_at=time.time(), ranges={t: len(r.sums) for t, r in ranges.items()}
        )

    def _rows_planning(self, conn: sa.Connection, table: TableSchema, plan: RangePlanner) -> Iterator[dict[str, Any]]:
        """The table's rows in key order, each key fed to ``plan`` on the way."""
        for key, rest in _records(conn, table, KeyRange(None, None)):
            plan.add(key)
            yield dict(zip(_ordered_columns(table), (*key, *rest)))

    # -- every interval -------------------------------------------------------------------------
    def pull(self) -> bool:
        """Probe every range once the interval passed; ship, difference and apply the changed
        ones; whether any row of the replica changed."""
        now = time.monotonic()
        if now < self._next_at:
            return False
        self._next_at = now + self._interval
        try:
            changes, counts, ranges, shipped_ranges, shipped_rows = self._refresh()
            # Unchanged ranges and sums (most intervals) leave the replica untouched: no write at all.
            meta = self._meta(ranges) if ranges != self._ranges else {}
            if changes or meta:
                self._replica.apply(changes, meta)
        except (SnapshotError, InvalidRequest, OSError, sa.exc.DBAPIError) as exc:
            message = f"range checksums not applied: {exc}"
            if message != self._status["last_error"]:
                log.error("%s; the replica keeps the previous state", message)
            self._status["last_error"] = message
            return False
        self._ranges = ranges
        self._status.update(
            snapshots=self._status["snapshots"] + 1, last_snapshot_at=time.time(), last_error=None,
            last_changes=counts, algorithms=dict.fromkeys(ranges, "range-checksums"),
            ranges={t: len(r.sums) for t, r in ranges.items()},
            ranges_shipped=self._status["ranges_shipped"] + shipped_ranges,
            rows_shipped=self._status["rows_shipped"] + shipped_rows,
        )  # fmt: skip
        if changes:
            log.info("range checksums: %s", ", ".join(f"{t} {c}" for t, c in counts.items()))
        return bool(changes)

    def _refresh(self) -> tuple[list[RowChange], dict[str, dict[str, int]], dict[str, TableRanges], int, int]:
        changes: list[RowChange] = []
        counts: dict[str, dict[str, int]] = {}
        out: dict[str, TableRanges] = {}
        shipped_ranges = shipped_rows = 0
        conn = self._dialect.begin_snapshot(self._engine)
        try:
            for name, table in self._schema.tables.items():
                # no ranges yet (a crash between loading the copy and recording its ranges):
                # one range whose checksum never matches, read whole and split on the way
                kept = self._ranges.get(name) or TableRanges([], [""])
                bounds: list[tuple[int, ...]] = []
                sums: list[str] = []
                found: list[ChangeList] = []
                for i, r in enumerate(kept.ranges()):
                    if i:
                        bounds.append(r.lo)  # type: ignore[arg-type]
                    s = self._sum(conn, table, r)
                    if s == kept.sums[i]:
                        sums.append(s)
                        continue
                    rows = list(_records(conn, table, r))
                    shipped_ranges += 1
                    shipped_rows += len(rows)
                    found.append(diff_in_memory(self._replica_rows(table, r), rows, where=f"{name} range {_show(r)}"))
                    pieces = split_range(r, rows, self._rows_per_range)
                    bounds.extend(p.lo for p in pieces[1:])  # type: ignore[misc]
                    sums.extend(s if len(pieces) == 1 else self._sum(conn, table, p) for p in pieces)
                merged = ChangeList.from_changes(c for cl in found for c in cl)
                counts[name] = merged.counts()
                changes.extend(row_changes(table, merged))
                out[name] = TableRanges(bounds, sums)
        finally:
            conn.close()
        return changes, counts, out, shipped_ranges, shipped_rows

    # -- SQL ------------------------------------------------------------------------------------
    def _sum(self, conn: sa.Connection, table: TableSchema, r: KeyRange) -> str:
        """The source's checksum of range ``r``: ``count:sum``."""
        where, params = _predicate(conn, table, r)
        count, total = conn.execute(sa.text(self._checksum(conn, table, where)), params).one()
        return f"{count}:{total}"

    def _replica_rows(self, table: TableSchema, r: KeyRange) -> list[Record]:
        with self._replica.engine.connect() as conn:
            return list(_records(conn, table, r))

    def _meta(self, ranges: dict[str, TableRanges]) -> dict[str, str]:
        return {_META: json.dumps({t: {"bounds": r.bounds, "sums": r.sums} for t, r in ranges.items()})}


def _ordered_columns(table: TableSchema) -> list[str]:
    return [*table.primary_key, *(c for c in table.columns if c not in table.primary_key)]


def _quote(conn: sa.Connection, name: str) -> str:
    return conn.dialect.identifier_preparer.quote_identifier(name)


def _predicate(conn: sa.Connection, table: TableSchema, r: KeyRange) -> tuple[str, dict[str, Any]]:
    """``r`` as a WHERE clause over the table's (quoted) key columns, values bound."""
    key = [_quote(conn, c) for c in table.primary_key]
    return r.sql_predicate(key)


def _records(conn: sa.Connection, table: TableSchema, r: KeyRange) -> Iterator[Record]:
    """The rows of range ``r`` in key order, as ``(key, rest)`` in wire form."""
    where, params = _predicate(conn, table, r)
    columns = ", ".join(_quote(conn, c) for c in _ordered_columns(table))
    order = ", ".join(_quote(conn, c) for c in table.primary_key)
    sql = f"SELECT {columns} FROM {_quote(conn, table.name)} WHERE {where} ORDER BY {order}"
    width = len(table.primary_key)
    for row in conn.execute(sa.text(sql).execution_options(yield_per=10_000), params):
        values = tuple(map(wire_value, row))
        yield values[:width], values[width:]


def _checksum_sql(engine: sa.Engine):
    """``(conn, table, where) -> SQL`` selecting a range's row count and hash sum, per dialect."""
    name = engine.dialect.name
    if name == "postgresql":

        def postgresql(conn: sa.Connection, table: TableSchema, where: str) -> str:
            row = ", ".join(_quote(conn, c) for c in table.columns)
            digest = f"('x' || substr(md5(CAST(ROW({row}) AS text)), 1, 15))::bit(60)::bigint"
            return f"SELECT count(*), coalesce(sum({digest}), 0) FROM {_quote(conn, table.name)} WHERE {where}"

        return postgresql
    if name in ("mysql", "mariadb"):

        def mariadb(conn: sa.Connection, table: TableSchema, where: str) -> str:
            row = ", ".join(f"QUOTE({_quote(conn, c)})" for c in table.columns)
            digest = f"CAST(CONV(SUBSTRING(MD5(CONCAT_WS(',', {row})), 1, 15), 16, 10) AS UNSIGNED)"
            return f"SELECT COUNT(*), COALESCE(SUM({digest}), 0) FROM {_quote(conn, table.name)} WHERE {where}"

        return mariadb
    if name == "sqlite":
        # Connections opened from now on get the aggregate; drop those opened before.
        sa.event.listen(engine, "connect", _register_sqlite_checksum)
        engine.dispose()

        def sqlite(conn: sa.Connection, table: TableSchema, where: str) -> str:
            row = ", ".join(_quote(conn, c) for c in table.columns)
            return (
                f"SELECT COUNT(*), COALESCE(pvm_range_checksum({row}), 0) FROM {_quote(conn, table.name)} WHERE {where}"
            )

        return sqlite
    raise WrapperError(f"range-checksum capture does not support {name} sources")


class _SqliteChecksum:
    """``pvm_range_checksum(col, …)``: the sum of 60-bit row hashes modulo 2**60."""

    def __init__(self) -> None:
        self.total = 0

    def step(self, *values: Any) -> None:
        digest = hashlib.blake2b(repr(values).encode(), digest_size=8).digest()
        self.total = (self.total + int.from_bytes(digest, "big")) % _HASH_MOD

    def finalize(self) -> int:
        return self.total


def _register_sqlite_checksum(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.create_aggregate("pvm_range_checksum", -1, _SqliteChecksum)


def _show(r: KeyRange) -> str:
    return f"[{r.lo if r.lo is not None else '-inf'}, {r.hi if r.hi is not None else '+inf'})"
