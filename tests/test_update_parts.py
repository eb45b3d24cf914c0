"""A source transaction larger than one message is one update, one seq, shipped in parts.

A real wrapper (trigger capture on SQLite, in this process, its parts of ``PART`` changes) ships to a real manager over HTTP. Every transaction writes a
whole batch of ``ROWS`` rows (insert, update or delete all of them), so every state the
source passes through has each batch whole and of one value: the manager's log holds each
such transaction in one update, and the view as of every watermark equals recomputation
over the logged updates and shows no batch in part. A manager that restarts between two
parts keeps the parts it staged in its catalog; the wrapper's next part goes on from there and
the update is logged once.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import sqlite3
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

import wrappers.capture.log_rows as log_rows
import wrappers.shipper as shipper
from api.wrapper_app import create_app as create_wrapper_app
from contract.zset import ZSet
from pvm.http_server import http_url, listen, start_serving, uvicorn_server
from pvm.local_deployment import LocalDeployment
from pvm.wrapper_process import WrapperProcess, start_wrapper
from tests.capture_support import run_sql
from tests.fake_manager import FakeManager
from warehouse.catalog.db import Catalog, LogEntry
from warehouse.recompute import recompute
from warehouse.store.memory import MemoryStore
from wrappers.capture import CaptureConfig
from wrappers.capture.snapshots import SnapshotOptions
from wrappers.parts import PartLimits
from wrappers.replica import RowChange
from wrappers.wrapper import Wrapper, WrapperConfig

SOURCE, TABLE = "sa", "R"
COLUMNS = {(SOURCE, TABLE): ("id", "batch", "v")}
VIEW = "SELECT R.id, R.batch, R.v FROM sa.R WHERE R.v >= 0"
PART = 40  # changes per part
LIMITS = PartLimits(changes=PART)
ROWS = 150  # rows a transaction writes: 4 parts as inserts or deletes, 8 as updates (-old, +new)
SMALL = 100  # batches from here on are single rows, written by small transactions


def make_source(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"CREATE TABLE {TABLE} (id INTEGER PRIMARY KEY, batch INTEGER, v INTEGER)")
    write(path, "insert", 0)


def write(path: Path, action: str, batch: int) -> None:
    """One source transaction over every row of ``batch``."""
    with sqlite3.connect(path, timeout=30) as db:
        if action == "insert":
            db.executemany(
                f"INSERT INTO {TABLE} VALUES (?, ?, ?)", [(batch * 1000 + i, batch, batch) for i in range(ROWS)]
            )
        elif action == "update":
            db.execute(f"UPDATE {TABLE} SET v = v + 1 WHERE batch = ?", (batch,))
        else:
            db.execute(f"DELETE FROM {TABLE} WHERE batch = ?", (batch,))


def read_live(path: Path) -> dict[tuple[str, str], ZSet]:
    with sqlite3.connect(path) as db:
        return {(SOURCE, TABLE): ZSet.from_rows(db.execute(f"SELECT id, batch, v FROM {TABLE}").fetchall())}


def whole_batches(rows: ZSet) -> bool:
    """Whether every batch in ``rows`` (id, batch, v) has all its rows, all of one value (a
    batch numbered from ``SMALL`` on has one row)."""
    by_batch: dict[Any, list[Any]] = defaultdict(list)
    for (_, batch, v), weight in rows.items():
        by_batch[batch].extend([v] * weight)
    return all(
        len(values) == (1 if batch >= SMALL else ROWS) and len(set(values)) == 1 for batch, values in by_batch.items()
    )


@asynccontextmanager
async def wrapper_served(deployment: LocalDeployment, path: Path, state_dir: Path) -> AsyncIterator[Wrapper]:
    """A wrapper of ``path`` in this process, with its HTTP API, registered with the manager."""
    manager_token = secrets.token_urlsafe(16)
    config = WrapperConfig(
        source=SOURCE,
        url=f"sqlite:///{path}",
        tables=(TABLE,),
        manager_url=deployment.url,
        token=await deployment.wrapper_token(SOURCE),
        state_dir=state_dir,
        poll_interval=0.02,
        part_limits=LIMITS,
    )
    wrapper = Wrapper(config)
    sock = listen("127.0.0.1", 0)
    server = uvicorn_server(create_wrapper_app(wrapper, manager_token))
    serving = await start_serving(server, sock)
    try:
        await deployment.register_source(SOURCE, http_url(sock), "trigger", [TABLE], manager_token)
        yield wrapper
    finally:
        server.should_exit = True
        await serving


def parts_received(deployment: LocalDeployment) -> Counter[int]:
    """Count the parts the manager's receiver takes, per seq."""
    receiver = deployment.manager.receiver
    taken: Counter[int] = Counter()
    original = receiver._receive_part

    async def counting(source: str, update: Any) -> Any:
        taken[update.seq] += 1
        return await original(source, update)

    receiver._receive_part = counting  # type: ignore[method-assign]
    return taken


