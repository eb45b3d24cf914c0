"""The initial load in the Spark store (``warehouse.engine_load``) over real wrapper processes
and real HTTP: relation snapshots streamed as Arrow, staged as Parquet, joined by Spark.

Each test checks the view against recomputation over the sources (``warehouse.recompute``):
a plain load, a load that must compensate updates its snapshots reflect, a manager that
stops in the middle of a load and starts again, a stream cut short, and a wrapper that dies
while it streams. A load that did not finish is never shown: the view stays initializing
and the store holds nothing of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from contract.relation_snapshot import RelationSnapshot
from contract.zset import ZSet
from pvm.local_deployment import LocalDeployment, catalog_url, side_by_side
from warehouse.engine_load import EngineLoad
from warehouse.manager import Manager
from warehouse.recompute import recompute
from warehouse.store.spark import SparkStore

pytestmark = pytest.mark.spark

SOURCES = {
    "sa": ("R", "CREATE TABLE R (id INTEGER PRIMARY KEY, b INTEGER, note TEXT, price NUMERIC(6,2))"),
    "sb": ("S", "CREATE TABLE S (id INTEGER PRIMARY KEY, b INTEGER, c INTEGER)"),
    "sc": ("T", "CREATE TABLE T (id INTEGER PRIMARY KEY, c INTEGER, d TEXT, ok BOOLEAN)"),
}
COLUMNS = {
    ("sa", "R"): ("id", "b", "note", "price"),
    ("sb", "S"): ("id", "b", "c"),
    ("sc", "T"): ("id", "c", "d", "ok"),
}
VIEW = (
    "SELECT R.id AS rid, R.b, R.note, R.price, S.id AS sid, S.c, T.id AS tid, T.d, T.ok "
    "FROM sa.R, sb.S, sc.T WHERE R.b = S.b AND S.c = T.c AND T.d <> 'hidden' AND R.note LIKE 'n%'"
)


def make_sources(tmp_path: Path, rows: int, seed: int = 1) -> dict[str, Path]:
    rng = random.Random(seed)
    paths = {}
    for source, (table, ddl) in SOURCES.items():
        path = tmp_path / f"{source}.db"
        with contextlib.closing(sqlite3.connect(path)) as db:
            db.execute(ddl)
            db.executemany(
                f"INSERT INTO {table} VALUES ({', '.join('?' * len(COLUMNS[(source, table)]))})",
                [random_row(table, k, rng, rows) for k in range(1, rows + 1)],
            )
            db.commit()
        paths[source] = path
    return paths


def random_row(table: str, key: int, rng: random.Random, rows: int) -> tuple:
    """Join values drawn from about half as many values as rows: each join step keeps the
    view about as large as a relation."""
    domain = max(5, rows // 2)
    if table == "R":
        return (key, rng.randrange(domain), rng.choice(["n1", "n2", "x", "né"]), rng.choice([1.5, 2, None, 10.25]))
    if table == "S":
        return (key, rng.randrange(domain), rng.randrange(domain))
    return (key, rng.randrange(domain), rng.choice(["d1", "hidden", None]), rng.choice([0, 1, None]))


def read_live(paths: dict[str, Path]) -> dict[tuple[str, str], ZSet]:
    out = {}
    for source, (table, _) in SOURCES.items():
        with contextlib.closing(sqlite3.connect(paths[source])) as db:
            rows = db.execute(f"SELECT {', '.join(COLUMNS[(source, table)])} FROM {table}").fetchall()
        out[(source, table)] = ZSet.from_rows(tuple(r) for r in rows)
    return out


@contextlib.asynccontextmanager
async def deployed(
    spark: SparkSession, tmp_path: Path, paths: dict[str, Path], wrapper_args: tuple[str, ...] = ()
) -> AsyncIterator[tuple[SparkStore, LocalDeployment]]:
    """A wrapper per source (``wrapper_args`` added to its command line) and a manager over
    a Spark store in ``tmp_path / "data"``; the store's views are dropped afterwards (the
    session's catalog is shared)."""
    store = SparkStore(spark, tmp_path / "data")
    try:
        async with LocalDeployment(tmp_path, store) as deployment:
            await side_by_side(
                *(
                    deployment.add_sqlite_source(source, paths[source], [table], capture_args=wrapper_args)
                    for source, (table, _) in SOURCES.items()
                )
            )
            yield store, deployment
    finally:
        for view in store.views():
            store.drop(view)


