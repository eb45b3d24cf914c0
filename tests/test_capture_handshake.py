"""Trigger capture on PostgreSQL and MariaDB, and log capture on PostgreSQL, through a real
wrapper process and a stand-in manager: the watermark handshake under concurrent writers (docs/design.md, invariant 3), and a
durable wrapper across a crash and a manager outage (invariants 1 and 2).

Outbox ids there are not commit order, so these are the tests that would catch a wrapper
that skips a late-committing transaction or ships one twice.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from contract.expr import Cmp, Col, Like, to_wire
from contract.zset import ZSet
from pvm.wrapper_process import WrapperProcess, start_wrapper
from tests.capture_support import (
    R_DDL,
    contents,
    expected_answer,
    fetch,
    pg_log_slot,
    random_transaction,
    replay,
    run_sql,
)
from tests.fake_manager import FakeManager

pytestmark = pytest.mark.servers

SOURCE = "src"
TOKEN = "wrapper-secret"
INITIAL = [(i, i % 6, random.Random(i).choice(["xa", "Xb", "y", None])) for i in range(1, 41)]


CAPTURE_ARGS = {
    "postgresql": [],
    "postgresql-log": ["--capture", "log"],
    "mariadb": [],
    "mariadb-log": ["--capture", "log"],
}
FIXTURES = {"postgresql": "pg_url", "postgresql-log": "pg_log_url", "mariadb": "maria_url", "mariadb-log": "maria_url"}


@pytest.fixture(params=list(CAPTURE_ARGS))
def source(request: pytest.FixtureRequest) -> tuple[str, list[str]]:
    """A source URL with table r loaded with INITIAL, and the wrapper's capture arguments."""
    url = request.getfixturevalue(FIXTURES[request.param])
    run_sql(url, R_DDL)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO r VALUES (:id, :b, :v)"), [{"id": i, "b": b, "v": v} for i, b, v in INITIAL])
    engine.dispose()
    return url, CAPTURE_ARGS[request.param]


def start(source: tuple[str, list[str]], manager: FakeManager, tmp_path: Path, **options: object) -> WrapperProcess:
    url, capture_args = source
    return start_wrapper(
        SOURCE, url, ["r"], manager.url, token=TOKEN, state_dir=tmp_path / "state",
        log_path=tmp_path / "wrapper.log", capture_args=capture_args, **options,  # type: ignore[arg-type]
    )  # fmt: skip


def subquery(keys: list[list], where: object | None, select: list[str]) -> dict:
    on = Cmp("=", Col("$key", "k0"), Col("r", "b"))
    return {"relation": "r", "alias": "r", "keys": keys, "on": to_wire(on),
            "where": to_wire(where) if where is not None else None, "select": select}  # fmt: skip


def released(source: tuple[str, list[str]], mark: str) -> bool:
    """Whether the source keeps nothing acknowledged: an empty outbox, or a slot confirmed
    through ``mark``, a WAL position after every change committed so far."""
    url, capture_args = source
    if "log" not in capture_args:
        return fetch(url, "SELECT count(*) FROM _pvm_outbox")[0][0] == 0
    if not url.startswith("postgresql"):
        return True  # the binary log is MariaDB's to keep or purge: nothing to release
    [(confirmed,)] = fetch(
        url,
        f"SELECT confirmed_flush_lsn >= '{mark}' FROM pg_replication_slots WHERE slot_name = '{pg_log_slot(url)}'",
    )
    return bool(confirmed)


def flush(wrapper_url: str) -> int:
    """A subquery without keys: ships everything committed so far; its watermark."""
    response = httpx.post(
        f"{wrapper_url}/v1/subquery", json={"relation": "r", "alias": "r", "keys": [], "select": []}, timeout=60
    )
    response.raise_for_status()
    return response.json()["watermark"]


def writers(url: str, n: int, stop: threading.Event, committed: list[bool], base: int) -> list[threading.Thread]:
    """``n`` threads, each on its own connection, committing random transactions until ``stop``."""

    def write(i: int) -> None:
        rng = random.Random(base + i)
        fresh = itertools.count(base + 100_000 * (i + 1))
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            while not stop.is_set():
                committed.append(random_transaction(conn, rng, fresh, range(1, 60)))
                time.sleep(rng.random() * 0.003)
        engine.dispose()

    return [threading.Thread(target=write, args=(i,)) for i in range(n)]


