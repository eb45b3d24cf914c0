"""Pruning the update log (docs/protocol.md, "Pruning the update log").

What goes: an update every view over its source reflects at its recorded W, a unit record
at or below its view's W (but the newest few). What stays: everything a lagging view, a
shelved queue, a restart or a resent update still needs. The catalog's rule is held to it
directly, on SQLite, PostgreSQL and MariaDB; the manager's, under a workload, a paused view,
a restart with a queue past its budget, resent updates, and a crash with commits held while
it prunes in the background; every view must still equal its recomputation, as of every
unit record left.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import pytest
import sqlalchemy as sa

import migrations
from api.metrics import registry_for, render
from contract.schemas import Change, Update
from tests.sim import recompute, start_sim_manager
from tests.test_oracle import TABLES as ORACLE_TABLES
from tests.test_oracle import VIEWS as ORACLE_VIEWS
from tests.test_oracle import random_row, random_transaction, read_view
from tests.test_recovery import Delays, HeldStore, until
from warehouse.catalog.db import (
    Catalog,
    NewUpdate,
    Pruned,
    PruneReach,
    RelationInfo,
    ViewInfo,
    content_digest,
    reflected_through,
)
from warehouse.log_pruning import LogPruning
from warehouse.store.memory import MemoryStore

TABLES = {"a": {"R": ("k", "v TEXT")}, "b": {"S": ("k", "w")}}
JOIN = "SELECT R.k, R.v, S.w FROM a.R, b.S WHERE R.k = S.k"
ONLY_R = "SELECT R.k, R.v FROM a.R"
# everything as soon as no reader needs it, in small transactions, few unit records kept;
# rounds only when a test asks for one
AT_ONCE = LogPruning(retention_s=0, interval_s=3600, batch=7, keep_units=3)


# -- the catalog's rule ---------------------------------------------------------------------------


def _change(seq: int, tag: str = "") -> list[dict]:
    return [{"relation": "R", "sign": 1, "row": {"k": seq, "v": f"{tag}{seq}"}}]


def _updates(seqs, tag: str = "") -> list[NewUpdate]:
    return [NewUpdate(seq, _change(seq, tag), None, None, content_digest(_change(seq, tag))) for seq in seqs]


def _mariadb_catalog():
    name = f"pvm_catalog_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine("mysql+pymysql://root@127.0.0.1:3306/test", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    return admin, name


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def catalog(request, tmp_path):
    if request.param == "sqlite":
        cat = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
        yield cat
        cat.close()
    elif request.param == "postgresql":
        cat = Catalog(request.getfixturevalue("postgresql_catalog"))
        yield cat
        cat.close()
    else:
        admin, name = _mariadb_catalog()
        cat = Catalog(f"mysql+pymysql://root@127.0.0.1:3306/{name}")
        try:
            yield cat
        finally:
            cat.close()
            with admin.connect() as conn:
                conn.exec_driver_sql(f"DROP DATABASE {name}")
            admin.dispose()


def _view(name: str, bases: dict[str, int]) -> ViewInfo:
    return ViewInfo(name, "SELECT …", 1, 1, "out_of_order", "active", bases, 0, None, time.time())


def test_the_catalog_prunes_what_every_view_reflects_and_no_more(catalog: Catalog) -> None:
    relation = RelationInfo("a", "R", ("k", "v"), ("INTEGER", "TEXT"), ())
    catalog.add_source("a", "http://a", "trigger", [relation])
    catalog.add_source("b", "http://b", "trigger", [RelationInfo("b", "S", ("k",), ("INTEGER",), ())])
    ids = {e.seq: e.id for e in catalog.append_updates("a", _updates(range(1, 11)))}
    held = catalog.append_updates("a", _updates([12]))  # above the gap at 11: never released
    catalog.append_updates("b", _updates([1, 2]))
    # v1 loaded a at seq 2 and reflects a through 6 at W = 3; v2 loaded at 0, reflects 1-4
    # at W = 2, and runs a unit of seq 5; no view reads b
    catalog.add_view(_view("v1", {"a": 2}))
    catalog.add_view(_view("v2", {"a": 0}))
    catalog.start_unit("v1", 1, [])
    catalog.start_unit("v1", 2, [ids[3], ids[4], ids[5]])
    catalog.start_unit("v1", 3, [ids[6]])
    catalog.commit_units("v1", [1, 2, 3], 3)
    catalog.start_unit("v2", 1, [])
    catalog.start_unit("v2", 2, [ids[1], ids[2], ids[3], ids[4]])
    catalog.commit_units("v2", [1, 2], 2)
    catalog.start_unit("v2", 3, [ids[5]])
    assert [(u.source, u.first_seq, u.last_seq) for u in catalog.units("v1")] == [
        (None, None, None),
        ("a", 3, 5),
        ("a", 6, 6),
    ]
    reach = PruneReach({"a": 10, "b": 2})
    # nothing is old enough yet
    assert (catalog.prune(reach, before=0.0, most=100, keep_units=0).entries, catalog.log_size()) == (0, 13)

    # a transaction removes at most `most` of each kind, a prefix of a's seqs
    first = catalog.prune(reach, before=time.time() + 1, most=2, keep_units=0)
    assert (first.entries, first.units) == (2, 2)
    rest = catalog.prune(reach, before=time.time() + 1, most=100, keep_units=0)
    # a: through 4 (v2 reflects no more; v1's 5 and 6 stay for it); b: no view reads it, all of it
    assert [e.seq for e in catalog.log_entries("a")] == [5, 6, 7, 8, 9, 10, 12]
    assert catalog.log_entries("b") == []
    assert first.entries + rest.entries == 4 + 2
    # unit records at or below W fold into the view's row; v2's running unit stays
    assert [u.order for u in catalog.units("v1")] == [] and [u.order for u in catalog.units("v2")] == [3]
    views = catalog.views()
    assert (views["v1"].folded_order, views["v1"].folded_seqs) == (3, {"a": 6})
    assert (views["v2"].folded_order, views["v2"].folded_seqs) == (2, {"a": 4})
    assert catalog.reflected("v1", 3) == {"a": 6} and catalog.reflected("v2", 3) == {"a": 5}

    # the receiver's cursor after a restart: released through 10, 12 held (by its log id)
    assert catalog.log_positions("a") == (10, {12: held[0].id})
    assert catalog.log_positions("b") == (2, {})
    # a resent pruned seq is a duplicate, whatever it holds now: acknowledged, not logged again
    assert catalog.append_updates("a", _updates([1, 2], tag="other")) == []
    assert catalog.append_updates("b", _updates([2, 3]))[0].seq == 3
    assert [e.seq for e in catalog.log_entries("a")][:1] == [5]

    # v2 commits seq 5 and moves on: seq 5 may go; v1 still needs nothing more than it has
    catalog.commit_units("v2", [3], 3)
    assert catalog.prune(reach, before=time.time() + 1, most=100, keep_units=5).entries == 1
    assert catalog.log_positions("a") == (10, {12: held[0].id})
    # keep_units keeps the newest committed records; the one kept still tells what it holds
    assert [u.order for u in catalog.units("v2")] == [3]
    assert reflected_through(catalog.views()["v2"].start()[1], catalog.units("v2"), 3) == {"a": 5}

    # the manager's word that v1 reads nothing of a's 7 and 8 (never queued) and v2 nothing
    # of 6-9: through 8 may go; its word counts for no more than what the views reflect
    passed = PruneReach({"a": 10}, {"v1": {"a": 8}, "v2": {"a": 9}})
    assert catalog.prune(passed, before=time.time() + 1, most=100, keep_units=5).entries == 3
    assert catalog.log_positions("a") == (10, {12: held[0].id}) and catalog.log_entries("a")[0].seq == 9
    low = PruneReach({"a": 10}, {"v1": {"a": 1}, "v2": {"a": 1}})
    assert catalog.prune(low, before=time.time() + 1, most=100, keep_units=5).entries == 0


def test_the_catalog_keeps_times_to_the_millisecond(catalog: Catalog) -> None:
    """Pruning compares the times rows were received and committed with a cut-off: they are
    double precision on every database (a bare FLOAT on MariaDB rounds today's epoch seconds
    to 128 s), so a cut-off a second after them prunes them and one a second before does not."""
    catalog.add_source("a", "http://a", "trigger", [RelationInfo("a", "R", ("k", "v"), ("INTEGER", "TEXT"), ())])
    catalog.add_view(_view("v", {"a": 0}))
    before = time.time()
    (entry,) = catalog.append_updates("a", _updates([1]))
    catalog.start_unit("v", 1, [])
    catalog.start_unit("v", 2, [entry.id])
    catalog.commit_units("v", [1, 2], 2)
    after = time.time()
    (logged,) = catalog.log_entries("a")
    units = catalog.units("v")
    for at in (logged.received_at, *(u.started_at for u in units), *(u.committed_at for u in units)):
        assert at is not None and before - 1e-3 <= at <= after + 1e-3
    reach = PruneReach({"a": 1})
    assert catalog.prune(reach, before=before - 1, most=10, keep_units=0) == Pruned(0, 0)
    assert catalog.prune(reach, before=after + 1, most=10, keep_units=0) == Pruned(1, 2)


def test_the_migration_records_what_each_unit_holds(tmp_path) -> None:
    """Units recorded before 0005 get their seqs from the log, so a pruned log cannot lose them."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    migrations.upgrade(url, "0004")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO sources (name, wrapper_url, capture, created_at) VALUES ('a', 'http://a', 'trigger', 0)"
        )
        for seq in (1, 2, 3):
            conn.exec_driver_sql(
                f"INSERT INTO update_log (id, source, seq, changes, received_at) VALUES ({10 + seq}, 'a', {seq}, '[]', 0)"
            )
        conn.exec_driver_sql(
            "INSERT INTO views (name, sql, parallelism, batch_size, commit_mode, state, bases, watermark, created_at) "
            "VALUES ('v', 'SELECT', 1, 1, 'arrival', 'active', '{\"a\": 0}', 2, 0)"
        )
        for order, log_ids in ((1, "[]"), (2, "[11, 12]"), (3, "[13]")):
            conn.exec_driver_sql(
                "INSERT INTO units (view, order_no, log_ids, committed, started_at) "
                f"VALUES ('v', {order}, '{log_ids}', 1, 0)"
            )
    engine.dispose()
    catalog = Catalog(url)
    try:
        assert [(u.source, u.first_seq, u.last_seq) for u in catalog.units("v")] == [
            (None, None, None),
            ("a", 1, 2),
            ("a", 3, 3),
        ]
        assert catalog.views()["v"].start() == (0, {"a": 0}) and catalog.log_positions("a") == (3, {})
    finally:
        catalog.close()


