"""Verification: recompute a view from its sources and compare it with the stored view.

The stored view as of its watermark W is the view over a legal source state: for every source
s, exactly the updates with ``seq <= upto_s``, where ``upto_s`` is the largest seq among the
updates maintained in units with order <= W (or the view's starting point, ``bases[s]``).
Nothing has to stop for the check: each relation is read as a snapshot through its wrapper
(the initial-load subquery: the relation filtered by the view's local predicate, projected to
the columns the view reads, answered as of the source's watermark ``w``), and the changes of
the source's logged updates ``upto_s < seq <= w`` are subtracted from it, filtered and
projected exactly as maintenance sees them (``DeltaExtractor``). What is left is the relation
in the state the view claims to reflect. The view's own SELECT then runs over those contents
in Spark SQL (its ``source.table`` references rewritten to temporary views), and the result is
compared, row by row with multiplicities, with the store's signed weights as of W.

With a store that has no Spark session (the in-memory store) the recomputation runs in plain
Python (``warehouse.recompute``) instead.

One verification runs at a time per view: it reads every relation of the view through its
wrapper and recomputes the view, so a second one asked meanwhile is refused (409) rather than
queued: it would only repeat the same work for an answer the first is about to give.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlglot
from sqlglot import exp

from contract import expr
from contract.schemas import NAN, Subquery
from contract.zset import Row, ZSet, row_order
from warehouse.catalog.db import LogEntry, UnitInfo
from warehouse.plan import ViewPlan
from warehouse.recompute import recompute

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from warehouse.manager import Manager, ViewHandle

ATTEMPTS = 3  # a compaction may fold W away between reading W and reading the store


class VerifyError(Exception):
    """The view cannot be verified now (still initializing, failed, …); ``status`` is the HTTP
    status to answer with."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class SourceCut:
    """How one relation was brought to the view's state."""

    source: str
    relation: str
    upto: int  # the source's last seq reflected by the view as of W
    snapshot_watermark: int  # the snapshot reflects seq <= this
    subtracted_updates: int  # logged updates taken back out of the snapshot
    rows: int  # rows of the relation in the view's state (after filter and projection)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Report:
    view: str
    columns: list[str]
    watermark: int
    engine: str  # "spark" or "python"
    expected_rows: int  # rows of the recomputation (with multiplicities)
    stored_rows: int  # positive rows of the stored view as of W (with multiplicities)
    missing: list[tuple[Row, int]]  # in the recomputation, not (as often) in the store
    extra: list[tuple[Row, int]]  # in the store, not (as often) in the recomputation
    missing_total: int
    extra_total: int
    sources: list[SourceCut] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return self.missing_total == 0 and self.extra_total == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "view": self.view,
            "columns": self.columns,
            "watermark": self.watermark,
            "equal": self.equal,
            "engine": self.engine,
            "expected_rows": self.expected_rows,
            "stored_rows": self.stored_rows,
            "missing_total": self.missing_total,
            "extra_total": self.extra_total,
            "missing": [{"row": list(r), "count": n} for r, n in self.missing],
            "extra": [{"row": list(r), "count": n} for r, n in self.extra],
            "sources": [s.to_dict() for s in self.sources],
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
        }


# -- the pure parts ------------------------------------------------------------------------------


def reflected_seqs(
    units: Sequence[UnitInfo], entries: Mapping[int, LogEntry], bases: Mapping[str, int], watermark: int
) -> dict[str, int]:
    """Per source, the last seq the view reflects as of ``watermark``: updates enter the
    serialization order in seq order per source, so the units up to W cover a seq prefix."""
    upto = dict(bases)
    for unit in units:
        if unit.order > watermark:
            continue
        for log_id in unit.log_ids:
            entry = entries[log_id]
            upto[entry.source] = max(upto.get(entry.source, 0), entry.seq)
    return upto


