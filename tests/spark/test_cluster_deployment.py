"""The service as deploy/README.md runs it: a Spark standalone master and two workers (each a
JVM of its own, from ``deploy/spark-cluster.sh``, authenticating with a shared secret), the
manager as ``pvm serve --config manager.toml`` in a process of its own with its catalog on
PostgreSQL and its views in Spark on the cluster, and three wrappers (PostgreSQL, MariaDB,
SQLite) under concurrent writers.

The main test loses a worker (kill -9 of its JVM and its executor) while the view is
maintained, then stops and restarts the manager from the same file while the sources keep
changing: the view as of every W must equal recomputation over the source states the
shipped updates describe, and at the end the live databases; ``pvm verify`` agrees, and an
analyst reads the view over Spark Connect with a token (a wrong token is refused). The
other tests use the same cluster: an application without the cluster's secret is refused,
and a manager whose executors never come stops with an error instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from contract.zset import ZSet
from pvm.bench.three_sources import (
    COLUMNS,
    TABLES,
    VIEW,
    WrapperSet,
    Writers,
    create,
    expected_states,
    read_live,
    sqlite_file,
    until,
)
from tests.spark.cluster_support import (
    ROOT,
    ServedManager,
    SparkCluster,
    command_lines,
    free_port,
    kill_leftovers,
    process_groups,
)
from warehouse.catalog.db import Catalog, RelationInfo, StoreRecords
from warehouse.catalog.secrets import key_file_for
from warehouse.recompute import recompute
from warehouse.sql_views import parse_view

pytestmark = [pytest.mark.cluster, pytest.mark.servers]


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A master and two workers of 1 core and 1 GiB each, with a shared secret; stopped (and
    anything left of them killed) afterwards, also when a test failed."""
    base = tmp_path_factory.mktemp("cluster")
    secret = base / "spark-secret"
    secret.touch(mode=0o600)
    secret.write_text(secrets.token_urlsafe(32) + "\n")
    running = SparkCluster(base / "run", secret)
    daemons: list[int] = []
    try:
        running.start()
        properties = running.run_dir / "daemon.properties"  # the daemons' --properties-file
        assert properties.stat().st_mode & 0o777 == 0o600
        assert f"spark.authenticate.secret={secret.read_text().strip()}" in properties.read_text()
        daemons = [running.daemon_pid(name) for name in ("master", "worker-1", "worker-2")]
        yield running
    finally:
        stopped = running.stop()
        left = kill_leftovers(base, grace_s=10)
        groups = {pgid: pids for pgid, pids in process_groups().items() if pgid in daemons}
        assert stopped.returncode == 0, stopped.stderr
        assert not left and not groups, f"left running after the cluster stopped: {left} {groups}"


def manager_config(
    path: Path, data_dir: Path, catalog: str | None, port: int, cluster: SparkCluster, **more: object
) -> Path:
    """A manager.toml in the style of deploy/manager.toml, for ``cluster`` (``catalog`` None:
    SQLite in the data directory)."""
    settings: dict[str, object] = {
        "data_dir": str(data_dir),
        "catalog": catalog,
        "host": "127.0.0.1",
        "port": port,
        "store": "spark",
        "spark_master": cluster.master,
        "spark_auth_secret_file": str(cluster.secret_file),
        "spark_conf": [
            "spark.executor.memory=512m",
            "spark.executor.cores=1",
            "spark.cores.max=2",
            "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1",
        ],
        "spark_executor_timeout": 90,
        "connect_port": 0,
        "analyst_memory": "512m",
        "compaction_interval": 3600,  # every W stays readable for the oracle
        "log_level": "INFO",
    }
    settings.update(more)  # None: the key left out
    path.write_text("".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items() if value is not None))
    return path


def read_view(manager: ServedManager, view: str, as_of: int | None = None) -> ZSet:
    """The view (as of ``as_of``), every page of it, over the HTTP API."""
    rows: list[tuple[object, ...]] = []
    while True:
        query = {"offset": len(rows), "limit": 10_000} | ({} if as_of is None else {"as_of": as_of})
        page = manager.call("GET", f"/v1/views/{view}/rows", params=query)
        rows += [tuple(row) for row in page["rows"]]
        if len(rows) >= page["total"]:
            return ZSet.from_rows(rows)


