"""``pvm bench wire --captured``: one large source transaction, captured and shipped by a real
wrapper process, until the manager acknowledges it, with the memory both sides take.

For each size N, one SQLite transaction inserts N rows of ``pvm.bench.wire.ROW_SHAPE`` into
the source of a ``pvm.local_deployment`` (a manager served from this process, the source's
wrapper a process of its own, trigger capture, no view): N changes, one update, one seq. The
figures are the seconds from the transaction's commit to the manager's acknowledgment of
that seq (capture, the wrapper's state, the posts of its parts, the manager's staging and
logging) and until the wrapper had captured it (its health's ``last_seq``); the resident set
size of the wrapper process and of this process (the manager, with nothing else running)
before and at its peak meanwhile, sampled every ``SAMPLE_SECONDS``, and the wrapper's own
high-water mark (``VmHWM``); and the most changes the wrapper says it held while capturing
and while shipping (``held`` in its health).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pvm.bench.process_memory import rss_peaks, status_kib

SAMPLE_SECONDS = 0.02


def insert_rows(path: Path, first_id: int, n: int) -> None:
    """One source transaction inserting ``n`` rows with ids from ``first_id`` on (made as they
    are written, a chunk at a time)."""
    from pvm.bench.wire import ROW_SHAPE, rows_of

    marks = ", ".join("?" for _ in ROW_SHAPE)
    chunk = 10_000
    with sqlite3.connect(path, timeout=60) as db:
        for start in range(0, n, chunk):
            rows = rows_of(min(chunk, n - start))
            db.executemany(f"INSERT INTO orders VALUES ({marks})", ([first_id + start + r[0], *r[1:]] for r in rows))


async def captured(
    sizes: Sequence[int], wrapper_args: Sequence[str] = (), timeout: float = 3600.0
) -> list[dict[str, Any]]:
    """For each size, one transaction captured and shipped by the wrapper process (started
    with ``wrapper_args`` besides its defaults): seconds to acknowledged and the RSS figures
    (the module's docstring)."""
    from pvm.bench.wire import ROW_SHAPE
    from pvm.local_deployment import LocalDeployment

    columns = ", ".join(f"{name} {declared}" for name, declared in ROW_SHAPE)
    out = []
    with tempfile.TemporaryDirectory(prefix="pvm-bench-wire-captured-") as tmp:
        data_dir = Path(tmp)
        source = data_dir / "shop.db"
        with sqlite3.connect(source) as db:
            db.execute(f"CREATE TABLE orders ({columns})")
        async with LocalDeployment(data_dir) as deployment:
            wrapper = await deployment.add_sqlite_source("shop", source, ["orders"], capture_args=list(wrapper_args))
            receiver = deployment.manager.receiver
            for seq, n in enumerate(sizes, start=1):  # each transaction one update: seq 1, 2, …
                with rss_peaks({"wrapper": wrapper.pid, "manager": os.getpid()}, SAMPLE_SECONDS) as rss:
                    began = time.perf_counter()
                    await asyncio.to_thread(insert_rows, source, sum(sizes[: seq - 1]), n)
                    committed = time.perf_counter()
                    captured_s = await _timed(committed, seq, wrapper.url, receiver, timeout)
                    acknowledged = time.perf_counter()
                health = await _health(wrapper.url)
                out.append(
                    {
                        "changes": n,
                        "write_s": round(committed - began, 3),
                        "captured_s": captured_s,
                        "acknowledged_s": round(acknowledged - committed, 3),
                        "wrapper": {**rss["wrapper"], "hwm_mib": round(status_kib(wrapper.pid, "VmHWM") / 1024, 1)},
                        "manager": rss["manager"],
                        "held": health.get("held"),  # the wrapper's own count (wrappers.parts.HeldChanges)
                    }
                )
    return out


async def _timed(committed: float, seq: int, wrapper_url: str, receiver: Any, timeout: float) -> float | None:
    """Wait until the manager acknowledged ``seq``; the seconds from ``committed`` until the
    wrapper had captured it (its health's ``last_seq``; None if never seen before the
    acknowledgment)."""
    import httpx

    deadline = time.monotonic() + timeout
    captured_s = None
    async with httpx.AsyncClient(timeout=10) as http:
        while receiver.released_through("shop") < seq:
            if time.monotonic() > deadline:
                from pvm.cli import CliError

                raise CliError(f"the update was not acknowledged within {timeout:.0f} s")
            if captured_s is None and await _last_seq(http, wrapper_url) >= seq:
                captured_s = round(time.perf_counter() - committed, 3)
            await asyncio.sleep(0.05)
    return captured_s


async def _last_seq(http: Any, wrapper_url: str) -> int:
    """The wrapper's last seq; 0 while it does not answer (a wrapper that held an update
    whole could leave its event loop without a turn for longer than the timeout)."""
    import httpx

    try:
        return int((await http.get(f"{wrapper_url}/v1/health")).json()["last_seq"])
    except httpx.HTTPError:
        return 0


async def _health(wrapper_url: str) -> dict[str, Any]:
    import httpx

    async with httpx.AsyncClient(timeout=60) as http:
        health: dict[str, Any] = (await http.get(f"{wrapper_url}/v1/health")).json()
        return health


def report(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="one source transaction captured and shipped by a wrapper process until acknowledged")
    columns = ("changes", "s captured / acked", "wrapper MiB: start / peak (+growth)", "VmHWM", "held", "manager MiB")
    for column in columns:
        table.add_column(column, justify="right")
    for r in rows:
        w, m, held = r["wrapper"], r["manager"], r["held"]
        captured = "?" if r["captured_s"] is None else f"{r['captured_s']:.1f}"
        table.add_row(
            f"{r['changes']:,}",
            f"{captured} / {r['acknowledged_s']:.1f}",
            f"{w['start_mib']:.0f} / {w['peak_mib']:.0f} (+{w['growth_mib']:.0f})",
            f"{w['hwm_mib']:.0f}",
            "?" if held is None else f"{held['capturing_peak']:,} / {held['shipping_peak']:,}",
            f"{m['start_mib']:.0f} / {m['peak_mib']:.0f} (+{m['growth_mib']:.0f})",
        )
    Console().print(table)
