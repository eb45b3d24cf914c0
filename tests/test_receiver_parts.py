"""Updates in parts, staged in the catalog (docs/api.md, "Updates in parts").

The catalog's side on SQLite, PostgreSQL and MariaDB: parts are staged a row each, logged as
one seq with their last part (copied inside the database), read back whole or by name, cut
a read of the log, and go with their log entry when it is pruned. The manager's: an update
of many parts is acknowledged and released only with its last part, the receiver holding
counts and a digest, never the changes; parts outlive a restart; part 0 drops what was
staged; resends compare as for any update; and views over sources that ship large updates
in parts, with queues past their budget, equal recomputation as of every watermark.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from contract.schemas import Ack, Change, Update, UpdatePart
from contract.zset import ZSet
from tests.sim import Delays, SimSource, start_sim_manager
from tests.test_oracle import check_view, read_view
from warehouse.catalog.db import (
    Catalog,
    LogEntry,
    LogRef,
    NewUpdate,
    PruneReach,
    RelationInfo,
    SeqConflict,
    StagedPart,
    StagedUpdate,
    content_digest,
)
from warehouse.catalog.models import LogPartRow, StagedPartRow
from warehouse.catalog.statement_size import StatementTooLarge
from warehouse.manager import Manager
from warehouse.receiver import PartRefused, TooLarge
from warehouse.store.memory import MemoryStore

TABLES = {"a": {"R": ("k", "v TEXT")}, "b": {"S": ("k", "w")}}
VIEW = "SELECT R.k, R.v, S.w FROM a.R, b.S WHERE R.k = S.k"


# -- the catalog ----------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'catalog.db'}"
    elif request.param == "postgresql":
        url = request.getfixturevalue("postgresql_catalog")
    else:
        url = request.getfixturevalue("mariadb_catalog")
    cat = Catalog(url)
    cat.add_source("a", "http://a", "trigger", [RelationInfo("a", "R", ("k", "v"), ("INTEGER", "TEXT"), ())])
    yield cat
    cat.close()


@pytest.fixture
def mariadb_catalog() -> Iterator[str]:
    name = f"pvm_catalog_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine("mysql+pymysql://root@127.0.0.1:3306/test", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield f"mysql+pymysql://root@127.0.0.1:3306/{name}"
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE {name}")
        admin.dispose()


def changes(keys: range, v: object = "x") -> list[dict]:
    return [{"relation": "R", "sign": 1, "row": {"k": k, "v": v}} for k in keys]


def staged_rows(engine: sa.Engine) -> list[tuple[str, int, int, int]]:
    """(source, seq, part, changes) of every staged part."""
    with engine.connect() as conn:
        q = sa.select(StagedPartRow.source, StagedPartRow.seq, StagedPartRow.part, StagedPartRow.count)
        return sorted((s, q_, p, c) for s, q_, p, c in conn.execute(q.order_by(StagedPartRow.part)))


def log_parts(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(LogPartRow)).scalar_one())


def test_parts_are_staged_then_logged_as_one_seq(catalog: Catalog) -> None:
    # values whose JSON must come back as they went: 1.0 stays a float, NaN and -0.0 stay
    odd = [{"relation": "R", "sign": -1, "row": {"k": 1.0, "v": float("nan")}}, *changes(range(1), -0.0)]
    parts = [changes(range(3)), odd, changes(range(3, 5), "ü")]
    whole = [c for part in parts for c in part]
    catalog.append_updates("a", [NewUpdate(1, changes(range(1)), None, None, content_digest(changes(range(1))))])
    assert catalog.stage_part("a", StagedPart(2, 0, parts[0], "t1", 5.5))
    assert catalog.stage_part("a", StagedPart(2, 1, parts[1], "t1", 5.5))
    assert catalog.staged("a") == StagedUpdate(2, "t1", 5.5, 2, 5)
    assert content_digest(catalog.staged_part("a", 2, 1)) == content_digest(parts[1])  # NaN is not NaN: digests
    assert catalog.log_entries("a", 1) == []  # nothing logged before the last part

    ref = catalog.log_staged("a", StagedPart(2, 2, parts[2], "t1", 5.5), content_digest(whole))
    assert isinstance(ref, LogRef) and ref.seq == 2
    assert catalog.staged("a") is None and staged_rows(catalog.engine) == []
    assert log_parts(catalog.engine) == 3
    [entry] = catalog.log_entries("a", 1)
    assert (entry.id, entry.parts, len(entry.changes)) == (ref.id, 3, 7)
    assert content_digest(entry.changes) == content_digest(whole)  # the same content, value for value
    assert [type(e) for e in catalog.log_releases([entry.id - 1, entry.id])] == [LogEntry, LogRef]

    # resent whole: the same content is a duplicate, other content a conflict
    assert catalog.append_updates("a", [NewUpdate(2, whole, "t1", 5.5, content_digest(whole))]) == []
    with pytest.raises(SeqConflict):
        catalog.append_updates("a", [NewUpdate(2, whole[:-1], "t1", 5.5, content_digest(whole[:-1]))])
    # or in parts again: logged already, nothing staged
    assert not catalog.stage_part("a", StagedPart(2, 0, parts[0], "t1", 5.5))
    assert catalog.log_staged("a", StagedPart(2, 0, whole, "t1", 5.5), content_digest(whole)) is None
    assert staged_rows(catalog.engine) == []

    # a read of the log ends with an update logged from parts
    catalog.append_updates(
        "a", [NewUpdate(3, changes(range(9, 10)), None, None, content_digest(changes(range(9, 10))))]
    )
    assert [e.seq for e in catalog.log_range_read("a", 0, 3, 10, lambda e: e.seq)] == [1, 2]
    assert [e.seq for e in catalog.log_range_read("a", 2, 3, 10, lambda e: e.seq)] == [3]
    # read through a function, the update of parts is never joined: its changes come a
    # part at a time, as often as the function goes through them, and the same as whole
    seen: list[tuple[bool, int, int]] = []

    def read(e: LogEntry) -> str:
        seen.append((isinstance(e.changes, list), sum(1 for _ in e.changes), sum(1 for _ in e.changes)))
        return content_digest(list(e.changes))

    read_back = catalog.log_range_read("a", 0, 3, 10, read)
    assert [(r.seq, r.parts) for r in read_back] == [(1, 0), (2, 3)]
    assert read_back[1].value == content_digest(whole) and seen[1] == (False, 7, 7)
    assert catalog.log_ids_read([entry.id], read)[entry.id].value == content_digest(whole)

    # pruned, its parts go with it
    pruned = catalog.prune(PruneReach({"a": 2}), before=float("inf"), most=10, keep_units=0)
    assert pruned.entries == 2 and log_parts(catalog.engine) == 0


def test_what_a_source_stages_is_one_update_and_never_left_behind(catalog: Catalog) -> None:
    catalog.stage_part("a", StagedPart(1, 0, changes(range(2)), None, None))
    catalog.stage_part("a", StagedPart(1, 1, changes(range(2, 4)), None, None))
    catalog.stage_part("a", StagedPart(1, 0, changes(range(1)), None, None))  # part 0: afresh
    assert staged_rows(catalog.engine) == [("a", 1, 0, 1)]
    catalog.stage_part("a", StagedPart(2, 0, changes(range(3)), None, None))  # another seq's part 0
    assert staged_rows(catalog.engine) == [("a", 2, 0, 3)]
    whole = changes(range(5))
    catalog.append_updates("a", [NewUpdate(2, whole, None, None, content_digest(whole))])  # logged whole meanwhile
    assert staged_rows(catalog.engine) == []
    catalog.stage_part("a", StagedPart(3, 0, changes(range(3)), None, None))
    catalog.append_updates("a", [NewUpdate(3, whole, None, None, content_digest(whole))])
    with pytest.raises(SeqConflict):  # seq 3 was logged meanwhile, with other content
        catalog.log_staged("a", StagedPart(3, 1, changes(range(3, 4)), None, None), content_digest(changes(range(4))))
    assert staged_rows(catalog.engine) == []


def packet_of(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql("SELECT @@max_allowed_packet").scalar_one())
    finally:
        engine.dispose()


def test_a_part_too_large_for_one_mariadb_statement_is_refused_before_it_is_sent(mariadb_catalog: str) -> None:
    """MariaDB refuses a statement beyond ``max_allowed_packet`` and drops the connection: the
    catalog measures the changes' JSON as the driver would send them and refuses a part (or
    an update) that cannot fit, naming the sizes, with nothing staged or logged."""
    packet = packet_of(mariadb_catalog)
    cat = Catalog(mariadb_catalog)
    cat.add_source("a", "http://a", "trigger", [RelationInfo("a", "R", ("k", "v"), ("INTEGER", "TEXT"), ())])
    try:
        wide = changes(range(packet // 1000 + 100), "w" * 1000)  # just beyond the packet
        with pytest.raises(StatementTooLarge, match=f"max_allowed_packet {packet:,} bytes") as refused:
            cat.stage_part("a", StagedPart(1, 0, wide, None, None))
        assert packet < refused.value.size < packet * 1.2
        with pytest.raises(StatementTooLarge):
            cat.append_updates("a", [NewUpdate(1, wide, None, None, content_digest(wide))])
        assert cat.staged("a") is None and cat.log_entries("a", 0) == []
        half = len(wide) // 2  # the same changes in two parts fit, on the connections as they were
        assert cat.stage_part("a", StagedPart(1, 0, wide[:half], None, None))
        assert cat.log_staged("a", StagedPart(1, 1, wide[half:], None, None), content_digest(wide)) is not None
        assert len(cat.log_entries("a", 0)[0].changes) == len(wide)
    finally:
        cat.close()


# -- the manager ----------------------------------------------------------------------------------


def part_of(seq: int, index: int, last: bool, keys: range, v: str = "x") -> Update:
    wire = [Change(relation="R", sign=1, row={"k": k, "v": v}) for k in keys]
    return Update(seq=seq, changes=wire, txid=f"t{seq}", part=UpdatePart(index=index, last=last))


async def defined(tmp_path: Path, **options: object) -> tuple[Manager, dict[str, SimSource]]:
    manager, sources = await start_sim_manager(tmp_path / "catalog.db", TABLES, **options)
    sources["a"].load("R", [])
    sources["b"].load("S", [(k, 10 * k) for k in range(1000)])
    await manager.define_view(VIEW, "v", parallelism=2)
    await manager.wait_idle("v", timeout=60)
    return manager, sources


async def test_an_update_of_many_parts_is_staged_then_logged_acknowledged_and_seen_whole(tmp_path: Path) -> None:
    """200 changes in 40 parts of 5: each part staged in the catalog, acknowledged with the
    parts held; the receiver holds counts and a digest only; nothing logged or visible until
    the last part; then one seq, released by name and read from the log by the view."""
    manager, sources = await defined(tmp_path, max_queued_changes=50)
    try:
        released: list[object] = []
        release = manager.receiver._release
        manager.receiver._release = lambda entry: (released.append(entry), release(entry))
        sources["a"].commit([("R", 1, (k, f"r{k}")) for k in range(200)])
        source = sources["a"]
        seen_staged = []
        original = source.receive

        async def observing(name: str, updates: list[Update]) -> Ack:
            ack = await original(name, updates)
            if ack.parts is not None:
                staging = manager.receiver._cursors["a"].staging
                assert staging is not None and (staging.parts, staging.changes) == (ack.parts, 5 * ack.parts)
                assert not any(isinstance(v, list) for v in vars(staging).values())  # no changes in memory
                assert await manager.db(Catalog.log_entries, "a", 0) == [] and read_view(manager, "v") == ZSet()
                seen_staged.append(len(staged_rows(manager.catalog.engine)))
            return ack

        source.receive = observing
        acks = await source.ship_in_parts(5)
        assert [a.parts for a in acks] == [*range(1, 40), None]
        assert all(a.through == 0 for a in acks[:-1]) and acks[-1].through == 1
        assert seen_staged == list(range(1, 40))
        assert staged_rows(manager.catalog.engine) == []
        assert [type(e) for e in released] == [LogRef]  # by name: the receiver never read it whole
        [entry] = await manager.db(Catalog.log_entries, "a", 0)
        assert [c["row"]["k"] for c in entry.changes] == list(range(200)) and entry.parts == 40
        await manager.wait_idle("v", timeout=60)
        assert manager.view("v").maintainer.counters.updates_read_back == 1
        assert await check_view(manager, "v", sources, check_history=True) == []
    finally:
        await manager.stop()


async def test_a_part_its_mariadb_catalog_cannot_take_is_answered_413(tmp_path: Path, mariadb_catalog: str) -> None:
    """The receiver's answer to a part (or a whole update) beyond the catalog's statement
    bound: 413, naming the seq, the part and the remedy; what was staged stays."""
    manager, sources = await defined(tmp_path, catalog_url=mariadb_catalog)
    try:
        n = packet_of(mariadb_catalog) // 1000 + 100
        assert (await manager.receive("a", [part_of(1, 0, False, range(3))])).parts == 1
        with pytest.raises(TooLarge, match=r"part 1 of update seq 1 of source 'a': .* --part-bytes") as refused:
            await manager.receive("a", [part_of(1, 1, False, range(3, n), v="w" * 1000)])
        assert refused.value.status == 413
        assert manager.receiver.status("a").unfinished == (1, 1, 3)  # part 0 is still staged
        wide = [Change(relation="R", sign=1, row={"k": k, "v": "w" * 1000}) for k in range(n)]
        with pytest.raises(TooLarge, match="update seq 2 of source 'a'"):
            await manager.receive("a", [Update(seq=2, changes=wide)])
        assert await manager.db(Catalog.log_entries, "a", 0) == []
        ack = await manager.receive("a", [part_of(1, 1, True, range(3, 6))])
        assert ack.through == 1
    finally:
        await manager.stop()


async def test_staged_parts_outlive_a_restart(tmp_path: Path) -> None:
    """A manager that restarts between two parts takes the update up at its next part, and
    logs it with the digest of the whole: a whole resend of it compares as for any update."""
    store = MemoryStore()
    manager, sources = await defined(tmp_path, store=store)
    try:
        for index in range(3):
            await manager.receive("a", [part_of(1, index, False, range(3 * index, 3 * index + 3))])
    finally:
        await manager.stop()
    manager, sources = await start_sim_manager(tmp_path / "catalog.db", TABLES, store=store, sources=sources)
    try:
        assert manager.receiver.status("a").unfinished == (1, 3, 9)
        with pytest.raises(PartRefused, match="holds parts 0-2, the next is part 3"):
            await manager.receive("a", [part_of(1, 4, True, range(12, 15))])
        ack = await manager.receive("a", [part_of(1, 3, True, range(9, 12))])
        assert (ack.through, ack.parts) == (1, None)
        [entry] = await manager.db(Catalog.log_entries, "a", 0)
        assert [c["row"]["k"] for c in entry.changes] == list(range(12))
        same = Update(
            seq=1, changes=[Change(relation="R", sign=1, row={"k": k, "v": "x"}) for k in range(12)], txid="t1"
        )
        assert (await manager.receive("a", [same])).through == 1  # the same content: acknowledged
        with pytest.raises(SeqConflict):
            await manager.receive("a", [same.model_copy(update={"changes": same.changes[:-1]})])
        assert (await manager.receive("a", [part_of(1, 0, False, range(3))])).through == 1  # ignored
        await manager.wait_idle("v", timeout=60)
        assert sorted(read_view(manager, "v").rows()) == [(k, "x", 10 * k) for k in range(12)]
    finally:
        await manager.stop()


async def test_part_0_resent_midway_drops_what_was_staged(tmp_path: Path) -> None:
    manager, _ = await defined(tmp_path)
    engine = manager.catalog.engine
    try:
        for index in range(3):
            await manager.receive("a", [part_of(1, index, False, range(index, index + 1), v="old")])
        assert [r[2] for r in staged_rows(engine)] == [0, 1, 2]
        await manager.receive("a", [part_of(1, 0, False, range(2))])  # the wrapper starts over
        assert staged_rows(engine) == [("a", 1, 0, 2)]
        await manager.receive("a", [part_of(1, 1, True, range(2, 4))])
        [entry] = await manager.db(Catalog.log_entries, "a", 0)
        assert [(c["row"]["k"], c["row"]["v"]) for c in entry.changes] == [(k, "x") for k in range(4)]
        await manager.receive("a", [part_of(2, 0, False, range(5, 7))])
        await manager.receive("a", [part_of(3, 0, False, range(7, 9))])  # another seq's part 0: seq 2 is dropped
        assert staged_rows(engine) == [("a", 3, 0, 2)]
    finally:
        await manager.stop()


@pytest.mark.parametrize("seed", range(3))
async def test_views_over_large_updates_in_parts_match_recomputation(tmp_path: Path, seed: int) -> None:
    """Both sources ship small updates and large ones in parts, concurrently with
    maintenance; the queues' budget is a few changes, so large and small updates are read
    back from the log and subtracted from it. Every state as of a watermark is the
    recomputation over the sources' updates up to it."""
    rng = random.Random(seed)
    delays = Delays(before_snapshot=0.002, evaluation=0.002)
    manager, sources = await start_sim_manager(
        tmp_path / "catalog.db", TABLES, seed=seed, delays=delays, max_queued_changes=6
    )
    try:
        sources["a"].load("R", [(k, f"r{k}") for k in range(10)])
        sources["b"].load("S", [(k, k) for k in range(10)])
        await manager.define_view(VIEW, "v", parallelism=3, batch_size=4)
        rows = {"a": {(k, f"r{k}") for k in range(10)}, "b": {(k, k) for k in range(10)}}
        shipping = []
        for step in range(30):
            name = rng.choice("ab")
            table = "R" if name == "a" else "S"
            large = rng.random() < 0.3
            transaction = []
            for _ in range(rng.randint(8, 25) if large else rng.randint(1, 2)):
                if rows[name] and rng.random() < 0.4:
                    row = rng.choice(sorted(rows[name]))
                    rows[name].discard(row)
                    transaction.append((table, -1, row))
                else:
                    k = rng.randrange(12)
                    row = (k, f"r{k}.{step}") if name == "a" else (k, rng.randrange(100))
                    if row not in rows[name]:
                        rows[name].add(row)
                        transaction.append((table, 1, row))
            if not transaction:
                continue
            sources[name].commit(transaction)
            shipping.append(asyncio.create_task(sources[name].ship_in_parts(4) if large else sources[name].ship()))
            await asyncio.sleep(rng.uniform(0, 0.004))
        await asyncio.gather(*shipping)
        await manager.wait_idle("v", timeout=60)
        assert any(e.parts for e in await manager.db(Catalog.log_entries, None, 0))
        assert await check_view(manager, "v", sources, check_history=True) == []
    finally:
        await manager.stop()