def engine_of(manager: Manager, view: str) -> EngineLoad:
    load = manager.view(view).maintainer.view_change.initial_load
    assert load is not None, "the Spark store loads the view in Spark"
    return load


def recomputed(manager: Manager, view: str, paths: dict[str, Path]) -> ZSet:
    return recompute(manager.view(view).plan, read_live(paths), COLUMNS)


async def test_the_load_in_spark_equals_recomputation(spark, tmp_path):
    paths = make_sources(tmp_path, rows=300)
    async with deployed(spark, tmp_path, paths) as (store, deployment):
        manager = deployment.manager
        await manager.define_view(VIEW, "v")
        engine_of(manager, "v")
        await manager.wait_idle("v", timeout=120)
        assert manager.view("v").info.state == "active"
        counters = manager.view("v").maintainer.counters
        assert counters.subqueries == 0  # no row of the load went through a subquery
        expected = recomputed(manager, "v", paths)
        assert len(expected) > 20
        assert manager.read("v") == expected
        assert not any((tmp_path / "data" / "staging" / "v").glob("*/*.parquet"))  # staging removed


AGGREGATES = {
    "grouped": (
        "SELECT S.c, COUNT(*) AS n, COUNT(R.price) AS priced, SUM(R.b) AS total, AVG(S.b) AS mean, "
        "MIN(T.d) AS low, MAX(R.id) AS top FROM sa.R, sb.S, sc.T WHERE R.b = S.b AND S.c = T.c "
        "GROUP BY S.c HAVING COUNT(*) > 1"
    ),
    "ungrouped": "SELECT COUNT(*) AS n, SUM(S.c) AS s, MIN(R.note) AS low FROM sa.R, sb.S WHERE R.b = S.b",
    "notes": "SELECT DISTINCT R.note, T.ok FROM sa.R, sb.S, sc.T WHERE R.b = S.b AND S.c = T.c",
}


async def test_aggregate_views_load_in_spark_and_equal_recomputation(spark, tmp_path):
    """Their stored rows come from the engine's join (``aggregate.encode_sql``), and each view
    read from them is the aggregate recomputed from the sources; updates after the load are
    maintained onto them."""
    paths = make_sources(tmp_path, rows=200)
    async with deployed(spark, tmp_path, paths) as (store, deployment):
        manager = deployment.manager
        for shape, sql in AGGREGATES.items():
            await manager.define_view(sql, shape)
            engine_of(manager, shape)
        for shape in AGGREGATES:
            await manager.wait_idle(shape, timeout=120)
            assert manager.view(shape).info.state == "active"
            assert manager.view(shape).maintainer.counters.subqueries == 0, shape
            expected = recomputed(manager, shape, paths)
            assert len(expected) >= (1 if shape == "ungrouped" else 3), shape
            assert manager.read(shape) == expected, shape
        with contextlib.closing(sqlite3.connect(paths["sa"])) as db:
            db.execute("DELETE FROM R WHERE id IN (SELECT id FROM R ORDER BY id LIMIT 20)")
            db.execute("UPDATE R SET b = b + 1 WHERE id > 150")
            db.commit()
        await deployment.wait_shipped()
        for shape in AGGREGATES:
            await manager.wait_idle(shape, timeout=120)
            assert manager.read(shape) == recomputed(manager, shape, paths), shape


