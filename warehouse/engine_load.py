"""The initial load of a view in the Spark store: relation snapshots joined by Spark.

The SWEEP initial load sends every row of every relation through the manager's Python
objects. Here each wrapper streams one relation whole (after its local predicate, the
view's columns only) as of a watermark ``w_j`` (``contract.relation_snapshot``, the same
handshake as a subquery); the manager writes each record batch to a Parquet file as it
arrives, and Spark joins the staged relations and appends the result to the view's z-log
with the load's order number, in one job. No row of a relation passes through a Python
object of the manager, and memory does not grow with the relations.

Correctness is the SWEEP load's (docs/protocol.md, "The initial load in Spark"): the load
is a unit whose answers are the snapshots. The snapshot of relation ``j`` reflects its
source's updates with ``seq <= w_j``, and those ordered after the load (every update the
view has queued, and those of units numbered after it) must not be reflected: the
protocol names them (``concurrent_deltas``, the same call a subquery's answer makes) and
their deltas are staged beside the snapshot with negated weights. Spark joins Z-sets, so
relation ``j`` is ``R_j(w_j) − Σ ΔR_j = R_j`` as of the load's order, and the join of the
corrected relations is the view as of the load, exactly.

An aggregate or DISTINCT view's load appends what ``aggregate.encode`` would store for the
join's rows, computed by the same job (``load_sql``, ``aggregate.encode_sql``).

The z-log append is the commit of the load's effect: the effect handed to the commit
manager is empty, and a load run again (after a fault or a restart) whose order the store
already holds stages nothing. A stream cut short (``TruncatedSnapshot``) is a lost
connection: the load is retried from scratch, and nothing of a partial stream reaches the
view.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.parquet as pq

from contract import expr
from contract.column_types import spark_type
from contract.expr import Cmp, Col
from contract.relation_snapshot import (
    Readable,
    RelationSnapshot,
    SnapshotReader,
    SnapshotStreamError,
    arrow_type,
    encode_batch,
)
from contract.zset import ZSet, total
from warehouse.aggregate import encode_sql
from warehouse.plan import RelationRef, ViewPlan
from warehouse.protocol import INITIAL_TERM, Unit, ViewProtocol
from warehouse.spill import SpillLog, deltas_from_log

WEIGHT = "_w"
ORDER = "_order"


@runtime_checkable
class SnapshotSource(Protocol):
    """A source client that streams relation snapshots (``warehouse.sources.HttpSourceClient``)."""

    def open_snapshot(self, request: RelationSnapshot) -> AbstractContextManager[Readable]:
        """The snapshot stream's bytes, read from the calling thread."""
        ...


@runtime_checkable
class LoadStore(Protocol):
    """A store that runs the load's join itself (``warehouse.store.spark.SparkStore``)."""

    def staging_dir(self, view: str) -> Path:
        """Where staged relations go: a directory the store's engine reads."""
        ...

    def load(self, view: str, order: int, query: str) -> bool:
        """Append the rows of ``query`` (view columns, ``_w``) to the view's z-log as order
        ``order`` in one job; False if the store holds that order already."""
        ...

    def committed_orders(self, view: str) -> set[int]: ...


@dataclass
class LoadProgress:
    """How far a running load is, for the view's status and its gauges."""

    relations: int
    started_at: float = field(default_factory=time.time)
    phase: str = "staging"  # staging the relations, then "joining" in the engine
    staged: int = 0  # relations staged whole
    rows: dict[int, int] = field(default_factory=dict)  # rows received, by relation position
    expected: dict[int, int] = field(default_factory=dict)  # the sources' estimates, by position

    def status(self, now: float | None = None) -> dict[str, object]:
        """Where the load is. The staging's percent and ETA count rows against the sources'
        estimates of their relations (``contract.relation_snapshot``) once every relation
        has one, relations staged whole otherwise. An estimate may be off: the percent stays
        below 100 until the last relation is staged, and the ETA assumes the rate so far.

        >>> p = LoadProgress(2, started_at=100.0, rows={0: 300, 1: 100}, expected={0: 600, 1: 1000})
        >>> p.status(now=104.0)["percent"], p.status(now=104.0)["eta_seconds"]
        (25.0, 12.0)
        >>> LoadProgress(2, started_at=100.0, staged=1, rows={0: 600}).status(now=104.0)["eta_seconds"] is None
        True
        """
        elapsed = (time.time() if now is None else now) - self.started_at
        rows = sum(self.rows.values())
        estimated = len(self.expected) == self.relations and self.relations > 0
        expected = sum(self.expected.values()) if estimated else None
        if self.phase != "staging" or not self.relations:
            percent, eta = 100.0, None
        elif expected:
            percent = min(99.9, 100.0 * rows / expected)
            eta = max(0.0, elapsed * (expected - rows) / rows) if rows else None
        else:
            percent, eta = 100.0 * self.staged / self.relations, None
        return {
            "phase": self.phase,
            "relations": self.relations,
            "relations_staged": self.staged,
            "rows_staged": rows,
            "rows_expected": expected,
            "percent": round(percent, 1),
            "eta_seconds": None if eta is None else round(eta, 1),
            "seconds": round(elapsed, 1),
        }


