"""``pvm bench capture``: what each capture method costs a source, and how fresh a view stays.

1. **Write cost** (PostgreSQL and MariaDB). The same workload, same seed, runs against the
   same starting table with no capture, with trigger capture and with log capture installed,
   in rounds (``--rounds``; each round runs every method once, the order rotating from
   round to round): ``--connections`` connections commit ``--transactions`` transactions
   in total, each of ``--statements`` statements (half updates, a quarter inserts, a
   quarter deletes) on a table of ``--rows`` rows. The ratio of a method's median time to
   that of no capture is what it costs the writers; so that the noise shows, every
   method's fastest, median and slowest run is reported, and so is the spread of the
   ratio within a round (a method's time over that of no capture in the same round, the
   runs closest in time). On PostgreSQL each run also counts the WAL it wrote (the
   server's insert position before and after; anything else writing on the server counts
   too). Triggers work inside the writers' transactions; log capture makes PostgreSQL's
   writers log whole old rows (REPLICA IDENTITY FULL) for a slot; on MariaDB the writers of
   "none" and "trigger" write without the binary log (``sql_log_bin = 0``), those of "log"
   with it, so that log/none is the binary log's cost (``capture_write``). No wrapper
   drains the outbox or reads the log meanwhile, so the writers pay for capture alone.
2. **Freshness** (PostgreSQL + MariaDB + SQLite, one wrapper process each, the manager in
   this process), once with every source captured by triggers and once with PostgreSQL and
   MariaDB captured from their logs (SQLite has no log capture: triggers both times), at
   the same rate. Writers commit ``--view-transactions`` random transactions, two
   connections per source (in a process of their own, ``capture_load``), while a marker transaction every ``--marker-interval`` seconds
   inserts a row that joins into the view; freshness is the time from a marker's commit
   to its row being readable in the view (as of the watermark). After the writers stop,
   the view must converge, and the maintenance oracle (``pvm.bench.three_sources``) must
   hold for every watermark and for the live databases. With ``--crash`` (the default,
   when log capture is measured) a third run, with log capture, SIGKILLs and restarts the
   log-captured wrappers and then restarts the manager while the writers run
   (``three_sources.crash_and_restart``), and must pass the same checks. It is not in the
   freshness ratios: the restarts stall the view, which would then not compare with the
   trigger run at the same rate.

   Freshness runs in ``--freshness-rounds`` rounds, each running both methods, the order
   alternating from round to round (trigger first, then log first, ...): a run's freshness
   over some sixty markers moves by tens of percent from run to run on a shared machine,
   and whichever runs second meets a warmer (or busier) machine. Each method's figures pool
   its markers over the rounds; the ratio is given pooled and per round.

``--method`` restricts both parts to one method. The servers default to the development
ones; every part works in its own scratch schema (PostgreSQL) and database (MariaDB),
dropped at its end together with any slot and publication log capture made there.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from pvm.bench.capture_load import MARKERS, LoadProcess
from pvm.bench.spark_deployment import quantile, write_figures
from pvm.cli import CliError

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MARIADB_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
METHODS = ("trigger", "log")  # measured against "none"; --method both measures them side by side
# The anchors: join partners of the markers (capture_load.MARKERS), rows no random writer touches.
ANCHORS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "pg": [("s", {"id": 900, "b": 77, "c": 77}), ("t", {"id": 900, "c": 77, "d": "d1"})],
    "my": [("r", {"id": 901, "b": 78, "note": "n-anchor"}), ("t", {"id": 901, "c": 78, "d": "d1"})],
    "lite": [("r", {"id": 902, "b": 79, "note": "n-anchor"}), ("s", {"id": 902, "b": 79, "c": 79})],
}
SLOT_RELEASE_SECONDS = 30.0  # a stopped wrapper's backend may finish a read before the slot is free


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pg-url", default=PG_URL, help=f"PostgreSQL server to use (default: {PG_URL})")
    parser.add_argument("--mariadb-url", default=MARIADB_URL, help=f"MariaDB server to use (default: {MARIADB_URL})")
    parser.add_argument(
        "--transactions", type=int, default=5000,
        help="write cost: transactions per run (default: 5000, 3-5 s on the development machine)",
    )  # fmt: skip
    parser.add_argument("--statements", type=int, default=4, help="write cost: statements per transaction (default: 4)")
    parser.add_argument("--connections", type=int, default=4, help="write cost: concurrent connections (default: 4)")
    parser.add_argument("--rows", type=int, default=5000, help="write cost: rows in the table (default: 5000)")
    parser.add_argument(
        "--rounds", type=int, default=5, help="write cost: rounds, each running every method once (default: 5)"
    )
    parser.add_argument(
        "--view-transactions", type=int, default=500, help="freshness: random source transactions (default: 500)"
    )
    parser.add_argument(
        "--marker-interval", type=float, default=0.05, help="freshness: seconds between markers (default: 0.05)"
    )
    parser.add_argument(
        "--freshness-rounds", type=int, default=3,
        help="freshness: rounds, each running every method once, the order alternating (default: 3)",
    )  # fmt: skip
    parser.add_argument(
        "--method", choices=["both", *METHODS], default="both",
        help="the capture methods measured against none and against each other (default: both)",
    )  # fmt: skip
    parser.add_argument(
        "--crash", action=argparse.BooleanOptionalAction, default=True,
        help="freshness: one more log capture run in which every log-captured wrapper is killed and started again, "
        "then the manager, while the writers run; the oracle must hold there too (default: on, with log capture)",
    )  # fmt: skip
    parser.add_argument("--skip-write-cost", action="store_true", help="measure freshness only")
    parser.add_argument("--skip-freshness", action="store_true", help="measure the write cost only")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here, and a PNG plot next to them")
    parser.add_argument("--seed", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    from pvm.bench import capture_report, capture_write

    counts = (args.transactions, args.statements, args.connections, args.rows, args.rounds, args.view_transactions)
    if min(*counts, args.freshness_rounds) < 1:
        raise CliError(
            "--transactions, --statements, --connections, --rows, --rounds, --view-transactions and "
            "--freshness-rounds must be >= 1"
        )
    if not args.marker_interval > 0:
        raise CliError("--marker-interval must be > 0")
    if args.skip_write_cost and args.skip_freshness:
        raise CliError("--skip-write-cost and --skip-freshness leave nothing to measure")
    methods = METHODS if args.method == "both" else (args.method,)
    results: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items() if not k.startswith("_")}}
    if not args.skip_write_cost:
        capture_write.check_binlog_control(args.mariadb_url)
        with scratch_sources(args.pg_url, args.mariadb_url) as (pg, my):
            results["write_cost"] = {
                name: capture_write.write_cost(url, methods, args)
                for name, url in (("postgresql", pg), ("mariadb", my))
            }
        capture_report.print_write_cost(results["write_cost"])
    if not args.skip_freshness:
        by_round: list[dict[str, dict[str, Any]]] = []
        for number in range(args.freshness_rounds):
            round_runs: dict[str, dict[str, Any]] = {}
            for method in methods if number % 2 == 0 else methods[::-1]:
                with scratch_sources(args.pg_url, args.mariadb_url) as (pg, my):
                    round_runs[method] = asyncio.run(freshness(pg, my, method, args))
                capture_report.print_freshness_run(method, round_runs[method], f"round {number + 1}: ")
            by_round.append(round_runs)
        runs = {method: pooled([r[method] for r in by_round]) for method in methods}
        results["freshness"] = {"runs": runs, "by_round": by_round}
        if len(runs) == 2:
            for method, run in runs.items():
                capture_report.print_freshness_run(method, run, f"{len(by_round)} round(s) pooled: ")
            results["freshness"]["ratio_log_to_trigger"] = freshness_ratios(runs["trigger"], runs["log"])
            results["freshness"]["ratio_log_to_trigger_by_round"] = [
                freshness_ratios(r["trigger"], r["log"]) for r in by_round
            ]
            capture_report.print_freshness_ratios(
                results["freshness"]["ratio_log_to_trigger"], results["freshness"]["ratio_log_to_trigger_by_round"]
            )
        if args.crash and "log" in methods:
            with scratch_sources(args.pg_url, args.mariadb_url) as (pg, my):
                results["freshness"]["with_restarts"] = asyncio.run(freshness(pg, my, "log", args, crash=True))
            capture_report.print_freshness_run("log", results["freshness"]["with_restarts"])
    write_figures(args.json, results, capture_report.plot)
    return 0


# -- scratch space on the servers ----------------------------------------------------------------
def scratch_name() -> str:
    return f"pvm_bench_{uuid.uuid4().hex[:10]}"


@contextmanager
def scratch_sources(pg_admin: str, my_admin: str) -> Iterator[tuple[str, str]]:
    """URLs of a fresh PostgreSQL schema and MariaDB database, dropped afterwards together
    with the slot and publication log capture may have made for the schema."""
    name = scratch_name()
    engines = [sa.create_engine(u, isolation_level="AUTOCOMMIT") for u in (pg_admin, my_admin)]
    try:
        for engine, ddl in zip(engines, (f"CREATE SCHEMA {name}", f"CREATE DATABASE {name} CHARACTER SET utf8mb4")):
            with engine.connect() as conn:
                conn.exec_driver_sql(ddl)
    except sa.exc.DBAPIError as exc:
        raise CliError(f"cannot prepare the benchmark's scratch space: {exc.orig}") from exc
    pg = sa.make_url(pg_admin).update_query_dict({"options": f"-csearch_path={name}"})
    my = sa.make_url(my_admin).set(database=name)
    pg_url = pg.render_as_string(hide_password=False)
    try:
        yield pg_url, my.render_as_string(hide_password=False)
    finally:
        try:
            release_log_capture(pg_url)
        finally:
            drops = (f"DROP SCHEMA IF EXISTS {name} CASCADE", f"DROP DATABASE IF EXISTS {name}")
            for engine, ddl in zip(engines, drops):
                with engine.connect() as conn:
                    conn.exec_driver_sql(ddl)
                engine.dispose()


def release_log_capture(pg_url: str) -> None:
    """Drop the publication and slot of log capture in the schema of ``pg_url``, if any: an
    abandoned slot would retain the server's WAL for good. Waits for a stopped wrapper's
    backend to let go of the slot."""
    from wrappers.capture import CaptureConfig, log_slot, uninstall_log
    from wrappers.errors import WrapperError

    engine = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    try:
        slot = log_slot(CaptureConfig("log"), engine)
        deadline = time.monotonic() + SLOT_RELEASE_SECONDS
        with engine.connect() as conn:
            tables: list[str] = list(
                conn.execute(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")).scalars()
            )
            active = sa.text("SELECT active_pid FROM pg_replication_slots WHERE slot_name = :s")
            while conn.execute(active, {"s": slot}).scalar() is not None and time.monotonic() < deadline:
                time.sleep(0.2)
        try:
            uninstall_log(CaptureConfig("log"), engine, tables)
        except WrapperError as exc:
            raise CliError(f"{exc}; drop replication slot {slot} by hand, or it retains the server's WAL") from exc
    finally:
        engine.dispose()


# -- 2. freshness and convergence of a view over three databases --------------------------------
async def freshness(pg: str, my: str, method: str, args: argparse.Namespace, *, crash: bool = False) -> dict[str, Any]:
    """One run of the view with PostgreSQL and MariaDB captured by ``method`` (SQLite by
    triggers); with ``crash``, the log-captured wrappers and then the manager are restarted
    while the writers run (``three_sources.crash_and_restart``)."""
    from pvm.bench import three_sources as scenario
    from pvm.local_deployment import LocalDeployment
    from warehouse.counters import ViewCounters
    from warehouse.recompute import recompute

    capture = {"pg": method, "my": method, "lite": "trigger"}
    with tempfile.TemporaryDirectory(prefix="pvm-bench-capture-") as tmp:
        data = Path(tmp)
        urls = {"pg": pg, "my": my, "lite": scenario.sqlite_file(data / "lite.db")}
        scenario.create(urls, random.Random(args.seed))
        add_anchors(urls)
        initial = scenario.read_live(urls)
        deployment = await LocalDeployment(data).__aenter__()
        try:
            wrappers = scenario.WrapperSet(deployment)
            for source, url in urls.items():
                await wrappers.add(
                    source, url, [scenario.TABLES[source][0]], capture[source],
                    capture_args=["--capture", capture[source]],
                )  # fmt: skip
            await deployment.manager.define_view(scenario.VIEW, "v", parallelism=4)
            await deployment.manager.wait_idle("v", timeout=120)
            crashing = [source for source, m in capture.items() if m == "log"] if crash else []
            load = LoadProcess(
                urls, transactions=args.view_transactions, connections=2, seed=args.seed, pause=0.05,
                marker_interval=args.marker_interval, until=bool(crashing),  # with restarts: until the manager is back
            )  # fmt: skip
            await asyncio.to_thread(load.start)
            started = load.started_at or time.perf_counter()
            commits = load.commits

            async def restart() -> scenario.Restarted:
                try:
                    return await scenario.crash_and_restart(deployment, wrappers, crashing, "v", 0.5)
                finally:
                    load.release()

            restarting = asyncio.create_task(restart()) if crashing else None
            try:
                seen = await watch_markers(
                    lambda: deployment.manager,
                    lambda _: load.writers_done and (restarting is None or restarting.done()),
                    commits, {}, restarting,
                )  # fmt: skip
            finally:
                await asyncio.to_thread(load.finish)
            writing_seconds = time.perf_counter() - started
            before: list[ViewCounters] = []
            restarts: dict[str, Any] | None = None
            if restarting is not None:
                restarted = restarting.result()
                deployment = restarted.deployment
                before.append(restarted.counters)
                restarts = {"wrappers": restarted.wrappers, "manager": 1}
            if load.errors:
                raise CliError(f"a writer failed: {load.errors[0]}")
            seen = await watch_markers(
                lambda: deployment.manager, lambda found: len(found) >= len(commits), commits, seen
            )
            await deployment.wait_shipped(timeout=300)
            manager = deployment.manager
            await manager.wait_idle("v", timeout=600)
            converged = time.perf_counter() - started - writing_seconds
            maintainer = manager.view("v").maintainer
            if maintainer.failed:
                raise CliError(f"maintenance failed ({method} capture): {maintainer.failed}")
            checked = await scenario.check_oracle(manager, "v", initial)
            live = recompute(manager.view("v").plan, scenario.read_live(urls), scenario.COLUMNS)
            if manager.read("v") != live:
                raise CliError(f"the view does not equal recomputation over the live sources ({method} capture)")
        finally:
            await deployment.__aexit__(None, None, None)
    counters = [*before, maintainer.counters]
    lags = {source: sorted(seen[(s, k)] - t for s, k, t in commits if s == source) for source in MARKERS}
    run: dict[str, Any] = {
        "capture": capture,
        "source_transactions_committed": sum(load.committed),
        "source_transactions_per_second": sum(load.committed) / writing_seconds,
        "marker_transactions": len(commits),
        "writing_seconds": writing_seconds,
        "converged_seconds_after_writers": converged,
        "watermarks_checked_by_oracle": checked,
        "oracle": "passed",
        "compensations": sum(c.compensations for c in counters),
        # the watermark waits for subqueries: their time per source shows where a slower view waits
        "subqueries": subquery_times(counters),
        "freshness_seconds": lag_quantiles(lags),
        "lags_seconds": {source: v for source, v in lags.items() if v},
    }
    if restarts is not None:
        run["restarts"] = restarts
    return run


def lag_quantiles(lags: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """p50, p95 and max of each source's sorted marker lags (sources without any left out)."""
    return {
        source: {"p50": quantile(v, 0.5), "p95": quantile(v, 0.95), "max": max(v)} for source, v in lags.items() if v
    }


