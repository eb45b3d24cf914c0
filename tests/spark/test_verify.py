"""``pvm verify``: the view recomputed in Spark from snapshots of its sources, rolled back to
the state the view reflects, equals the stored view while updates are still unmaintained;
a corrupted store is caught with the differing rows listed and a non-zero exit. The
recomputation and the comparison run in the analysts' query process, which reads the stored
view from the store's files: commits and publishes of the view go on meanwhile."""

from __future__ import annotations

import asyncio
import random
import threading
import uuid

import pytest
from pyspark.sql import SparkSession

from api.auth import issue
from api.manager_app import create_app
from contract.zset import ZSet
from pvm.cli import main
from pvm.http_server import http_url, listen, start_serving, uvicorn_server
from tests.sim import SimSource
from tests.spark.analyst_support import TABLES, change, join_sql, settle, sim_manager
from warehouse.analysts.supervisor import AnalystProcess
from warehouse.manager import Manager
from warehouse.store.memory import MemoryStore
from warehouse.store.spark import SparkStore
from warehouse.verify import Report, differences, verify_view

pytestmark = pytest.mark.spark


async def _served(tmp_path, store, analysts: AnalystProcess, seed: int = 3):
    """A manager over in-process sources, started by its HTTP server as ``pvm serve`` does,
    with the analysts' query process (``store`` must be subscribed to it)."""
    rng = random.Random(seed)
    sources = {name: SimSource(name, tables, random.Random(rng.random())) for name, tables in TABLES.items()}
    sources["s1"].load("r", [(i, rng.randrange(4)) for i in range(1, 13)])
    sources["s2"].load("s", [(b, rng.randrange(3)) for b in range(4) for _ in range(2)])
    manager = Manager(
        f"sqlite:///{tmp_path / f'catalog-{uuid.uuid4().hex[:8]}.db'}",
        store,
        connect=lambda n, u: sources[n],
        analysts=analysts,
    )
    sock = listen("127.0.0.1", 0)
    server = uvicorn_server(create_app(manager))
    serving = await start_serving(server, sock)
    for s in sources.values():
        s.receive = manager.receive
        await manager.add_source(s.name, f"sim://{s.name}")
    return manager, sources, http_url(sock), server, serving


async def _pvm(capsys, *argv: str) -> tuple[int, str]:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


async def test_pvm_verify_passes_then_catches_corruption(
    spark: SparkSession, analyst_store: SparkStore, analysts: AnalystProcess, tmp_path, view: str, capsys
) -> None:
    spark_store = analyst_store
    manager, sources, url, server, serving = await _served(tmp_path, spark_store, analysts)
    try:
        _, token = await issue(manager, "analyst")
        await manager.define_view(join_sql(view), name=view, parallelism=3)
        rng = random.Random(11)
        for _ in range(10):
            change(sources[rng.choice(["s1", "s2"])], rng)
            if rng.random() < 0.5:
                await sources[rng.choice(["s1", "s2"])].ship()
        for s in sources.values():
            await s.ship()
        await manager.wait_idle(view, timeout=60)

        # updates the view does not reflect yet: received but not maintained, and committed
        # at the sources but not even shipped (the snapshot handshake ships them)
        manager.pause_view(view)
        for _ in range(4):
            change(sources["s1"], rng)
            change(sources["s2"], rng)
            await sources["s2"].ship()
        for _ in range(3):
            change(sources["s1"], rng)
        code, out = await _pvm(capsys, "verify", view, "--manager", url, "--token", token)
        assert code == 0, out
        assert "verified" in out
        report = (await verify_view(manager, view)).to_dict()
        assert report["equal"] and report["engine"] == "spark"
        assert sum(c["subtracted_updates"] for c in report["sources"]) > 0  # the roll-back was needed

        # corrupt the store behind the manager's back: one bogus row, one real row taken away
        real = next(iter(spark_store.read(view).rows()))
        zlog = SparkStore.zlog_table(view)
        spark.sql(f"INSERT INTO {zlog} VALUES (424242, 7, 1, 1, 1), ({real[0]}, {real[1]}, {real[2]}, -1, 1)")
        code, out = await _pvm(capsys, "verify", view, "--manager", url, "--token", token, "--max-differences", "5")
        assert code == 1, out
        assert "MISMATCH" in out and "424242" in out and str(real[0]) in out
        report = (await verify_view(manager, view)).to_dict()
        assert report["extra"] == [{"row": [424242, 7, 1], "count": 1}]
        assert report["missing"] == [{"row": list(real), "count": 1}]

        code, out = await _pvm(capsys, "verify", "no_such_view", "--manager", url, "--token", token)
        assert code == 2 and "no_such_view" in out
    finally:
        server.should_exit = True
        await serving