# -- the manager: what a lagging view, a shelved queue, a restart, a resend need -----------------


def expected(manager, sources, view: str):
    contents = {(s, t): z for s, src in sources.items() for t, z in src.state.items()}
    columns = {(s, t): c for s, src in sources.items() for t, c in src.tables.items()}
    return recompute(manager.view(view).plan, contents, columns)


async def check_history(manager, sources, view: str) -> list[str]:
    """The view as of every unit record left (and the order they were folded into) equals
    its recomputation over the sources at the seqs the records say it reflects there."""
    info, units = await manager.db(Catalog.view_units, view)  # together: a round may fold in between
    units = [u for u in units if u.order <= manager.watermark(view)]
    folded, start = info.start()
    plan = manager.view(view).plan
    columns = {(s, t): c for s, src in sources.items() for t, c in src.tables.items()}
    mismatches = []
    for order in ([folded] if folded else []) + [u.order for u in units]:
        upto = reflected_through(start, units, order)
        contents = {(s, t): z for s in plan.sources for t, z in sources[s].state_at(upto[s]).items()}
        if (got := read_view(manager, view, as_of=order)) != (want := recompute(plan, contents, columns)):
            mismatches.append(f"{view} as of {order}: got {got}, expected {want}")
    return mismatches


async def settle(manager, sources, *views: str) -> None:
    for s in sources.values():
        await s.ship()
    for view in views:
        await manager.wait_idle(view, timeout=60)
        assert manager.read(view) == expected(manager, sources, view), view
        assert await check_history(manager, sources, view) == []


