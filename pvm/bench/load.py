"""``pvm bench load``: materializing a view over large relations, against Spark over JDBC.

For each ``--rows`` N, three sources of N rows each, PostgreSQL, MariaDB and SQLite, each
behind its wrapper process with trigger capture, and a three-way join view over them
(``pvm.bench.three_sources.VIEW``, keys chosen so the join has about N rows):

* **pvm**: the view defined in the Spark store, from ``define`` to active (the initial
  load in Spark: relation snapshots streamed from the wrappers as Arrow, staged as
  Parquet, joined by Spark; ``warehouse.engine_load``), with the manager's peak RSS,
  sampled every 50 ms while it runs (the manager is this process; Spark's JVM is
  another);
* **jdbc**: what a Spark user would run instead: the three tables read by Spark over JDBC
  (Debian's drivers, passed with ``spark.jars``) and the view's SQL over them, written as
  Parquet. It is skipped, with the reason, when the drivers are missing (``bash
  scripts/setup.sh`` installs them) or the Spark session was started without them.

With ``--update-rows U``, each size then maintains one large source transaction, twice,
side by side: PostgreSQL's ``UPDATE`` of U rows of ``r`` (each a delete and an insert of the
view's delta), maintained **in parts** (``warehouse.unit_parts``: the unit sweeps at most
``PART_ROWS`` delta rows at once and stores each part's effect as it goes), then the same
rows changed back and maintained **whole** (parts switched off). For each: the seconds from
the source's commit until W covers it, and the manager's RSS peak above its level when the
transaction began. In parts runs first, so that what the whole run leaves allocated cannot
hide its peak.

Before the measured sizes, both paths run once at ``--warm-up`` rows (reported apart): the
session's first Spark jobs run before the JIT has compiled them, a cost of the process's
first minutes, not of a view, which would otherwise fall on whichever path runs first.

Goals (measured, not tested): at 1,000,000 rows the view materializes in at most 1.5 times
the JDBC recompute's time, and the manager stays under 1 GiB RSS at every N.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from pvm.bench.process_memory import rss_peaks
from pvm.bench.spark_deployment import measured, write_figures
from pvm.cli import CliError

DEFAULT_ROWS = "10000,100000,1000000"
DEFAULT_WARM_UP = 10_000
JARS = ("postgresql.jar", "mariadb-java-client.jar", "sqlite-jdbc.jar")
JAR_DIR = Path("/usr/share/java")
DRIVERS = {"pg": "org.postgresql.Driver", "my": "org.mariadb.jdbc.Driver", "lite": "org.sqlite.JDBC"}
GOALS = {"time_vs_jdbc": 1.5, "manager_rss_mib": 1024}
INSERT_CHUNK = 20_000


def configure(parser: argparse.ArgumentParser) -> None:
    from pvm.bench.capture import MARIADB_URL, PG_URL

    parser.add_argument(
        "--rows", default=DEFAULT_ROWS, help=f"rows per source, comma-separated sizes (default: {DEFAULT_ROWS})"
    )
    parser.add_argument("--pg-url", default=PG_URL, help=f"PostgreSQL server to use (default: {PG_URL})")
    parser.add_argument("--mariadb-url", default=MARIADB_URL, help=f"MariaDB server to use (default: {MARIADB_URL})")
    parser.add_argument("--skip-jdbc", action="store_true", help="measure the view's load only")
    parser.add_argument(
        "--update-rows",
        type=int,
        default=0,
        metavar="ROWS",
        help="after each load, one source transaction changing this many rows, maintained in parts "
        "and then whole, side by side (default: 0, none)",
    )
    parser.add_argument(
        "--warm-up",
        type=int,
        default=DEFAULT_WARM_UP,
        metavar="ROWS",
        help="rows per source of one unmeasured round of both paths first, so that neither measured "
        f"path pays the JVM's first-use costs (default: {DEFAULT_WARM_UP:,}; 0: none)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where sources, catalog and Spark files go (default: a temporary directory)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here, and a PNG plot beside")
    parser.add_argument("--seed", type=int, default=1)


def sizes(text: str) -> list[int]:
    """``--rows``: positive sizes.

    >>> sizes("10,1000"), sizes(" 5 ")
    ([10, 1000], [5])
    """
    try:
        out = [int(part) for part in text.split(",")]
    except ValueError:
        raise CliError(f"--rows takes comma-separated row counts, not {text!r}") from None
    if not out or min(out) < 1:
        raise CliError("--rows: every size must be at least 1")
    return out


def run(args: argparse.Namespace) -> int:
    args.sizes = sizes(args.rows)
    if args.warm_up < 0:
        raise CliError("--warm-up takes a row count, 0 for none")
    if args.update_rows < 0:
        raise CliError("--update-rows takes a row count, 0 for none")
    figures = measured(args, "pvm-bench-load-", measure)
    report(figures)
    write_figures(args.json, figures, plot)
    return 0


def jars() -> list[Path]:
    return [JAR_DIR / jar for jar in JARS if (JAR_DIR / jar).exists()]


def measure(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    from rich.console import Console

    from pvm.local_deployment import catalog_url
    from pvm.serve import open_store

    console = Console(stderr=True)
    drivers = jars()
    with console.status("starting Spark"):
        conf = {"spark.jars": ",".join(map(str, drivers))} if drivers else None
        store = open_store("spark", data_dir, None, catalog_url(data_dir), spark_conf=conf)
    figures: dict[str, Any] = {"machine": {"cores": os.cpu_count()}, "goals": GOALS}
    if args.warm_up:
        # the session's first scans, joins and writes run before the JIT has compiled them
        # (5-23 s for a job that takes 5-8 s warm): a one-time cost of the process, not of a
        # view, which the path measured first would pay alone
        warm_dir = data_dir / "warm-up"
        warm_dir.mkdir(parents=True, exist_ok=True)
        figures["warm_up"] = asyncio.run(one_size(args, args.warm_up, warm_dir, store, console))
    runs = []
    for n in args.sizes:
        run_dir = data_dir / f"rows-{n}"
        run_dir.mkdir(parents=True, exist_ok=True)
        runs.append(asyncio.run(one_size(args, n, run_dir, store, console, min(args.update_rows, n))))
    figures["runs"] = runs
    return figures


async def one_size(
    args: argparse.Namespace, n: int, run_dir: Path, store: Any, console: Any, update_rows: int = 0
) -> dict[str, Any]:
    """Load the view over ``n`` rows per source (and maintain ``update_rows`` changed
    rows, in parts and whole), then recompute it over JDBC."""
    from pvm.bench.capture import scratch_sources
    from pvm.bench.three_sources import sqlite_file

    with scratch_sources(args.pg_url, args.mariadb_url) as (pg, my):
        urls = {"pg": pg, "my": my, "lite": sqlite_file(run_dir / "lite.db")}
        with console.status(f"{n:,} rows per source: filling PostgreSQL, MariaDB and SQLite"):
            for source, url in urls.items():
                await asyncio.to_thread(populate, source, url, n, random.Random(f"{args.seed}-{source}"))
        figures: dict[str, Any] = {"rows": n, "pvm": await load_view(urls, run_dir, store, console, n, update_rows)}
        if not args.skip_jdbc:
            with console.status(f"{n:,} rows per source: the same view in Spark over JDBC"):
                figures["jdbc"] = await asyncio.to_thread(jdbc_recompute, store.spark, urls, run_dir / "jdbc")
        return figures


def rows_of(table: str, n: int, rng: random.Random) -> Iterator[tuple[Any, ...]]:
    """Rows whose join keys match one to one (``b`` and ``c`` follow ``id``), so the view has
    about as many rows as the sources less what its local predicates leave out."""
    for i in range(1, n + 1):
        if table == "r":
            yield (i, i, rng.choice(("n1", "n2", "x")))
        elif table == "s":
            yield (i, i, i)
        else:
            yield (i, i, rng.choice(("d1", "d2", "hidden")))


JOIN_INDEXES = {"r": ("b",), "s": ("b", "c"), "t": ("c",)}
"""The view's join columns, indexed as a data engineer would for incremental maintenance: a
change's subqueries look rows up by them (the initial load scans whole tables anyway)."""