def view_status(manager: ServedManager, view: str) -> dict:
    return dict(manager.call("GET", f"/v1/views/{view}"))


def quiescent(manager: ServedManager, view: str) -> bool:
    """Every wrapper has shipped all it captured, and the view has nothing left to do."""
    with httpx.Client(timeout=10) as http:
        for wrapper in manager.wrappers.values():
            health = http.get(f"{wrapper.url}/v1/health").json()
            if health["pending"] or health["acked_through"] != health["last_seq"]:
                return False
    status = view_status(manager, view)
    assert status["state"] == "active" and status["error"] is None, status
    return bool(status["idle"]) and status["updates_queued"] == 0 and status["units_running"] == 0


async def settle(manager: ServedManager, view: str, timeout: float = 120) -> None:
    """Until ``quiescent`` three times in a row."""
    deadline = time.monotonic() + timeout
    streak = 0
    while streak < 3:
        assert time.monotonic() < deadline, f"{view} did not settle: {view_status(manager, view)}"
        streak = streak + 1 if await asyncio.to_thread(quiescent, manager, view) else 0
        await asyncio.sleep(0.2)


def view_plan(catalog: Catalog, view: str) -> Any:
    """The view's plan, parsed from its SQL as the manager parses it (with the relations its
    catalog registered)."""
    relations: dict[tuple[str, str], RelationInfo] = {
        (s.name, r.name): r for s in catalog.sources().values() for r in s.relations.values()
    }
    sql = catalog.views()[view].sql
    return parse_view(sql, lambda s, t: relations[(s, t)].columns if (s, t) in relations else None, view)


def stored_as_of(catalog: Catalog, view: str) -> Callable[[int], ZSet]:
    """The view as of W straight from the store's files, as the store defines it: the base
    and the z-log rows with ``_order <= W``, their weights summed (docs/spark.md, Layout)."""
    record = StoreRecords(catalog).load(view)
    assert record is not None
    columns = record["columns"]

    def rows(location: str | None) -> list[dict[str, Any]]:
        path = Path(str(location).removeprefix("file:"))
        return pq.read_table(path).to_pylist() if location and any(path.glob("*.parquet")) else []

    base, zlog = rows(record["base_location"]), rows(record["zlog_location"])

    def as_of(order: int) -> ZSet:
        state = ZSet()
        for row in base + [r for r in zlog if r["_order"] <= order]:
            state.add(tuple(row[c] for c in columns), row["_w"])
        return state

    return as_of


