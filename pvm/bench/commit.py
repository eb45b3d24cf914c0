"""``pvm bench commit``: what the Spark view store sustains, and how fresh the views stay.

Two measurements in one run, on one Spark session:

1. **Grouped commits.** Effect rows per second committed to the Spark store when the commit
   manager appends many ready effects at once, against one append per effect, side by side
   on the same store (``pvm.bench.grouped_appends.bench_commit``).
2. **Freshness.** A whole deployment (three SQLite sources with trigger capture and their
   wrapper processes, the manager, the Spark store with background compaction) maintains a
   three-way join view while a writer process commits source transactions at a steady
   ``--rate`` spread round-robin over the three sources: new orders in ``shop``, renamed customers in
   ``crm``, renamed products in ``inventory``. A transaction's freshness is the time from its
   commit at the source to the moment its row is visible to Spark SQL readers: the end of the
   first publish of a watermark W that covers it (after which every query of the view sees
   it). The transaction is traced to its maintenance unit through the manager's update log
   (each transaction leaves a marker, an order id or a new name, in its changes).
   Independently, a reader polls the view with Spark SQL as an analyst would (a REST query, run
   by the analysts' query process) and records when it first sees each marker: an upper bound (by at most one poll period) that cross-checks
   the publish instants. A rename overwritten by a later rename of the same row before the
   reader saw it may legally never be seen by a poller (readers see states as of W, not every
   state in between): such markers are counted, not timed, in the polled figures.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pvm.bench.spark_deployment import (
    measured,
    populate_sources,
    running_analysts,
    start_spark_store,
    write_figures,
    write_transactions,
)
from pvm.bench.spark_deployment import quantile as _quantile
from pvm.cli import CliError
from pvm.demo import SCHEMAS
from warehouse.catalog.db import Catalog
from warehouse.protocol import DEFAULT_BATCH_SIZE

VIEW = "fresh_orders"
VIEW_SQL = (
    f"CREATE VIEW {VIEW} AS SELECT o.id AS order_id, o.qty, c.name AS customer, p.name AS product "
    "FROM crm.customers c, shop.orders o, inventory.products p "  # a chain: every SWEEP step joins
    "WHERE o.customer_id = c.id AND o.product_id = p.id"
)
# No goal for the ratio of grouped to single appends any more: it was 20x while an append was a
# Spark job (0.2-1 s whatever its size); an append is now a file the store writes (a few ms).
GOALS = {"grouped_rows_per_s": 50_000, "freshness_p99_s": 2.0}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rate",
        type=float,
        default=200.0,
        help="source transactions per second, over all three sources (default: 200)",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the writer runs (default: 20)")
    parser.add_argument("--rows", type=int, default=2000, help="customers, products and initial orders (default: 2000)")
    parser.add_argument("--parallelism", type=int, default=4, help="PPU size p of the view (default: 4)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"the view's batch_size: the most queued updates of one source per unit (default: {DEFAULT_BATCH_SIZE}, "
        "a view's default: the unit size adapts below it)",
    )
    parser.add_argument(
        "--effects-per-group", type=int, default=200, help="grouped commits: effects per append (default: 200)"
    )
    parser.add_argument(
        "--rows-per-effect", type=int, default=100, help="grouped commits: rows per effect (default: 100)"
    )
    parser.add_argument("--groups", type=int, default=5, help="grouped commits: timed appends (default: 5)")
    parser.add_argument(
        "--single-effects", type=int, default=20, help="one effect per append: timed appends (default: 20)"
    )
    parser.add_argument(
        "--poll-interval", type=float, default=1.0, help="seconds between the Spark SQL reader's polls (default: 1)"
    )
    parser.add_argument("--skip-freshness", action="store_true", help="measure the commit rates only")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where sources, catalog and Spark files go (default: a temporary directory)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    parser.add_argument("--seed", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    if args.rate <= 0 or args.seconds <= 0 or args.rows < 10:
        raise CliError("need --rate > 0, --seconds > 0 and --rows >= 10")
    if (
        min(
            args.effects_per_group,
            args.rows_per_effect,
            args.groups,
            args.single_effects,
            args.parallelism,
            args.batch_size,
        )
        < 1
    ):
        raise CliError("the sizes and counts must be >= 1")
    figures = measured(args, "pvm-bench-commit-", measure)
    report(figures)
    write_figures(args.json, figures)
    return 0


def measure(args: argparse.Namespace, data_dir: Path) -> dict:
    from rich.console import Console

    from pvm.bench.grouped_appends import bench_commit

    console = Console(stderr=True)
    store = start_spark_store(data_dir, console)
    with console.status("grouped commits against one append per effect"):
        commit = bench_commit(
            store,
            effects_per_group=args.effects_per_group,
            rows_per_effect=args.rows_per_effect,
            groups=args.groups,
            single_effects=args.single_effects,
        )
    figures = {
        "machine": {"cores": os.cpu_count()},
        "commit": {k: round(v, 3) for k, v in commit.items()},
        "goals": GOALS,
    }
    if not args.skip_freshness:
        figures["freshness"] = asyncio.run(Freshness(args, data_dir, store, console).run())
    return figures


# -- freshness ---------------------------------------------------------------------------------------
@dataclass
class Marker:
    committed_at: float
    key: tuple[str, int]  # the source row it lives in; a later marker on it supersedes this one
    seen_at: float | None = None


@dataclass(frozen=True)
class Trace:
    """When a transaction's changes reached each stage (seconds since the epoch)."""

    received: float  # durable in the manager's update log
    started: float  # its maintenance unit got an order number
    committed: float  # the unit's effect appended to the z-log and recorded
    published: float  # a W covering it published to SQL readers