def populate(source: str, url: str, n: int, rng: random.Random) -> None:
    """The source's table of the view with ``n`` rows, inserted in chunks (the benchmark's own
    memory stays flat), then its join columns indexed."""
    from pvm.bench.three_sources import TABLES

    table, ddl, columns = TABLES[source]
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(ddl)
        insert = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
        if source == "lite":
            insert = insert.replace("%s", "?")
        rows = rows_of(table, n, rng)
        while chunk := [row for _, row in zip(range(INSERT_CHUNK), rows)]:
            with engine.begin() as conn:
                conn.exec_driver_sql(insert, chunk)
        with engine.begin() as conn:
            for column in JOIN_INDEXES[table]:
                conn.exec_driver_sql(f"CREATE INDEX {table}_{column} ON {table} ({column})")
    finally:
        engine.dispose()


async def load_view(
    urls: dict[str, str], run_dir: Path, store: Any, console: Any, n: int, update_rows: int = 0
) -> dict[str, Any]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from pvm.bench.three_sources import TABLES, VIEW, WrapperSet
    from pvm.local_deployment import LocalDeployment, side_by_side

    async with LocalDeployment(run_dir, store) as deployment:
        wrappers = WrapperSet(deployment)
        await side_by_side(
            *(wrappers.add(source, url, [TABLES[source][0]], capture="trigger") for source, url in urls.items())
        )
        manager = deployment.manager
        name = f"load_{n}"
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeElapsedColumn(),
        )
        with (
            Progress(*columns, console=console, transient=True) as progress,
            rss_peaks({"manager": os.getpid()}, 0.05) as peaks,
        ):
            task = progress.add_task(f"{n:,} rows per source: loading the view", total=100)
            started = time.perf_counter()
            await manager.define_view(VIEW, name)
            seen = {"defined": time.perf_counter()}  # when each phase was first seen
            while manager.view(name).info.state == "initializing" and manager.view(name).maintainer.failed is None:
                status = manager.status(name)
                load = status.get("load") or {}
                phase = load.get("phase", "committing" if "staging" in seen else "starting")
                seen.setdefault(phase, time.perf_counter())
                progress.update(
                    task,
                    completed=load.get("percent", 0.0),
                    description=f"{n:,} rows per source: {load.get('phase', 'loading')}, "
                    f"{load.get('rows_staged', 0):,} rows staged",
                )
                await asyncio.sleep(0.1)
            seconds = time.perf_counter() - started
            seen["active"] = time.perf_counter()
        handle = manager.view(name)
        if handle.maintainer.failed is not None:
            raise CliError(f"the view failed to load: {handle.maintainer.failed}")
        engine = handle.maintainer.view_change.initial_load is not None
        rows = await asyncio.to_thread(row_count, store, name)
        update: dict[str, Any] = {}
        if update_rows:
            for way in ("parts", "whole"):
                with console.status(f"{n:,} rows per source: one transaction of {update_rows:,} rows, {way}"):
                    update[way] = await large_update(manager, name, urls["pg"], update_rows, way == "parts")
        await manager.drop_view(name)
    return {
        **({"update": {"rows": update_rows, **update}} if update else {}),
        "seconds": round(seconds, 3),
        "rows_per_s": round(3 * n / seconds, 1),
        "view_rows": rows,
        "manager_rss_start_mib": peaks["manager"]["start_mib"],
        "manager_rss_peak_mib": peaks["manager"]["peak_mib"],
        "engine_load": engine,
        # seconds from define to the first sight of each phase (polled every 0.1 s)
        "phases": {phase: round(at - started, 2) for phase, at in seen.items()},
    }