def supports(plan: ViewPlan, declared: Sequence[Sequence[str]]) -> str | None:
    """Why the engine cannot load this view (None: it can). Spark evaluates the join, so the
    join must mean in Spark what it means in ``contract.expr``: only equalities of two
    columns of one type family, each integer, text or boolean (floats have NaN and -0.0,
    untyped columns compare as JSON text). ``declared[j]``: the declared types of relation
    ``j``'s columns, in the plan's order. An aggregate or DISTINCT view's stored rows are
    computed from the join's by ``aggregate.encode_sql``, as ``encode`` would, provided its
    groups and MIN/MAX values are no floats (Spark groups NaN and -0.0 as one value, Python
    does not). A view that adds NULL-extended rows (a LEFT JOIN) is loaded by subqueries,
    which apply that operator."""
    if plan.summary is not None:
        body = body_types(plan, declared)
        keyed = [*range(plan.summary.groups), *plan.summary.extremes]
        floats = [plan.summary.names[i] for i in keyed if body[i] == "DOUBLE"]
        if floats:
            return f"the aggregate groups or takes MIN/MAX of floating-point columns {floats}"
    if plan.outer is not None:
        return "a LEFT JOIN's NULL-extended rows are not computed by the engine's join"
    position = {r.alias: j for j, r in enumerate(plan.relations)}

    def declared_type(c: Col) -> str | None:
        j = position[c.relation]
        return spark_type(declared[j][plan.relations[j].columns.index(c.name)])

    for conjunct in plan.join:
        if not (
            isinstance(conjunct, Cmp)
            and conjunct.op == "="
            and isinstance(conjunct.left, Col)
            and isinstance(conjunct.right, Col)
        ):
            return f"join predicate {conjunct!r} is not an equality of two columns"
        types = {declared_type(c) for c in (conjunct.left, conjunct.right)}
        if len(types) != 1 or next(iter(types)) not in ("BIGINT", "STRING", "BOOLEAN"):
            return f"join predicate {conjunct!r} compares columns of types {sorted(map(str, types))}"
    return None


def body_types(plan: ViewPlan, declared: Sequence[Sequence[str]]) -> list[str | None]:
    """The Spark SQL types of the view body's columns (``plan.outputs``), from the declared
    types of the relations' columns (``declared`` as ``supports`` takes it)."""
    position = {r.alias: j for j, r in enumerate(plan.relations)}
    types: list[str | None] = []
    for out in plan.outputs:
        j = position[out.column.relation]
        types.append(spark_type(declared[j][plan.relations[j].columns.index(out.column.name)]))
    return types


def load_sql(plan: ViewPlan, relations: Sequence[tuple[str, str | None]], declared: Sequence[Sequence[str]]) -> str:
    """What the load appends to the view's z-log: the join's rows (``join_sql``), or for an
    aggregate or DISTINCT view the stored rows ``encode`` would make of them (their columns
    ``b<i>`` in the body's order).

    The join's rows are not summed per row: a row may come more than once (a projection
    that drops a join column), and a row the snapshots hold may come again with the
    opposite weight (its compensation). Every reader of the z-log sums the weights per row
    (``spark_sql.sums_sql``, ``summed_sql``, compaction), and ``encode_sql`` sums them per
    group and per MIN/MAX value, so both mean what their sums mean. One exception: a sum
    of floating-point values is summed per body row first (``presummed``), or rows that
    cancel would leave their rounding in it."""
    body = join_sql(plan, relations)
    if plan.summary is None:
        return body
    names = ", ".join([*(f"b{i}" for i in range(len(plan.outputs))), WEIGHT])
    types = body_types(plan, declared)
    stored = plan.summary.stored_types(types)
    if any(types[a] == "DOUBLE" for a in plan.summary.summed):
        body = presummed(body, len(plan.outputs))
    return f"WITH body AS (SELECT * FROM ({body}) AS joined({names}))\n" + encode_sql(plan.summary, "body", stored)


