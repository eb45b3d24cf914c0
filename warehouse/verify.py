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

Where it runs. The manager reads the snapshots and the update log (the sources' cut above);
the recomputation and the comparison run in the analysts' query process
(``warehouse/analysts/verification.py``): the manager sends it the relations' contents, the
view's SELECT and the store's record of the view, and it reads the stored view as of W from
the files that record names (what they hold up to W no longer changes), as ``/rows`` does. So a verification never holds the
store's per-view lock (the one commits and publishes take), never reads the view into the
manager, and never runs in the Spark session that writes the store: it competes with
analysts' queries, within their limits (concurrency, ``--query-timeout``), not with
maintenance. With a store that has no Spark session (the in-memory store: tests and quick
runs) the recomputation runs in plain Python (``warehouse.recompute``) in the manager instead.

At scale. Where the view's join can run in the store's engine (``Manager.engine_inputs``, as
for an initial load in Spark), the relations are not read into the manager at all: each is
streamed to Parquet beside the view's files, with the logged changes to take back beside it
with negated weights, and the query process recomputes the view's stored rows with the
initial load's SQL (``engine_load.load_sql``) and compares them in Spark
(``verification.compare_staged``): only the differences listed come back.

How many run. At most ``--max-verifications`` at once over all the manager's views (default
1), and one at a time per view. A verification reads every relation of the view through its
wrapper and recomputes the view, so more are refused (429 with ``Retry-After``) rather than
queued: a queue would only pile work on the wrappers and the query process, and a second
verification of the same view would repeat the first one's work for the answer it is about to
give.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlglot
from sqlglot import exp

from contract import expr
from contract.relation_snapshot import RelationSnapshot
from contract.schemas import Subquery
from contract.zset import Row, ZSet
from warehouse.analysts.messages import VerifyRelation, VerifyRequest
from warehouse.analysts.verification import differences
from warehouse.catalog.db import Catalog, LogEntry
from warehouse.engine_load import SnapshotSource, load_sql, snapshot_request, stage, write_taken_back
from warehouse.errors import Busy, Conflict, NotFound, Unsupported
from warehouse.plan import ViewPlan
from warehouse.recompute import recompute
from warehouse.store.base import StoreError

if TYPE_CHECKING:
    from warehouse.analysts.supervisor import AnalystProcess
    from warehouse.manager import Manager, ViewHandle

__all__ = ["Report", "SourceCut", "Verifications", "differences", "verify_view"]

ATTEMPTS = 3  # a compaction may fold W away while the sources are read: the check starts over
MAX_VERIFICATIONS = 1  # at once over all views of a manager (pvm serve --max-verifications)
BUSY_RETRY_AFTER_S = 5  # what a refused client hears; a verification takes seconds to minutes


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


# -- how many run --------------------------------------------------------------------------------


class Verifications:
    """The verifications running in a manager: at most ``limit`` at once over all its views,
    and one per view. Counted on the event loop (``admit`` never awaits), so no lock is needed."""

    def __init__(self, limit: int = MAX_VERIFICATIONS) -> None:
        if limit < 1:
            raise ValueError("at least one verification must be allowed to run")
        self.limit = limit
        self.running: dict[str, float] = {}  # view -> time.monotonic() its verification began

    @contextmanager
    def admit(self, view: str) -> Iterator[None]:
        """Count a verification of ``view`` while the block runs; Busy (with
        ``retry_after``) if one of the view already runs, or ``limit`` of any view do."""
        now = time.monotonic()
        if view in self.running:
            raise Busy(
                f"a verification of view {view!r} is already running (started {now - self.running[view]:.1f} s "
                "ago); wait for its answer, then ask again if needed",
                retry_after=BUSY_RETRY_AFTER_S,
            )
        if len(self.running) >= self.limit:
            running = ", ".join(f"{v!r} ({now - t:.0f} s)" for v, t in sorted(self.running.items()))
            raise Busy(
                f"{len(self.running)} verification(s) already running ({running}), the most this manager runs at "
                f"once (pvm serve --max-verifications, now {self.limit}); ask again once one has answered",
                retry_after=BUSY_RETRY_AFTER_S,
            )
        self.running[view] = now
        try:
            yield
        finally:
            del self.running[view]


# -- the whole check -----------------------------------------------------------------------------


async def verify_view(manager: Manager, name: str, max_differences: int = 20, who: str = "a verification") -> Report:
    """Recompute view ``name`` from its sources and compare it with the store as of W, within
    the manager's limits on verifications. ``who``: whose request it is, counted against the
    analysts' query process's limits like a query of theirs."""
    manager.view(name)  # an unknown view is 404, whatever runs
    with manager.verifications.admit(name):
        return await _verify(manager, name, max_differences, who)