@pytest.mark.parametrize("large", [False, True])
async def test_updates_during_the_load_are_compensated(spark, tmp_path, large):
    """Before each relation's snapshot is taken, its source changes: the snapshot reflects the
    change, and the view queued it too. The load must subtract it, and the view as of the
    load (W = 1) must be the sources before those changes; the changes are maintained after.
    ``large``: each change is shipped in parts and has more rows than a unit sweeps at once,
    so the view keeps it in the update log only (``ViewUpdate.logged``), and the load
    subtracts it read from there."""
    paths = make_sources(tmp_path, rows=200)
    before = read_live(paths)
    rng = random.Random(7)
    inserted = range(1000, 1030) if large else (1000, 1001)
    wrapper_args = ("--part-changes", "4") if large else ()
    async with deployed(spark, tmp_path, paths, wrapper_args) as (store, deployment):
        manager = deployment.manager
        manager.unit_part_rows = 5 if large else None
        changed = []

        def change_first(original):
            def open_snapshot(request: RelationSnapshot):
                source = next(s for s, (t, _) in SOURCES.items() if t == request.relation)
                table = request.relation
                with contextlib.closing(sqlite3.connect(paths[source])) as db:
                    db.execute(f"DELETE FROM {table} WHERE id IN (1, 2, 3)")
                    cols = COLUMNS[(source, table)]
                    rows = [random_row(table, k, rng, 200) for k in (1, 2, *inserted)]
                    db.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(cols))})", rows)
                    db.execute(
                        f"UPDATE {table} SET b = b + 1 WHERE id = 10"
                        if table != "T"
                        else "UPDATE T SET c = c + 1 WHERE id = 10"
                    )
                    db.commit()
                changed.append(source)
                return original(request)

            return open_snapshot

        for client in deployment.manager.clients.values():
            client.open_snapshot = change_first(client.open_snapshot)  # type: ignore[method-assign]
        await manager.define_view(VIEW, "v")
        await deployment.wait_shipped()
        await manager.wait_idle("v", timeout=120)
        assert sorted(changed) == sorted(SOURCES)
        assert manager.view("v").info.state == "active"
        plan = manager.view("v").plan
        assert manager.read("v", as_of=1) == recompute(plan, before, COLUMNS)  # the sources as of the load
        assert manager.read("v") == recomputed(manager, "v", paths)  # and the changes maintained after it
        counters = manager.view("v").maintainer.counters
        assert counters.compensations >= 3  # one update per source at least
        # each large update subtracted read from the log: by the load, and by later units
        assert counters.compensations_from_log >= 3 if large else counters.compensations_from_log == 0