async def change(sources, first: int, last: int, also_s: bool = False) -> None:
    for i in range(first, last):
        sources["a"].commit([("R", 1, (i % 5, f"r{i}"))])
        await sources["a"].ship()
        if also_s and i % 2:
            sources["b"].commit([("S", 1, (i % 5, i))])
            await sources["b"].ship()


async def test_a_lagging_view_keeps_what_it_has_not_reflected_through_a_restart(tmp_path) -> None:
    """Two views over source a; ``only_r`` is paused (its queue shelved: in the log only)
    while ``join`` goes on. Pruning removes what both reflect and b's updates (``join``
    reflects them all), keeps every update ``only_r`` has not reflected; after a restart
    with a queue budget of 3 changes, ``only_r`` reads its queue back from the log and both
    views equal their recomputation; then everything goes, and a resent seq is a duplicate."""
    catalog, store = tmp_path / "catalog.db", MemoryStore()
    manager, sources = await start_sim_manager(catalog, TABLES, store, log_pruning=AT_ONCE)
    try:
        sources["a"].load("R", [(0, "x"), (1, "y")])
        sources["b"].load("S", [(0, 0), (1, 10), (2, 20)])
        await manager.define_view(JOIN, "join", parallelism=2)
        await manager.define_view(ONLY_R, "only_r", parallelism=1)
        await change(sources, 0, 20, also_s=True)
        await settle(manager, sources, "join", "only_r")
        manager.pause_view("only_r")
        await change(sources, 20, 40)
        await manager.wait_idle("join")
        protocol = manager.view("only_r").maintainer.protocol
        await until(lambda: protocol.shelf is not None and not protocol.umq)
        assert protocol.queued == 20
        reflected = (await manager.db(Catalog.reflected, "only_r", manager.watermark("only_r")))["a"]
        assert reflected == len(sources["a"].shipped) - 20

        await manager.pruner.round()
        left = [e.seq for e in await manager.db(Catalog.log_entries, "a", 0)]
        assert left == list(range(reflected + 1, len(sources["a"].shipped) + 1))  # only_r's, all of them
        assert await manager.db(Catalog.log_entries, "b", 0) == []
        for view in ("join", "only_r"):
            units = await manager.db(Catalog.units, view)
            assert sum(u.order <= manager.watermark(view) for u in units) <= AT_ONCE.keep_units
            assert (await manager.db(Catalog.views))[view].folded_order > 0
        assert await check_history(manager, sources, "join") == []
    finally:
        await manager.stop()

    # a restart: only_r's queue (20 updates, 3 changes in memory at most) comes back from the log
    manager, _ = await start_sim_manager(
        catalog, TABLES, store, sources=sources, log_pruning=AT_ONCE, max_queued_changes=3
    )
    try:
        assert manager.receiver.released_through("b") == len(sources["b"].shipped)
        await change(sources, 40, 50, also_s=True)
        await settle(manager, sources, "join", "only_r")
        assert manager.view("only_r").maintainer.counters.updates_read_back > 0

        pruned = await manager.pruner.round()
        assert pruned.entries == len(left) + 10 + 5 and await manager.db(Catalog.log_size) == 0
        counters = manager.pruner.counters
        assert (counters.entries_pruned, counters.log_entries) == (pruned.entries, 0)
        # a wrapper resending a pruned seq with other content: a duplicate, acknowledged
        resent = Update(seq=3, changes=[Change(relation="R", sign=1, row={"k": 99, "v": "again"})])
        ack = await manager.receive("a", [resent])
        assert ack.through == len(sources["a"].shipped) and await manager.db(Catalog.log_size) == 0
        await settle(manager, sources, "join", "only_r")
    finally:
        await manager.stop()

    # and once more: a restart over a log pruned empty
    manager, _ = await start_sim_manager(catalog, TABLES, store, sources=sources, log_pruning=AT_ONCE)
    try:
        assert manager.receiver.released_through("a") == len(sources["a"].shipped)
        await change(sources, 50, 60, also_s=True)
        await settle(manager, sources, "join", "only_r")
        metrics_of = manager.pruner.counters
        await manager.pruner.round()
        assert metrics_of.entries_pruned == 15 and metrics_of.log_entries == 0
    finally:
        await manager.stop()