def test_handshake_under_concurrent_writers(source: tuple[str, list[str]], tmp_path: Path) -> None:
    """Every answer equals the Python join over the initial rows plus exactly updates
    1..watermark, while three connections commit and roll back multi-row transactions;
    half the subqueries carry ``at_least`` (what the manager holds when asked), and those
    may be answered in a standing snapshot: exact too, and never below it."""
    stop = threading.Event()
    committed: list[bool] = []
    answers: list[tuple[list, object, dict, int | None]] = []

    def query(seed: int, wrapper_url: str, held: Callable[[], int]) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=wrapper_url, timeout=60) as client:
            while not stop.is_set():
                keys = [[k] for k in rng.sample(range(6), rng.randint(1, 4))]
                where = rng.choice([None, Like(Col("r", "v"), "x%"), Like(Col("r", "v"), "x\\%")])
                body = subquery(keys, where, ["id", "v"])
                at_least = held() if rng.random() < 0.5 else None
                if at_least is not None:
                    body["at_least"] = at_least
                response = client.post("/v1/subquery", json=body)
                response.raise_for_status()
                answers.append((keys, where, response.json(), at_least))

    with FakeManager(token=TOKEN) as manager:
        url = source[0]
        with start(
            source, manager, tmp_path, poll_interval=0.02, query_delay_ms=5, max_concurrent_queries=2
        ) as wrapper:
            threads = writers(url, 3, stop, committed, base=1)
            held = lambda: len(manager.updates(SOURCE))  # noqa: E731
            threads += [threading.Thread(target=query, args=(s, wrapper.url, held)) for s in range(3)]
            for t in threads:
                t.start()
            started = time.monotonic()  # 3 s, longer on a loaded machine until there is enough to check
            while time.monotonic() - started < 3.0 or (
                (len(answers) <= 30 or sum(committed) <= 50) and time.monotonic() - started < 60
            ):
                time.sleep(0.1)
            stop.set()
            for t in threads:
                t.join()
            flush(wrapper.url)  # everything the writers committed shipped: then one transaction alone
            engine = sa.create_engine(url)
            with engine.begin() as conn:
                conn.execute(sa.text("INSERT INTO r VALUES (:id, 0, 'lone')"), {"id": 9_999_999})
            engine.dispose()
            last = flush(wrapper.url)
            standing = httpx.get(f"{wrapper.url}/v1/health").json()["standing_snapshot"]

        updates = manager.updates(SOURCE)
        assert not manager.conflicts
    assert [u.seq for u in updates] == list(range(1, last + 1))
    initial = ZSet.from_rows(INITIAL)
    assert replay(initial, updates) == contents(url)  # rolled-back work never shipped
    watermarks = {a["watermark"] for _, _, a, _ in answers}
    assert sum(committed) > 50 and len(answers) > 30 and len(watermarks) > 5, (
        sum(committed),
        len(answers),
        len(watermarks),
    )
    states = {0: initial}
    for w in range(1, last + 1):
        states[w] = replay(states[w - 1], [updates[w - 1]])
    for keys, where, answer, at_least in answers:
        got = {tuple(row[:-1]): row[-1] for row in answer["rows"]}
        assert got == expected_answer(keys, where, states[answer["watermark"]], ["id", "v"]), answer["watermark"]
        assert at_least is None or answer["watermark"] >= at_least
    assert standing["answers"] > 5, standing  # answered without a handshake of their own
    if url.startswith("postgresql") and not source[1]:  # trigger capture names PostgreSQL's transactions
        assert updates[-1].txid  # the lone transaction: an update of one transaction names it


