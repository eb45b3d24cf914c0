"""``pvm bench capture``: what capture costs a source, and how fresh a view stays.

1. **Write cost** (PostgreSQL and MariaDB). The same workload, same seed, runs against the
   same starting table with capture installed and without, alternating, ``--rounds`` times
   each: ``--connections`` connections commit ``--transactions`` transactions in total,
   each of ``--statements`` statements (half updates, a quarter inserts, a quarter deletes)
   on a table of ``--rows`` rows. The ratio of the median times is what capture costs the
   writers: the triggers' work happens inside their transactions. No wrapper drains the
   outbox meanwhile, so the source pays for capture alone. ``--method log`` installs log
   capture instead (PostgreSQL: REPLICA IDENTITY FULL and a slot, which make the writers
   log whole old rows; MariaDB: nothing, its binary log is on either way).
2. **Freshness** (PostgreSQL + MariaDB + SQLite, one wrapper process each, the manager in
   this process). Writers commit ``--view-transactions`` random transactions, two
   connections per source, while a marker transaction every ``--marker-interval`` seconds
   inserts a row that joins into the view; freshness is the time from a marker's commit
   to its row being readable in the view (as of the watermark). After the writers stop,
   the view must converge, and the maintenance oracle (``pvm.bench.three_sources``) must
   hold for every watermark and for the live databases.

The servers default to the development ones; the benchmark works in a scratch schema
(PostgreSQL) and database (MariaDB) that it drops at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from pvm.cli import CliError

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MARIADB_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
# Markers: rows whose join partners (anchors) no random writer touches; view column of their key.
MARKERS = {"pg": (50_000_000, 0), "my": (60_000_000, 3), "lite": (70_000_000, 5)}
ANCHORS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "pg": [("s", {"id": 900, "b": 77, "c": 77}), ("t", {"id": 900, "c": 77, "d": "d1"})],
    "my": [("r", {"id": 901, "b": 78, "note": "n-anchor"}), ("t", {"id": 901, "c": 78, "d": "d1"})],
    "lite": [("r", {"id": 902, "b": 79, "note": "n-anchor"}), ("s", {"id": 902, "b": 79, "c": 79})],
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pg-url", default=PG_URL, help=f"PostgreSQL server to use (default: {PG_URL})")
    parser.add_argument("--mariadb-url", default=MARIADB_URL, help=f"MariaDB server to use (default: {MARIADB_URL})")
    parser.add_argument(
        "--transactions", type=int, default=1200, help="write cost: transactions per run (default: 1200)"
    )
    parser.add_argument("--statements", type=int, default=4, help="write cost: statements per transaction (default: 4)")
    parser.add_argument("--connections", type=int, default=4, help="write cost: concurrent connections (default: 4)")
    parser.add_argument("--rows", type=int, default=5000, help="write cost: rows in the table (default: 5000)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="write cost: runs with and without capture, each (default: 3)"
    )
    parser.add_argument(
        "--view-transactions", type=int, default=500, help="freshness: random source transactions (default: 500)"
    )
    parser.add_argument(
        "--marker-interval", type=float, default=0.05, help="freshness: seconds between markers (default: 0.05)"
    )
    parser.add_argument(
        "--method", choices=["trigger", "log"], default="trigger",
        help="write cost: the capture method installed for the runs with capture (default: trigger)",
    )  # fmt: skip
    parser.add_argument("--skip-write-cost", action="store_true", help="measure freshness only")
    parser.add_argument("--skip-freshness", action="store_true", help="measure the write cost only")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--seed", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    if min(args.transactions, args.statements, args.connections, args.rows, args.rounds, args.view_transactions) < 1:
        raise CliError(
            "--transactions, --statements, --connections, --rows, --rounds and --view-transactions must be >= 1"
        )
    results: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items() if not k.startswith("_")}}
    with scratch_sources(args.pg_url, args.mariadb_url) as (pg, my):
        if not args.skip_write_cost:
            results["write_cost"] = {name: write_cost(url, args) for name, url in (("postgresql", pg), ("mariadb", my))}
        if not args.skip_freshness:
            results["freshness"] = asyncio.run(freshness(pg, my, args))
    print_results(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    return 0


# -- scratch space on the servers ----------------------------------------------------------------
@contextmanager
def scratch_sources(pg_admin: str, my_admin: str) -> Iterator[tuple[str, str]]:
    """URLs of a fresh PostgreSQL schema and MariaDB database, dropped afterwards."""
    name = f"pvm_bench_{uuid.uuid4().hex[:10]}"
    engines = [sa.create_engine(u, isolation_level="AUTOCOMMIT") for u in (pg_admin, my_admin)]
    try:
        for engine, ddl in zip(engines, (f"CREATE SCHEMA {name}", f"CREATE DATABASE {name} CHARACTER SET utf8mb4")):
            with engine.connect() as conn:
                conn.exec_driver_sql(ddl)
    except sa.exc.DBAPIError as exc:
        raise CliError(f"cannot prepare the benchmark's scratch space: {exc.orig}") from exc
    pg = sa.make_url(pg_admin).update_query_dict({"options": f"-csearch_path={name}"})
    my = sa.make_url(my_admin).set(database=name)
    try:
        yield pg.render_as_string(hide_password=False), my.render_as_string(hide_password=False)
    finally:
        for engine, ddl in zip(engines, (f"DROP SCHEMA {name} CASCADE", f"DROP DATABASE {name}")):
            with engine.connect() as conn:
                conn.exec_driver_sql(ddl)
            engine.dispose()


# -- 1. write cost -------------------------------------------------------------------------------
def write_cost(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from wrappers.capture import CaptureConfig, dialect_for, install_log, uninstall_log

    dialect = dialect_for(url)
    method = getattr(args, "method", "trigger")
    seconds: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(args.rounds):
        for mode in ("without", "with"):
            reset_table(url, args.rows)
            engine = dialect.open_engine(url)
            try:
                if mode == "with":
                    if method == "log":
                        install_log(CaptureConfig("log"), engine, ["w"])
                    else:
                        dialect.install(engine, ["w"])
                try:
                    seconds[mode].append(workload(engine, args))
                finally:
                    if mode == "with":  # a slot left behind would keep the server's WAL
                        if method == "log":
                            uninstall_log(CaptureConfig("log"), engine, ["w"])
                        else:
                            dialect.uninstall(engine, ["w"])
            finally:
                engine.dispose()
    without, with_ = statistics.median(seconds["without"]), statistics.median(seconds["with"])
    return {
        "seconds_without_capture": seconds["without"],
        "seconds_with_capture": seconds["with"],
        "transactions_per_second_without": args.transactions / without,
        "transactions_per_second_with": args.transactions / with_,
        "ratio": with_ / without,
    }


def reset_table(url: str, rows: int) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS w")
        conn.exec_driver_sql("CREATE TABLE w (id BIGINT PRIMARY KEY, a INTEGER, b VARCHAR(40))")
        conn.execute(
            sa.text("INSERT INTO w VALUES (:id, :a, :b)"),
            [{"id": i, "a": i % 97, "b": f"row {i}"} for i in range(1, rows + 1)],
        )
    engine.dispose()


def workload(engine: sa.Engine, args: argparse.Namespace) -> float:
    """Seconds for ``args.connections`` threads to commit ``args.transactions`` transactions."""
    share = -(-args.transactions // args.connections)
    ready = threading.Barrier(args.connections + 1)
    errors: list[BaseException] = []

    def write(i: int) -> None:
        rng = random.Random(f"{args.seed}-{i}")
        fresh = itertools.count(10_000_000 * (i + 1))
        try:
            with engine.connect() as conn:
                ready.wait()
                for _ in range(share):
                    for _ in range(args.statements):
                        action = rng.random()
                        if action < 0.5:
                            conn.execute(
                                sa.text("UPDATE w SET a = a + 1, b = :b WHERE id = :id"),
                                {"b": f"v{rng.random()}", "id": rng.randint(1, args.rows)},
                            )
                        elif action < 0.75:
                            conn.execute(sa.text("INSERT INTO w VALUES (:id, 1, 'new')"), {"id": next(fresh)})
                        else:
                            conn.execute(sa.text("DELETE FROM w WHERE id = :id"), {"id": rng.randint(1, args.rows)})
                    conn.commit()
        except BaseException as exc:
            errors.append(exc)
            ready.abort()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(args.connections)]
    for t in threads:
        t.start()
    ready.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise CliError(f"the write workload failed: {errors[0]}")
    return time.perf_counter() - started


# -- 2. freshness and convergence of a view over three databases --------------------------------
async def freshness(pg: str, my: str, args: argparse.Namespace) -> dict[str, Any]:
    from pvm.bench import three_sources as scenario
    from pvm.local_deployment import LocalDeployment

    with tempfile.TemporaryDirectory(prefix="pvm-bench-capture-") as tmp:
        data = Path(tmp)
        urls = {"pg": pg, "my": my, "lite": scenario.sqlite_file(data / "lite.db")}
        scenario.create(urls, random.Random(args.seed))
        add_anchors(urls)
        initial = scenario.read_live(urls)
        async with LocalDeployment(data) as deployment:
            wrappers = scenario.WrapperSet(deployment)
            for source, url in urls.items():
                await wrappers.add(source, url, [scenario.TABLES[source][0]])
            manager = deployment.manager
            await manager.define_view(scenario.VIEW, "v", parallelism=4)
            await manager.wait_idle("v", timeout=120)
            writers = scenario.Writers(urls, args.view_transactions, connections=2, seed=args.seed, pause=0.05)
            commits: list[tuple[str, int, float]] = []
            stop = threading.Event()
            marker = threading.Thread(target=write_markers, args=(urls, args.marker_interval, stop, commits))
            started = time.perf_counter()
            threads = writers.start()
            marker.start()
            seen = await watch_markers(manager, lambda _: not any(t.is_alive() for t in threads), commits, {})
            writing = time.perf_counter() - started
            stop.set()
            marker.join()
            if writers.errors:
                raise CliError(f"a writer failed: {writers.errors[0]}")
            seen = await watch_markers(manager, lambda found: len(found) >= len(commits), commits, seen)
            await deployment.wait_shipped(timeout=300)
            await manager.wait_idle("v", timeout=600)
            converged = time.perf_counter() - started - writing
            maintainer = manager.view("v").maintainer
            if maintainer.failed:
                raise CliError(f"maintenance failed: {maintainer.failed}")
            checked = await scenario.check_oracle(manager, "v", initial)
            from warehouse.recompute import recompute

            live = recompute(manager.view("v").plan, scenario.read_live(urls), scenario.COLUMNS)
            if manager.read("v") != live:
                raise CliError("the view does not equal recomputation over the live sources")
    lags = {source: sorted(seen[(s, k)] - t for s, k, t in commits if s == source) for source in MARKERS}
    return {
        "source_transactions_committed": sum(writers.committed),
        "marker_transactions": len(commits),
        "writing_seconds": writing,
        "converged_seconds_after_writers": converged,
        "watermarks_checked_by_oracle": checked,
        "oracle": "passed",
        "compensations": maintainer.counters.compensations,
        "freshness_seconds": {
            source: {"p50": _quantile(v, 0.5), "p95": _quantile(v, 0.95), "max": max(v)}
            for source, v in lags.items()
            if v
        },
    }


def add_anchors(urls: dict[str, str]) -> None:
    from pvm.bench.three_sources import TABLES

    by_table = {table: source for source, (table, _, _) in TABLES.items()}
    for rows in ANCHORS.values():
        for table, row in rows:
            engine = sa.create_engine(urls[by_table[table]])
            with engine.begin() as conn:
                conn.execute(
                    sa.text(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(':' + c for c in row)})"), row
                )
            engine.dispose()


def write_markers(urls: dict[str, str], interval: float, stop: threading.Event, commits: list) -> None:
    """Round-robin over the sources, one marker row per transaction, until ``stop``."""
    from pvm.bench.three_sources import TABLES

    rows = {
        "pg": lambda k: {"id": k, "b": 77, "note": "n-marker"},
        "my": lambda k: {"id": k, "b": 78, "c": 78},
        "lite": lambda k: {"id": k, "c": 79, "d": "d1"},
    }
    engines = {s: sa.create_engine(u, connect_args={"timeout": 30} if s == "lite" else {}) for s, u in urls.items()}
    try:
        for n in itertools.count():
            if stop.is_set():
                return
            source = list(MARKERS)[n % len(MARKERS)]
            key = MARKERS[source][0] + n
            row = rows[source](key)
            table = TABLES[source][0]
            with engines[source].begin() as conn:
                conn.execute(
                    sa.text(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(':' + c for c in row)})"), row
                )
            commits.append((source, key, time.perf_counter()))
            time.sleep(interval)
    finally:
        for engine in engines.values():
            engine.dispose()


async def watch_markers(
    manager: Any, done: Callable[[dict], bool], commits: list, seen: dict[tuple[str, int], float]
) -> dict[tuple[str, int], float]:
    """``seen`` plus when each further committed marker first shows in the view, reading it
    every 20 ms until ``done(seen so far)``."""
    seen = dict(seen)
    deadline = time.monotonic() + 600
    while not done(seen):
        if time.monotonic() > deadline:
            raise CliError("markers did not reach the view within 10 minutes")
        view = manager.read("v")
        now = time.perf_counter()
        present = {row[column] for row, _ in view.items() for column in (0, 3, 5)}
        for source, key, _ in list(commits):
            if (source, key) not in seen and key in present:
                seen[(source, key)] = now
        await asyncio.sleep(0.02)
    return seen


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def print_results(results: dict[str, Any]) -> None:
    for name, cost in results.get("write_cost", {}).items():
        print(
            f"{name:10s} write cost ({results['settings'].get('method', 'trigger')} capture): "
            f"{cost['transactions_per_second_without']:.0f} tx/s without capture, "
            f"{cost['transactions_per_second_with']:.0f} tx/s with, time ratio {cost['ratio']:.2f} (goal <= 1.6)"
        )
    fresh = results.get("freshness")
    if fresh:
        print(
            f"view over PostgreSQL + MariaDB + SQLite: {fresh['source_transactions_committed']} random and "
            f"{fresh['marker_transactions']} marker transactions in {fresh['writing_seconds']:.1f} s; converged "
            f"{fresh['converged_seconds_after_writers']:.2f} s after the writers; oracle {fresh['oracle']} at "
            f"{fresh['watermarks_checked_by_oracle']} watermarks"
        )
        for source, lag in fresh["freshness_seconds"].items():
            print(f"  freshness {source:4s}: p50 {lag['p50']:.3f} s, p95 {lag['p95']:.3f} s, max {lag['max']:.3f} s")