async def check_states(deployment: LocalDeployment, initial: dict[tuple[str, str], ZSet]) -> int:
    """The view as of every watermark equals recomputation over the source state the logged
    updates describe (as ``pvm.bench.three_sources.check_oracle``), and shows whole batches
    only; the number of states checked."""
    manager = deployment.manager
    plan, bases = manager.view("v").plan, manager.view("v").bases
    log = await manager.db(Catalog.log_entries, SOURCE, 0)
    by_id = {e.id: e for e in log}
    contents = {k: z.copy() for k, z in initial.items()}
    upto, applied, checked = bases.get(SOURCE, 0), 0, 0
    for unit in await manager.db(Catalog.units, "v"):
        upto = max([upto, *(by_id[i].seq for i in unit.log_ids)])
        for entry in log:
            if applied < entry.seq <= upto:
                for change in entry.changes:
                    row = tuple(change["row"][c] for c in COLUMNS[(SOURCE, TABLE)])
                    contents[(SOURCE, TABLE)].add(row, change["sign"])
        applied = max(applied, upto)
        shown = manager.read("v", as_of=unit.order)
        assert shown == recompute(plan, contents, COLUMNS), f"as of W={unit.order}"
        assert whole_batches(shown), f"as of W={unit.order} the view shows a batch in part"
        checked += 1
    return checked


def assert_transactions_whole(log: list[LogEntry], initial: dict[tuple[str, str], ZSet]) -> None:
    """Every prefix of the log is a state with whole batches only: no update ends inside a
    source transaction."""
    contents = initial[(SOURCE, TABLE)].copy()
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    for entry in log:
        for change in entry.changes:
            contents.add(tuple(change["row"][c] for c in COLUMNS[(SOURCE, TABLE)]), change["sign"])
        assert whole_batches(contents), f"the source state after seq {entry.seq} has a batch in part"