def presummed(rows: str, width: int) -> str:
    """``rows`` (``width`` columns, then ``_w``) summed per row, rows of sum 0 dropped.

    >>> presummed("SELECT a, _w FROM t", 1)
    'SELECT c0, SUM(_w) AS _w FROM (SELECT a, _w FROM t) AS body_rows(c0, _w) GROUP BY c0 HAVING SUM(_w) <> 0'
    """
    cols = ", ".join(f"c{i}" for i in range(width))
    return (
        f"SELECT {cols}, SUM({WEIGHT}) AS {WEIGHT} FROM ({rows}) AS body_rows({cols}, {WEIGHT}) "
        f"GROUP BY {cols} HAVING SUM({WEIGHT}) <> 0"
    )


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def join_sql(plan: ViewPlan, relations: Sequence[tuple[str, str | None]]) -> str:
    """The load's Spark SQL: the view's join over the staged relations (``relations[j]``:
    the snapshot's Parquet path and its compensation's, if any), each joined row with the
    product of its weights. Not summed per output row: the z-log's readers sum per row
    anyway, and a GROUP BY over every output column cost Spark about as much again as the
    join (``load_sql``).

    >>> from warehouse.plan import OutputColumn, RelationRef
    >>> r = RelationRef("r", "s1", "r", ("a", "b"))
    >>> s = RelationRef("s", "s2", "s", ("b",))
    >>> plan = ViewPlan("v", (r, s), (Cmp("=", Col("r", "b"), Col("s", "b")),), (OutputColumn("a", Col("r", "a")),))
    >>> print(join_sql(plan, [("/st/r0", None), ("/st/r1", "/st/c1")]))
    SELECT r0.`a`, r0._w * r1._w AS _w
    FROM (SELECT `a`, `b`, 1L AS _w FROM parquet.`/st/r0`) r0,
    (SELECT `b`, 1L AS _w FROM parquet.`/st/r1` UNION ALL SELECT `b`, _w FROM parquet.`/st/c1`) r1
    WHERE r0.`b` = r1.`b`
    """
    position = {r.alias: j for j, r in enumerate(plan.relations)}

    def column(c: Col) -> str:
        return f"r{position[c.relation]}.{_ident(c.name)}"

    parts = []
    for j, (relation, (snapshot, compensation)) in enumerate(zip(plan.relations, relations, strict=True)):
        cols = ", ".join(_ident(c) for c in relation.columns)
        source = f"SELECT {cols}, 1L AS {WEIGHT} FROM parquet.{_ident(snapshot)}"
        if compensation is not None:
            source += f" UNION ALL SELECT {cols}, {WEIGHT} FROM parquet.{_ident(compensation)}"
        parts.append(f"({source}) r{j}")
    outputs = ", ".join(column(o.column) for o in plan.outputs)
    weight = " * ".join(f"r{j}.{WEIGHT}" for j in range(len(plan.relations)))
    where = " AND ".join(f"{column(c.left)} = {column(c.right)}" for c in plan.join if isinstance(c, Cmp))  # type: ignore[arg-type]
    return f"SELECT {outputs}, {weight} AS {WEIGHT}\nFROM " + ",\n".join(parts) + (f"\nWHERE {where}" if where else "")


def stage(
    stream: Readable,
    path: Path,
    columns: Sequence[str],
    declared: Sequence[str],
    progress: dict[int, int],
    j: int,
    estimates: dict[int, int] | None = None,
) -> tuple[int, pa.Schema]:
    """Write one snapshot stream to ``path`` (Parquet) a batch at a time; its watermark and
    schema. ``progress[j]``: the rows written so far; ``estimates[j]``: the source's estimate
    of them, if it sent one. SnapshotStreamError if its columns are not those asked, in the
    types the view expects; TruncatedSnapshot if it was cut short (the file is then
    incomplete: the caller throws the whole staging away)."""
    reader = SnapshotReader(stream)
    if estimates is not None and reader.rows_estimate is not None:
        estimates[j] = reader.rows_estimate
    expected = [(c, arrow_type(t)) for c, t in zip(columns, declared, strict=True)]
    got = [(f.name, f.type) for f in reader.schema]
    if got != expected:
        raise SnapshotStreamError(f"the snapshot has columns {got}, the view expects {expected}")
    with pq.ParquetWriter(path, reader.schema.remove_metadata()) as writer:
        for batch in reader.batches():
            writer.write_batch(batch)
            progress[j] = reader.rows
    return reader.watermark, reader.schema


def snapshot_request(relation: RelationRef) -> RelationSnapshot:
    """The snapshot of one relation of a view: its rows after its local predicate, in the
    columns the view reads."""
    return RelationSnapshot(
        relation=relation.table,
        alias=relation.alias,
        where=expr.to_wire(relation.where) if relation.where is not None else None,
        select=list(relation.columns),
    )