def test_crash_and_manager_outage_lose_nothing(source: tuple[str, list[str]], tmp_path: Path) -> None:
    """Changes committed while the manager is down and the wrapper is killed are shipped
    once, in order, after both come back; the outbox empties (log capture: the slot is
    confirmed) once they are acknowledged."""
    url = source[0]
    engine = sa.create_engine(url)
    rng = random.Random(3)
    fresh = itertools.count(500_000)

    def commit(n: int) -> None:
        with engine.connect() as conn:
            done = 0
            while done < n:
                done += random_transaction(conn, rng, fresh, range(1, 60))

    with FakeManager(token=TOKEN) as manager:
        wrapper = start(source, manager, tmp_path)
        try:
            commit(10)
            assert flush(wrapper.url) > 0
            manager.down = True
            commit(10)
            deadline = time.monotonic() + 20
            while httpx.get(f"{wrapper.url}/v1/health").json()["pending"] == 0:
                assert time.monotonic() < deadline, "nothing captured while the manager is down"
                time.sleep(0.05)
        finally:
            wrapper.kill()
        commit(10)  # while no wrapper runs
        manager.down = False
        with start(source, manager, tmp_path) as wrapper:
            last = flush(wrapper.url)
            pg_log = "log" in source[1] and url.startswith("postgresql")
            mark = str(fetch(url, "SELECT pg_current_wal_insert_lsn()")[0][0]) if pg_log else ""
            deadline = time.monotonic() + 20
            while not released(source, mark):
                assert time.monotonic() < deadline, "acknowledged changes stay in the source"
                time.sleep(0.05)
            capture = httpx.get(f"{wrapper.url}/v1/health").json()["capture"]
            if pg_log:
                assert capture["slot"] == pg_log_slot(url) and capture["retained_wal_bytes"] >= 0, capture
            elif "log" in source[1]:
                assert capture["unread_binlog_bytes"] >= 0 and capture["position"].startswith("mysql-bin."), capture
        updates = manager.updates(SOURCE)
        assert not manager.conflicts  # a resent seq always carried the same changes
    engine.dispose()
    assert [u.seq for u in updates] == list(range(1, last + 1))
    assert replay(ZSet.from_rows(INITIAL), updates) == contents(url)


def test_a_poll_holds_no_snapshot_while_the_manager_is_down(maria_url: str, tmp_path: Path) -> None:
    """With trigger capture every poll reads in an exact snapshot and offers it once the
    manager holds what it shipped. While the manager is down the poll's shipping retries,
    and its snapshot is closed after the time a snapshot may stand: MariaDB then has no
    transaction of the wrapper's open (its purge is not held back by the outage). Once the
    manager is back, a poll's snapshot stands again, at the last seq."""
    run_sql(maria_url, R_DDL)
    database = maria_url.rsplit("/", 1)[1]

    def health(url: str) -> dict:
        return httpx.get(f"{url}/v1/health", timeout=10).json()

    def open_transactions() -> int:
        engine = sa.create_engine(maria_url)
        try:
            with engine.connect() as conn:
                return int(
                    conn.execute(
                        sa.text(
                            "SELECT COUNT(*) FROM information_schema.innodb_trx t JOIN information_schema.processlist p "
                            "ON p.id = t.trx_mysql_thread_id WHERE p.db = :db"
                        ),
                        {"db": database},
                    ).scalar_one()
                )
        finally:
            engine.dispose()

    def wait_for(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)

    with FakeManager(token=TOKEN) as manager, start((maria_url, []), manager, tmp_path, poll_interval=0.02) as wrapper:
        run_sql(maria_url, "INSERT INTO r VALUES (1, 1, 'a')")
        wait_for(lambda: (h := health(wrapper.url))["last_seq"] >= 1 and h["standing_snapshot"]["watermark"] == 1)
        assert open_transactions() >= 1  # the standing snapshot

        manager.down = True
        run_sql(maria_url, "INSERT INTO r VALUES (2, 2, 'b')")
        wait_for(lambda: health(wrapper.url)["last_seq"] == 2)
        time.sleep(1.5)  # past STANDING_SECONDS: the standing one retired, the poll's closed
        stuck = health(wrapper.url)
        assert stuck["acked_through"] == 1 and stuck["standing_snapshot"]["watermark"] is None
        assert open_transactions() == 0

        manager.down = False
        wait_for(lambda: health(wrapper.url)["standing_snapshot"]["watermark"] == 2)
    assert [u.seq for u in manager.updates(SOURCE)] == [1, 2]