def roll_back(
    snapshot: ZSet, later: Sequence[LogEntry], delta_of: Callable[[LogEntry], ZSet | None]
) -> tuple[ZSet, int]:
    """The snapshot without the changes of ``later`` updates (as the view sees them)."""
    out = snapshot.copy()
    used = 0
    for entry in later:
        delta = delta_of(entry)
        if delta:
            out.add_all(delta, -1)
            used += 1
    return out, used


def differences(expected: ZSet, stored: ZSet, limit: int) -> tuple[list, list, int, int]:
    """Rows missing from the store and extra in it, with counts (first ``limit`` of each)."""
    diff = stored - expected
    missing = sorted(((r, -w) for r, w in diff.items() if w < 0), key=lambda x: row_order(x[0]))
    extra = sorted(((r, w) for r, w in diff.items() if w > 0), key=lambda x: row_order(x[0]))
    return missing[:limit], extra[:limit], sum(n for _, n in missing), sum(n for _, n in extra)


def spark_select(plan: ViewPlan, tables: Mapping[tuple[str, str], str]) -> str:
    """The view's SELECT in Spark SQL with every ``source.table`` replaced by ``tables[…]``
    (aliased as before, so column references keep resolving)."""
    statement = sqlglot.parse_one(plan.sql)
    select = statement.expression if isinstance(statement, exp.Create) else statement
    assert isinstance(select, exp.Select), "parse_view accepted only a SELECT"
    select = select.copy()
    for table in list(select.find_all(exp.Table)):
        name = tables[(table.db, table.name)]
        alias = table.alias or table.name
        table.replace(exp.Table(this=exp.to_identifier(name), alias=exp.TableAlias(this=exp.to_identifier(alias))))
    return select.sql(dialect="spark")


# -- Spark ---------------------------------------------------------------------------------------


def _infer_type(values: Sequence[Any]):
    from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType

    kinds = {type(v) for v in values if v is not None}
    if not kinds or kinds <= {str}:
        return StringType(), None
    if kinds <= {bool}:
        return BooleanType(), None
    if kinds <= {int} and all(-(2**63) <= v < 2**63 for v in values if v is not None):
        return LongType(), None
    if kinds <= {int, float}:
        return DoubleType(), None
    return StringType(), "mixes value types " + ", ".join(sorted(k.__name__ for k in kinds)) + "; compared as text"