class Gate:
    """Holds the snapshot streams of a load until released; says when one is held."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self.release = threading.Event()

    def wrap(self, original):
        def open_snapshot(request: RelationSnapshot):
            self.held.set()
            self.release.wait(60)
            raise ConnectionError("the process that asked is gone")

        return open_snapshot


async def test_a_restart_in_the_middle_of_a_load_loads_again(spark, tmp_path):
    paths = make_sources(tmp_path, rows=150)
    data = tmp_path / "data"
    async with deployed(spark, tmp_path, paths) as (store, deployment):
        first = deployment.manager
        gate = Gate()
        for client in first.clients.values():
            client.open_snapshot = gate.wrap(client.open_snapshot)  # type: ignore[method-assign]
        await first.define_view(VIEW, "v")
        assert await asyncio.to_thread(gate.held.wait, 30)
        assert first.view("v").info.state == "initializing"
        progress = first.status("v")["load"]
        assert progress is not None and progress["phase"] == "staging"
        await first.view("v").maintainer.stop()  # the process ends in the middle of the load
        gate.release.set()
        assert store.committed_orders("v") == set()  # nothing of the load is in the view

        second = Manager(catalog_url(tmp_path), SparkStore(spark, data))
        await second.start()
        try:
            assert second.view("v").info.state == "initializing"
            await second.wait_idle("v", timeout=120)
            assert second.view("v").info.state == "active"
            assert second.read("v") == recomputed(second, "v", paths)
        finally:
            await second.stop()


async def test_a_stream_cut_short_is_retried_and_never_shown(spark, tmp_path):
    paths = make_sources(tmp_path, rows=3000)
    async with deployed(spark, tmp_path, paths) as (store, deployment):
        manager = deployment.manager
        client = manager.clients["sa"]
        original = client.open_snapshot
        cut = threading.Event()

        @contextlib.contextmanager
        def truncated(request: RelationSnapshot):
            with original(request) as stream:
                data = stream.read()
            if not cut.is_set():  # the first answer loses its end: bytes cut mid-batch
                cut.set()
                data = data[: len(data) // 2]

            class Once:
                def __init__(self) -> None:
                    self.data = data

                def read(self, size: int = -1) -> bytes:
                    out = self.data if size < 0 else self.data[:size]
                    self.data = self.data[len(out) :]
                    return out

            yield Once()

        client.open_snapshot = truncated  # type: ignore[method-assign]
        await manager.define_view(VIEW, "v")
        await manager.wait_idle("v", timeout=120)
        assert cut.is_set()
        maintainer = manager.view("v").maintainer
        assert maintainer.counters.retries >= 1  # the cut stream was a transient fault
        assert manager.view("v").info.state == "active"
        assert manager.read("v") == recomputed(manager, "v", paths)


async def test_a_wrapper_that_dies_mid_stream_leaves_the_view_initializing(spark, tmp_path):
    paths = make_sources(tmp_path, rows=20_000)
    async with deployed(spark, tmp_path, paths) as (store, deployment):
        manager = deployment.manager
        client = manager.clients["sa"]
        original = client.open_snapshot
        wrapper = deployment.wrappers["sa"]

        @contextlib.contextmanager
        def dying(request: RelationSnapshot):
            with original(request) as stream:
                head = stream.read(4096)  # the stream has begun
                wrapper.kill()

                class Rest:
                    def __init__(self) -> None:
                        self.head = head

                    def read(self, size: int = -1) -> bytes:
                        if not self.head:
                            return stream.read(size)
                        cut = len(self.head) if size < 0 else size
                        out, self.head = self.head[:cut], self.head[cut:]
                        return out

                yield Rest()

        client.open_snapshot = dying  # type: ignore[method-assign]
        await manager.define_view(VIEW, "v")
        maintainer = manager.view("v").maintainer
        for _ in range(600):
            if maintainer.retrying:
                break
            await asyncio.sleep(0.05)
        retry = next(iter(maintainer.retrying.values()))
        assert "snapshot stream" in retry.error or "Connect" in retry.error, retry.error
        assert manager.view("v").info.state == "initializing"
        assert store.committed_orders("v") == set()
        assert manager.watermark("v") == 0  # readers see nothing of a partial load


async def test_verification_stages_the_relations_and_compares_in_spark(spark, analysts, tmp_path):
    """``pvm verify`` at scale: the relations are streamed and staged as the initial load
    stages them, rolled back to the view's state (the view is paused with changes received
    but not maintained), joined and compared by the analysts' query process; no relation
    passes through the manager as rows. It passes on a right view, plain or aggregate, and
    lists the rows of a corrupted one."""
    from warehouse.verify import verify_view

    paths = make_sources(tmp_path, rows=200)
    async with deployed(spark, tmp_path, paths) as (store, deployment):
        manager = deployment.manager
        manager.analysts = analysts
        await manager.define_view(VIEW, "v")
        await manager.define_view(AGGREGATES["grouped"], "g")
        for view in ("v", "g"):
            await manager.wait_idle(view, timeout=120)
            manager.pause_view(view)
        with contextlib.closing(sqlite3.connect(paths["sa"])) as db:
            db.execute("DELETE FROM R WHERE id IN (SELECT id FROM R ORDER BY id LIMIT 20)")
            db.execute("UPDATE R SET b = b + 1 WHERE id > 150")
            db.commit()
        await deployment.wait_shipped()
        for view in ("v", "g"):
            report = await verify_view(manager, view)
            assert report.engine == "spark (staged)" and report.equal, report.to_dict()
            assert report.expected_rows == sum(w for _, w in manager.read(view).items()) > 0
            assert sum(c.subtracted_updates for c in report.sources) > 0  # rolled back to the view's state
        real = next(iter(manager.read("v").rows()))
        bogus = (999_999, *real[1:])
        zlog = SparkStore.zlog_table("v")
        values = ", ".join("NULL" if v is None else repr(v) for v in bogus)
        spark.sql(f"INSERT INTO {zlog} SELECT {values}, 1L, 1L")
        report = await verify_view(manager, "v")
        assert not report.equal and report.extra_total == 1 and report.missing_total == 0
        assert [(list(r), n) for r, n in report.extra] == [(list(bogus), 1)]
