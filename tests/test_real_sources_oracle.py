"""The maintenance oracle over a view joining a PostgreSQL, a MariaDB and a SQLite source,
each in its own wrapper process, while two connections per source commit and roll back
multi-row transactions with key changes; one wrapper crashes and restarts, and so does the
manager. PostgreSQL and MariaDB are captured by triggers (the PostgreSQL wrapper crashes)
or from their logs (the MariaDB one does); SQLite by triggers, or by differencing snapshots
of it taken every 0.3 s (and its wrapper crashes). The view as of every watermark must equal
recomputation over the source states the shipped updates describe, and at the end the
live databases.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import httpx
import pytest

from pvm.bench.three_sources import (
    TABLES,
    VIEW,
    WrapperSet,
    Writers,
    check_oracle,
    crash_and_restart,
    create,
    read_live,
    sqlite_file,
    until,
)
from pvm.local_deployment import LocalDeployment
from warehouse.recompute import recompute

pytestmark = pytest.mark.servers


SNAPSHOT_ARGS = ["--capture", "snapshot", "--snapshot-interval", "0.3"]
LOG_ARGS = ["--capture", "log"]


@pytest.mark.parametrize(
    ("server_capture", "lite_capture"), [("trigger", "trigger"), ("trigger", "snapshot"), ("log", "trigger")]
)
async def test_view_over_three_databases_matches_recomputation(
    pg_log_url: str, maria_url: str, tmp_path: Path, server_capture: str, lite_capture: str
) -> None:
    urls = {"pg": pg_log_url, "my": maria_url, "lite": sqlite_file(tmp_path / "lite.db")}
    crashing = "lite" if lite_capture == "snapshot" else "my" if server_capture == "log" else "pg"
    create(urls, random.Random(1))
    initial = read_live(urls)
    deployment = await LocalDeployment(tmp_path).__aenter__()
    try:
        wrappers = WrapperSet(deployment)
        for source, url in urls.items():
            capture = lite_capture if source == "lite" else server_capture
            args = {"snapshot": SNAPSHOT_ARGS, "log": LOG_ARGS}.get(capture, [])
            await wrappers.add(
                source, url, [TABLES[source][0]], capture, query_delay_ms=5, max_concurrent_queries=2,
                capture_args=args,
            )  # fmt: skip
        await deployment.manager.define_view(VIEW, "v", parallelism=4)
        writers = Writers(urls, transactions=180, connections=2, pause=0.25)
        threads = writers.start()
        restarted = await crash_and_restart(deployment, wrappers, [crashing], "v")
        deployment = restarted.deployment
        compensations = restarted.counters.compensations
        await until(lambda: not any(t.is_alive() for t in threads), 120, "the writers")
        assert not writers.errors, writers.errors
        if lite_capture == "snapshot":  # a snapshot taken after the last write
            await snapshot_after(deployment.wrappers["lite"].url, time.time())
        await deployment.wait_shipped(timeout=60)
        manager = deployment.manager
        await manager.wait_idle("v", timeout=120)
        assert manager.view("v").maintainer.failed is None
        assert sum(writers.committed) >= 180
        released = {s: manager.receiver.released_through(s) for s in urls}
        # every source shipped a sequence of updates. How many depends on the machine's load,
        # not on correctness: a wrapper that falls behind merges its backlog into one update,
        # and snapshot capture ships one per snapshot that found changes
        assert all(released[s] >= 2 for s in urls), (released, manager.source_health)
        checked = await check_oracle(manager, "v", initial)
        # every W checked; a backlog is maintained in sets (adaptive batching), so there are
        # fewer W than updates, and fewer still on a busy machine: at least two a source
        assert checked == manager.watermark("v") >= 2 * len(urls)
        assert compensations + manager.view("v").maintainer.counters.compensations > 0  # concurrency happened
        final = manager.read("v")
        assert not final.has_negative() and final == recompute(
            manager.view("v").plan, read_live(urls), {(s, t): cols for s, (t, _, cols) in TABLES.items()}
        )
    finally:
        await deployment.__aexit__(None, None, None)


async def snapshot_after(wrapper_url: str, moment: float) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        for _ in range(200):
            capture = (await http.get(f"{wrapper_url}/v1/health")).json()["capture"]
            assert capture["last_error"] is None, capture
            if capture["last_snapshot_at"] > moment:
                return
            await asyncio.sleep(0.05)
    raise TimeoutError("no snapshot was taken after the writers stopped")