def pooled(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One method's runs (of the rounds) as one: counts added, rates over the time written,
    subqueries' means weighted by their numbers, freshness over every marker of every run."""
    lags: dict[str, list[float]] = {}
    for run in runs:
        for source, values in run["lags_seconds"].items():
            lags.setdefault(source, []).extend(values)
    lags = {source: sorted(values) for source, values in lags.items()}
    count: dict[str, int] = {}
    total: dict[str, float] = {}
    for run in runs:
        for source, sub in run["subqueries"].items():
            count[source] = count.get(source, 0) + sub["count"]
            total[source] = total.get(source, 0.0) + sub["count"] * sub["mean_seconds"]
    committed = sum(run["source_transactions_committed"] for run in runs)
    writing = sum(run["writing_seconds"] for run in runs)
    return {
        "capture": runs[0]["capture"],
        "source_transactions_committed": committed,
        "source_transactions_per_second": committed / writing,
        "marker_transactions": sum(run["marker_transactions"] for run in runs),
        "writing_seconds": writing,
        "converged_seconds_after_writers": max(run["converged_seconds_after_writers"] for run in runs),
        "watermarks_checked_by_oracle": sum(run["watermarks_checked_by_oracle"] for run in runs),
        "oracle": "passed",
        "compensations": sum(run["compensations"] for run in runs),
        "subqueries": {s: {"count": count[s], "mean_seconds": total[s] / count[s]} for s in sorted(count) if count[s]},
        "freshness_seconds": lag_quantiles(lags),
        "lags_seconds": lags,
    }


def subquery_times(counters: Sequence[Any]) -> dict[str, dict[str, float]]:
    """Number and mean seconds of the subqueries per source, over the counters of every
    manager of a run (they restart with the manager)."""
    count: dict[str, int] = {}
    total: dict[str, float] = {}
    for c in counters:
        for source, histogram in c.subquery_seconds.items():
            count[source] = count.get(source, 0) + histogram.count
            total[source] = total.get(source, 0.0) + histogram.total
    return {source: {"count": count[source], "mean_seconds": total[source] / count[source]} for source in sorted(count)}


def freshness_ratios(trigger: dict[str, Any], log: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per source seen in both runs, log capture's freshness percentiles over trigger capture's."""
    before, after = trigger["freshness_seconds"], log["freshness_seconds"]
    return {
        source: {q: after[source][q] / before[source][q] for q in ("p50", "p95", "max")}
        for source in before
        if source in after
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


async def watch_markers(
    manager: Callable[[], Any],
    done: Callable[[dict], bool],
    commits: list,
    seen: dict[tuple[str, int], float],
    beside: asyncio.Task[Any] | None = None,
) -> dict[tuple[str, int], float]:
    """``seen`` plus when each further committed marker first shows in the view of the
    current ``manager()``, reading it every 20 ms until ``done(seen so far)`` (or until
    ``beside``, a task running meanwhile, fails)."""
    seen = dict(seen)
    deadline = time.monotonic() + 600
    while not done(seen):
        if time.monotonic() > deadline:
            raise CliError("markers did not reach the view within 10 minutes")
        if beside is not None and beside.done() and beside.exception() is not None:
            beside.result()
        view = manager().read("v")
        now = time.perf_counter()
        present = {row[column] for row, _ in view.items() for column in (0, 3, 5)}
        for source, key, _ in list(commits):
            if (source, key) not in seen and key in present:
                seen[(source, key)] = now
        await asyncio.sleep(0.02)
    return seen
