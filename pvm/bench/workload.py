"""``pvm bench workload``: a CH-benCHmark-style load at a rate ramp, and how fresh the views stay.

TPC-C's New-Order, Payment and Delivery over eight tables split across PostgreSQL, MariaDB
and SQLite (``pvm.bench.tpcc``), each behind its wrapper process, the manager in this
process, three join views over them (undelivered orders with their customers, order lines
with their items and districts, stock with items and warehouses) in the Spark store (or the
memory store). ``--writers`` writer processes, never threads of this one, commit TPC-C
transactions on a fixed schedule at each rate of ``--rates`` for ``--seconds``; between
rates the views catch up, so each rate starts from a quiet deployment.

Per rate: the rate reached; per view the freshness of every source transaction it saw,
from its commit (the writer's clock, traced through the ``tx`` column its rows carry) to
the end of the first publish of a watermark W covering its unit (after which every reader
of the view as of W sees it), p50, p99 and max; the lag (``lag_seconds`` of the view's
status) sampled every ``--sample-interval`` seconds and how fast it grew; the manager
process's CPU and RSS (and the Spark JVM's), and for a phase longer than a minute how far
the manager's RSS rose after its first minute. A rate is *bounded* when, for every view, the
lag did not grow by more than ``LAG_GROWTH_BOUND`` seconds per second over the rate's
second half, and the writers reached 90% of it. At the end the views are checked against
recomputation from the live databases.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import multiprocessing
import os
import queue
import time
from pathlib import Path
from typing import Any

from pvm.bench.spark_deployment import measured, quantile, start_spark_store, write_figures
from pvm.bench.tpcc import TABLES, VIEWS, Size, load_commits
from pvm.cli import CliError
from pvm.heap import freeze_long_lived

LAG_GROWTH_BOUND = 0.1
SETTLE_S = 60.0  # the memory goal: RSS growth counted after the first minute
"""Seconds of lag gained per second of load above which a rate is not sustained."""


def configure(parser: argparse.ArgumentParser) -> None:
    from pvm.bench.capture import MARIADB_URL, PG_URL
    from warehouse.protocol import DEFAULT_BATCH_SIZE

    parser.add_argument(
        "--rates",
        default="250,500,1000,2000",
        help="TPC-C transactions per second, one after the other (default: 250,500,1000,2000)",
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each rate runs (default: 30)")
    parser.add_argument("--store", choices=("spark", "memory"), default="spark", help="the view store (default: spark)")
    parser.add_argument("--warehouses", type=int, default=4, help="TPC-C warehouses (default: 4)")
    parser.add_argument(
        "--customers", type=int, default=100, help="customers (and initial orders) per district (default: 100)"
    )
    parser.add_argument("--items", type=int, default=2000, help="items (default: 2000)")
    parser.add_argument(
        "--writers", type=int, default=2, help="writer processes, each owning whole warehouses (default: 2)"
    )
    parser.add_argument("--parallelism", type=int, default=4, help="PPU size p of each view (default: 4)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"the views' batch_size (default: {DEFAULT_BATCH_SIZE}, the default: adaptive up to it)",
    )
    parser.add_argument("--views", default=",".join(VIEWS), help=f"views to maintain (default: {','.join(VIEWS)})")
    parser.add_argument("--sample-interval", type=float, default=0.5, help="seconds between lag samples (default: 0.5)")
    parser.add_argument("--pg-url", default=PG_URL, help=f"PostgreSQL server to use (default: {PG_URL})")
    parser.add_argument("--mariadb-url", default=MARIADB_URL, help=f"MariaDB server to use (default: {MARIADB_URL})")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where SQLite, catalog and Spark files go (default: a temporary directory)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures to this file (and a PNG next to it)")
    parser.add_argument("--seed", type=int, default=1)


def parse_rates(text: str) -> list[float]:
    """``--rates``: positive numbers, comma-separated.

    >>> parse_rates("250, 500,1000")
    [250.0, 500.0, 1000.0]
    """
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CliError(f"--rates {text!r}: expected numbers separated by commas") from None
    if not rates or min(rates) <= 0:
        raise CliError(f"--rates {text!r}: expected positive numbers separated by commas")
    return rates


def run(args: argparse.Namespace) -> int:
    args.rate_list = parse_rates(args.rates)
    args.view_names = [v.strip() for v in args.views.split(",") if v.strip()]
    unknown = sorted(set(args.view_names) - set(VIEWS))
    if unknown or not args.view_names:
        raise CliError(f"--views: unknown {', '.join(unknown) or 'none given'}; choose from {', '.join(VIEWS)}")
    if min(args.warehouses, args.customers, args.items, args.writers, args.parallelism, args.batch_size) < 1:
        raise CliError("--warehouses, --customers, --items, --writers, --parallelism and --batch-size must be >= 1")
    if args.writers > args.warehouses:
        raise CliError("each writer owns whole warehouses: --writers must not exceed --warehouses")
    if args.seconds <= 0 or args.sample_interval <= 0:
        raise CliError("--seconds and --sample-interval must be positive")
    figures = measured(args, "pvm-bench-workload-", measure)
    report(figures)
    write_figures(args.json, figures, plot)
    return 0


def measure(args: argparse.Namespace, data_dir: Path) -> dict:
    from rich.console import Console

    from pvm.bench import tpcc
    from pvm.bench.capture import scratch_sources
    from pvm.bench.three_sources import sqlite_file

    console = Console(stderr=True)
    size = Size(args.warehouses, args.customers, args.items)
    with scratch_sources(args.pg_url, args.mariadb_url) as (pg, my):
        urls = {"pg": pg, "my": my, "lite": sqlite_file(data_dir / "stores.db")}
        with console.status("creating and populating the eight tables"):
            tpcc.create(urls, size, args.seed)
        if args.store == "spark":
            store = start_spark_store(data_dir, console)
        else:
            from warehouse.store.memory import MemoryStore

            store = MemoryStore()
        try:
            return asyncio.run(Workload(args, data_dir, urls, size, store, console).run())
        finally:
            store.close()


class Workload:
    def __init__(
        self, args: argparse.Namespace, data_dir: Path, urls: dict[str, str], size: Size, store, console
    ) -> None:
        self.args, self.data_dir, self.urls, self.size, self.store, self.console = (
            args,
            data_dir,
            urls,
            size,
            store,
            console,
        )
        self.views: list[str] = args.view_names
        self.publishes: dict[str, tuple[list[float], list[int]]] = {v: ([], []) for v in self.views}
        self.after = dict.fromkeys(TABLES, 0)  # per source, the last seq of the log already traced

    async def run(self) -> dict:
        publish = self.store.publish

        def recorded_publish(view: str, watermark: int) -> None:
            publish(view, watermark)
            if view in self.publishes:  # W is visible to readers from now on
                times, marks = self.publishes[view]
                times.append(time.time())
                marks.append(watermark)

        self.store.publish = recorded_publish
        try:
            return await self._run()
        finally:
            del self.store.publish

    async def _run(self) -> dict:
        from pvm.bench.three_sources import WrapperSet
        from pvm.local_deployment import LocalDeployment

        async with LocalDeployment(self.data_dir, self.store) as deployment:
            wrappers = WrapperSet(deployment)
            with self.console.status("starting the wrappers"):
                for source, tables in TABLES.items():
                    await wrappers.add(source, self.urls[source], list(tables), max_concurrent_queries=2)
            manager = deployment.manager
            with self.console.status("initial load of the views"):
                loaded = time.monotonic()
                for name in self.views:
                    await manager.define_view(
                        VIEWS[name], parallelism=self.args.parallelism, batch_size=self.args.batch_size
                    )
                for name in self.views:
                    await manager.wait_idle(name, timeout=900)
                loaded = time.monotonic() - loaded
            self._check_failed(manager)
            freeze_long_lived()  # as `pvm serve` does once started, when the views it recovers are loaded
            self.after = {s: manager.receiver.released_through(s) for s in TABLES}
            writers = Writers(self.urls, self.size, self.args.writers, self.args.seed)
            try:
                with self.console.status("starting the writer processes"):
                    await asyncio.to_thread(writers.wait_ready)
                phases = [await self._phase(deployment, writers, rate) for rate in self.args.rate_list]
            finally:
                writers.stop()
            with self.console.status("checking the views against the live databases"):
                verified = await asyncio.to_thread(self._verify, manager)
        bounded = [p["target_rate"] for p in phases if p["bounded"]]
        return {
            "machine": {"cores": os.cpu_count()},
            "settings": {
                "store": self.args.store,
                "warehouses": self.size.warehouses,
                "customers_per_district": self.size.customers,
                "items": self.size.items,
                "writers": self.args.writers,
                "seconds_per_rate": self.args.seconds,
                "parallelism": self.args.parallelism,
                "batch_size": self.args.batch_size,
                "views": self.views,
            },
            "initial_load_s": round(loaded, 2),
            "phases": phases,
            "highest_bounded_rate": max(bounded) if bounded else None,
            "verified": verified,
        }

    async def _phase(self, deployment, writers: Writers, rate: float) -> dict:
        import psutil

        manager = deployment.manager
        process = psutil.Process()
        process.cpu_percent(None)
        jvms = [p for p in process.children(recursive=True) if "java" in p.name().lower()]
        for jvm in jvms:
            jvm.cpu_percent(None)
        samples: list[dict[str, Any]] = []
        began = time.time()
        writers.start_phase(rate, self.args.seconds)

        def sample(stage: str) -> None:
            row: dict[str, Any] = {"t": round(time.time() - began, 2), "stage": stage}
            for view in self.views:
                status = manager.status(view)
                row[view] = {
                    "lag_s": status["lag_seconds"],
                    "queued": status["updates_queued"],
                    "queued_changes": status["queued_changes"],
                    "running": status["units_running"],
                    "retained": status["units_retained"],
                }
            row["manager_cpu_pct"] = process.cpu_percent(None)
            row["manager_rss_mb"] = round(process.memory_info().rss / 2**20, 1)
            row["jvm_cpu_pct"] = sum(j.cpu_percent(None) for j in jvms)
            row["jvm_rss_mb"] = round(sum(j.memory_info().rss for j in jvms) / 2**20, 1)
            samples.append(row)

        with self.console.status(f"{rate:g} transactions/s for {self.args.seconds:g} s") as status:
            results = None
            while results is None:
                await asyncio.sleep(self.args.sample_interval)
                sample("writing")
                results = writers.results()
                status.update(
                    f"{rate:g} transactions/s: {samples[-1]['t']:.0f} s, lag "
                    + ", ".join(f"{v} {samples[-1][v]['lag_s']:.1f} s" for v in self.views)
                )
            wrote = time.time() - began
            status.update(f"{rate:g} transactions/s: the views catch up")
            catch_up = asyncio.ensure_future(self._catch_up(deployment))
            while not catch_up.done():
                await asyncio.sleep(self.args.sample_interval)
                sample("catching up")
            await catch_up
        self._check_failed(manager)
        figures, commit_files = results
        commits = await asyncio.to_thread(
            load_commits, commit_files
        )  # after the samples: the bench's, not the manager's
        return await self._figures(manager, rate, wrote, time.time() - began - wrote, figures, commits, samples)

    async def _catch_up(self, deployment) -> None:
        await deployment.wait_shipped(timeout=900)
        for view in self.views:
            await deployment.manager.wait_idle(view, timeout=900)
        deadline = time.monotonic() + 60
        while any(self.store.published(v) < deployment.manager.watermark(v) for v in self.views):
            if time.monotonic() > deadline:
                raise CliError("the views' watermarks were not published within 60 s")
            await asyncio.sleep(0.05)

    def _check_failed(self, manager) -> None:
        for view in self.views:
            status = manager.status(view)
            if status["state"] == "failed":
                raise CliError(f"maintenance of {view} failed: {status['error']}")

    async def _figures(
        self,
        manager,
        rate: float,
        wrote: float,
        caught_up: float,
        writers: list[dict],
        commits: dict[int, float],
        samples,
    ) -> dict:
        from warehouse.catalog.db import Catalog

        tx_of: dict[int, int] = {}  # log id -> the source transaction it holds
        for source in TABLES:
            for entry in await manager.db(Catalog.log_entries, source, self.after[source]):
                self.after[source] = max(self.after[source], entry.seq)
                txs = [c["row"].get("tx") for c in entry.changes if c["sign"] == 1] or [
                    c["row"].get("tx") for c in entry.changes
                ]
                tx = max((t for t in txs if t is not None), default=None)
                if tx in commits:
                    tx_of[entry.id] = tx
        views = {}
        writing = [s for s in samples if s["stage"] == "writing"]
        for view in self.views:
            order_of = {i: u.order for u in await manager.db(Catalog.units, view) for i in u.log_ids if i in tx_of}
            times, marks = self.publishes[view]
            fresh = []
            for log_id, order in order_of.items():
                i = bisect.bisect_left(marks, order)
                if i < len(marks):
                    fresh.append(times[i] - commits[tx_of[log_id]])
            fresh.sort()
            lags = [(s["t"], s[view]["lag_s"]) for s in writing]
            status = manager.status(view)
            views[view] = {
                "source_transactions": len(fresh),
                "freshness_p50_s": _round(quantile(fresh, 0.5)),
                "freshness_p99_s": _round(quantile(fresh, 0.99)),
                "freshness_max_s": _round(fresh[-1]) if fresh else None,
                "lag_max_s": max((lag for _, lag in lags), default=0.0),
                "lag_growth_s_per_s": round(slope(lags[len(lags) // 2 :]), 3),
                "batching": status["batching"],
                "counters": status["counters"],
            }
        transactions = sum(w["transactions"] for w in writers)
        seconds = max(w["seconds"] for w in writers)
        reached = transactions / seconds
        bounded = reached >= 0.9 * rate and all(v["lag_growth_s_per_s"] <= LAG_GROWTH_BOUND for v in views.values())
        return {
            "target_rate": rate,
            "reached_rate": round(reached, 1),
            "transactions": transactions,
            "source_transactions": len(commits),
            "mix": {k: sum(w["mix"][k] for w in writers) for k in writers[0]["mix"]},
            "writer_errors": [w["last_error"] for w in writers if w["last_error"]],
            "max_behind_schedule_s": round(max(w["max_behind_schedule_s"] for w in writers), 3),
            "writing_s": round(wrote, 2),
            "catch_up_s": round(caught_up, 2),
            "bounded": bounded,
            "views": views,
            "manager_cpu_pct_mean": _round(_mean([s["manager_cpu_pct"] for s in writing])),
            "manager_rss_mb_max": max((s["manager_rss_mb"] for s in samples), default=None),
            "manager_rss_growth_after_1min_pct": rss_growth_after(writing, SETTLE_S),
            "jvm_cpu_pct_mean": _round(_mean([s["jvm_cpu_pct"] for s in writing])),
            "jvm_rss_mb_max": max((s["jvm_rss_mb"] for s in samples), default=None),
            "samples": samples,
        }

    def _verify(self, manager) -> dict[str, bool]:
        """Each view against recomputation over the live databases; a mismatch is an error."""
        import sqlalchemy as sa

        from contract.zset import ZSet
        from warehouse.recompute import recompute

        contents, columns = {}, {}
        for source, tables in TABLES.items():
            engine = sa.create_engine(self.urls[source])
            with engine.connect() as conn:
                for table in tables:
                    result = conn.execute(sa.text(f"SELECT * FROM {table}"))
                    columns[(source, table)] = tuple(result.keys())
                    contents[(source, table)] = ZSet.from_rows(tuple(r) for r in result)
            engine.dispose()
        for view in self.views:
            expected = recompute(manager.view(view).plan, contents, columns)
            if manager.read(view) != expected:
                raise CliError(f"view {view} does not equal recomputation over the live databases")
        return dict.fromkeys(self.views, True)


class Writers:
    """The writer processes (``pvm.bench.tpcc.write_phases``), each with a command queue."""

    def __init__(self, urls: dict[str, str], size: Size, count: int, seed: int) -> None:
        from pvm.bench.tpcc import write_phases

        context = multiprocessing.get_context("spawn")
        self.out = context.Queue()
        self.commands = [context.Queue() for _ in range(count)]
        self.processes = [
            context.Process(
                target=write_phases,
                args=(urls, size, i, count, seed, self.commands[i], self.out),
                name=f"bench-writer-{i}",
                daemon=True,
            )
            for i in range(count)
        ]
        for p in self.processes:
            p.start()
        self._reports: list[dict] = []
        self._commit_files: list[str] = []

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every writer has started and connected (a spawned interpreter takes seconds)."""
        ready, deadline = 0, time.monotonic() + timeout
        while ready < len(self.processes):
            try:
                _, figures, _ = self.out.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise CliError(f"the writer processes did not start within {timeout:g} s") from None
            if "error" in figures:
                raise CliError(f"a writer could not start: {figures['error']}")
            ready += 1

    def start_phase(self, rate: float, seconds: float) -> None:
        self._reports, self._commit_files = [], []
        for commands in self.commands:
            commands.put((rate / len(self.commands), seconds))

    def results(self) -> tuple[list[dict], list[str]] | None:
        """Every writer's figures and the files of its commit times (``tpcc.load_commits``
        reads them) once all have reported, else None."""
        while True:
            try:
                _, figures, commits = self.out.get_nowait()
            except queue.Empty:
                break
            if "error" in figures:
                raise CliError(f"a writer could not start: {figures['error']}")
            self._reports.append(figures)
            self._commit_files.append(commits)
        if len(self._reports) == len(self.processes):
            return self._reports, self._commit_files
        dead = [p for p in self.processes if not p.is_alive()]
        if dead:
            raise CliError(f"writer process {dead[0].name} ended with code {dead[0].exitcode}")
        return None

    def stop(self) -> None:
        for commands in self.commands:
            commands.put(None)
        for p in self.processes:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of ``(t, y)`` points (0 for fewer than two).

    >>> slope([(0, 1.0), (1, 1.5), (2, 2.0)]), slope([(0, 3.0)])
    (0.5, 0.0)
    """
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if var == 0 else sum((t - mt) * (y - my) for t, y in points) / var


def rss_growth_after(samples: list[dict[str, Any]], settle_s: float) -> float | None:
    """How far the manager's RSS rose above its size at ``settle_s`` into the phase, at most,
    in percent of that size; None for a phase shorter than ``settle_s`` (a one-time growth of
    the first minute, the caches and the JVM's first jobs, is not what the goal bounds).

    >>> rows = [{"t": t, "manager_rss_mb": mb} for t, mb in [(30, 90), (60, 100), (90, 108), (120, 104)]]
    >>> rss_growth_after(rows, 60), rss_growth_after(rows[:1], 60)
    (8.0, None)
    """
    later = [s["manager_rss_mb"] for s in samples if s["t"] >= settle_s]
    if not later:
        return None
    return round(100 * (max(later) - later[0]) / later[0], 1)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _round(value: float) -> float | None:
    return None if value != value else round(value, 3)  # nan: nothing measured


def report(figures: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    s = figures["settings"]
    table = Table(
        title=f"CH-benCHmark-style load, {s['store']} store, {s['warehouses']} warehouses, {s['writers']} writer processes"
    )
    for column in (
        "rate (target / reached)",
        "view",
        "freshness p50 / p99 / max",
        "lag max, growth",
        "manager CPU, RSS",
        "bounded",
    ):
        table.add_column(column)
    for p in figures["phases"]:
        for i, (view, v) in enumerate(p["views"].items()):
            table.add_row(
                f"{p['target_rate']:g} / {p['reached_rate']:g}" if i == 0 else "",
                view,
                f"{v['freshness_p50_s']} / {v['freshness_p99_s']} / {v['freshness_max_s']} s",
                f"{v['lag_max_s']:.1f} s, {v['lag_growth_s_per_s']:+.2f} s/s",
                f"{p['manager_cpu_pct_mean']}%, {p['manager_rss_mb_max']} MB" if i == 0 else "",
                ("yes" if p["bounded"] else "no") if i == 0 else "",
            )
    console.print(table)
    for p in figures["phases"]:
        if (growth := p["manager_rss_growth_after_1min_pct"]) is not None:
            console.print(
                f"{p['target_rate']:g} transactions/s: manager RSS grew {growth:+.1f}% after the first minute"
            )
    console.print(f"highest rate with bounded freshness: {figures['highest_bounded_rate']} transactions/s")
    console.print(f"views equal recomputation over the live databases: {all(figures['verified'].values())}")


def plot(figures: dict, png: Path) -> None:
    """Lag over time per view across the rates, and freshness per rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lag_ax, fresh_ax) = plt.subplots(1, 2, figsize=(13, 4.8))
    offset = 0.0
    views = figures["settings"]["views"]
    for p in figures["phases"]:
        samples = p["samples"]
        for k, view in enumerate(views):
            lag_ax.plot(
                [offset + s["t"] for s in samples],
                [s[view]["lag_s"] for s in samples],
                color=f"C{k}",
                label=view if p is figures["phases"][0] else None,
            )
        end = offset + (samples[-1]["t"] if samples else 0)
        lag_ax.axvspan(offset, offset + p["writing_s"], color="0.92")
        lag_ax.text(offset, 0, f"{p['target_rate']:g}/s", fontsize=8, va="bottom")
        offset = end + 1
    lag_ax.set_xlabel("seconds (shaded: writers running; then catching up)")
    lag_ax.set_ylabel("lag_seconds")
    lag_ax.legend(fontsize=8)
    rates = [p["target_rate"] for p in figures["phases"]]
    for k, view in enumerate(views):
        for q, style in (("p50", "-o"), ("p99", "--s")):
            fresh_ax.plot(
                rates,
                [p["views"][view][f"freshness_{q}_s"] for p in figures["phases"]],
                style,
                color=f"C{k}",
                label=f"{view} {q}",
            )
    fresh_ax.set_xscale("log")
    fresh_ax.set_xlabel("target rate (TPC-C transactions/s)")
    fresh_ax.set_ylabel("source commit to visible as of W (s)")
    fresh_ax.legend(fontsize=7)
    fig.suptitle(f"pvm bench workload ({figures['settings']['store']} store)")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