async def test_retention_keeps_young_updates_and_keep_update_log_keeps_all(tmp_path) -> None:
    store = MemoryStore()
    manager, sources = await start_sim_manager(
        tmp_path / "catalog.db", TABLES, store, log_pruning=LogPruning(retention_s=3600, interval_s=3600)
    )
    try:
        sources["a"].load("R", [(0, "x")])
        await manager.define_view(ONLY_R, "only_r", parallelism=1)
        await change(sources, 0, 10)
        await settle(manager, sources, "only_r")
        assert (await manager.pruner.round()).entries == 0  # all younger than an hour
        assert (await manager.pruner.round(now=time.time() + 3601)).entries == 10
        metrics = render(registry_for(manager))[0].decode()
        assert "pvm_update_log_pruned_total 10.0" in metrics and "pvm_update_log_entries 0.0" in metrics, metrics
        assert "pvm_update_log_last_pruned_timestamp_seconds " in metrics
    finally:
        await manager.stop()
    manager, _ = await start_sim_manager(tmp_path / "catalog.db", TABLES, store, sources=sources)
    try:
        assert manager.pruner is None  # a manager given no pruning keeps its log
        await change(sources, 10, 15)
        await settle(manager, sources, "only_r")
    finally:
        await manager.stop()


@pytest.mark.parametrize("seed", range(3))
async def test_pruning_while_maintaining_and_a_crash_with_commits_held(tmp_path, seed: int) -> None:
    """The oracle's views and workload with the log pruned in the background every few
    milliseconds, in transactions of 5; commits are then held, the manager dies with every
    unit since uncommitted, and a new one (pruning too) recovers them from what is left."""
    rng = random.Random(seed)
    store = HeldStore()
    catalog = tmp_path / f"catalog-{seed}.db"
    pruning = LogPruning(retention_s=0, interval_s=0.005, batch=5, keep_units=2)
    delays = Delays(before_snapshot=0.002, evaluation=0.003, shipping=0.001)
    manager, sources = await start_sim_manager(
        catalog, ORACLE_TABLES, store, seed=seed, delays=delays, log_pruning=pruning
    )

    async def workload(transactions: int) -> None:
        for _ in range(transactions):
            source = rng.choice(list(sources.values()))
            source.commit(random_transaction(rng, source))
            await source.ship()
            await asyncio.sleep(0.001)

    try:
        for s in sources.values():
            for t, cols in s.tables.items():
                s.load(t, [random_row(rng, len(cols)) for _ in range(6)])
        for name, sql in ORACLE_VIEWS.items():
            await manager.define_view(sql, name=name, parallelism=rng.choice([1, 2, 3]), batch_size=rng.choice([1, 2]))
        await workload(30)
        for name in ORACLE_VIEWS:
            await manager.wait_idle(name, timeout=60)
        await until(lambda: manager.pruner.counters.entries_pruned > 0)
        store.open.clear()
        await workload(12)
        await until(lambda: all(manager.view(v).maintainer.protocol.quiet for v in ORACLE_VIEWS))
        units = [u for v in ORACLE_VIEWS for u in await manager.db(Catalog.units, v)]
        assert any(not u.committed for u in units)
        await asyncio.sleep(0.05)  # rounds while units wait for their commits
    finally:
        await manager.stop()  # the crash: nothing since the hold is committed
    store.abandoned = True
    store.open.set()

    manager, _ = await start_sim_manager(catalog, ORACLE_TABLES, store, sources=sources, log_pruning=pruning)
    try:
        await workload(12)
        for name in ORACLE_VIEWS:
            await settle(manager, sources, name)
        await manager.pruner.round()
        assert await manager.db(Catalog.log_size) == 0  # every view reflects everything
    finally:
        await manager.stop()
