"""The manager: sources, views, the receiver and one maintainer per view, wired together.

Everything runs on one asyncio loop; catalog calls run on one dedicated thread (``db``) so
an embedded SQLite catalog never sees concurrent writers, and view store calls run in
worker threads (Spark jobs take their time). A ``blocking_executor`` given to the
constructor takes all of them instead: the simulated schedules run them inline, so that
nothing but the event loop decides the interleaving. The HTTP API (``api/manager_app.py``)
and the tests drive this object directly.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from contract import expr
from contract.column_types import spark_type
from contract.schemas import CAPTURE_METHODS, Ack, Interest, RelationInterest, Update
from contract.value_fit import Family, view_family
from contract.zset import ZSet, row_order
from warehouse import engine_load
from warehouse.aggregate import non_numeric, summed, visible
from warehouse.analysts.messages import PinnedView
from warehouse.analysts.supervisor import AnalystProcess
from warehouse.backoff import Backoff
from warehouse.catalog.db import (
    Catalog,
    CatalogError,
    LogEntry,
    LogRef,
    PruneReach,
    RelationInfo,
    UnitInfo,
    ViewInfo,
    reflected_through,
)
from warehouse.consistent_cut import Cut, NoConsistentCut, Span, ViewSeqs, consistent_cut
from warehouse.deltas import DeltaExtractor
from warehouse.engine_load import EngineLoad, LoadStore, SnapshotSource
from warehouse.errors import Conflict, Invalid, NotFound, Refused
from warehouse.health import StoreProbe
from warehouse.log_pruning import LogPruner, LogPruning
from warehouse.maintainer import COMMIT_MODES, ViewMaintainer, ViewSettings, run_blocking
from warehouse.plan import ViewPlan
from warehouse.protocol import DEFAULT_BATCH_SIZE, DEFAULT_QUEUE_BUDGET, Unit, ViewProtocol, ViewUpdate
from warehouse.receiver import DEFAULT_SEQ_WINDOW, PlainUpdate, Receiver, RelationShape
from warehouse.seq_history import MAX_SPANS, SeqHistory
from warehouse.sources import HttpSourceClient, SourceClient, SourceError
from warehouse.spill import CatalogSpillLog, SpillLog
from warehouse.sql_views import ViewDefinitionError, parse_view
from warehouse.store import StoreError, Summed, ViewStore
from warehouse.verify import MAX_VERIFICATIONS, Verifications

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")

SOURCE_WATCH_S = 10.0
"""How often the manager asks every wrapper for its health (``Manager._watch_sources``)."""

CHANGE_LOG_WARNING_BYTES = 1 << 30
"""Change log a source keeps for (or has not yet given to) its wrapper's log capture, above
which the manager warns (``Manager.source_problems``, ``/metrics``): a stopped wrapper's
PostgreSQL slot keeps every WAL segment until it reads again or is uninstalled."""


def change_log_bytes(report: Mapping[str, Any]) -> int | None:
    """How much change log a wrapper's health report says its source keeps for it: a
    PostgreSQL slot's retained WAL, or the MariaDB binary log not read yet. None: the wrapper
    does not capture from a log, or said nothing of it.

    >>> change_log_bytes({"capture": {"method": "log", "retained_wal_bytes": 4096, "unread_wal_bytes": 10}})
    4096
    >>> change_log_bytes({"capture": {"method": "log", "unread_binlog_bytes": 77}})
    77
    >>> change_log_bytes({"capture": {"method": "trigger"}}) is None
    True
    """
    capture = report.get("capture")
    if not isinstance(capture, dict):
        return None
    for key in ("retained_wal_bytes", "unread_binlog_bytes"):
        if isinstance(value := capture.get(key), int):
            return value
    return None


Connect = Callable[[str, str], SourceClient]


def lag_seconds(protocol: ViewProtocol, now: float | None = None) -> float:
    """Age of the oldest update of the view not visible at W: received, but in no unit
    committed at or below W (still queued, running, or maintained above W). 0 when every
    received update is visible."""
    return protocol.lag_seconds(time.time() if now is None else now)


STALL_AFTER_S = 60.0
CUT_RETRY_AFTER_S = 1  # what a reader hears when views have no state in common yet
CUT_REFRESH_ROUNDS = 20  # the cut over all views is taken anew at least every so many rounds
LOG_IDS_PER_READ = 900  # an IN list within every SQLite's limit on bound parameters


@dataclass
class ViewHandle:
    info: ViewInfo
    plan: ViewPlan
    extractor: DeltaExtractor
    maintainer: ViewMaintainer
    bases: dict[str, int] | None  # None while the view is being defined: route everything

    def set_part_rows(self, rows: int) -> None:
        """The most delta rows a unit of the view sweeps at once; a view that sweeps in parts
        also leaves the delta of an update with more in the log (``ViewUpdate.logged``)."""
        change = self.maintainer.view_change
        change.part_rows = rows
        self.extractor.hold_rows = rows if change.sweeps_in_parts else None


def view_progress(handle: ViewHandle) -> dict[str, Any]:
    """How far behind a view is: updates queued or running, updates not visible at W (queued,
    plus every numbered unit above W), and the age of the oldest update not visible at W
    (``lag_seconds``). The view's status and its gauges take all three from one call, so a
    request computes each once."""
    progress = handle.maintainer.protocol.progress()
    return {
        "updates_pending": progress.updates_pending,
        "lag_updates": progress.lag_updates,
        "lag_seconds": lag_seconds(handle.maintainer.protocol),
    }


def retry_status(maintainer: ViewMaintainer) -> dict[str, Any] | None:
    """What the view is retrying after transient faults: how many steps (units, the commit),
    the most attempts of one, the latest error and since when; None when nothing is."""
    retries = list(maintainer.retrying.values())
    if not retries:
        return None
    latest = max(retries, key=lambda r: (r.attempts, r.since))
    return {
        "steps": len(retries),
        "attempts": max(r.attempts for r in retries),
        "error": latest.error,
        "since": min(r.since for r in retries),
    }


def load_status(maintainer: ViewMaintainer) -> dict[str, Any] | None:
    """How far the view's initial load in the store's engine is (phase, relations and rows
    staged, seconds); None when no such load runs."""
    load = maintainer.view_change.initial_load
    progress = load.progress if load is not None else None
    return progress.status() if progress is not None else None


class Manager:
    def __init__(
        self,
        catalog_url: str,
        store: ViewStore | None,
        connect: Connect | None = None,
        protocol: Callable[[int, int], ViewProtocol] = ViewProtocol,
        commit_group_size: int = 1000,
        commit_linger: float = 0.0,
        analysts: AnalystProcess | None = None,
        catalog_key_file: Path | None = None,
        backoff: Backoff | None = None,
        stall_after_s: float = STALL_AFTER_S,
        seq_window: int = DEFAULT_SEQ_WINDOW,
        max_queued_changes: int | None = DEFAULT_QUEUE_BUDGET,
        unit_part_rows: int | None = None,
        source_watch_s: float = SOURCE_WATCH_S,
        max_verifications: int = MAX_VERIFICATIONS,
        blocking_executor: Executor | None = None,
        change_log_warning_bytes: int = CHANGE_LOG_WARNING_BYTES,
        log_pruning: LogPruning | None = None,
    ) -> None:
        """``store`` None: given to ``start`` instead (``pvm serve`` opens Spark while the
        API already answers). ``analysts``: the analysts' query process (Spark store only;
        may also be set before ``start``). ``catalog_key_file``: the key of the manager
        tokens sealed in the catalog (``warehouse.catalog.secrets``; default: next to an
        SQLite catalog file). ``backoff``: waits between retries of a transient fault;
        ``stall_after_s``: how long a view may have work without progress before the
        watchdog calls it stalled; ``source_watch_s``: how often every wrapper's health is
        asked; ``change_log_warning_bytes``: change log kept for a source's log capture
        above which the manager warns; ``max_queued_changes``: the changes a view's UMQ holds
        in memory, past which its tail stays in the update log (``warehouse.spill``; None:
        no bound); ``unit_part_rows``: the most delta rows a unit sweeps at once, past which
        it is swept in parts (``warehouse.unit_parts``; None: its ``PART_ROWS``); ``max_verifications``: verifications run at once over all views
        (``warehouse.verify``); ``log_pruning``: when and how the update log and the unit
        records no reader needs any more are removed (``warehouse.log_pruning``; None: kept
        for good); ``protocol``: makes a view's protocol state from its
        parallelism and batch size (tests give one broken on purpose, for the oracle to
        catch).

        ``blocking_executor``: runs every blocking call (the catalog's, the store's,
        checking received batches) instead of the threads that run them by default; the
        simulated schedules run them inline on the event loop, so that a seed replays."""
        self.catalog_url = catalog_url
        self.catalog_key_file = catalog_key_file
        self.store = store  # None until start() is given one
        self.analysts = analysts  # runs analysts' SQL, row reads and verifications (Spark store only)
        self.verifications = Verifications(max_verifications)
        self.started = False
        self.source_watch_s = source_watch_s
        self.change_log_warning_bytes = change_log_warning_bytes
        self.source_health: dict[str, dict[str, Any]] = {}  # source -> its wrapper's last report
        self.manager_tokens: dict[str, str] = {}  # source -> the secret its wrapper expects from us
        self.connect = connect or (lambda name, url: HttpSourceClient(name, url, self.manager_tokens.get(name)))
        self.new_protocol = protocol  # (parallelism, batch_size) -> a view's protocol state
        self.max_queued_changes = max_queued_changes
        self.unit_part_rows = unit_part_rows
        self.commit_group_size = commit_group_size
        self.commit_linger = commit_linger
        self.backoff = backoff or Backoff()
        self.stall_after_s = stall_after_s
        self.store_probe: StoreProbe | None = None
        self.catalog: Catalog | None = None
        self.clients: dict[str, SourceClient] = {}
        self.relations: dict[str, dict[str, RelationInfo]] = {}
        self.wrapper_urls: dict[str, str] = {}
        self.views: dict[str, ViewHandle] = {}
        self.blocking_executor = blocking_executor
        self.receiver = Receiver(
            self.db,
            self._release,
            self._receiver_schema,
            window=seq_window,
            run_off_loop=None if blocking_executor is None else self._blocking,
        )
        self._executor = blocking_executor or ThreadPoolExecutor(1, thread_name_prefix="catalog")
        self._define_lock = asyncio.Lock()
        self._background: set[asyncio.Task] = set()
        self.pruner = None if log_pruning is None else LogPruner(self.db, self._prunable, log_pruning)

    # -- plumbing -----------------------------------------------------------------------------
    @property
    def view_store(self) -> ViewStore:
        """The view store; views exist only once ``start`` has one."""
        assert self.store is not None, "the manager has not started"
        return self.store

    async def db(self, method: Callable[Concatenate[Catalog, P], T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``method`` of the catalog, run on the catalog's one thread: ``await
        self.db(Catalog.units, view)`` (a ``CatalogCall``)."""
        assert self.catalog is not None
        fn = functools.partial(method, self.catalog, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def _blocking(self, function: Callable[..., Any], *args: Any) -> Any:
        """A store call (or another blocking one) off the loop: ``blocking_executor`` or a worker thread."""
        return await run_blocking(self.blocking_executor, function, *args)

    async def start(self, store: ViewStore | None = None) -> None:
        """Open the catalog and recover every view; ``store``: the view store, if the
        constructor was not given one."""
        if store is not None:
            self.store = store
        if self.store is None:
            raise ValueError("the manager needs a view store")
        self.store_probe = StoreProbe(self.store.health)
        loop = asyncio.get_running_loop()
        self.catalog = await loop.run_in_executor(self._executor, Catalog, self.catalog_url, self.catalog_key_file)
        for name, info in (await self.db(Catalog.sources)).items():
            if info.manager_token:
                self.manager_tokens[name] = info.manager_token
            self._register_source(name, info.wrapper_url, info.relations)
            released, held = await self.db(Catalog.log_positions, name)
            self.receiver.recover(name, released, held, await self.db(Catalog.staged, name))
        for view in (await self.db(Catalog.views)).values():
            await self._recover_view(view)
        # Resend the views' interest in the background: a wrapper may be busy resending
        # updates to this very manager, which only answers once start() has returned.
        self._background.add(asyncio.create_task(self._resync_interest(), name="resync-interest"))
        self._background.add(asyncio.create_task(self._watch_sources(), name="watch-sources"))
        self._background.add(asyncio.create_task(self._show_cuts(), name="show-cuts"))
        if self.pruner is not None:
            self._background.add(asyncio.create_task(self.pruner.run(), name="prune-log"))
        self.started = True

    def _prunable(self) -> PruneReach:
        """How far the update log may be pruned as far as this process knows (taken on the
        loop, at one instant): per source, what the receiver released (an update held
        behind a gap is not, and no view has it); a source of a view being defined is left
        out, since the updates released to that view before its bases are recorded may be
        queued by it and nothing in the catalog says so. Per view, the seqs through which
        what it holds in no recorded unit is nothing it reads (``passed_over``)."""
        defining = {s for handle in self.views.values() if handle.bases is None for s in handle.plan.sources}
        released = {s: self.receiver.released_through(s) for s in self.clients if s not in defining}
        passed = {
            name: handle.maintainer.passed_over(released)
            for name, handle in self.views.items()
            if handle.bases is not None
        }
        return PruneReach(released, passed)

    async def _show_cuts(self) -> None:
        """Hand the analysts' query process the greatest consistent cut over every view that
        has one (``cut_of_all``), for its consistent views (docs/protocol.md, 'Consistent
        reads across views'): taken on the loop, where the views' maintenance state changes,
        whenever a view's W or store record moved, at most every ``cut_interval_s``."""
        shown: object = None
        rounds = 0
        while True:
            analysts = self.analysts
            interval = 0.5 if analysts is None else analysts.settings.cut_interval_s
            if analysts is not None and self.store is not None and self.view_store.engine == "spark":
                try:
                    moved = self._cut_signature()
                    rounds += 1
                    if moved != shown or rounds >= CUT_REFRESH_ROUNDS:
                        began = time.monotonic()
                        views, released = self._all_seqs()
                        # the fixpoint may take long over long histories: not on the loop
                        cut = await asyncio.to_thread(cut_leaving_out, views, released)
                        analysts.show_consistent(self._pins(cut, skip_gone=True))
                        shown, rounds = moved, 0
                        # it holds the interpreter meanwhile: never more than a fifth of the time
                        interval = max(interval, 4 * (time.monotonic() - began))
                except Exception:  # a view changing under it: the next round takes it again
                    log.warning("could not take the consistent cut over all views", exc_info=True)
            await asyncio.sleep(interval)

    def _cut_signature(self) -> tuple[tuple[str, int, Any], ...]:
        """What moves the cut over all views: a view's W, its store record (versions, W),
        whether it has a state. Queues and releases move it too, but only as some W moves
        (a view is held back by another's queued units, which leave the queue as that
        view's W moves); ``CUT_REFRESH_ROUNDS`` takes it anew now and then regardless."""
        signature = []
        for name, handle in sorted(self.views.items()):
            try:
                record: Any = self.view_store.record(name)
            except StoreError:
                record = None
            signature.append((name, handle.maintainer.protocol.watermark, (record, handle.maintainer.has_state)))
        return tuple(signature)

    async def _watch_sources(self) -> None:
        """Ask every source's wrapper for its health every ``source_watch_s``: a capture that
        keeps failing stops the source's updates without a word to the views (they look idle,
        not stalled), so the manager's health names it (``source_problems``)."""
        while True:
            for name, client in list(self.clients.items()):
                try:
                    # asyncio.timeout, not wait_for: 3.11's wait_for drops a cancel that lands
                    # as the inner call finishes, and stop() would then wait for this loop forever
                    async with asyncio.timeout(5.0):
                        report = await client.health()
                except Exception as exc:  # unreachable, refused, slow: that is the report
                    report = {"reachable": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
                self.source_health[name] = report
            await asyncio.sleep(self.source_watch_s)

    def source_problems(self) -> list[str]:
        """Sources whose wrapper did not answer, reported its capture blocked, or whose change log
        grew past the warning, when last asked."""
        problems = []
        for name, report in sorted(self.source_health.items()):
            if report.get("reachable") is False:
                problems.append(f"source {name!r}: its wrapper does not answer ({report.get('error')})")
            elif isinstance(blocked := report.get("blocked"), dict):
                problems.append(
                    f"source {name!r}: capture blocked ({blocked.get('loop')}, {blocked.get('attempts')} attempts): "
                    f"{blocked.get('error')}"
                )
            if (kept := change_log_bytes(report)) is not None and kept > self.change_log_warning_bytes:
                problems.append(
                    f"source {name!r}: its database keeps {kept / (1 << 20):.0f} MiB of change log for the wrapper "
                    f"(warning above {self.change_log_warning_bytes / (1 << 20):.0f} MiB): is the wrapper behind "
                    "or stopped? `pvm wrapper uninstall` releases a source that is no longer captured"
                )
        return problems

    async def _resync_interest(self) -> None:
        for source in list(self.clients):
            try:
                await self._push_interest(source)
            except Exception:  # the wrapper keeps its stored interest; a view change resends it
                log.warning("could not resend the interest of source %s", source, exc_info=True)

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for handle in self.views.values():
            await handle.maintainer.stop()
        for client in self.clients.values():
            await client.aclose()
        if self.catalog is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self.catalog.close)
        if self._executor is not self.blocking_executor:  # the caller's is the caller's to shut down
            self._executor.shutdown(wait=True)

    # -- sources ----------------------------------------------------------------------------
    async def add_source(
        self,
        name: str,
        wrapper_url: str,
        capture: str = "trigger",
        tables: list[str] | None = None,
        manager_token: str | None = None,
    ) -> dict[str, RelationInfo]:
        """Register a source; ``manager_token`` is the bearer token its wrapper expects from
        the manager (the wrapper's ``--manager-token``), kept in the catalog."""
        if not _identifier(name):
            raise Refused(f"source name {name!r} must be a letter or _ followed by letters, digits or _")
        if name in self.clients:
            raise Conflict(f"source {name!r} is already registered")
        if capture not in CAPTURE_METHODS:
            raise Invalid(f"unknown capture method {capture!r}: choose one of {', '.join(CAPTURE_METHODS)}")
        if manager_token:
            self.manager_tokens[name] = manager_token
        client = self.connect(name, wrapper_url)
        self.manager_tokens.pop(name, None)  # kept below, once the source is registered
        try:
            schema = await client.schema()
        except Exception as exc:
            await client.aclose()
            raise SourceError(f"could not read the schema of source {name!r} at {wrapper_url}: {exc}") from exc
        unknown = sorted(set(tables or ()) - set(schema))
        if unknown:
            await client.aclose()
            raise Invalid(
                f"source {name!r} has no captured table(s) {', '.join(unknown)} (the wrapper at {wrapper_url} "
                f"captures: {', '.join(sorted(schema)) or 'none'})"
            )
        reported = await _reported_capture(client, name)
        if reported is not None and reported != capture:
            await client.aclose()
            raise Invalid(
                f"source {name!r}: capture {capture!r} was given, but the wrapper at {wrapper_url} reports capture "
                f"method {reported!r}; register it with capture {reported!r}"
            )
        relations = {
            t: RelationInfo(name, t, s.columns, s.types, s.primary_key)
            for t, s in schema.items()
            if tables is None or t in tables
        }
        await self.db(Catalog.add_source, name, wrapper_url, capture, list(relations.values()), manager_token)
        self.clients[name] = client
        self.relations[name] = relations
        self.wrapper_urls[name] = wrapper_url
        if manager_token:
            self.manager_tokens[name] = manager_token
        self.receiver.recover(name)
        return relations

    def _register_source(self, name: str, url: str, relations: dict[str, RelationInfo]) -> None:
        self.clients[name] = self.connect(name, url)
        self.relations[name] = relations
        self.wrapper_urls[name] = url

    def _schema(self, source: str, table: str):
        rel = self.relations.get(source, {}).get(table)
        return None if rel is None else rel.columns

    def _receiver_schema(self, source: str, seq: int) -> dict[str, RelationShape] | None:
        """The shape of each relation, with the columns a view maintaining update ``seq`` needs."""
        if source not in self.relations:
            return None
        out = {}
        for table, rel in self.relations[source].items():
            needed: set[str] = set()
            for handle in self.views.values():
                if handle.bases is not None and seq > handle.bases.get(source, 0):
                    needed.update(handle.extractor.needed_columns(source, table))
            columns, typed = _typed_columns(rel)
            out[table] = RelationShape(columns, needed, typed)
        return out

    # -- views ------------------------------------------------------------------------------
    async def define_view(
        self,
        sql: str,
        name: str | None = None,
        parallelism: int = 4,
        batch_size: int = DEFAULT_BATCH_SIZE,
        commit_mode: str = "out_of_order",
    ) -> ViewInfo:
        if not 1 <= parallelism <= 256:
            raise Invalid("parallelism must be between 1 and 256")
        if not 1 <= batch_size <= 10_000:
            raise Invalid("batch_size must be between 1 and 10000")
        if commit_mode not in COMMIT_MODES:
            raise Invalid(f"commit_mode must be one of {', '.join(COMMIT_MODES)}")
        try:
            plan = parse_view(sql, self._schema, name)
        except ViewDefinitionError as exc:
            raise Invalid(str(exc)) from exc
        self._check_summed_types(plan)
        types = self._output_types(plan)
        summed = self._summed(plan)
        async with self._define_lock:
            if plan.name in self.views:
                raise Conflict(f"view {plan.name!r} already exists")
            try:  # names and columns the store can live with
                self.view_store.check_new_view(plan.name, plan.stored_names, types)
            except StoreError as exc:
                raise Invalid(str(exc)) from exc
            info = ViewInfo(
                plan.name, sql, parallelism, batch_size, commit_mode, "initializing", {}, 0, None, time.time()
            )
            handle = self._new_handle(info, plan, self.new_protocol(parallelism, batch_size))
            self.views[plan.name] = handle  # from here on, updates of its sources are routed to it
            recorded = False
            try:
                bases = {s: await self._push_interest(s) for s in plan.sources}
                info.bases = bases
                await self.db(Catalog.add_view, info)
                recorded = True
                await self._blocking(self.view_store.create, plan.name, plan.stored_names, types, summed)
            except BaseException:
                del self.views[plan.name]
                await self._forget_failed_view(plan, recorded)
                raise
            handle.bases = bases
            handle.maintainer.protocol.drop_queued(bases)
            handle.maintainer.start()
            await handle.maintainer.begin_initial_load(bases)
            return info

    async def _forget_failed_view(self, plan: ViewPlan, recorded: bool) -> None:
        """Undo what a definition that failed half-way did, so nothing of it stays behind.

        A view left in the catalog would come back at the next start, and its sources would
        keep capturing the columns it asked for.
        """
        try:
            if recorded:
                await self.db(Catalog.drop_view, plan.name)
            for source in plan.sources:
                await self._push_interest(source)
        except Exception:  # the definition's own error is what the caller must see
            log.exception("could not undo the failed definition of view %s", plan.name)

    async def drop_view(self, name: str) -> None:
        handle = self.view(name)
        await handle.maintainer.stop()
        del self.views[name]
        await self.db(Catalog.drop_view, name)
        await self._blocking(self.view_store.drop, name)
        for source in handle.plan.sources:
            await self._push_interest(source)

    def _declared_types(self, plan: ViewPlan) -> list[str | None]:
        """The SQL types the sources declare for the view's body columns (None: unknown)."""
        aliases = {r.alias: r for r in plan.relations}
        types: list[str | None] = []
        for out in plan.outputs:
            ref = aliases[out.column.relation]
            rel = self.relations.get(ref.source, {}).get(ref.table)
            if rel is not None and out.column.name in rel.columns and len(rel.types) == len(rel.columns):
                types.append(rel.types[rel.columns.index(out.column.name)] or None)
            else:
                types.append(None)
        return types

    def _body_types(self, plan: ViewPlan) -> list[str | None]:
        return [spark_type(t) for t in self._declared_types(plan)]

    def _output_types(self, plan: ViewPlan) -> list[str | None]:
        """Spark SQL types of the columns the store keeps for the view, from the types its
        sources declare."""
        body = self._body_types(plan)
        return body if plan.summary is None else plan.summary.stored_types(body)

    def _summed(self, plan: ViewPlan) -> Summed | None:
        """How the store's readers see an aggregate view (None: a plain view)."""
        return None if plan.summary is None else summed(plan.summary, self._body_types(plan))

    def _check_summed_types(self, plan: ViewPlan) -> None:
        """Invalid if SUM or AVG reads a column its source declares non-numeric."""
        if plan.summary is None:
            return
        declared = self._declared_types(plan)
        for call in plan.summary.calls:
            if call.func in ("sum", "avg") and call.arg is not None:
                found = non_numeric(declared[call.arg])
                if found is not None:
                    column = plan.outputs[call.arg].column
                    raise Invalid(
                        f"{call.func.upper()}({column.relation}.{column.name}) needs a numeric column; "
                        f"{column.relation}.{column.name} is {found}"
                    )

    def _new_handle(self, info: ViewInfo, plan: ViewPlan, protocol: ViewProtocol) -> ViewHandle:
        settings = ViewSettings(
            info.parallelism,
            info.batch_size,
            info.commit_mode,
            self.commit_group_size,
            self.commit_linger,
            self.backoff,
        )
        protocol.queue_budget = self.max_queued_changes
        extractor = DeltaExtractor(plan)
        handle: ViewHandle | None = None

        def routed(entry: LogEntry) -> ViewUpdate | None:
            return None if handle is None else self._routed(handle, entry)

        spill_log = CatalogSpillLog(self.db, routed, self.receiver.released_through, extractor.deltas)
        maintainer = ViewMaintainer(
            info.name,
            plan,
            settings,
            protocol,
            self.view_store,
            self.clients,
            self.db,
            self._set_state,
            store_types=self._output_types(plan),
            store_executor=self.blocking_executor,
            spill_log=spill_log,
        )
        maintainer.view_change.initial_load = self._engine_load(plan, protocol, spill_log)
        maintainer.view_change.floor = lambda source: self._floor(handle, source)
        handle = ViewHandle(info, plan, extractor, maintainer, None)
        default = maintainer.view_change.part_rows  # unit_parts.PART_ROWS
        handle.set_part_rows(self.unit_part_rows if self.unit_part_rows is not None else default)
        return handle

    def _floor(self, handle: ViewHandle | None, source: str) -> int:
        """The least seq of ``source`` an answer to a unit of the view starting now must
        reflect: every update the manager has released (those ordered before the unit are
        among them), and the view's bases, which its initial load reflects and which a
        wrapper may not have shipped yet when the view's first units start."""
        bases = handle.bases if handle is not None else None
        return max(self.receiver.released_through(source), bases.get(source, 0) if bases else 0)

    def engine_inputs(self, plan: ViewPlan) -> tuple[LoadStore, dict[str, SnapshotSource], list[list[str]]] | None:
        """What joining the view's relations in the store's engine takes: a store that runs
        joins (Spark), a client that streams snapshots per source, and the declared types of
        each relation's columns (``engine_load.supports``); None where any is missing or
        the view's join would not mean the same there. The initial load and verification
        use the engine when they can."""
        store = self.view_store
        if not isinstance(store, LoadStore):
            return None
        sources: dict[str, SnapshotSource] = {}
        for name in plan.sources:
            client = self.clients.get(name)
            if not isinstance(client, SnapshotSource):
                return None
            sources[name] = client
        declared: list[list[str]] = []
        for r in plan.relations:
            rel = self.relations.get(r.source, {}).get(r.table)
            if rel is None or len(rel.types) != len(rel.columns):
                return None
            declared.append([rel.types[rel.columns.index(c)] for c in r.columns])
        why = engine_load.supports(plan, declared)
        if why is not None:
            log.info("view %s is joined with subqueries, not in the engine: %s", plan.name, why)
            return None
        return store, sources, declared

    def _engine_load(self, plan: ViewPlan, protocol: ViewProtocol, spill_log: SpillLog) -> EngineLoad | None:
        """The view's initial load in the store's engine; None: the load runs SWEEP's
        subqueries."""
        inputs = self.engine_inputs(plan)
        if inputs is None:
            return None
        store, sources, declared = inputs
        return EngineLoad(plan, protocol, sources, store, declared, spill_log)

    async def _set_state(self, view: str, state: str, error: str | None) -> None:
        handle = self.views.get(view)
        if handle is None:
            return
        handle.info.state, handle.info.error = state, error
        await self.db(Catalog.update_view, view, state=state, error=error)

    async def _recover_view(self, info: ViewInfo) -> None:
        """Rebuild a view's protocol state from the catalog after a restart. A view recorded
        failed is tried again: the cause may be gone (a source back, the store restarted)."""
        # the row again, with its unit records: they start where pruning folded the older ones
        info, units = await self.db(Catalog.view_units, info.name)
        plan = parse_view(info.sql, self._schema, info.name)
        protocol = self.new_protocol(info.parallelism, info.batch_size)
        handle = self._new_handle(info, plan, protocol)
        handle.bases = info.bases
        recorded = {u.order: u.committed for u in units}
        held = ViewProtocol.held_after_restart(recorded)
        kept = [u for u in units if u.order in held]
        ids = sorted({i for u in kept for i in u.log_ids})
        updates: dict[int, ViewUpdate | None] = {}
        for first in range(0, len(ids), LOG_IDS_PER_READ):
            # what the view reads of each, made on the catalog's thread, parts one at a time
            read = await self.db(Catalog.log_ids_read, ids[first : first + LOG_IDS_PER_READ], handle.extractor)
            updates.update((i, e.value) for i, e in read.items())
        rebuilt = [
            Unit(u.order, tuple(v for v in (updates[i] for i in u.log_ids) if v is not None), initial=not u.log_ids)
            for u in kept
        ]
        folded_order, start = info.start()
        waiting = protocol.restore(recorded, rebuilt, (), folded=folded_order)
        # pruned unit records (through folded_order) hold seqs through start[source] only
        await self._requeue_logged(handle, start, skip={i for u in units for i in u.log_ids})
        self.views[info.name] = handle  # nothing was released meanwhile: start() recovers views first
        if info.state == "failed":
            log.warning("view %s had failed before the restart (%s): trying it again", info.name, info.error)
            await self._set_state(info.name, "initializing", None)
        # the committed initial load (its record folded by pruning: at or below the folded order)
        loaded = next((u.order for u in units if u.committed and not u.log_ids), info.folded_order or None)
        await handle.maintainer.republish(loaded if info.state == "initializing" else None)
        handle.maintainer.recover(waiting)  # they wait for PPU slots, oldest first
        handle.maintainer.recorded_watermark = protocol.watermark
        history = handle.maintainer.history
        history.number(u for u in rebuilt if recorded[u.order])  # retained: numbered above W too
        if handle.maintainer.initial_order is not None:  # the initial load runs again
            history.begin(handle.maintainer.initial_order, info.bases)
        else:
            recover_history(history, info, units, protocol.watermark)
        handle.maintainer.start()

    async def _requeue_logged(self, handle: ViewHandle, bases: Mapping[str, int], skip: Collection[int]) -> None:
        """Queue the view's updates in the update log after seq ``bases[source]``, released by
        the receiver (not held behind a gap) and in no unit (``skip``: log ids in units), in
        arrival order: the UMQ rebuilt after a restart. Read a chunk at a time: past the
        view's queue budget they stay in the log (the protocol's shelf)."""
        protocol, spill_log = handle.maintainer.protocol, handle.maintainer.spill_log
        assert spill_log is not None
        after = dict(bases)
        while True:
            chunk = await spill_log.read_back(after, LOG_IDS_PER_READ)
            for update in chunk.updates:
                if update.log_id not in skip:
                    protocol.receive(update)
            after.update(chunk.through)
            if chunk.exhausted:
                return

    def pause_view(self, name: str) -> None:
        """No new unit starts; updates keep being received, and once nothing of the view
        runs, they stay in the update log only."""
        self.view(name).maintainer.pause()

    async def resume_view(self, name: str) -> None:
        """Maintain the view again: a paused one, or a failed one (its unfinished units run
        again with their order numbers). Its queued updates are read back from the log, a
        chunk at a time."""
        await self.view(name).maintainer.resume()

    def view(self, name: str) -> ViewHandle:
        handle = self.views.get(name)
        if handle is None:
            raise NotFound(f"unknown view {name!r}")
        return handle

    # -- interest: what the wrappers must ship -----------------------------------------------------
    def interest(self, source: str) -> Interest:
        relations: dict[str, RelationInterest] = {}
        for handle in self.views.values():
            for r in handle.plan.relations:
                if r.source != source:
                    continue
                entry = relations.setdefault(r.table, RelationInterest(columns=[], where=[]))
                entry.columns = sorted(set(entry.columns) | set(r.columns))
                entry.where.append(expr.to_wire(_as_table(r.where, r.alias, r.table)) if r.where is not None else None)
        for entry in relations.values():
            if None in entry.where:
                entry.where = [None]
        return Interest(relations=relations)

    async def _push_interest(self, source: str) -> int:
        return await self.clients[source].set_interest(self.interest(source))

    # -- updates ------------------------------------------------------------------------------------
    async def receive(self, source: str, updates: Sequence[Update | PlainUpdate]) -> Ack:
        return await self.receiver.receive(source, updates)

    def _release(self, entry: LogEntry | LogRef) -> None:
        """Hand a released update to every view over its source. One logged from parts comes
        by name (``LogRef``): each view queues it in the update log only, and reads it when
        maintenance gets to it (``_routed`` then decides what the view receives of it)."""
        for handle in self.views.values():
            if entry.source not in handle.plan.sources:
                continue
            if isinstance(entry, LogRef):
                if handle.bases is None or entry.seq > handle.bases.get(entry.source, 0):
                    handle.maintainer.receive_logged(entry.source, entry.seq, entry.received_at)
            elif (update := self._routed(handle, entry)) is not None:
                handle.maintainer.receive(update)

    @staticmethod
    def _routed(handle: ViewHandle, entry: LogEntry) -> ViewUpdate | None:
        """What view ``handle`` receives of a released update of one of its sources (None:
        nothing); the same when a spilled queue is read back from the log."""
        if handle.bases is not None and entry.seq <= handle.bases.get(entry.source, 0):
            return None
        if handle.bases is None and not handle.extractor.complete(entry):
            return None  # shipped under the previous interest: before the view's boundary
        return handle.extractor(entry)

    # -- reading -----------------------------------------------------------------------------------
    def watermark(self, name: str) -> int:
        return self.view(name).maintainer.protocol.watermark

    def read(self, name: str, as_of: int | None = None, latest: bool = False) -> ZSet:
        """The view's signed weights as of W (default), a given order, or every commit; an
        aggregate view's rows (each of weight 1), from the per-group sums the store keeps."""
        handle = self.view(name)
        if as_of is not None and as_of > handle.maintainer.protocol.watermark:
            raise Invalid(f"as_of {as_of} is beyond the view's watermark {handle.maintainer.protocol.watermark}")
        try:
            stored = self.view_store.read(
                name, None if latest else (handle.maintainer.protocol.watermark if as_of is None else as_of)
            )
        except StoreError as exc:
            raise Invalid(str(exc)) from exc
        return stored if handle.plan.summary is None else visible(handle.plan.summary, stored)

    def read_rows(self, name: str, as_of: int | None = None, latest: bool = False) -> list[tuple]:
        """What a SQL reader of the view sees (positive rows, each repeated by its weight) as
        of W (default), a given order, or every commit, expanded from the store's weights.
        Blocking: call it off the loop. Only for stores held in this process (the Spark
        store's rows are read by the analysts' query process: ``read_page``)."""
        return self.read(name, as_of, latest).expand()

    async def read_page(
        self, name: str, as_of: int | None, latest: bool, offset: int, limit: int, who: str
    ) -> tuple[int, int | None, int, list[list[Any]]]:
        """A page of the view's rows, sorted by every column: ``(W, as of, total, rows)``.
        With the analysts' query process (the Spark store) the page is read and sorted there,
        from the files the store's record names: nothing of the view passes through this
        process but the page, and no store lock is held. Otherwise (the in-process store) it
        is cut from the view's rows here."""
        handle = self.view(name)
        watermark = handle.maintainer.protocol.watermark
        if as_of is not None and as_of > watermark:
            raise Invalid(f"as_of {as_of} is beyond the view's watermark {watermark}")
        pinned = None if latest else (watermark if as_of is None else as_of)
        if self.analysts is None or self.view_store.engine != "spark":
            rows = sorted(await self._blocking(self.read_rows, name, pinned, latest), key=row_order)
            return watermark, pinned, len(rows), [list(r) for r in rows[offset : offset + limit]]
        try:
            self.view_store.check_as_of(name, pinned)
            record = self.view_store.record(name)
        except StoreError as exc:
            raise Invalid(str(exc)) from exc
        page = await self.analysts.rows(record.to_record(), pinned, offset, limit, who)
        return watermark, pinned, page.total, page.rows

    def consistent_cut(self, names: Sequence[str]) -> Cut:
        """An order per view of ``names`` at which they all show one state of their sources,
        the latest there is (``warehouse.consistent_cut``): read each view as of its order.
        Conflict (retryable) while a view has no state yet, or none in common with the others."""
        try:
            return self._cut({name: self._seqs(name) for name in dict.fromkeys(names)})
        except NoConsistentCut as exc:
            raise Conflict(str(exc), retry_after=CUT_RETRY_AFTER_S) from exc

    def _cut(self, views: Mapping[str, ViewSeqs]) -> Cut:
        released = {s: self.receiver.released_through(s) for seqs in views.values() for s in seqs.sources}
        return consistent_cut(views, released)

    def pinned(self, names: Sequence[str]) -> dict[str, PinnedView]:
        """Each of ``names`` as of its order in their consistent cut, with the store record
        whose files hold that state (what the analysts' query process reads it from).
        Conflict (retryable) while there is no cut, or a view was compacted past its order
        or dropped meanwhile."""
        cut = self.consistent_cut(names)
        try:
            return self._pins(cut, skip_gone=False)
        except StoreError as exc:
            raise Conflict(f"{exc}; ask again", retry_after=CUT_RETRY_AFTER_S) from exc

    def cut_of_all(self) -> dict[str, PinnedView]:
        """``pinned`` over every view that can be in a cut: a view whose initial load runs or
        whose queue is being read back is left out, and so is a view ``NoConsistentCut``
        names (defined later, its initial load read a source beyond what the others have
        reached; or compacted past what they need), until a cut with it exists. Leaving views
        out only ever raises the others' orders, and any subset of a cut is a cut."""
        return self._pins(cut_leaving_out(*self._all_seqs()), skip_gone=True)

    def _all_seqs(self) -> tuple[dict[str, ViewSeqs], dict[str, int]]:
        """Every view that has a state, and the sources' releases: what ``cut_leaving_out``
        takes (snapshots, taken on the loop)."""
        views: dict[str, ViewSeqs] = {}
        for name in sorted(self.views):
            try:
                views[name] = self._seqs(name)
            except (Conflict, NotFound):
                continue
        released = {s: self.receiver.released_through(s) for seqs in views.values() for s in seqs.sources}
        return views, released

    def _pins(self, cut: Cut, skip_gone: bool) -> dict[str, PinnedView]:
        pins = {}
        for name, order in cut.orders.items():
            try:
                self.view_store.check_as_of(name, order)
                record = self.view_store.record(name)
            except StoreError:
                if skip_gone:  # the others are still one cut
                    continue
                raise
            pins[name] = PinnedView(record=record.to_record(), as_of=order)
        return pins

    def _seqs(self, name: str) -> ViewSeqs:
        handle = self.view(name)
        readable_from = 0
        if self.view_store.engine == "spark":
            try:
                readable_from = self.view_store.record(name).compacted_through
            except StoreError as exc:
                raise NotFound(str(exc)) from exc
        seqs = handle.maintainer.seqs(readable_from)
        if seqs is None:
            raise Conflict(
                f"view {name!r} has no state to read together with others yet (its initial load runs, or its "
                "queue is being read back as it resumes); ask again in a moment",
                retry_after=CUT_RETRY_AFTER_S,
            )
        return seqs

    def frontier(self, name: str) -> dict[str, list[int]] | None:
        """Per source, the seqs ``[lo, hi]`` the view as of W shows the source at (any of
        them: the updates between change nothing it reads); None while it has no state."""
        seqs = self.view(name).maintainer.seqs()
        if seqs is None:
            return None
        return {
            s: list(seqs.interval(seqs.watermark, s, self.receiver.released_through(s))) for s in sorted(seqs.sources)
        }

    def status(self, name: str) -> dict[str, Any]:
        handle = self.view(name)
        m = handle.maintainer
        c = m.counters
        progress = m.protocol.progress()
        return {
            "name": name,
            "state": handle.info.state,
            "error": handle.info.error,
            "sql": handle.info.sql,
            "parallelism": handle.info.parallelism,
            "batch_size": handle.info.batch_size,
            "commit_mode": handle.info.commit_mode,
            "watermark": m.protocol.watermark,
            "frontier": self.frontier(name),
            "paused": m.paused,
            "idle": m.idle,
            "retrying": retry_status(m),
            "load": load_status(m),
            "stalled": self.stalled(handle),
            "no_progress_seconds": round(m.seconds_without_progress(), 3),
            "updates_queued": progress.queued,
            "updates_spilled": progress.spilled,
            "queued_changes": progress.queued_changes,
            "units_running": progress.running,
            "units_waiting": progress.waiting,
            "units_retained": progress.retained,
            **view_progress(handle),
            "batching": {source: costs.summary() for source, costs in sorted(m.protocol.costs.items())},
            "counters": {
                "updates_received": c.updates_received,
                "units_started": c.units_started,
                "units_maintained": c.units_maintained,
                "units_committed": c.units_committed,
                "subqueries": c.subqueries,
                "compensations": c.compensations,
                "compensations_from_log": c.compensations_from_log,
                "updates_read_back": c.updates_read_back,
                "unit_parts": c.unit_parts,
                "commit_groups": c.commit_groups,
                "peak_running": c.peak_running,
                "retries": c.retries,
            },
        }

    # -- trouble -----------------------------------------------------------------------------------
    def stalled(self, handle: ViewHandle) -> bool:
        """The watchdog: the view has had work and made no progress for ``stall_after_s``."""
        return handle.maintainer.seconds_without_progress() >= self.stall_after_s

    def stalled_views(self) -> list[str]:
        """Why readiness fails for views: one sentence per stalled view."""
        return [
            f"view {name!r}: maintenance stalled, no progress for {handle.maintainer.seconds_without_progress():.0f} s"
            + (f" (retrying: {retry['error']})" if (retry := retry_status(handle.maintainer)) else "")
            for name, handle in sorted(self.views.items())
            if self.stalled(handle)
        ]

    def view_problems(self) -> list[str]:
        """Every view in trouble, one sentence each: failed, retrying or stalled."""
        problems = []
        for name, handle in sorted(self.views.items()):
            m = handle.maintainer
            if m.failed is not None:
                problems.append(f"view {name!r} failed: {m.failed} (resume it once the cause is fixed)")
            elif (retry := retry_status(m)) is not None:
                problems.append(f"view {name!r} retrying (attempt {retry['attempts']}): {retry['error']}")
        return problems + self.stalled_views()

    async def wait_idle(self, name: str, timeout: float = 60.0) -> None:
        await asyncio.wait_for(self.view(name).maintainer.wait_idle(), timeout)


def recover_history(history: SeqHistory, info: ViewInfo, units: Sequence[UnitInfo], watermark: int) -> None:
    """The record of a loaded view's units at or below W after a restart, so that a cut can
    read it before W again: the spans of its newest ``MAX_SPANS`` units, from their unit
    records, over what the state before them holds (where the record starts: the initial
    load's order and bases, or the order the pruned records were folded into).

    >>> info = ViewInfo("v", "", 1, 1, "", "active", {"s": 2}, 5, None, 0.0, folded_order=3, folded_seqs={"s": 4})
    >>> history = SeqHistory()
    >>> recover_history(history, info, [UnitInfo(4, (9,), True, source="s", first_seq=5, last_seq=6)], 5)
    >>> history.base_order, history.base, history.spans
    (3, {'s': 4}, [Span(order=4, source='s', first=5, last=6)])
    """
    folded_order, start = info.start()
    done = [u for u in units if u.order <= watermark]
    maintained = [u for u in done if u.source is not None]
    tail = maintained[-MAX_SPANS:]
    if len(tail) < len(maintained):
        history.begin(tail[0].order - 1, reflected_through(start, units, tail[0].order - 1))
    else:  # the initial load's order, unless its record was folded
        history.begin(folded_order or min(u.order for u in done), start)
    history.add(
        Span(u.order, u.source, u.first_seq, u.last_seq)
        for u in tail
        if u.source is not None and u.first_seq is not None and u.last_seq is not None
    )


def cut_leaving_out(views: Mapping[str, ViewSeqs], released: Mapping[str, int]) -> Cut:
    """The greatest cut of ``views`` without the views ``NoConsistentCut`` names, left out
    one round at a time (an empty cut if none is left)."""
    left = dict(views)
    while left:
        try:
            return consistent_cut(left, released)
        except NoConsistentCut as exc:
            if not set(exc.views) & set(left):
                break
            for name in exc.views:
                left.pop(name, None)
    return Cut({}, {})


async def _reported_capture(client: SourceClient, name: str) -> str | None:
    """The capture method the source's wrapper reports in its health (``capture.method``);
    None when it reports none or cannot say (a failed probe)."""
    try:
        data = await client.health()
    except Exception:  # its schema answered: take its word on the rest
        log.warning("could not read the health of the wrapper of source %s", name, exc_info=True)
        return None
    capture = data.get("capture") if isinstance(data, dict) else None
    method = capture.get("method") if isinstance(capture, dict) else None
    return method if isinstance(method, str) else None


@functools.lru_cache(maxsize=4096)
def _typed_columns(rel: RelationInfo) -> tuple[frozenset[str], tuple[tuple[str, Family, str], ...]]:
    """A relation's columns, and ``(column, view family, declared type)`` of each column whose
    values the view's store constrains: what the receiver holds an update's values to. A
    relation registered without types constrains none."""
    if len(rel.types) != len(rel.columns):
        return frozenset(rel.columns), ()
    typed = tuple(
        (column, family, declared)
        for column, declared in zip(rel.columns, rel.types)
        if (family := view_family(declared)) is not None
    )
    return frozenset(rel.columns), typed


def _identifier(name: str) -> bool:
    return (
        bool(name)
        and len(name) <= 64
        and (name[0].isalpha() or name[0] == "_")
        and all(ch.isalnum() or ch == "_" for ch in name)
        and name.isascii()
    )


def _as_table(e: expr.Expr, alias: str, table: str) -> expr.Expr:
    """Wrappers know relations by table name, views by alias: rename for the interest."""
    return expr.substitute(e, {c: expr.Col(table, c.name) for c in expr.columns(e) if c.relation == alias})


__all__ = ["CatalogError", "Manager", "lag_seconds", "view_progress"]