STAGES = (  # (name, from, to): the legs of a transaction's freshness
    ("shipped to the manager", "source", "received"),
    ("queued for a unit", "received", "started"),
    ("maintained and appended", "started", "committed"),
    ("published", "committed", "published"),
)


@dataclass
class Ledger:
    """Markers by what the reader looks for: order ids and names."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    orders: dict[int, Marker] = field(default_factory=dict)
    names: dict[str, Marker] = field(default_factory=dict)
    latest: dict[tuple[str, int], str] = field(default_factory=dict)  # row -> its newest name
    polls: list[float] = field(default_factory=list)  # seconds between poll starts
    errors: list[str] = field(default_factory=list)  # failed reads

    def pending(self) -> int:
        with self.lock:
            return sum(m.seen_at is None for m in (*self.orders.values(), *self.names.values()))


class Freshness:
    def __init__(self, args: argparse.Namespace, data_dir: Path, store, console) -> None:
        self.args = args
        self.data_dir = data_dir
        self.store = store
        self.console = console
        self.rng = random.Random(args.seed)
        self.ledger = Ledger()
        self.stop_reader = threading.Event()
        self.publishes: list[tuple[float, int]] = []  # (end of publish, W), in time order
        self.publish_seconds: list[float] = []
        self.commit_seconds: list[float] = []
        self.commit_rows: list[int] = []

    async def run(self) -> dict:
        from warehouse.store.compaction import CompactionPolicy, Compactor

        paths = self._create_sources()
        compactor = Compactor(self.store, CompactionPolicy(max_files=30, max_age_s=15.0), interval_s=2.0)
        publish, commit = self.store.publish, self.store.commit

        def recorded_publish(view: str, watermark: int) -> None:
            started = time.time()
            publish(view, watermark)
            if view == VIEW:
                self.publishes.append((time.time(), watermark))  # W is visible to SQL readers
                self.publish_seconds.append(time.time() - started)

        def timed_commit(view: str, effects) -> None:
            started = time.time()
            commit(view, effects)
            if view == VIEW:
                self.commit_seconds.append(time.time() - started)
                self.commit_rows.append(sum(len(e.delta) for e in effects))

        self.store.publish, self.store.commit = recorded_publish, timed_commit
        try:
            return await self._run(paths, compactor)
        finally:
            del self.store.publish, self.store.commit

    async def _run(self, paths: dict[str, Path], compactor) -> dict:
        from warehouse.analysts.supervisor import AnalystSettings

        # SQL readers query the views in the analysts' query process, as in the service
        settings = AnalystSettings(work_dir=self.data_dir / "analysts", master="local[1]")
        async with running_analysts(self.store, settings) as self.analysts:
            return await self._run_deployment(paths, compactor)

    async def _run_deployment(self, paths: dict[str, Path], compactor) -> dict:
        from pvm.local_deployment import LocalDeployment, side_by_side

        async with LocalDeployment(self.data_dir, self.store) as deployment:
            await side_by_side(
                *(
                    deployment.add_sqlite_source(source, paths[source], [table], max_concurrent_queries=2)
                    for source, (table, _) in SCHEMAS.items()
                )
            )
            manager = deployment.manager
            with self.console.status("initial load of the view"):
                await manager.define_view(VIEW_SQL, parallelism=self.args.parallelism, batch_size=self.args.batch_size)
                await manager.wait_idle(VIEW, timeout=300)
            compactor.start()
            with self.console.status("starting the analysts' query process"):
                if not await asyncio.to_thread(self.analysts.wait_ready, 300):
                    raise CliError(f"the analysts' query process did not start: {self.analysts.status()}")
            reader = threading.Thread(target=self._read, name="bench-reader", daemon=True)
            reader.start()
            try:
                with self.console.status(f"{self.args.rate:g} transactions/s for {self.args.seconds:g} s"):
                    writer = await asyncio.to_thread(self._write, paths)
                with self.console.status("waiting for the last markers"):
                    await deployment.wait_shipped()
                    await manager.wait_idle(VIEW, timeout=300)
                    deadline = time.monotonic() + 60
                    while time.monotonic() < deadline and (  # noqa: ASYNC110 (conditions in three processes)
                        self.store.published(VIEW) != manager.watermark(VIEW)
                        or not self.analysts.shown()
                        or (self.ledger.pending() and not self._all_pending_superseded())
                    ):
                        await asyncio.sleep(0.2)
            finally:
                self.stop_reader.set()
                await asyncio.to_thread(reader.join)
                await asyncio.to_thread(compactor.stop)
            status = manager.status(VIEW)
            if status["state"] == "failed":
                raise CliError(f"maintenance failed: {status['error']}")
            visible = await self._visible_at(manager)
            await manager.drop_view(VIEW)
        return self._figures(writer, status, visible)

    async def _visible_at(self, manager) -> dict[tuple[str, object], Trace]:
        """Per marker, its way through the service, up to when the first watermark covering
        its transaction was published."""
        import bisect

        units = {u.order: u for u in await manager.db(Catalog.units, VIEW)}
        order_of = {log_id: u.order for u in units.values() for log_id in u.log_ids}
        times = [t for t, _ in self.publishes]
        marks = [w for _, w in self.publishes]  # nondecreasing
        out: dict[tuple[str, object], Trace] = {}
        for source in SCHEMAS:
            for entry in await manager.db(Catalog.log_entries, source, 0):
                order = order_of.get(entry.id)
                i = bisect.bisect_left(marks, order) if order is not None else len(marks)
                if i == len(marks):
                    continue
                unit = units[order]
                trace = Trace(entry.received_at, unit.started_at, unit.committed_at, times[i])
                for change in entry.changes:
                    if change["sign"] == 1:
                        row = change["row"]
                        key = ("order", row["id"]) if source == "shop" else ("name", row.get("name"))
                        out[key] = trace
        return out

    # -- the sources and the writer ----------------------------------------------------------------
    def _create_sources(self) -> dict[str, Path]:
        return populate_sources(self.data_dir, self.args.rows, self.rng, prefix="fresh-")

    def _write(self, paths: dict[str, Path]) -> dict:
        """Commit transactions on a fixed schedule in a writer process of its own (a thread
        here would share the manager's interpreter with it); returns what was achieved. The
        writer reports each marker with its commit time as it goes."""
        context = multiprocessing.get_context("spawn")
        markers = context.Queue()
        writer = context.Process(
            target=write_transactions,
            args=(
                {s: str(p) for s, p in paths.items()},
                self.args.rows,
                self.args.rate,
                self.args.seconds,
                self.args.seed,
                markers,
            ),
            name="bench-writer",
            daemon=True,
        )
        writer.start()
        ledger = self.ledger
        try:
            while True:
                try:
                    kind, key, at = markers.get(timeout=5)
                except queue.Empty:
                    if not writer.is_alive():
                        raise CliError(f"the writer process ended with code {writer.exitcode}") from None
                    continue
                with ledger.lock:
                    if kind == "order":
                        ledger.orders[key] = Marker(at, ("shop", key))
                    elif kind == "name":
                        name, row = key
                        ledger.names[name] = Marker(at, tuple(row))
                        ledger.latest[tuple(row)] = name
                    else:
                        return key  # "done": the writer's figures
        finally:
            writer.join(timeout=30)

    def _all_pending_superseded(self) -> bool:
        with self.ledger.lock:
            return all(
                m.seen_at is not None or self.ledger.latest.get(m.key) != name for name, m in self.ledger.names.items()
            ) and all(m.seen_at is not None for m in self.ledger.orders.values())

    # -- the reader -----------------------------------------------------------------------------------
    def _read(self) -> None:
        from api.analyst import check_query

        # Markers only: new orders and renamed rows. The conditions are on the view's grouping
        # columns, so Spark filters below the view's aggregation, as for any selective query.
        # The query goes to the analysts' query process, as an analyst's REST query does.
        query = check_query(
            f"SELECT order_id, customer, product FROM {VIEW} "
            f"WHERE order_id > {self.args.rows} OR customer LIKE '%-t%' OR product LIKE '%-t%'",
            [VIEW],
        )
        last = None
        while not self.stop_reader.is_set():
            started = time.time()
            try:
                result = asyncio.run(self.analysts.query(query, 1_000_000, "bench reader"))
            except Exception as exc:  # counted: a reader must never miss the view
                self.ledger.errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                self.stop_reader.wait(0.05)
                continue
            if last is not None:
                self.ledger.polls.append(started - last)
            last = started
            orders = {row[0] for row in result.rows}
            names = {row[1] for row in result.rows} | {row[2] for row in result.rows}
            with self.ledger.lock:
                for order, marker in self.ledger.orders.items():
                    if marker.seen_at is None and order in orders:
                        marker.seen_at = started
                for name, marker in self.ledger.names.items():
                    if marker.seen_at is None and name in names:
                        marker.seen_at = started
            self.stop_reader.wait(self.args.poll_interval)

    def _figures(self, writer: dict, status: dict, visible: dict) -> dict:
        ledger = self.ledger
        keyed = [
            *((("order", k), m) for k, m in ledger.orders.items()),
            *((("name", k), m) for k, m in ledger.names.items()),
        ]
        exact = sorted(visible[k].published - m.committed_at for k, m in keyed if k in visible)
        early = sum(
            1 for k, m in keyed if k in visible and m.seen_at is not None and m.seen_at < visible[k].published - 0.05
        )
        stages = {}
        for name, start, end in STAGES:
            legs = sorted(
                getattr(visible[k], end) - (m.committed_at if start == "source" else getattr(visible[k], start))
                for k, m in keyed
                if k in visible
            )
            stages[name] = {"p50_s": round(_quantile(legs, 0.5), 3), "p99_s": round(_quantile(legs, 0.99), 3)}
        markers = [m for _, m in keyed]
        seen = sorted(m.seen_at - m.committed_at for m in markers if m.seen_at is not None)
        unseen = [(name, m) for name, m in ledger.names.items() if m.seen_at is None]
        superseded = sum(ledger.latest.get(m.key) != name for name, m in unseen)
        missing = len(unseen) - superseded + sum(m.seen_at is None for m in ledger.orders.values())
        polls = sorted(ledger.polls)
        return {
            "sources": len(SCHEMAS),
            "target_rate": self.args.rate,
            "achieved_rate": round(writer["rate"], 1),
            "writer_seconds": round(writer["seconds"], 2),
            "max_behind_schedule_s": round(writer["max_behind_schedule_s"], 3),
            "transactions": writer["transactions"],
            "measured": len(exact),
            "p50_s": round(_quantile(exact, 0.50), 3),
            "p90_s": round(_quantile(exact, 0.90), 3),
            "p99_s": round(_quantile(exact, 0.99), 3),
            "max_s": round(exact[-1], 3) if exact else None,
            "stages": stages,
            "publishes": len(self.publishes),
            "store_append_s_mean": round(sum(self.commit_seconds) / max(1, len(self.commit_seconds)), 3),
            "store_append_rows_mean": round(sum(self.commit_rows) / max(1, len(self.commit_rows)), 1),
            "publish_s_mean": round(sum(self.publish_seconds) / max(1, len(self.publish_seconds)), 3),
            "polled": {
                "measured": len(seen),
                "superseded_unseen": superseded,
                "never_seen": missing,
                "seen_before_publish": early,
                "p50_s": round(_quantile(seen, 0.50), 3),
                "p90_s": round(_quantile(seen, 0.90), 3),
                "p99_s": round(_quantile(seen, 0.99), 3),
                "max_s": round(seen[-1], 3) if seen else None,
            },
            "poll_period_p50_s": round(_quantile(polls, 0.5), 3),
            "poll_period_max_s": round(polls[-1], 3) if polls else None,
            "read_errors": len(ledger.errors),
            "first_read_error": ledger.errors[0] if ledger.errors else None,
            "view": {
                "parallelism": self.args.parallelism,
                "batch_size": self.args.batch_size,
                "units_committed": status["counters"]["units_committed"],
                "commit_groups": status["counters"]["commit_groups"],
                "compensations": status["counters"]["compensations"],
                "watermark": status["watermark"],
            },
        }


def report(figures: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    c = figures["commit"]
    table = Table(title="Spark store commits (side by side, one run)")
    for col in ("", "effect rows/s", "rows per append", "ms per append"):
        table.add_column(col)
    for label, way, rows in (
        ("grouped appends", "grouped", "rows_per_group"),
        ("one append per effect", "single", "rows_per_single_append"),
    ):
        table.add_row(label, f"{c[f'{way}_rows_per_s']:,.0f}", f"{c[rows]:,.0f}", f"{c[f'{way}_append_ms']:.1f}")
    table.add_row("ratio", f"{c['speedup']:.1f}x", "", "")
    console.print(table)
    f = figures.get("freshness")
    if f:
        t = Table(title=f"freshness: source commit -> visible in Spark SQL ({f['sources']} sources)")
        t.add_column("")
        t.add_column("value")
        t.add_row("rate (target / achieved)", f"{f['target_rate']:g} / {f['achieved_rate']:g} transactions/s")
        t.add_row("transactions measured", f"{f['measured']} of {f['transactions']} ({f['publishes']} publishes of W)")
        t.add_row("p50 / p90 / p99 / max", f"{f['p50_s']:.3f} / {f['p90_s']:.3f} / {f['p99_s']:.3f} / {f['max_s']} s")
        for stage, legs in f["stages"].items():
            t.add_row(f"  {stage} (p50 / p99)", f"{legs['p50_s']:.3f} / {legs['p99_s']:.3f} s")
        p = f["polled"]
        t.add_row(
            "polled by a Spark SQL reader: p50 / p99",
            f"{p['p50_s']:.3f} / {p['p99_s']:.3f} s ({p['measured']} seen, {p['superseded_unseen']} renames superseded "
            f"unseen, {p['never_seen']} never seen, {p['seen_before_publish']} seen before their publish)",
        )
        t.add_row("reader poll period (p50 / max)", f"{f['poll_period_p50_s']:.3f} / {f['poll_period_max_s']} s")
        t.add_row(
            "failed reads", str(f["read_errors"]) + (f" (first: {f['first_read_error']})" if f["read_errors"] else "")
        )
        t.add_row("units / commit groups", f"{f['view']['units_committed']} / {f['view']['commit_groups']}")
        t.add_row(
            "store append / publish (mean)",
            f"{f['store_append_s_mean']:.3f} s for {f['store_append_rows_mean']:g} rows / {f['publish_s_mean']:.3f} s",
        )
        console.print(t)
    g = figures["goals"]
    verdicts = [
        ("grouped >= 50,000 rows/s", c["grouped_rows_per_s"] >= g["grouped_rows_per_s"]),
    ]
    if f:
        verdicts.append(("freshness p99 <= 2 s", f["p99_s"] <= g["freshness_p99_s"]))
    for text, ok in verdicts:
        console.print(f"{'[green]met[/green]' if ok else '[red]not met[/red]'}: {text}")