async def large_update(manager: Any, view: str, pg_url: str, rows: int, in_parts: bool) -> dict[str, Any]:
    """One PostgreSQL transaction flipping ``note`` of ``rows`` rows of ``r`` (each a
    delete and an insert of the view's delta), maintained with units in parts or whole:
    the seconds from its commit until the view's W covers it, and the manager's RSS."""
    handle = manager.view(view)
    await manager.wait_idle(view, timeout=3600)
    received = handle.maintainer.counters.updates_received
    saved = handle.maintainer.view_change.part_rows
    handle.set_part_rows(saved if in_parts else 2**62)
    parts_before = handle.maintainer.counters.unit_parts
    try:
        with rss_peaks({"manager": os.getpid()}, 0.05) as peaks:
            started = time.perf_counter()
            await asyncio.to_thread(flip_notes, pg_url, rows)
            deadline = time.monotonic() + 600
            while handle.maintainer.counters.updates_received == received:  # captured and shipped
                if time.monotonic() > deadline:
                    raise CliError(f"the transaction of {rows:,} rows did not reach the view in 10 minutes")
                await asyncio.sleep(0.05)
            await manager.wait_idle(view, timeout=3600)
            seconds = time.perf_counter() - started
    finally:
        handle.set_part_rows(saved)
    if handle.maintainer.failed is not None:
        raise CliError(f"the view failed to maintain the update: {handle.maintainer.failed}")
    return {
        "seconds": round(seconds, 3),
        "parts": handle.maintainer.counters.unit_parts - parts_before,
        "manager_rss_start_mib": peaks["manager"]["start_mib"],
        "manager_rss_peak_mib": peaks["manager"]["peak_mib"],
        "manager_rss_growth_mib": peaks["manager"]["growth_mib"],
    }