def _frame(spark: SparkSession, columns: Sequence[str], contents: ZSet, notes: list[str], label: str):
    """A DataFrame of the bag ``contents`` (each row repeated by its weight)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StringType, StructField, StructType

    negative = [r for r, w in contents.items() if w < 0]
    if negative:
        notes.append(f"{label}: {len(negative)} row(s) with a negative count in the rolled-back snapshot")
    rows = contents.expand()
    fields, arrays = [], []
    for i, name in enumerate(columns):
        values = [r[i] for r in rows]
        kind, note = _infer_type(values)
        if note:
            notes.append(f"{label}.{name} {note}")
        if note or isinstance(kind, StringType):
            values = [None if v is None else v if isinstance(v, str) else str(v) for v in values]
        fields.append(StructField(name, kind))
        arrays.append(pa.array(values, type=to_arrow_type(kind)))
    schema = StructType(fields)
    table = pa.Table.from_arrays(arrays, names=list(columns))
    return spark.createDataFrame(table, schema=schema)


def spark_recompute(
    spark: SparkSession, plan: ViewPlan, contents: Mapping[tuple[str, str], ZSet], notes: list[str]
) -> ZSet:
    session = spark.newSession()  # temporary views of its own, the catalog shared
    prefix = f"pvm_verify_{uuid.uuid4().hex[:10]}"
    names: dict[tuple[str, str], str] = {}
    for i, r in enumerate(plan.relations):
        name = f"{prefix}_{i}"
        _frame(
            session, r.columns, contents[(r.source, r.table)], notes, f"{r.source}.{r.table}"
        ).createOrReplaceTempView(name)
        names[(r.source, r.table)] = name
    try:
        result = session.sql(spark_select(plan, names)).toArrow()
    finally:
        for name in names.values():
            session.catalog.dropTempView(name)
    columns = [[NAN if v != v else v for v in result.column(i).to_pylist()] for i in range(result.num_columns)]
    return ZSet.from_rows(zip(*columns))  # every NaN the one object Z-sets can cancel


# -- the whole check -----------------------------------------------------------------------------


@contextmanager
def only_one(handle: ViewHandle, name: str) -> Iterator[None]:
    """Marks a verification of the view as running; VerifyError (409) if one already is."""
    if handle.verifying_since is not None:
        running = time.monotonic() - handle.verifying_since
        raise VerifyError(
            f"a verification of view {name!r} is already running (started {running:.1f} s ago); "
            "wait for its answer, then ask again if needed"
        )
    handle.verifying_since = time.monotonic()
    try:
        yield
    finally:
        handle.verifying_since = None


async def verify_view(manager: Manager, name: str, max_differences: int = 20) -> Report:
    """Recompute view ``name`` from its sources and compare it with the store as of W, one
    verification of the view at a time."""
    with only_one(manager.view(name), name):
        return await _verify(manager, name, max_differences)


async def _verify(manager: Manager, name: str, max_differences: int) -> Report:
    from warehouse.manager import ManagerError

    started = time.perf_counter()
    for attempt in range(ATTEMPTS):
        handle = manager.view(name)
        if handle.maintainer.failed is not None:
            raise VerifyError(f"view {name!r} has failed ({handle.maintainer.failed}); nothing to verify")
        if handle.bases is None or handle.maintainer.initial_order is not None:
            raise VerifyError(f"view {name!r} is still being initialized; verify it once it is active")
        watermark = handle.maintainer.protocol.watermark
        try:
            stored = await asyncio.to_thread(manager.read, name, watermark)
            break
        except ManagerError:
            if attempt == ATTEMPTS - 1:
                raise
    assert handle.bases is not None  # checked in the loop; a defined view keeps its bases
    plan, bases = handle.plan, dict(handle.bases)
    units = [u for u in await manager.db("units", name) if u.order <= watermark]
    ids = [i for u in units for i in u.log_ids]
    entries = {e.id: e for e in await manager.db("log_entries", None, 0, ids)} if ids else {}
    upto = reflected_seqs(units, entries, bases, watermark)

    contents: dict[tuple[str, str], ZSet] = {}
    cuts: list[SourceCut] = []
    for position, r in enumerate(plan.relations):
        request = Subquery(
            relation=r.table,
            alias=r.alias,
            keys=[[]],
            on=None,
            where=expr.to_wire(r.where) if r.where is not None else None,
            select=list(r.columns),
        )
        answer = await manager.clients[r.source].subquery(request)
        snapshot = ZSet((tuple(row[1:-1]), int(row[-1])) for row in answer.rows)
        since = upto.get(r.source, 0)
        later = [e for e in await manager.db("log_entries", r.source, since) if e.seq <= answer.watermark]

        def delta_of(entry: LogEntry, position: int = position) -> ZSet | None:
            update = handle.extractor(entry)
            return None if update is None else update.deltas.get(position)

        state, used = roll_back(snapshot, later, delta_of)
        contents[(r.source, r.table)] = state
        cuts.append(SourceCut(r.source, r.table, since, answer.watermark, used, sum(w for _, w in state.items())))

    notes: list[str] = []
    spark = getattr(manager.store, "spark", None)
    if spark is not None:
        expected = await asyncio.to_thread(spark_recompute, spark, plan, contents, notes)
        engine = "spark"
    else:
        columns = {(r.source, r.table): r.columns for r in plan.relations}
        expected = recompute(plan, contents, columns)
        engine = "python"
    missing, extra, missing_total, extra_total = differences(expected, stored, max_differences)
    return Report(
        view=name,
        columns=list(plan.output_names),
        watermark=watermark,
        engine=engine,
        expected_rows=sum(w for _, w in expected.items()),
        stored_rows=sum(max(w, 0) for _, w in stored.items()),
        missing=missing,
        extra=extra,
        missing_total=missing_total,
        extra_total=extra_total,
        sources=cuts,
        seconds=time.perf_counter() - started,
        notes=notes,
    )
