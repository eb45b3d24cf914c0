"""A source transaction larger than one message is one update, one seq, shipped in parts.

A real wrapper (trigger capture on SQLite, in this process so that the part size can be
lowered to ``PART`` changes) ships to a real manager over HTTP. Every transaction writes a
whole batch of ``ROWS`` rows (insert, update or delete all of them), so every state the
source passes through has each batch whole and of one value: the manager's log holds each
such transaction in one update, and the view as of every watermark equals recomputation
over the logged updates and shows no batch in part. A manager that restarts between two
parts forgets them; the wrapper resends the update from its first part and it is logged once.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import sqlite3
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import wrappers.shipper as shipper
from api.wrapper_app import create_app as create_wrapper_app
from contract.zset import ZSet
from pvm.http_server import http_url, listen, start_serving, uvicorn_server
from pvm.local_deployment import LocalDeployment
from warehouse.catalog.db import Catalog, LogEntry
from warehouse.recompute import recompute
from warehouse.store.memory import MemoryStore
from wrappers.wrapper import Wrapper, WrapperConfig

SOURCE, TABLE = "sa", "R"
COLUMNS = {(SOURCE, TABLE): ("id", "batch", "v")}
VIEW = "SELECT R.id, R.batch, R.v FROM sa.R WHERE R.v >= 0"
PART = 40  # changes per message
ROWS = 150  # rows a transaction writes: 4 parts as inserts or deletes, 8 as updates (-old, +new)


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shipper, "PART_CHANGES", PART)


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
    """Whether every batch in ``rows`` (id, batch, v) has all its rows, all of one value."""
    by_batch: dict[Any, list[Any]] = defaultdict(list)
    for (_, batch, v), weight in rows.items():
        by_batch[batch].extend([v] * weight)
    return all(len(values) == ROWS and len(set(values)) == 1 for values in by_batch.values())


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


async def test_a_transaction_larger_than_a_part_is_one_update_and_never_seen_in_part(tmp_path: Path) -> None:
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
            await until_shipped(deployment, wrapper)
            await deployment.manager.wait_idle("v", timeout=60)

            log = await deployment.manager.db(Catalog.log_entries, SOURCE, 0)
            assert_transactions_whole(log, initial)
            assert all(len(e.changes) >= ROWS for e in log), [len(e.changes) for e in log]
            assert any(len(e.changes) > 2 * PART for e in log)
            assert taken and all(taken[e.seq] >= -(-len(e.changes) // PART) for e in log)  # each came in parts
            assert await check_states(deployment, initial) == deployment.manager.watermark("v") > 1
            final = deployment.manager.read("v")
            assert final == recompute(deployment.manager.view("v").plan, read_live(path), COLUMNS)


async def until_shipped(deployment: LocalDeployment, wrapper: Wrapper, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    stable = 0
    while stable < 3:
        assert asyncio.get_running_loop().time() < deadline, wrapper.health()
        done = (
            wrapper.state.last_seq == deployment.manager.receiver.released_through(SOURCE)
            and not wrapper.state.has_pending
        )
        stable = stable + 1 if done else 0
        await asyncio.sleep(0.05)


async def test_parts_are_resent_from_the_first_after_a_manager_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sa.db"
    make_source(path)
    initial = read_live(path)
    store = MemoryStore()
    answers: list[tuple[int, int]] = []  # (seq, HTTP status) of every part posted
    second_part_taken, restarted = asyncio.Event(), asyncio.Event()
    post = shipper.Shipper._acknowledgment

    async def acknowledgment(self: shipper.Shipper, body: str, last_seq: int) -> Any:
        """The wrapper's posts, held after the first acknowledged part 1 until the manager restarted."""
        try:
            ack = await post(self, body, last_seq)
        except shipper.ShipError as error:
            status = re.match(r"HTTP (\d+)", str(error))
            answers.append((0, int(status.group(1)) if status else 0))
            raise
        if '"part":{"index":1' in body and not second_part_taken.is_set():
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
            held = deployment.manager.receiver._cursors[SOURCE].assembly
            assert held is not None and held.parts == 2 and len(held.changes) == 2 * PART
            port = int(deployment.url.rsplit(":", 1)[1])
            await deployment.__aexit__(None, None, None)  # the manager goes down, forgetting the parts
            deployment = await LocalDeployment(tmp_path, store=store, port=port).__aenter__()
            taken = parts_received(deployment)
            restarted.set()
            await until_shipped(deployment, wrapper)
            await deployment.manager.wait_idle("v", timeout=60)

            assert (0, 409) in answers  # part 2 refused: the new manager holds no part of it
            log = await deployment.manager.db(Catalog.log_entries, SOURCE, 0)
            assert [len(e.changes) for e in log] == [2 * ROWS]  # one update, logged once
            assert taken[1] == -(-2 * ROWS // PART) + 1  # part 2, refused, then all 8 from part 0
            assert_transactions_whole(log, initial)
            assert await check_states(deployment, initial) >= 1
            final = deployment.manager.read("v")
            assert final == recompute(deployment.manager.view("v").plan, read_live(path), COLUMNS)
            assert {v for (_, _, v) in final.rows()} == {1}
    finally:
        await deployment.__aexit__(None, None, None)
