"""What the benchmarks that run a whole deployment on the Spark store share: three populated
SQLite sources (``shop``, ``crm``, ``inventory`` of ``pvm demo``), a writer process that
commits source transactions into them on a fixed schedule, and the analysts' query process
subscribed to the store for the length of a run."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pvm.demo import SCHEMAS, empty_sources


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (nan for none)."""
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def populate_sources(data_dir: Path, rows: int, rng: random.Random, prefix: str) -> dict[str, Path]:
    """``rows`` customers and products, and one order per customer and product, so that every
    row of the sources is in the join view from the start."""
    paths = empty_sources(data_dir, prefix=prefix)
    with sqlite3.connect(paths["crm"]) as db:
        db.executemany(
            "INSERT INTO customers VALUES (?, ?, ?)", [(i, f"c{i}", rng.choice("NSEW")) for i in range(1, rows + 1)]
        )
    with sqlite3.connect(paths["inventory"]) as db:
        db.executemany(
            "INSERT INTO products VALUES (?, ?, ?)",
            [(i, f"p{i}", round(rng.uniform(1, 100), 2)) for i in range(1, rows + 1)],
        )
    with sqlite3.connect(paths["shop"]) as db:
        db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", [(i, i, rows + 1 - i, 1) for i in range(1, rows + 1)])
    return paths


def write_transactions(
    paths: dict[str, str], rows: int, rate: float, seconds: float, seed: int, markers, every_marker: bool = True
) -> None:
    """Commit ``rate`` transactions a second for ``seconds`` into the three sources of
    ``populate_sources``, round-robin, each on its own schedule slot: new orders in ``shop``,
    renamed customers in ``crm``, renamed products in ``inventory``. With ``every_marker``,
    put every transaction's marker on ``markers`` as ``(kind, key, commit time)``; in any case
    end with ``("done", figures, None)``. Runs in a process of its own (a thread would share
    the interpreter of the manager it loads)."""
    rng = random.Random(seed)
    connections = {s: sqlite3.connect(p, timeout=30) for s, p in paths.items()}
    total = int(rate * seconds)
    next_order = rows
    late = 0.0
    started = time.monotonic()
    try:
        for i in range(total):
            target = started + i / rate
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                late = max(late, -delay)
            source = ("shop", "crm", "inventory")[i % 3]
            db = connections[source]
            if source == "shop":
                next_order += 1
                with db:
                    db.execute(
                        "INSERT INTO orders VALUES (?, ?, ?, ?)",
                        (next_order, rng.randint(1, rows), rng.randint(1, rows), rng.randint(1, 5)),
                    )
                if every_marker:
                    markers.put(("order", next_order, time.time()))
            else:
                key = rng.randint(1, rows)
                name = f"{source[0]}{key}-t{i}"
                table = SCHEMAS[source][0]
                with db:
                    db.execute(f"UPDATE {table} SET name = ? WHERE id = ?", (name, key))  # fixed names
                if every_marker:
                    markers.put(("name", (name, (source, key)), time.time()))
    finally:
        elapsed = time.monotonic() - started
        for db in connections.values():
            db.close()
    markers.put(
        (
            "done",
            {"transactions": total, "seconds": elapsed, "rate": total / elapsed, "max_behind_schedule_s": late},
            None,
        )
    )


@asynccontextmanager
async def running_analysts(store, settings) -> AsyncIterator:
    """The analysts' query process (``warehouse.analysts.supervisor.AnalystProcess`` with
    ``settings``), shown every view of ``store`` while the block runs, then stopped."""
    from warehouse.analysts.supervisor import AnalystProcess

    analysts = AnalystProcess(settings)
    store.subscribe(analysts.publish)
    analysts.start()
    try:
        yield analysts
    finally:
        store.unsubscribe(analysts.publish)
        await asyncio.to_thread(analysts.stop)


def measured(args: Any, prefix: str, measure: Callable[[Any, Path], dict]) -> dict:
    """``measure(args, data_dir)`` in ``args.data_dir`` (made if missing), or in a temporary
    directory named ``prefix…`` that is removed afterwards."""
    if args.data_dir is None:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            return measure(args, Path(tmp))
    args.data_dir.mkdir(parents=True, exist_ok=True)
    return measure(args, args.data_dir)


def start_spark_store(data_dir: Path, console: Any) -> Any:
    """The Spark view store of a benchmark's deployment in ``data_dir``, as ``pvm serve`` opens it:
    with its default retention of compacted-away versions, so that a compaction during the run
    does not delete files under the readers' queries."""
    from pvm.local_deployment import catalog_url
    from pvm.serve import open_store, retention_s

    with console.status("starting Spark"):
        return open_store(
            "spark", data_dir, None, catalog_url(data_dir), retire_after_s=retention_s(argparse.Namespace())
        )


def write_figures(path: Path | None, figures: dict, plot: Callable[[dict, Path], None] | None = None) -> None:
    """The figures as JSON at ``path`` (nothing without one), and ``plot``'s PNG next to it."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=2))
    if plot is None:
        print(f"wrote {path}")
        return
    png = path.with_suffix(".png")
    plot(figures, png)
    print(f"wrote {path} and {png}")