@pytest.mark.parametrize("encoding", ["json", "stream"])
async def test_a_transaction_larger_than_a_part_is_one_update_and_never_seen_in_part(
    tmp_path: Path, encoding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As JSON bodies, and as update streams (every post one: the wrapper's threshold lowered)."""
    streams = streams_read(monkeypatch)
    if encoding == "stream":
        monkeypatch.setattr(shipper, "ARROW_FROM_CHANGES", 1)
    path = tmp_path / "sa.db"
    make_source(path)
    initial = read_live(path)
    async with LocalDeployment(tmp_path) as deployment:
        taken = parts_received(deployment)
        async with wrapper_served(deployment, path, tmp_path / "state") as wrapper:
            write(path, "insert", 1)
            await deployment.manager.define_view(VIEW, "v", parallelism=2)
            for action, batch in [("insert", 2), ("update", 1), ("insert", 3), ("delete", 0), ("update", 2)]:
                await asyncio.to_thread(write, path, action, batch)
                await asyncio.sleep(0.05)  # some reads see one transaction, some several
            await until_shipped(deployment, wrapper, path)
            await deployment.manager.wait_idle("v", timeout=60)

            log = await deployment.manager.db(Catalog.log_entries, SOURCE, 0)
            assert_transactions_whole(log, initial)
            assert all(len(e.changes) >= ROWS for e in log), [len(e.changes) for e in log]
            assert any(len(e.changes) > 2 * PART for e in log)
            assert taken and all(taken[e.seq] >= -(-len(e.changes) // PART) for e in log)  # each came in parts
            assert_held_within_a_part(wrapper, max(len(e.changes) for e in log))
            assert await check_states(deployment, initial) == deployment.manager.watermark("v") > 1
            final = deployment.manager.read("v")
            assert final == recompute(deployment.manager.view("v").plan, read_live(path), COLUMNS)
    assert (len(streams) >= len(log)) if encoding == "stream" else not streams


def assert_held_within_a_part(wrapper: Wrapper, largest: int) -> None:
    """The wrapper held at most a part's changes while it captured, and while it shipped, the
    largest update (of ``largest`` changes, several parts) included; nothing now."""
    held = wrapper.health()["held"]
    assert largest > 2 * PART and held["part_changes"] == PART
    assert 0 < held["capturing_peak"] <= PART and 0 < held["shipping_peak"] <= PART, held
    assert held["capturing"] == held["shipping"] == 0, held


def streams_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bodies the manager reads as update streams, by size."""
    import api.ingest as ingest

    read, sizes = ingest.read_stream, []

    def counting(body: bytes) -> Any:
        sizes.append(len(body))
        return read(body)

    monkeypatch.setattr(ingest, "read_stream", counting)
    return sizes


async def until_shipped(deployment: LocalDeployment, wrapper: Wrapper, path: Path, timeout: float = 30.0) -> None:
    """Until every change committed in the source at ``path`` is acknowledged: its outbox is
    empty (rows are deleted once acknowledged) and the manager has every seq assigned."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (
        outbox_rows(path) == 0
        and wrapper.state.last_seq == deployment.manager.receiver.released_through(SOURCE)
        and not wrapper.state.has_pending
    ):
        assert asyncio.get_running_loop().time() < deadline, wrapper.health()
        await asyncio.sleep(0.05)


def outbox_rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT count(*) FROM _pvm_outbox").fetchone()[0])


async def test_parts_outlive_a_manager_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sa.db"
    make_source(path)
    initial = read_live(path)
    store = MemoryStore()
    answers: list[tuple[int, int]] = []  # (seq, HTTP status) of every part posted
    second_part_taken, restarted = asyncio.Event(), asyncio.Event()
    post = shipper.Shipper._acknowledgment

    async def acknowledgment(self: shipper.Shipper, body: shipper.Body, last_seq: int) -> Any:
        """The wrapper's posts, held after the first acknowledged part 1 until the manager restarted."""
        try:
            ack = await post(self, body, last_seq)
        except shipper.ShipError as error:
            status = re.match(r"HTTP (\d+)", str(error))
            answers.append((0, int(status.group(1)) if status else 0))
            raise
        if b'"part":{"index":1' in body.content and not second_part_taken.is_set():
            second_part_taken.set()
            await restarted.wait()
        answers.append((ack.parts or 0, 200))
        return ack

    monkeypatch.setattr(shipper.Shipper, "_acknowledgment", acknowledgment)
    deployment = await LocalDeployment(tmp_path, store=store).__aenter__()
    try:
        async with wrapper_served(deployment, path, tmp_path / "state") as wrapper:
            await deployment.manager.define_view(VIEW, "v", parallelism=2)
            await deployment.manager.wait_idle("v", timeout=60)
            await asyncio.to_thread(write, path, "update", 0)  # 300 changes: 8 parts
            await asyncio.wait_for(second_part_taken.wait(), 30)
            held = deployment.manager.receiver._cursors[SOURCE].staging
            assert held is not None and (held.parts, held.changes) == (2, 2 * PART)
            assert (await deployment.manager.db(Catalog.staged, SOURCE)).parts == 2  # in the catalog
            port = int(deployment.url.rsplit(":", 1)[1])
            await deployment.__aexit__(None, None, None)  # the manager goes down between two parts
            deployment = await LocalDeployment(tmp_path, store=store, port=port).__aenter__()
            taken = parts_received(deployment)
            restarted.set()
            await until_shipped(deployment, wrapper, path)
            await deployment.manager.wait_idle("v", timeout=60)

            assert all(status == 200 for _, status in answers)  # part 2 continued what was staged
            log = await deployment.manager.db(Catalog.log_entries, SOURCE, 0)
            assert [len(e.changes) for e in log] == [2 * ROWS]  # one update, logged once
            assert taken[1] == -(-2 * ROWS // PART) - 2  # parts 2 to 7 only
            assert await deployment.manager.db(Catalog.staged, SOURCE) is None
            assert_transactions_whole(log, initial)
            assert await check_states(deployment, initial) >= 1
            final = deployment.manager.read("v")
            assert final == recompute(deployment.manager.view("v").plan, read_live(path), COLUMNS)
            assert {v for (_, _, v) in final.rows()} == {1}
    finally:
        await deployment.__aexit__(None, None, None)


SERVERS = {"postgresql": "pg_url", "postgresql-log": "pg_log_url", "mariadb": "maria_url", "mariadb-log": "maria_url"}


@pytest.mark.servers
@pytest.mark.parametrize("kind", list(SERVERS))
async def test_a_large_transaction_of_a_server_is_one_update_in_parts(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trigger and log capture of PostgreSQL and MariaDB: small transactions are merged into
    updates of at most 20 rows here (half a part), a large one is never cut and travels in parts.
    Log capture keeps at most 40 rows of a transaction in memory here, the rest on disk."""
    url = request.getfixturevalue(SERVERS[kind])
    monkeypatch.setattr(log_rows, "SPILL_ROWS", 40)
    monkeypatch.setattr(log_rows, "CHUNK_ROWS", 7)
    spilled: list[int] = []
    original_finish = log_rows.RowsBuilder.finish

    def finish(builder: log_rows.RowsBuilder) -> log_rows.TransactionRows:
        rows = original_finish(builder)
        spilled.append(rows.spilled)
        return rows

    monkeypatch.setattr(log_rows.RowsBuilder, "finish", finish)
    run_sql(url, "CREATE TABLE big (id INTEGER PRIMARY KEY, grp INTEGER, v INTEGER)")
    engine = sa.create_engine(url)

    def transaction(*statements: tuple[str, Any]) -> None:
        with engine.begin() as conn:
            for statement, parameters in statements:
                conn.execute(sa.text(statement), parameters)

    insert = "INSERT INTO big VALUES (:id, :grp, :v)"
    with FakeManager() as manager:
        config = WrapperConfig(
            source=SOURCE,
            url=url,
            tables=("big",),
            manager_url=manager.url,
            state_dir=tmp_path / "state",
            poll_interval=0.02,
            capture=CaptureConfig("log" if kind.endswith("-log") else "trigger"),
            part_limits=LIMITS,
        )
        wrapper = Wrapper(config)
        await wrapper.start()
        try:
            await wrapper.ship_once()  # log capture starts where its first read is
            before = wrapper.state.last_seq
            await asyncio.to_thread(transaction, (insert, [{"id": i, "grp": 1, "v": 1} for i in range(ROWS)]))
            # captured before the next: MariaDB's trigger capture, knowing no transaction ids,
            # makes one update of whatever one read sees (whole transactions, however many)
            for _ in range(600):
                if wrapper.state.last_seq > before:
                    break
                await wrapper.ship_once()
            for i in range(40):  # small transactions, merged
                await asyncio.to_thread(transaction, (insert, {"id": 1000 + i, "grp": SMALL + i, "v": 0}))
            await asyncio.to_thread(transaction, ("UPDATE big SET v = v + 1 WHERE grp = 1", {}))
            await asyncio.to_thread(transaction, ("DELETE FROM big WHERE grp >= :g", {"g": SMALL + 20}))
            for _ in range(600):
                await wrapper.ship_once()
                if not wrapper.state.has_pending and manager.through(SOURCE) == wrapper.state.last_seq:
                    break
                await asyncio.sleep(0.05)
            assert_held_within_a_part(wrapper, 2 * ROWS)
        finally:
            await wrapper.stop()
            engine.dispose()
    updates = manager.updates(SOURCE)
    assert updates and [u.seq for u in updates] == list(range(1, len(updates) + 1))
    state = ZSet()
    for update in updates:
        for change in update.changes:
            state.add((change.row["id"], change.row["grp"], change.row["v"]), change.sign)
        assert whole_batches(state), f"the source state after seq {update.seq} has a transaction in part"
    assert state == ZSet.from_rows([(i, 1, 2) for i in range(ROWS)] + [(1000 + i, SMALL + i, 0) for i in range(20)])
    assert any(len(u.changes) >= 2 * ROWS for u in updates)  # the update of the large batch: one seq
    parts = [u.part for b in manager.posts for u in b.updates if u.part is not None]
    assert sum(p.last for p in parts) >= 2 and len(parts) >= 4 + 8  # the insert and the update, in parts
    if kind.startswith("postgresql"):  # where transactions are known, small ones are merged, not one per update
        assert len(updates) < 40
    if kind.endswith("-log"):  # the insert and the update (ROWS rows each) went to disk from their 40th row
        on_disk = 40 + (ROWS - 40) // 7 * 7  # then a chunk of 7 at a time; the last few stayed in memory
        assert sorted(spilled)[-3:] == [0, on_disk, on_disk], spilled
    else:
        assert spilled == []


REPLICA_CAPTURE = {
    "timestamp": CaptureConfig("timestamp", timestamp_column="modified", settle_seconds=0),
    "snapshot": CaptureConfig("snapshot", snapshot=SnapshotOptions(interval=0.01, algorithm="window")),
    "application": CaptureConfig("application"),
}


@pytest.mark.parametrize("method", list(REPLICA_CAPTURE))
async def test_a_large_pull_or_application_transaction_is_one_update_in_parts(tmp_path: Path, method: str) -> None:
    """Timestamp, snapshot and application capture feed a replica, whose trigger capture
    ships each pull (each application transaction) as one update, in parts when large."""
    path = tmp_path / "legacy.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, grp INTEGER, v INTEGER, modified INTEGER)")

    def write(statement: str, rows: list[tuple[Any, ...]] | None = None) -> None:
        with sqlite3.connect(path) as db:
            db.executemany(statement, rows) if rows is not None else db.execute(statement)

    def replayed(manager: FakeManager) -> ZSet:
        state = ZSet()
        for update in manager.updates(SOURCE):
            for change in update.changes:
                state.add((change.row["id"], change.row["grp"], change.row["v"]), change.sign)
            assert whole_batches(state), f"the source state after seq {update.seq} has a transaction in part"
        return state

    with FakeManager() as manager:
        config = WrapperConfig(
            SOURCE, f"sqlite:///{path}", ("items",), manager.url, state_dir=tmp_path / "state",
            poll_interval=0.02, capture=REPLICA_CAPTURE[method], part_limits=LIMITS,
        )  # fmt: skip
        wrapper = Wrapper(config)
        await wrapper.start()
        try:
            for v in (1, 2):
                if method == "application":
                    op: Any = "insert" if v == 1 else "update"
                    await wrapper.post_changes(
                        [RowChange("items", op, key={"id": i}, row={"id": i, "grp": 1, "v": v}) for i in range(ROWS)]
                    )
                elif v == 1:
                    write("INSERT INTO items VALUES (?, 1, 1, 1)", [(i,) for i in range(ROWS)])
                else:
                    write("UPDATE items SET v = 2, modified = 2")
                wanted = ZSet.from_rows([(i, 1, v) for i in range(ROWS)])
                for _ in range(400):
                    if replayed(manager) == wanted:
                        break
                    await asyncio.sleep(0.05)
                assert replayed(manager) == wanted, f"{method}: v = {v} never arrived whole"
        finally:
            await wrapper.stop()
    updates = manager.updates(SOURCE)
    assert [len(u.changes) for u in updates] == [ROWS, 2 * ROWS]
    assert len([u for b in manager.posts for u in b.updates if u.part is not None]) == 4 + 8


async def test_a_wrapper_that_restarts_mid_update_resends_it_from_the_first_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sa.db"
    make_source(path)
    stuck = asyncio.Event()  # set once the first wrapper hangs after part 1: it is stopped there
    post = shipper.Shipper._acknowledgment

    async def acknowledgment(self: shipper.Shipper, body: shipper.Body, last_seq: int) -> Any:
        ack = await post(self, body, last_seq)
        if b'"part":{"index":1' in body.content and not stuck.is_set():
            stuck.set()
            await asyncio.Event().wait()  # never: the wrapper is stopped here
        return ack

    monkeypatch.setattr(shipper.Shipper, "_acknowledgment", acknowledgment)
    with FakeManager() as manager:

        def config() -> WrapperConfig:
            return WrapperConfig(
                SOURCE, f"sqlite:///{path}", (TABLE,), manager.url, state_dir=tmp_path / "state", poll_interval=0.02,
                part_limits=LIMITS,
            )  # fmt: skip

        first = Wrapper(config())
        await first.start()
        try:
            await asyncio.to_thread(write, path, "update", 0)  # 300 changes: 8 parts
            await asyncio.wait_for(stuck.wait(), 30)
        finally:
            await first.stop()
        assert manager.through(SOURCE) == 0 and manager.parts_held(SOURCE) == 2  # parts 0 and 1 held
        second = Wrapper(config())
        assert second.state.last_seq == 1 and second.state.has_pending  # the update is still the wrapper's
        await second.start()
        try:
            await asyncio.to_thread(manager.wait_through, SOURCE, 1, 30)
        finally:
            await second.stop()
    indexes = [u.part.index for b in manager.posts for u in b.updates if u.part is not None]
    assert indexes == [0, 1, *range(8)]  # from part 0 again
    [update] = manager.updates(SOURCE)
    assert len(update.changes) == 2 * ROWS and manager.conflicts == []
    assert sorted(c.row["v"] for c in update.changes if c.sign > 0) == [1] * ROWS


async def test_parts_and_posts_are_cut_by_bytes_as_well(tmp_path: Path) -> None:
    """With a byte limit far below a part's changes, parts and posts of whole updates stop at
    that many bytes of JSON: an update is still one seq, and a post several whole updates."""
    path = tmp_path / "wide.db"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE w (id INTEGER PRIMARY KEY, note TEXT)")

    def insert(ids: range) -> None:
        with sqlite3.connect(path) as db:
            db.executemany("INSERT INTO w VALUES (?, ?)", [(i, "n" * 100) for i in ids])

    limits = PartLimits(changes=1000, bytes=2048)
    sizes: list[tuple[int, int]] = []  # (updates, bytes of their changes) of every post
    with FakeManager() as manager:
        config = WrapperConfig(
            SOURCE, f"sqlite:///{path}", ("w",), manager.url, state_dir=tmp_path / "state", poll_interval=0.02,
            part_limits=limits,
        )  # fmt: skip
        wrapper = Wrapper(config)
        try:
            insert(range(200))  # one update of about 30 KB: in parts
            wrapper._capture_now()
            for k in range(12):  # small updates, pending before anything ships
                insert(range(1000 + 3 * k, 1003 + 3 * k))
                wrapper._capture_now()
            await wrapper.start()
            await asyncio.to_thread(manager.wait_through, SOURCE, 13, 30)
        finally:
            await wrapper.stop()
        for batch in manager.posts:
            sizes.append((len(batch.updates), sum(len(_changes_json(u.changes)) for u in batch.updates)))
        [large, *small] = manager.updates(SOURCE)
        whole_posts = [len(b.updates) for b in manager.posts if b.updates[0].part is None]
    parts = [u for b in manager.posts for u in b.updates if u.part is not None]
    assert len(large.changes) == 200 and len(small) == 12 and manager.conflicts == []
    assert len(parts) >= 200 * 140 // 2048 and all(len(p.changes) < 1000 for p in parts)  # cut by bytes
    assert all(size <= 2048 for _, size in sizes)
    assert max(whole_posts) > 1 and sum(whole_posts) >= 12  # several whole updates to a post, within the bytes
    assert wrapper.health()["held"]["shipping_peak"] <= max(len(p.changes) for p in parts)


def _changes_json(changes: list[Any]) -> bytes:
    return b"[" + b",".join(c.model_dump_json().encode() for c in changes) + b"]"


async def test_a_wrapper_killed_while_it_captures_or_ships_an_update_resumes_it(tmp_path: Path) -> None:
    """A wrapper process killed (SIGKILL) while it writes a large update's parts to its state,
    and again while it ships them: each restart goes on from what the state recorded (the
    unrecorded parts dropped and the outbox read again; the recorded update resent from its
    part 0), and the manager gets the update once, whole."""
    path = tmp_path / "sa.db"
    make_source(path)
    rows, part = 20_000, 200
    state = tmp_path / "state" / f"{SOURCE}.state.sqlite3"
    with FakeManager() as manager:

        def start() -> WrapperProcess:
            return start_wrapper(
                SOURCE, f"sqlite:///{path}", [TABLE], manager.url, state_dir=tmp_path / "state",
                poll_interval=0.02, capture_args=["--part-changes", str(part)], log_path=tmp_path / "wrapper.log",
            )  # fmt: skip

        first = start()
        try:
            manager.refuse_parts_from = 3
            with sqlite3.connect(path) as db:  # one transaction of 20,000 rows: 100 parts
                db.executemany(f"INSERT INTO {TABLE} VALUES (?, 7, 7)", [(10_000 + i,) for i in range(rows)])
            await until(lambda: state_counts(state)[1] > 0)  # capture is writing its parts
        finally:
            first.kill()
        recorded, parts_written = state_counts(state)
        assert recorded == 0 and parts_written > 0  # killed before the update was recorded

        second = start()
        try:
            await until(lambda: manager.parts_held(SOURCE) == 3, timeout=120)  # parts 0-2 taken, 3 refused
        finally:
            second.kill()
        assert manager.through(SOURCE) == 0

        manager.refuse_parts_from = None
        with start() as third:
            await asyncio.to_thread(manager.wait_through, SOURCE, 1, 120)
            await until(lambda: outbox_rows(path) == 0)
            health = httpx.get(f"{third.url}/v1/health").json()
    [update] = manager.updates(SOURCE)
    assert sorted(c.row["id"] for c in update.changes) == [10_000 + i for i in range(rows)]
    assert {c.sign for c in update.changes} == {1} and manager.conflicts == []
    firsts = [u.part.index for b in manager.posts for u in b.updates if u.part is not None].count(0)
    assert firsts >= 2  # the second wrapper and the third each began at part 0
    assert health["last_seq"] == health["acked_through"] == 1 and health["pending"] == 0
    assert health["held"]["capturing_peak"] <= part and health["held"]["shipping_peak"] <= part


def state_counts(state: Path) -> tuple[int, int]:
    """(updates recorded, parts written) in a wrapper's state file."""
    with sqlite3.connect(state) as db:
        return (
            int(db.execute("SELECT count(*) FROM pending").fetchone()[0]),
            int(db.execute("SELECT count(*) FROM parts").fetchone()[0]),
        )


async def until(done: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not done():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)