def _analysts(manager: Manager) -> AnalystProcess | None:
    """Where the recomputation and the comparison run: the analysts' query process for a
    store of engine "spark", None (in the manager) for a store held in this process."""
    if manager.view_store.engine == "python":
        return None
    if manager.analysts is None:
        raise Unsupported(
            "verifying a view of the Spark store needs the analysts' query process (pvm serve --store spark starts it)"
        )
    return manager.analysts


async def _verify(manager: Manager, name: str, max_differences: int, who: str) -> Report:
    started = time.perf_counter()
    analysts = _analysts(manager)
    for _ in range(ATTEMPTS):
        handle = manager.view(name)
        if handle.maintainer.failed is not None:
            raise Conflict(f"view {name!r} has failed ({handle.maintainer.failed}); nothing to verify")
        if handle.bases is None or handle.maintainer.initial_order is not None:
            raise Conflict(f"view {name!r} is still being initialized; verify it once it is active")
        watermark = handle.maintainer.protocol.watermark
        if analysts is None:
            contents, cuts = await _relations_as_of(manager, name, handle, watermark)
            report: Report | None = await asyncio.to_thread(
                _compare_here, manager, name, handle.plan, contents, watermark, max_differences
            )
        elif (inputs := manager.engine_inputs(handle.plan)) is not None:
            # the relations staged as files and joined by the query process's Spark, as an
            # initial load in Spark joins them: nothing of them passes through this process
            store, sources, declared = inputs
            staging = Path(tempfile.mkdtemp(prefix="verify-", dir=_made(store.staging_dir(name))))
            try:
                sql, cuts = await _staged_as_of(manager, name, handle, watermark, sources, declared, staging)
                report = await _compare_there(
                    manager, analysts, name, handle.plan, watermark, max_differences, who, sql
                )
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        else:
            contents, cuts = await _relations_as_of(manager, name, handle, watermark)
            report = await _compare_there(
                manager, analysts, name, handle.plan, watermark, max_differences, who, contents
            )
        if report is not None:
            report.sources = cuts
            report.seconds = time.perf_counter() - started
            return report
    raise Conflict(
        f"compactions of view {name!r} kept folding its state as of W while its sources were read; ask again",
        retry_after=BUSY_RETRY_AFTER_S,
    )


async def _compare_there(
    manager: Manager,
    analysts: AnalystProcess,
    name: str,
    plan: ViewPlan,
    watermark: int,
    max_differences: int,
    who: str,
    relations: Mapping[tuple[str, str], ZSet] | str,
) -> Report | None:
    """The recomputation and the comparison in the analysts' query process, from the
    relations' contents, or from SQL over their staged files (a ``str``); None if a
    compaction folded the state as of W away meanwhile (the caller starts over)."""
    # Taken after the sources were read, so that its files are kept (a compaction retires
    # them only after the query timeout) for as long as the query process may read them.
    try:
        record = manager.view_store.record(name)
    except StoreError as exc:  # dropped meanwhile
        raise NotFound(str(exc)) from exc
    if record.compacted_through > watermark:
        return None
    if isinstance(relations, str):
        request = VerifyRequest(
            record=record.to_record(),
            as_of=watermark,
            sql=relations,
            relations=[],
            max_differences=max_differences,
            staged=True,
        )
    else:
        request = await asyncio.to_thread(_request, plan, relations, record.to_record(), watermark, max_differences)
    result = await analysts.verify(request, who)
    return Report(
        view=name,
        columns=list(plan.view_names),
        watermark=watermark,
        engine="spark (staged)" if isinstance(relations, str) else "spark",
        expected_rows=result.expected_rows,
        stored_rows=result.stored_rows,
        missing=[(tuple(r), n) for r, n in result.missing],
        extra=[(tuple(r), n) for r, n in result.extra],
        missing_total=result.missing_total,
        extra_total=result.extra_total,
        notes=result.notes,
    )


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


async def _reflected_as_of(manager: Manager, name: str, watermark: int) -> dict[str, int]:
    """Per source, the last seq the view as of ``watermark`` reflects: the updates after it
    are in the update log still, since pruning keeps what the view has not reflected at
    its recorded W, and ``watermark`` is at least that."""
    return await manager.db(Catalog.reflected, name, watermark)