def check_oracle_over_http(manager: ServedManager, catalog_url: str, view: str, initial: dict) -> tuple[int, Any]:
    """``pvm.bench.three_sources.check_oracle`` for a manager in another process: the units
    and the update log from its catalog. The view as of every W is read from the store's
    files, and as of the first, a middle and the last W also over the HTTP API (each such
    read is a Spark job of the analysts' process: a second or more on a busy machine). The
    number of states checked, and the view's plan."""
    catalog = Catalog(catalog_url, key_file_for(catalog_url, manager.data_dir))
    try:
        plan, bases = view_plan(catalog, view), catalog.views()[view].bases
        units = catalog.units(view)
        log = {source: catalog.log_entries(source, 0) for source in TABLES}
        stored = stored_as_of(catalog, view)
    finally:
        catalog.close()
    assert units and all(unit.committed for unit in units)
    over_http = {units[0].order, units[len(units) // 2].order, units[-1].order}
    for order, expected in expected_states(plan, bases, units, log, initial):
        assert stored(order) == expected, f"{view} as of W={order}, in the store's files"
        if order in over_http:
            assert read_view(manager, view, as_of=order) == expected, f"{view} as of W={order}, read over HTTP"
    return len(units), plan


CONNECT_CLIENT = r"""
import json, re, sys
from pyspark.sql import SparkSession

address, token, view = sys.argv[1], sys.argv[2], sys.argv[3]
out = {}
for name, url in (("right", f"{address}/;token={token}"), ("wrong", f"{address}/;token=pvm_1_not-the-token")):
    try:
        spark = SparkSession.builder.remote(url).create()
        out[name] = {"rows": sorted([list(r) for r in spark.sql(f"SELECT * FROM {view}").collect()], key=repr)}
    except Exception as exc:
        text = " ".join(str(exc).split())
        code = re.search(r"StatusCode\.([A-Z_]+)", text)
        details = re.search(r'details = "([^"]*)"', text)
        out[name] = {"code": code.group(1) if code else type(exc).__name__, "detail": details.group(1) if details else text[:300]}
print(json.dumps(out))
"""


def connect_as_analyst(address: str, token: str, view: str) -> dict:
    """A real Spark Connect client (no JVM) with ``token``, then with a wrong one."""
    done = subprocess.run(
        [sys.executable, "-c", CONNECT_CLIENT, address, token, view], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def pvm_verify(manager: ServedManager, view: str) -> dict:
    """``pvm verify VIEW --json`` against the manager: its report (exit status 0: equal)."""
    done = subprocess.run(
        [sys.executable, "-m", "pvm", "verify", view, "--manager", manager.url, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PVM_TOKEN": manager.admin_token},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return dict(json.loads(done.stdout))


async def test_a_view_survives_a_lost_worker_and_a_manager_restart(
    spark_cluster: SparkCluster, pg_url: str, maria_url: str, postgresql_catalog: str, tmp_path: Path
) -> None:
    began = time.monotonic()

    def step(what: str) -> None:
        print(f"{time.monotonic() - began:6.1f} s: {what}", flush=True)

    urls = {"pg": pg_url, "my": maria_url, "lite": sqlite_file(tmp_path / "lite.db")}
    create(urls, random.Random(3))
    initial = read_live(urls)
    data_dir = tmp_path / "manager"
    port = free_port()
    config = manager_config(tmp_path / "manager.toml", data_dir, postgresql_catalog, port, spark_cluster)
    manager = ServedManager(data_dir, config, port)
    wrappers = WrapperSet(manager)
    threads = []
    try:
        first_start = await asyncio.to_thread(manager.start)
        step("manager started")
        secret = spark_cluster.secret_file.read_text().strip()
        assert not [pid for pid, line in command_lines().items() if secret in line], "the secret is on a command line"
        await asyncio.gather(
            *(
                wrappers.add(s, url, [TABLES[s][0]], query_delay_ms=5, max_concurrent_queries=2)
                for s, url in urls.items()
            )
        )
        step("wrappers registered")
        manager.call("POST", "/v1/views", json={"sql": VIEW, "name": "v", "parallelism": 4})
        await until(lambda: view_status(manager, "v")["state"] == "active", 120, "the view's initial load")

        step("view defined")
        writers = Writers(urls, transactions=60, connections=2, pause=0.6)
        threads += writers.start()
        await asyncio.sleep(2)
        # a worker's machine dies: its JVM and its executor, at once
        killed = spark_cluster.kill_worker(2)
        assert len(killed) >= 2, killed  # the worker and its executor
        at_kill = view_status(manager, "v")["watermark"]
        await until(lambda: not any(t.is_alive() for t in threads), 120, "the writers")
        assert not writers.errors, writers.errors
        step("writers done")
        await settle(manager, "v")
        step("settled")
        assert view_status(manager, "v")["watermark"] > at_kill  # maintenance went on, on one worker
        assert spark_cluster.state()["aliveworkers"] == 1
        assert "Lost executor" in (data_dir / "spark.log").read_text()

        # the manager stops (systemd's SIGTERM) and comes back from the same file; the sources
        # go on changing meanwhile
        more = Writers(urls, transactions=30, connections=1, pause=0.2, seed=2)
        threads += more.start()
        assert manager.stop() == 0, manager.tail()  # its own cleanup ran
        step("manager stopped")
        restart = await asyncio.to_thread(manager.start)
        step("manager restarted")
        await until(lambda: not any(t.is_alive() for t in threads), 120, "the writers")
        assert not more.errors, more.errors
        await settle(manager, "v")
        assert sum(writers.committed) + sum(more.committed) >= 90

        step("settled again")
        checked, plan = await asyncio.to_thread(check_oracle_over_http, manager, postgresql_catalog, "v", initial)
        assert checked >= view_status(manager, "v")["watermark"] > 10
        final = read_view(manager, "v")
        assert not final.has_negative() and final == recompute(plan, read_live(urls), COLUMNS)

        step("oracle checked")
        # two clients of their own processes, at once: pvm verify, and an analyst over Connect
        analyst = manager.token("analyst")
        report, seen = await asyncio.gather(
            asyncio.to_thread(pvm_verify, manager, "v"),
            asyncio.to_thread(connect_as_analyst, manager.connect_url(), analyst, "v"),
        )
        assert report["equal"] is True and report["stored_rows"] == sum(w for _, w in final.items())
        assert ZSet.from_rows(tuple(r) for r in seen["right"]["rows"]) == final
        assert seen["wrong"]["code"] == "UNAUTHENTICATED", seen["wrong"]
        assert "the token is unknown, malformed or revoked" in seen["wrong"]["detail"]
        step("verified, and read over Connect")
        print(f"\ncluster test: first start {first_start:.1f} s, restart {restart:.1f} s, {checked} states checked")
    finally:
        for thread in threads:
            thread.join(timeout=60)
        await asyncio.gather(*(asyncio.to_thread(w.stop) for w in manager.wrappers.values()))
        stopped = manager.stop()
        left = kill_leftovers(tmp_path, grace_s=20)
        print(f"cluster test: {time.monotonic() - began:.1f} s")
    assert stopped == 0 and not left, (stopped, left)


def serve_until_it_stops(config: Path, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """How ``pvm serve --config config`` ended, and after how many seconds."""
    started = time.monotonic()
    ended = subprocess.run(
        [sys.executable, "-m", "pvm", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )
    return ended, time.monotonic() - started


async def test_without_the_secret_or_free_workers_the_start_stops_with_an_error(
    spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    """Two managers at once: one without the cluster's secret (the master refuses its
    application), one asking for executors larger than any worker (the master has it wait
    for ever). Neither hangs: each stops, saying why, after --spark-executor-timeout; the
    first (15 s) well before the minute Spark's driver would spend on its registrations. (The
    second has 20 s: the master must take its application first, within the same timeout,
    and two drivers starting at once on a busy machine took more than 8 s for that.)"""
    completed = len(spark_cluster.state()["completedapps"])
    configs = {}
    for name, more in {
        "no-secret": {"spark_auth_secret_file": None, "spark_executor_timeout": 15},
        "too-big": {"spark_conf": ["spark.executor.memory=2g", "spark.cores.max=1"], "spark_executor_timeout": 20},
    }.items():
        config = manager_config(tmp_path / f"{name}.toml", tmp_path / name, None, free_port(), spark_cluster, **more)
        configs[name] = config
    try:
        done = dict(
            zip(
                configs,
                await asyncio.gather(*(asyncio.to_thread(serve_until_it_stops, c, tmp_path) for c in configs.values())),
                strict=True,
            )
        )
    finally:
        left = kill_leftovers(tmp_path, grace_s=10)
    assert not left, left
    for name, (ended, _) in done.items():
        assert ended.returncode == 2, (name, ended.stderr[-3000:])
    # the master drops the application without the secret; Spark's driver would try three
    # registrations of 20 s, the manager waits 15 s from its JVM's start (on a busy machine
    # a driver took more than 8 s to try its first registration; the other manager waits
    # longer anyway)
    refused, took = done["no-secret"][0].stderr, done["no-secret"][1]
    assert f"pvm: error: --spark-master {spark_cluster.master}: Spark did not start on this master" in refused
    assert "the master did not take the application within 15 s" in refused and took < 50, (took, refused)
    assert "if the cluster authenticates (spark.authenticate), give --spark-auth-secret-file" in refused
    assert "Expected SaslMessage" in (spark_cluster.run_dir / "master.log").read_text()
    # the other one was taken, and waited for executors no worker can give
    waiting = done["too-big"][0].stderr
    assert f"pvm: error: --spark-master {spark_cluster.master}: no executor registered in 20 s" in waiting
    assert "spark.executor.memory=2g" in waiting and "see the master's web UI" in waiting
    state = spark_cluster.state()
    assert not state["activeapps"] and len(state["completedapps"]) == completed + 1, state
