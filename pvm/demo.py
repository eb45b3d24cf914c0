"""``pvm demo``: the whole product on one machine, verified at the end.

Three SQLite databases play three independent sources (a shop's orders, a CRM's customers,
an inventory's products). Each gets a wrapper process with trigger capture; the manager
runs in this process and serves its HTTP API. A view joining the three, and an aggregate
view of sales per region over the same join, are defined while writers keep changing all
three sources; maintenance runs with PVM (parallel SWEEP with compensation), the aggregate
kept per group from the join's signed effects. Once the writers stop and everything is
maintained, both views are compared with a recomputation from the live sources. Exit
status 0 only if they are equal.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pvm.cli import CliError

VIEW_NAME = "order_details"
VIEW_SQL = (
    "CREATE VIEW order_details AS "
    "SELECT o.id AS order_id, c.name AS customer, c.region, p.name AS product, p.price, o.qty "
    "FROM shop.orders o, crm.customers c, inventory.products p "
    "WHERE o.customer_id = c.id AND o.product_id = p.id AND o.qty > 0 AND c.region <> 'internal'"
)
SUMMARY_NAME = "region_sales"
SUMMARY_SQL = (
    "CREATE VIEW region_sales AS "
    "SELECT c.region, COUNT(*) AS orders, SUM(o.qty) AS items, AVG(o.qty) AS mean_qty, "
    "MIN(p.price) AS cheapest, MAX(p.price) AS dearest "
    "FROM shop.orders o, crm.customers c, inventory.products p "
    "WHERE o.customer_id = c.id AND o.product_id = p.id AND o.qty > 0 "
    "GROUP BY c.region HAVING COUNT(*) > 0"
)
REGIONS = ["north", "south", "east", "west", "internal"]
SCHEMAS = {
    "shop": (
        "orders",
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, product_id INTEGER, qty INTEGER)",
    ),
    "crm": ("customers", "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, region TEXT)"),
    "inventory": ("products", "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, price REAL)"),
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where the sources and the catalog go (default: a new temporary directory)",
    )
    parser.add_argument(
        "--transactions", type=int, default=400, help="source transactions the writers commit (default: 400)"
    )
    parser.add_argument("--writers", type=int, default=3, help="concurrent writer threads (default: 3)")
    parser.add_argument(
        "--rate", type=float, default=100.0, help="source transactions per second, all writers together (default: 100)"
    )
    parser.add_argument("--parallelism", type=int, default=4, help="PPU size p of the view (default: 4)")
    parser.add_argument(
        "--query-delay-ms", type=float, default=5.0, help="extra cost of every subquery at the sources (default: 5)"
    )
    parser.add_argument(
        "--store",
        choices=["memory", "spark"],
        default="spark",
        help="view store: Spark tables, or in memory (default: spark)",
    )
    parser.add_argument("--seed", type=int, default=7, help="random seed of the data and the workload")
    parser.add_argument(
        "--serve",
        action="store_true",
        help="after the verification, keep the manager and the wrappers running to explore (Ctrl-C stops)",
    )
    parser.add_argument("--port", type=int, default=8000, help="with --serve: the manager's port (default: 8000)")


def run(args: argparse.Namespace) -> int:
    if args.transactions < 0 or args.writers < 1 or args.parallelism < 1 or args.rate <= 0:
        raise CliError("--transactions must be >= 0, --writers and --parallelism >= 1, --rate > 0")
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="pvm-demo-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(Demo(args, data_dir).run())


# -- the sources ---------------------------------------------------------------------------------
def empty_sources(data_dir: Path, prefix: str = "") -> dict[str, Path]:
    """Fresh SQLite databases for the shop, CRM and inventory sources (WAL: readers and the
    writers do not block each other)."""
    paths = {}
    for source, (_table, ddl) in SCHEMAS.items():
        path = data_dir / f"{prefix}{source}.db"
        path.unlink(missing_ok=True)
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(ddl)
        paths[source] = path
    return paths


def create_sources(data_dir: Path, rng: random.Random) -> dict[str, Path]:
    paths = empty_sources(data_dir)
    with sqlite3.connect(paths["crm"]) as db:
        db.executemany(
            "INSERT INTO customers VALUES (?, ?, ?)", [(i, f"customer-{i}", rng.choice(REGIONS)) for i in range(1, 201)]
        )
    with sqlite3.connect(paths["inventory"]) as db:
        db.executemany(
            "INSERT INTO products VALUES (?, ?, ?)",
            [(i, f"product-{i}", round(rng.uniform(1, 100), 2)) for i in range(1, 51)],
        )
    with sqlite3.connect(paths["shop"]) as db:
        db.executemany(
            "INSERT INTO orders VALUES (?, ?, ?, ?)",
            [(i, rng.randint(1, 200), rng.randint(1, 50), rng.randint(1, 5)) for i in range(1, 1001)],
        )
    return paths


def one_transaction(paths: dict[str, Path], rng: random.Random, next_id: list[int]) -> None:
    """One random source transaction: inserts, updates (key-preserving and not) and deletes."""
    source = rng.choice(["shop", "shop", "crm", "inventory"])
    with sqlite3.connect(paths[source], timeout=30) as db:
        if source == "shop":
            action = rng.random()
            if action < 0.45:
                next_id[0] += 1
                db.execute(
                    "INSERT INTO orders VALUES (?, ?, ?, ?)",
                    (next_id[0], rng.randint(1, 210), rng.randint(1, 55), rng.randint(0, 5)),
                )
            elif action < 0.75:
                db.execute("UPDATE orders SET qty = ? WHERE id = ?", (rng.randint(0, 5), rng.randint(1, next_id[0])))
            else:
                db.execute("DELETE FROM orders WHERE id = ?", (rng.randint(1, next_id[0]),))
        elif source == "crm":
            if rng.random() < 0.8:
                db.execute("UPDATE customers SET region = ? WHERE id = ?", (rng.choice(REGIONS), rng.randint(1, 210)))
            else:
                cid = rng.randint(201, 210)
                db.execute(
                    "INSERT INTO customers VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET region = excluded.region",
                    (cid, f"customer-{cid}", rng.choice(REGIONS)),
                )
        else:
            pid = rng.randint(1, 55)
            if rng.random() < 0.8:
                db.execute("UPDATE products SET price = ? WHERE id = ?", (round(rng.uniform(1, 100), 2), pid))
            else:
                db.execute(
                    "INSERT INTO products VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET price = excluded.price",
                    (pid, f"product-{pid}", round(rng.uniform(1, 100), 2)),
                )


def read_sources(paths: dict[str, Path]):
    from contract.zset import ZSet

    contents, columns = {}, {}
    for source, (table, _) in SCHEMAS.items():
        with sqlite3.connect(paths[source]) as db:
            cur = db.execute(f"SELECT * FROM {table}")  # fixed demo table names, no input
            columns[(source, table)] = tuple(d[0] for d in cur.description)
            contents[(source, table)] = ZSet.from_rows(cur.fetchall())
    return contents, columns


# -- the run -------------------------------------------------------------------------------------
@dataclass
class Progress:
    committed: int = 0
    done: bool = False
    started: float = field(default_factory=time.perf_counter)


class Demo:
    def __init__(self, args: argparse.Namespace, data_dir: Path) -> None:
        self.args = args
        self.data_dir = data_dir
        self.rng = random.Random(args.seed)

    async def run(self) -> int:
        import shutil

        import httpx
        from rich.console import Console

        from pvm.local_deployment import LocalDeployment, catalog_url
        from pvm.serve import open_store

        console = Console()
        console.print(f"[bold]pvm demo[/bold]: data in {self.data_dir}")
        paths = create_sources(self.data_dir, self.rng)
        (self.data_dir / "catalog.db").unlink(missing_ok=True)  # every demo starts afresh
        shutil.rmtree(self.data_dir / "spark", ignore_errors=True)
        shutil.rmtree(self.data_dir / "wrappers", ignore_errors=True)
        store = open_store(self.args.store, self.data_dir, None, catalog_url(self.data_dir))
        async with LocalDeployment(self.data_dir, store, port=self.args.port if self.args.serve else 0) as deployment:
            for source, (table, _) in SCHEMAS.items():
                await deployment.add_sqlite_source(
                    source, paths[source], [table], query_delay_ms=self.args.query_delay_ms, max_concurrent_queries=2
                )
            console.print(
                f"manager on {deployment.url}; wrappers: "
                + ", ".join(f"{name} {w.url}" for name, w in deployment.wrappers.items())
            )
            async with httpx.AsyncClient(base_url=deployment.url, timeout=60, headers=deployment.headers()) as api:
                progress = Progress()
                for sql in (VIEW_SQL, SUMMARY_SQL):
                    await _ok(api.post("/v1/views", json={"sql": sql, "parallelism": self.args.parallelism}))
                writers = self._start_writers(paths, progress)  # the initial load runs under these writes
                await self._watch(api, console, progress)
                for t in writers:
                    t.join()
                await deployment.wait_shipped()
                verified = 0
                for name, sql in ((VIEW_NAME, VIEW_SQL), (SUMMARY_NAME, SUMMARY_SQL)):
                    await deployment.manager.wait_idle(name, timeout=300)
                    status = (await api.get(f"/v1/views/{name}")).json()
                    verified |= await self._verify(api, console, paths, name, sql, status, progress)
            console.print(
                explore_commands(self.data_dir, deployment if self.args.serve else None),
                soft_wrap=True,
                highlight=False,
            )
            if self.args.serve:
                try:
                    await asyncio.Event().wait()  # until Ctrl-C
                finally:
                    console.print("stopping the wrappers and the manager")
            return verified

    def _start_writers(self, paths: dict[str, Path], progress: Progress) -> list[threading.Thread]:
        lock = threading.Lock()
        next_id = [1000]
        budget = [self.args.transactions]
        seeds = [self.rng.random() for _ in range(self.args.writers)]

        def writer(seed: float) -> None:
            rng = random.Random(seed)
            while True:
                with lock:
                    if budget[0] == 0:
                        return
                    budget[0] -= 1
                one_transaction(paths, rng, next_id)
                with lock:
                    progress.committed += 1
                time.sleep(rng.uniform(0, 2 * self.args.writers / self.args.rate))  # paced: ~rate tx/s

        threads = [threading.Thread(target=writer, args=(s,), daemon=True) for s in seeds]
        for t in threads:
            t.start()
        return threads

    async def _watch(self, api, console, progress: Progress) -> None:
        """A live display while the writers run and the view catches up."""
        from rich.live import Live

        with Live(console=console, refresh_per_second=8, transient=False) as live:
            while True:
                status = (await api.get(f"/v1/views/{VIEW_NAME}")).json()
                live.update(_status_table(status, progress, self.args.transactions, self.args.parallelism))
                if progress.committed >= self.args.transactions and status["idle"]:
                    return
                if status["state"] == "failed":
                    return
                await asyncio.sleep(0.15)

    async def _verify(self, api, console, paths, name: str, sql: str, status, progress: Progress) -> int:
        from rich.table import Table

        from contract.zset import ZSet
        from warehouse.recompute import recompute
        from warehouse.sql_views import parse_view

        if status["state"] == "failed":
            console.print(f"[red]view {name} failed[/red]: {status['error']}")
            return 1
        rows, offset = [], 0
        while True:
            page = (await api.get(f"/v1/views/{name}/rows", params={"offset": offset, "limit": 5000})).json()
            rows += page["rows"]
            offset += len(page["rows"])
            if offset >= page["total"]:
                break
        contents, columns = read_sources(paths)
        plan = parse_view(sql, lambda s, t: columns.get((s, t)))
        expected = recompute(plan, contents, columns)
        got = ZSet.from_rows(tuple(r) for r in rows)
        verified = got == expected
        table = Table(title=f"view {name}: first rows of {len(rows)}")
        for column in plan.view_names:
            table.add_column(column)
        for r in sorted(rows)[:8]:
            table.add_row(*(str(v) for v in r))
        console.print(table)
        c = status["counters"]
        elapsed = time.perf_counter() - progress.started
        console.print(
            f"{progress.committed} source transactions, {c['updates_received']} updates maintained in "
            f"{c['units_committed']} units, {c['subqueries']} subqueries, {c['compensations']} compensations, "
            f"watermark {status['watermark']}, {elapsed:.1f} s"
        )
        if verified:
            console.print(
                f"[green]verified[/green]: view {name} equals its recomputation from the live sources ({len(rows)} rows)"
            )
            return 0
        missing, extra = expected - got, got - expected
        console.print(f"[red]MISMATCH[/red] in view {name}: {len(missing)} rows missing, {len(extra)} rows extra")
        return 1


def _status_table(status: dict, progress: Progress, total: int, parallelism: int):
    from rich.table import Table

    c = status["counters"]
    t = Table(title="maintaining order_details (PVM)", show_header=False)
    t.add_row("source transactions committed", f"{progress.committed} / {total}")
    t.add_row("updates received / maintained", f"{c['updates_received']} / {c['units_committed']} units")
    t.add_row("watermark W", str(status["watermark"]))
    t.add_row(
        "queued (UMQ) / running (PPU)", f"{status['updates_queued']} / {status['units_running']} of {parallelism}"
    )
    t.add_row("compensations", str(c["compensations"]))
    t.add_row("lag behind the sources", f"{status.get('lag_updates', 0)} updates, {status['lag_seconds']:.2f} s")
    t.add_row("state", status["state"])
    return t


def explore_commands(data_dir: Path, deployment=None) -> str:
    """What to try next (rich markup): with a running deployment, ready-to-paste commands with
    its address and tokens; without one, how to get one."""
    url = deployment.url if deployment is not None else "http://127.0.0.1:8000"
    steps: list[tuple[str, str]] = []
    if deployment is None:
        steps.append(
            (
                "the same demo, then the manager and the wrappers stay up (Ctrl-C stops them) "
                "and it prints these commands with its tokens",
                "pvm demo --serve",
            )
        )
        token = "<the analyst token it prints>"
    else:
        token = deployment.analyst_token
    steps += [
        (
            "in another terminal, as an analyst (reads views, runs queries)",
            f"export PVM_MANAGER={url} PVM_TOKEN={token}",
        ),
        ("status, watermark W, lag, maintenance counters", f"pvm view show {VIEW_NAME}"),
        ("the view as of W: a state the sources really had", f"pvm view rows {VIEW_NAME} --limit 10"),
        ("the aggregate view, kept per region from the join's changes", f"pvm view rows {SUMMARY_NAME}"),
        (
            "Spark SQL over the view (read-only)",
            f'pvm query "SELECT region, COUNT(*) AS orders, SUM(qty) AS items FROM {VIEW_NAME} GROUP BY region"',
        ),
        (
            "change a source, then read the view again",
            f'sqlite3 {data_dir / "shop.db"} "UPDATE orders SET qty = 5 WHERE id = 1"',
        ),
        ("the API with examples (Authorize with a token)", f"{url}/docs"),
    ]
    if deployment is not None:
        steps += [
            ("Prometheus metrics", f"curl -s {url}/metrics | grep ^pvm_view"),
            (
                "as the administrator (define and drop views, create tokens)",
                f"export PVM_TOKEN={deployment.admin_token}",
            ),
        ]
    lines = [
        "[bold]keep exploring[/bold]" + (f": the manager keeps running on {url}, Ctrl-C stops it" if deployment else "")
    ]
    for comment, command in steps:
        lines += [f"  [dim]# {comment}[/dim]", f"  [cyan]{command}[/cyan]"]
    return "\n".join(lines)


async def _ok(response_awaitable) -> dict:
    response = await response_awaitable
    if response.status_code >= 400:
        raise CliError(f"{response.request.method} {response.request.url.path}: {response.status_code} {response.text}")
    return response.json() if response.content else {}