async def _staged_as_of(
    manager: Manager,
    name: str,
    handle: ViewHandle,
    watermark: int,
    sources: Mapping[str, SnapshotSource],
    declared: Sequence[Sequence[str]],
    staging: Path,
) -> tuple[str, list[SourceCut]]:
    """Every relation of the view staged in ``staging`` in the state the view claims to
    reflect as of ``watermark``, as an initial load in Spark stages it: its wrapper's
    snapshot streamed to Parquet, and the logged updates after the view's cut beside it with
    negated weights. Returns the SQL that recomputes the view's stored rows from those files
    (``engine_load.load_sql``). No row of a relation becomes a Python object here."""
    plan = handle.plan
    upto = await _reflected_as_of(manager, name, watermark)
    files: list[tuple[str, str | None]] = []
    cuts: list[SourceCut] = []
    for j, relation in enumerate(plan.relations):
        request = snapshot_request(relation)
        path = staging / f"r{j}.parquet"
        rows: dict[int, int] = {}

        def fetch(
            request: RelationSnapshot = request, path: Path = path, j: int = j, rows: dict[int, int] = rows
        ) -> tuple[int, Any]:
            with sources[plan.relations[j].source].open_snapshot(request) as stream:
                return stage(stream, path, plan.relations[j].columns, declared[j], rows, j)

        snapshot_watermark, schema = await asyncio.to_thread(fetch)
        since = upto.get(relation.source, 0)
        later = [
            e for e in await manager.db(Catalog.log_entries, relation.source, since) if e.seq <= snapshot_watermark
        ]
        taken_back = ZSet()
        used = 0
        for entry in later:
            delta = handle.extractor.deltas(entry).get(j)  # whole, at any size
            if delta:
                taken_back.add_all(delta)
                used += 1
        compensation = await asyncio.to_thread(write_taken_back, taken_back, schema, staging / f"c{j}.parquet")
        files.append((str(path), compensation))
        state_rows = rows.get(j, 0) - sum(w for _, w in taken_back.items())
        cuts.append(SourceCut(relation.source, relation.table, since, snapshot_watermark, used, state_rows))
    return load_sql(plan, files, declared), cuts


async def _relations_as_of(
    manager: Manager, name: str, handle: ViewHandle, watermark: int
) -> tuple[dict[tuple[str, str], ZSet], list[SourceCut]]:
    """Every relation of the view in the state the view claims to reflect as of
    ``watermark``: its wrapper's snapshot, minus the logged updates after the view's cut."""
    plan = handle.plan
    upto = await _reflected_as_of(manager, name, watermark)

    contents: dict[tuple[str, str], ZSet] = {}
    cuts: list[SourceCut] = []
    for read in plan.table_reads:  # a table a self-join reads twice is read once, for all its aliases
        request = Subquery(
            relation=read.table,
            alias=read.alias,
            keys=[[]],
            on=None,
            where=expr.to_wire(read.where) if read.where is not None else None,
            select=list(read.columns),
        )
        answer = await manager.clients[read.source].subquery(request)
        snapshot = ZSet((tuple(row[1:-1]), int(row[-1])) for row in answer.rows)
        since = upto.get(read.source, 0)
        later = [e for e in await manager.db(Catalog.log_entries, read.source, since) if e.seq <= answer.watermark]

        def delta_of(entry: LogEntry, table: str = read.table) -> ZSet | None:
            return handle.extractor.table_changes(entry, table)

        state, used = roll_back(snapshot, later, delta_of)
        contents[(read.source, read.table)] = state
        cuts.append(SourceCut(read.source, read.table, since, answer.watermark, used, sum(w for _, w in state.items())))
    return contents, cuts


def _request(
    plan: ViewPlan,
    contents: Mapping[tuple[str, str], ZSet],
    record: dict[str, Any],
    watermark: int,
    max_differences: int,
) -> VerifyRequest:
    """What the query process needs to recompute and compare: each relation (once, however
    often the view joins it) as a temporary view, and the view's SELECT over them."""
    names = {(t.source, t.table): f"verify_relation_{i}" for i, t in enumerate(plan.table_reads)}
    columns = {(t.source, t.table): t.columns for t in plan.table_reads}
    relations = [
        VerifyRelation(
            name=name,
            label=f"{source}.{table}",
            columns=list(columns[(source, table)]),
            rows=[[*row, weight] for row, weight in contents[(source, table)].items()],
        )
        for (source, table), name in names.items()
    ]
    return VerifyRequest(
        record=record,
        as_of=watermark,
        sql=spark_select(plan, names),
        relations=relations,
        max_differences=max_differences,
    )


def _compare_here(
    manager: Manager,
    name: str,
    plan: ViewPlan,
    contents: Mapping[tuple[str, str], ZSet],
    watermark: int,
    max_differences: int,
) -> Report:
    """The recomputation and the comparison in this process, for a store held in it (the
    in-memory store: its read copies from memory, no Spark job, no lock held for long)."""
    stored = manager.read(name, watermark)
    columns = {(t.source, t.table): t.columns for t in plan.table_reads}
    expected = recompute(plan, contents, columns)
    missing, extra, missing_total, extra_total = differences(expected, stored, max_differences)
    return Report(
        view=name,
        columns=list(plan.view_names),
        watermark=watermark,
        engine="python",
        expected_rows=sum(w for _, w in expected.items()),
        stored_rows=sum(max(w, 0) for _, w in stored.items()),
        missing=missing,
        extra=extra,
        missing_total=missing_total,
        extra_total=extra_total,
    )