async def test_commits_and_publishes_go_on_while_a_verification_reads_the_stored_view(
    analyst_store: SparkStore, analysts: AnalystProcess, tmp_path, view: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored side of a verification is held up for as long as the test likes, wherever
    it is read: a read through the store (under the view's lock, as commits and publishes
    take it) or the query process's work. A new unit of the view is committed and published
    meanwhile, and the verification, once it goes on, still finds the view right as of its W."""
    manager, sources = await sim_manager(tmp_path, analyst_store, seed=5, analysts=analysts)
    reading, release = threading.Event(), threading.Event()
    readers: list[str] = []
    try:
        await manager.define_view(join_sql(view), name=view, parallelism=2)
        rng = random.Random(5)
        for _ in range(6):
            change(sources[rng.choice(["s1", "s2"])], rng)
        for s in sources.values():
            await s.ship()
        await settle(manager, analyst_store, view)

        read = analyst_store.read

        def read_under_the_lock(name: str, as_of: int | None = None) -> ZSet:
            with analyst_store._hold(name):
                readers.append("the store")
                reading.set()
                release.wait(60)
            return read(name, as_of)

        engine_part = getattr(analysts, "verify", None)

        async def held_in_the_query_process(request, who):
            readers.append("the query process")
            reading.set()
            await asyncio.to_thread(release.wait, 60)
            return await engine_part(request, who)

        monkeypatch.setattr(analyst_store, "read", read_under_the_lock)
        monkeypatch.setattr(analysts, "verify", held_in_the_query_process, raising=False)
        checking = asyncio.create_task(verify_view(manager, view))
        try:
            assert await asyncio.to_thread(reading.wait, 60), "the verification never read the stored view"
            watermark, published = manager.watermark(view), analyst_store.published(view)
            change(sources["s1"], rng)
            await sources["s1"].ship()
            await asyncio.wait_for(manager.wait_idle(view), 30)  # committed, not held up
            assert manager.watermark(view) > watermark
            deadline = asyncio.get_running_loop().time() + 30
            while analyst_store.published(view) == published:  # published, not held up
                assert asyncio.get_running_loop().time() < deadline, "the new watermark was not published"
                await asyncio.sleep(0.05)
        finally:
            release.set()
        report = await checking
        assert readers == ["the query process"]
        assert report.equal and report.engine == "spark" and report.watermark == watermark, report.to_dict()
    finally:
        release.set()
        await manager.stop()


async def test_verify_a_self_join_with_a_left_join_in_spark(
    analyst_store: SparkStore, analysts: AnalystProcess, tmp_path, view: str
) -> None:
    """A view reading r twice, the second time through a LEFT JOIN: the verification reads r
    once, Spark runs the view's own SELECT (NULL-extended rows included) over it, and it
    equals the stored view, with updates not yet maintained rolled back."""
    manager, sources = await sim_manager(tmp_path, analyst_store, seed=5, analysts=analysts)
    sql = (
        f"CREATE VIEW {view} AS SELECT r.id, s.c, q.id AS qid FROM s1.r JOIN s2.s ON r.b = s.b "
        "LEFT JOIN s1.r q ON s.c = q.id AND q.b > 0"
    )
    try:
        await manager.define_view(sql, parallelism=3)
        rng = random.Random(5)
        for _ in range(10):
            change(sources[rng.choice(["s1", "s2"])], rng)
        for s in sources.values():
            await s.ship()
        await settle(manager, analyst_store, view)
        stored = analyst_store.read(view)
        assert any(row[2] is None for row in stored.rows()) and any(row[2] is not None for row in stored.rows())
        manager.pause_view(view)
        for _ in range(4):
            change(sources["s1"], rng)
            await sources["s1"].ship()
        report = await verify_view(manager, view)
        assert report.equal and report.engine == "spark", report.to_dict()
        assert [c.relation for c in report.sources] == ["r", "s"]  # r once, for both aliases
        assert report.sources[0].subtracted_updates > 0
    finally:
        await manager.stop()


async def test_verify_without_spark_recomputes_in_python(tmp_path) -> None:
    manager, sources = await sim_manager(tmp_path, MemoryStore(), seed=4)
    try:
        await manager.define_view(join_sql("v"), parallelism=2)
        rng = random.Random(4)
        for _ in range(8):
            change(sources[rng.choice(["s1", "s2"])], rng)
        for s in sources.values():
            await s.ship()
        await manager.wait_idle("v", timeout=60)
        report = await verify_view(manager, "v")
        assert report.equal and report.engine == "python" and report.expected_rows == report.stored_rows
    finally:
        await manager.stop()


def test_differences() -> None:
    missing, extra, m, e = differences(ZSet({(1,): 2, (2,): 1}), ZSet({(1,): 1, (3,): 1, (2,): 1}), 10)
    assert (missing, extra, m, e) == ([((1,), 1)], [((3,), 1)], 1, 1)
    assert Report("v", ["x"], 1, "python", 0, 0, [], [], 0, 0).equal