def flip_notes(url: str, rows: int) -> None:
    """``note`` of the first ``rows`` rows of ``r`` between 'n1' and 'n2', in one transaction."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE r SET note = CASE WHEN note = 'n1' THEN 'n2' ELSE 'n1' END WHERE id <= %s", (rows,)
            )
    finally:
        engine.dispose()


def row_count(store: Any, view: str) -> int:
    """Rows of the view (its weights summed), counted by Spark: the view is never collected
    into this process."""
    tables = (store.base_table(view), store.zlog_table(view))
    total = store.spark.sql(" UNION ALL ".join(f"SELECT _w FROM {t}" for t in tables)).agg({"_w": "sum"})
    return int(total.collect()[0][0] or 0)


def jdbc_url(url: str) -> str:
    """A SQLAlchemy URL of the benchmark's sources as a JDBC URL.

    >>> jdbc_url("postgresql+psycopg://postgres@127.0.0.1:5432/test?options=-csearch_path%3Dx")
    'jdbc:postgresql://127.0.0.1:5432/test?currentSchema=x&user=postgres'
    >>> jdbc_url("mysql+pymysql://root@127.0.0.1:3306/db"), jdbc_url("sqlite:////tmp/a.db")
    ('jdbc:mysql://127.0.0.1:3306/db?permitMysqlScheme&user=root', 'jdbc:sqlite:/tmp/a.db')
    """
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return f"jdbc:sqlite:{parsed.database}"
    user = f"user={parsed.username}" + (f"&password={parsed.password}" if parsed.password else "")
    if parsed.get_backend_name() == "postgresql":
        options = str(parsed.query.get("options", ""))
        schema = options.split("search_path=", 1)[1] if "search_path=" in options else "public"
        return f"jdbc:postgresql://{parsed.host}:{parsed.port or 5432}/{parsed.database}?currentSchema={schema}&{user}"
    # the mysql scheme: Spark quotes names for MySQL only there (its default dialect's double
    # quotes are string literals to MariaDB); Connector/J takes it with permitMysqlScheme
    return f"jdbc:mysql://{parsed.host}:{parsed.port or 3306}/{parsed.database}?permitMysqlScheme&{user}"


def jdbc_recompute(spark: Any, urls: dict[str, str], out: Path) -> dict[str, Any]:
    """The view recomputed by Spark from the three sources over JDBC, written as Parquet; or
    why it could not be."""
    from pvm.bench.three_sources import TABLES, VIEW

    missing = [jar for jar in JARS if not (JAR_DIR / jar).exists()]
    if missing:
        return {"skipped": f"JDBC drivers missing in {JAR_DIR}: {', '.join(missing)} (bash scripts/setup.sh)"}
    loaded = spark.sparkContext.getConf().get("spark.jars", "")
    if not all(jar in loaded for jar in JARS):
        return {"skipped": "the Spark session was started without the JDBC drivers in spark.jars"}
    started = time.perf_counter()
    try:
        for source, url in urls.items():
            table = TABLES[source][0]
            reader = spark.read.format("jdbc").option("url", jdbc_url(url)).option("driver", DRIVERS[source])
            reader.option("dbtable", table).load().createOrReplaceTempView(f"bench_jdbc_{table}")
        sql = VIEW
        for source, (table, _, _) in TABLES.items():
            sql = sql.replace(f"{source}.{table}", f"bench_jdbc_{table} {table}")
        spark.sql(sql).write.mode("overwrite").parquet(str(out))
    except Exception as exc:  # the load's figures are kept; the failure is reported with them
        return {"skipped": f"Spark over JDBC failed: {' '.join(str(exc).split())[:300]}"}
    seconds = time.perf_counter() - started
    rows = spark.read.parquet(str(out)).count()
    return {"seconds": round(seconds, 3), "view_rows": rows}


def report(figures: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="materializing a 3-source view in Spark")
    for column in ("rows/source", "view rows", "pvm s", "rows/s", "manager RSS peak", "JDBC s", "pvm/JDBC"):
        table.add_column(column, justify="right")
    for run in figures["runs"]:
        pvm, jdbc = run["pvm"], run.get("jdbc", {})
        ratio = f"{pvm['seconds'] / jdbc['seconds']:.2f}" if "seconds" in jdbc else "-"
        table.add_row(
            f"{run['rows']:,}",
            f"{pvm['view_rows']:,}",
            f"{pvm['seconds']:.2f}",
            f"{pvm['rows_per_s']:,.0f}",
            f"{pvm['manager_rss_peak_mib']:.0f} MiB",
            f"{jdbc['seconds']:.2f}" if "seconds" in jdbc else jdbc.get("skipped", "-")[:40],
            ratio,
        )
    console = Console()
    console.print(table)
    updated = [run for run in figures["runs"] if "update" in run["pvm"]]
    if updated:
        table = Table(title="one large source transaction, maintained in parts and whole")
        for column in ("rows/source", "rows changed", "parts", "in parts s", "whole s", "RSS growth parts", "whole"):
            table.add_column(column, justify="right")
        for run in updated:
            update = run["pvm"]["update"]
            parts, whole = update["parts"], update["whole"]
            table.add_row(
                f"{run['rows']:,}",
                f"{update['rows']:,}",
                f"{parts['parts']}",
                f"{parts['seconds']:.2f}",
                f"{whole['seconds']:.2f}",
                f"{parts['manager_rss_growth_mib']:.0f} MiB",
                f"{whole['manager_rss_growth_mib']:.0f} MiB",
            )
        console.print(table)
    if warm := figures.get("warm_up"):
        jdbc = warm.get("jdbc", {})
        console.print(
            f"warm-up, not in the table: {warm['rows']:,} rows per source, pvm {warm['pvm']['seconds']:.2f} s"
            + (f", JDBC {jdbc['seconds']:.2f} s" if "seconds" in jdbc else "")
        )


def plot(figures: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = figures["runs"]
    n = [r["rows"] for r in runs]
    fig, (time_ax, rss_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    time_ax.plot(n, [r["pvm"]["seconds"] for r in runs], "o-", label="pvm: engine-side initial load")
    timed = [r for r in runs if "seconds" in r.get("jdbc", {})]
    if timed:
        time_ax.plot([r["rows"] for r in timed], [r["jdbc"]["seconds"] for r in timed], "s--", label="Spark over JDBC")
    time_ax.set(xscale="log", yscale="log", xlabel="rows per source", ylabel="seconds", title="time to materialize")
    time_ax.legend()
    rss_ax.plot(n, [r["pvm"]["manager_rss_peak_mib"] for r in runs], "o-", label="manager peak RSS")
    rss_ax.axhline(GOALS["manager_rss_mib"], color="grey", linestyle=":", label="goal: 1 GiB")
    rss_ax.set(xscale="log", xlabel="rows per source", ylabel="MiB", title="manager memory")
    rss_ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