def write_taken_back(deltas: ZSet, schema: pa.Schema, path: Path) -> str | None:
    """``deltas`` with negated weights as a Parquet file of a staged relation's ``schema``
    and ``_w`` at ``path`` (which ``join_sql`` adds to the relation), or None if empty: the
    changes a snapshot reflects but the state it stands for must not."""
    if not deltas:
        return None
    rows, weights = zip(*deltas.items())
    batch = encode_batch(schema, rows, [-w for w in weights])
    fields = [pa.field(f.name, f.type) for f in schema] + [pa.field(WEIGHT, pa.int64())]
    pq.write_table(pa.Table.from_batches([batch], pa.schema(fields)), path)
    return str(path)


class EngineLoad:
    """Runs a view's initial load unit through the store's engine."""

    def __init__(
        self,
        plan: ViewPlan,
        protocol: ViewProtocol,
        sources: Mapping[str, SnapshotSource],
        store: LoadStore,
        declared: Sequence[Sequence[str]],
        spill_log: SpillLog | None = None,
    ) -> None:
        """``declared[j]``: relation ``j``'s declared column types, in the order of its
        columns in ``plan`` (what the streams' types follow); ``spill_log``: where spilled
        queued updates are read from."""
        self.plan = plan
        self.protocol = protocol
        self.spill_log = spill_log
        self.sources = sources
        self.store = store
        self.declared = declared
        self.progress: LoadProgress | None = None

    async def run(self, unit: Unit) -> tuple[ZSet, int, int]:
        """Load the view as of ``unit`` (the initial unit) into the store. Returns the empty
        effect (the store holds the load already), how many updates were compensated, and
        how many of them were read from the update log (spilled)."""
        assert unit.initial
        name = self.plan.name
        if unit.order in await asyncio.to_thread(self.store.committed_orders, name):
            return ZSet(), 0, 0  # appended before a crash or a failed commit record
        root = self.store.staging_dir(name)
        for old in root.glob(f"order-{unit.order}-*"):  # an earlier run's: nothing of it is of use
            shutil.rmtree(old, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
        # A directory of this run's own: a thread of a run that was cancelled cannot be
        # stopped, and may still be writing to its files.
        staging = Path(tempfile.mkdtemp(prefix=f"order-{unit.order}-", dir=root))
        self.progress = progress = LoadProgress(len(self.plan.relations))
        try:
            # every stream runs to its end or its fault before the staging goes
            results = await asyncio.gather(
                *(self._stage(j, staging) for j in range(len(self.plan.relations))), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            staged = [r for r in results if not isinstance(r, BaseException)]
            # Every update a snapshot reflects was received before its stream began (the
            # handshake), and none leaves the protocol while the load runs (it is the oldest
            # unit): asking now names exactly what each snapshot must not reflect.
            files: list[tuple[str, str | None]] = []
            compensated = from_log = 0
            for j, (path, watermark, schema) in enumerate(staged):
                compensation, count, logged = await self._compensation(unit, j, watermark, schema, staging)
                files.append((str(path), compensation))
                compensated += count
                from_log += logged
            progress.phase = "joining"
            await asyncio.to_thread(self.store.load, name, unit.order, load_sql(self.plan, files, self.declared))
        finally:
            self.progress = None
            shutil.rmtree(staging, ignore_errors=True)
        return ZSet(), compensated, from_log

    async def _stage(self, j: int, staging: Path) -> tuple[Path, int, pa.Schema]:
        relation = self.plan.relations[j]
        request = snapshot_request(relation)
        path = staging / f"r{j}.parquet"
        progress = self.progress
        assert progress is not None

        def fetch() -> tuple[int, pa.Schema]:
            with self.sources[relation.source].open_snapshot(request) as stream:
                return stage(stream, path, relation.columns, self.declared[j], progress.rows, j, progress.expected)

        watermark, schema = await asyncio.to_thread(fetch)
        progress.staged += 1
        return path, watermark, schema

    async def _compensation(
        self, unit: Unit, j: int, watermark: int, schema: pa.Schema, staging: Path
    ) -> tuple[str | None, int, int]:
        """The deltas of relation ``j`` that its snapshot reflects but the load must not,
        with negated weights, as a Parquet file (None: there are none), how many updates
        they come from, and how many of those were read from the update log: queued or
        numbered ones come from memory, spilled ones from the log (``warehouse.spill``)."""
        relation = self.plan.relations[j]
        concurrent = self.protocol.concurrent_deltas(unit, INITIAL_TERM, j, relation.source, watermark)
        logged = self.protocol.concurrent_logged(unit, INITIAL_TERM, j, relation.source, watermark)
        spilled = self.protocol.spilled_range(relation.source, watermark)
        undone, from_log = total(concurrent), 0
        if spilled is not None or logged:
            assert self.spill_log is not None, "updates were spilled without a log to read them from"
            async for read, updates in deltas_from_log(self.spill_log, j, spilled, logged):
                undone.add_all(read)
                from_log += updates
        path = write_taken_back(undone, schema, staging / f"c{j}.parquet")
        return path, len(concurrent) + from_log, from_log
