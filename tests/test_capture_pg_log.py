"""Log capture of PostgreSQL (``--capture log``): install and uninstall, what a read of the
slot yields, positions and confirmation, the snapshot check, and clear errors.

The wrapper end to end (handshake under concurrent writers, crash and outage) runs in
``test_capture_handshake.py`` with the other capture methods of the servers.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pvm.cli import main as pvm_main
from tests.capture_support import PG_ADMIN, fetch, pg_log_slot, pg_schema_url, run_sql
from tests.fake_manager import FakeManager
from wrappers.capture import CaptureConfig, install_log, pg_log, postgresql, uninstall_log
from wrappers.capture.log import IDLE_POLL_MAX_SECONDS, LogRead, PollPacing, SnapshotRace
from wrappers.capture.pg_log import PgLog, PgSnapshot, check_server
from wrappers.errors import WrapperError
from wrappers.schema import SourceSchema
from wrappers.wrapper import Wrapper, WrapperConfig

pytestmark = pytest.mark.servers
LOG = CaptureConfig("log")


@contextmanager
def reader(url: str, tables: list[str]) -> Iterator[tuple[sa.Engine, PgLog]]:
    engine = postgresql.open_engine(url)
    try:
        slot = install_log(LOG, engine, tables)
        log = PgLog(engine, SourceSchema.reflect(engine, tables), slot)
        try:
            yield engine, log
        finally:
            log.close()
    finally:
        engine.dispose()


def read(engine: sa.Engine, log: PgLog, after: int, *, exact: bool = True) -> LogRead:
    """A read as a subquery's (``exact``: everything committed before it) or a poll's (what
    the stream has delivered so far)."""
    conn = postgresql.begin_snapshot(engine)
    try:
        return log.read(conn, after, exact=exact)
    finally:
        conn.close()


def slot_row(url: str) -> tuple[Any, ...] | None:
    rows = fetch(
        url,
        f"SELECT (confirmed_flush_lsn - '0/0')::bigint, active FROM pg_replication_slots WHERE slot_name = '{pg_log_slot(url)}'",
    )
    return rows[0] if rows else None


def confirmed_slot(url: str, position: int) -> tuple[Any, ...]:
    """The slot's row once its confirmed position is ``position`` (within 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        row = slot_row(url)
        if row is not None and row[0] == position:
            return row
        assert time.monotonic() < deadline, f"the slot stayed at {row}"
        time.sleep(0.02)


def published(url: str) -> set[str]:
    return {
        t for (t,) in fetch(url, f"SELECT tablename FROM pg_publication_tables WHERE pubname = '{pg_log_slot(url)}'")
    }


def test_install_is_idempotent_and_uninstall_releases_the_slot(pg_log_url: str) -> None:
    url = pg_log_url
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY, v TEXT)", "CREATE TABLE s (x INT)")
    engine = postgresql.open_engine(url)
    assert install_log(LOG, engine, ["r"]) == pg_log_slot(url)
    install_log(LOG, engine, ["r", "s"])
    install_log(LOG, engine, ["r", "s"])
    assert published(url) == {"r", "s"} and slot_row(url) is not None
    identities = fetch(
        url,
        "SELECT relname, relreplident FROM pg_class WHERE relnamespace = current_schema()::regnamespace "
        "AND relname IN ('r', 's') ORDER BY 1",
    )
    assert identities == [("r", "f"), ("s", "f")]
    assert fetch(
        url,
        "SELECT count(*) FROM pg_trigger t JOIN pg_class c ON t.tgrelid = c.oid "
        "WHERE c.relnamespace = current_schema()::regnamespace",
    ) == [(0,)]
    uninstall_log(LOG, engine, ["r"])
    assert published(url) == {"s"} and slot_row(url) is not None  # s is still captured
    uninstall_log(LOG, engine, ["s"])
    uninstall_log(LOG, engine, ["s"])
    assert published(url) == set() and slot_row(url) is None  # the WAL is released
    engine.dispose()


def test_a_read_yields_committed_transactions_in_commit_order(pg_log_url: str) -> None:
    url = pg_log_url
    run_sql(
        url,
        "CREATE TABLE r (id INT PRIMARY KEY, b INT, n NUMERIC(8, 2), d DATE, ok BOOLEAN, f FLOAT8, t TEXT)",
        "CREATE TABLE s (x INT PRIMARY KEY)",
        "CREATE TABLE other (x INT)",
    )
    with reader(url, ["r", "s"]) as (engine, log):
        with engine.connect() as a, engine.connect() as b:
            a.exec_driver_sql("INSERT INTO r VALUES (1, 10, 1.50, '2024-02-29', true, 'Infinity', repeat('x', 5000))")
            b.exec_driver_sql("INSERT INTO r VALUES (2, 20, 2, NULL, false, 0.1, 'y')")
            b.commit()  # commits first
            a.exec_driver_sql("UPDATE r SET b = 11 WHERE id = 1")  # the long text is unchanged: not in the log
            b.exec_driver_sql("INSERT INTO r VALUES (3, 30, NULL, NULL, NULL, NULL, NULL)")
            b.rollback()
            a.exec_driver_sql("INSERT INTO s VALUES (7)")
            a.exec_driver_sql("INSERT INTO other VALUES (7)")
            a.commit()
            a.exec_driver_sql("INSERT INTO other VALUES (8)")  # a transaction of no captured table
            a.commit()
            a.exec_driver_sql("UPDATE r SET id = 5 WHERE id = 2")
            a.exec_driver_sql("DELETE FROM s")
            a.commit()
        first = read(engine, log, 0)
        transactions = first.transactions
        assert [[(r.relation, r.op) for r in t.rows] for t in transactions] == [
            [("r", "I")],
            [("r", "I"), ("r", "U"), ("s", "I")],
            [("r", "U"), ("s", "D")],
        ]
        assert len({t.xid for t in transactions}) == 3 and all(r.txid == t.xid for t in transactions for r in t.rows)
        assert [t.end for t in transactions] == sorted(t.end for t in transactions)
        assert first.through >= transactions[-1].end
        one = list(transactions[1].rows)
        assert one[0].new == {
            "id": 1,
            "b": 10,
            "n": 1.5,
            "d": "2024-02-29",
            "ok": True,
            "f": float("inf"),
            "t": "x" * 5000,
        }
        assert one[1].old == one[0].new and one[1].new == {**one[0].new, "b": 11}  # TOAST value from the old row
        assert next(iter(transactions[0].rows)).new == {
            "id": 2,
            "b": 20,
            "n": 2,
            "d": None,
            "ok": False,
            "f": 0.1,
            "t": "y",
        }
        key_change = next(iter(transactions[2].rows))
        assert key_change.old is not None and key_change.new is not None
        assert (key_change.old["id"], key_change.new["id"]) == (2, 5)
        # Resuming after a position skips what is before it; the slot moves only when confirmed.
        assert read(engine, log, transactions[0].end).transactions == transactions[1:]
        assert read(engine, log, first.through).transactions == []
        confirmed_before = slot_row(url)
        assert confirmed_before is not None and confirmed_before[0] < transactions[0].end
        log.confirm(transactions[1].end)  # a status update on the stream's connection
        after_confirm = confirmed_slot(url, transactions[1].end)
        assert read(engine, log, transactions[1].end).transactions == transactions[2:]
        log.confirm(transactions[0].end)  # never backwards
        time.sleep(0.2)
        assert slot_row(url) == after_confirm
        assert log.status()["retained_wal_bytes"] >= 0 and log.status()["slot"] == pg_log_slot(url)


def test_a_snapshot_that_no_prefix_of_the_log_matches_is_refused(
    pg_log_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Visibility is not always log order: a snapshot that sees a transaction but not one
    that committed before it must be retaken (simulated: the commit-to-visible window of a
    real server is microseconds long)."""
    url = pg_log_url
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY)")
    with reader(url, ["r"]) as (engine, log):
        run_sql(url, "INSERT INTO r VALUES (1)")
        run_sql(url, "INSERT INTO r VALUES (2)")
        both = read(engine, log, 0).transactions
        hidden = int(both[0].xid)
        real = PgSnapshot.sees
        monkeypatch.setattr(PgSnapshot, "sees", lambda self, xid: xid != hidden and real(self, xid))
        with pytest.raises(SnapshotRace, match=f"sees transaction {both[1].xid} but not {hidden}"):
            read(engine, log, 0, exact=True)
        polled = read(engine, log, 0, exact=False)
        assert polled.transactions == [] and polled.through == 0  # a poll stops before the hidden one
        assert polled.more  # and says it left transactions behind: the next poll comes soon
        monkeypatch.setattr(PgSnapshot, "sees", lambda self, xid: xid != int(both[1].xid) and real(self, xid))
        exact = read(engine, log, 0, exact=True)  # a visible prefix is fine
        assert exact.transactions == both[:1] and exact.through == both[0].end


def test_an_exact_read_has_the_wal_flushed_instead_of_waiting(
    pg_log_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A subquery's read needs the WAL flushed through its snapshot's insert position. A
    transaction committed with synchronous_commit = off is visible before it is flushed,
    and WAL of running transactions stays unflushed: the read commits a logical message of
    its own, whose commit flushes all that, instead of waiting for the WAL writer (up to
    3 x wal_writer_delay). Where it may not, it waits as before."""
    url = pg_log_url
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY)", "CREATE TABLE other (x INT)")
    with reader(url, ["r"]) as (engine, log), engine.connect() as writer, engine.connect() as running:
        writer.exec_driver_sql("SET synchronous_commit = off")
        writer.exec_driver_sql("INSERT INTO r VALUES (1)")
        writer.commit()  # visible, maybe not flushed yet
        running.exec_driver_sql("INSERT INTO other VALUES (1)")  # WAL of a running transaction
        insert = int(running.exec_driver_sql("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint").scalar_one())
        slept: list[float] = []
        real_sleep = time.sleep
        monkeypatch.setattr(pg_log.time, "sleep", slept.append)
        conn = postgresql.begin_snapshot(engine)
        try:
            assert log._flush_through(conn, insert) >= insert and slept == []  # flushed at once
            exact = log.read(conn, 0, exact=True)
        finally:
            conn.close()
        assert [[r.new for r in t.rows] for t in exact.transactions] == [[{"id": 1}]]
        assert slept == []

        monkeypatch.setattr(pg_log, "FLUSH_TRANSACTION", "SELECT pg_no_such_function()")
        monkeypatch.setattr(pg_log.time, "sleep", lambda seconds: slept.append(seconds) or real_sleep(seconds))
        running.exec_driver_sql("INSERT INTO other VALUES (2)")
        insert = int(running.exec_driver_sql("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint").scalar_one())
        conn = postgresql.begin_snapshot(engine)
        try:
            with caplog.at_level("WARNING", logger="wrappers.capture.pg_log"):
                log._flush_through(conn, insert)  # waits (while nothing else commits: the whole time)
        finally:
            conn.close()
        assert "subqueries wait for the WAL writer instead" in caplog.text and not log._force_flush
        running.rollback()


def test_a_stream_whose_connection_is_lost_is_started_again(pg_log_url: str) -> None:
    """The server ends the replication connection (here: terminated): the read after it
    starts a new stream from the slot's confirmed position, and nothing is lost or
    delivered twice."""
    url = pg_log_url
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY)")
    with reader(url, ["r"]) as (engine, log):
        run_sql(url, "INSERT INTO r VALUES (1)")
        first = read(engine, log, 0)
        [(pid, active)] = fetch(
            url, f"SELECT active_pid, active FROM pg_replication_slots WHERE slot_name = '{pg_log_slot(url)}'"
        )
        assert active  # the stream holds the slot
        fetch(url, f"SELECT pg_terminate_backend({pid})")
        run_sql(url, "INSERT INTO r VALUES (2)")
        second = read(engine, log, first.through)
        assert [next(iter(t.rows)).new for t in first.transactions + second.transactions] == [{"id": 1}, {"id": 2}]
        [(again,)] = fetch(url, f"SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{pg_log_slot(url)}'")
        assert again not in (None, pid)


def test_truncate_and_column_changes_stop_capture_with_a_clear_error(pg_log_url: str) -> None:
    url = pg_log_url
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY, v TEXT)", "INSERT INTO r VALUES (1, 'a')")
    with reader(url, ["r"]) as (engine, log):
        run_sql(url, "INSERT INTO r VALUES (2, 'b')")
        good = read(engine, log, 0)
        run_sql(url, "TRUNCATE r")
        with pytest.raises(WrapperError, match=r"TRUNCATE of r cannot be captured from the log"):
            read(engine, log, good.through)
        run_sql(url, "INSERT INTO r VALUES (3, 'c')")
        with pytest.raises(WrapperError, match=r"TRUNCATE of r"):  # capture stays stopped there
            read(engine, log, good.through)
        assert [next(iter(t.rows)).new for t in good.transactions] == [{"id": 2, "v": "b"}]


def test_a_column_change_is_reported_not_shipped(pg_log_url: str) -> None:
    url = pg_log_url
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY, v TEXT)")
    with reader(url, ["r"]) as (engine, log):
        run_sql(url, "ALTER TABLE r DROP COLUMN v", "INSERT INTO r VALUES (3)")
        with pytest.raises(WrapperError, match=r"table 'r' changed in the source \(columns with type oids now: id"):
            read(engine, log, 0)


class _Settings:
    """An engine whose connections answer the setting queries with ``values`` (in order)."""

    def __init__(self, *values: object) -> None:
        self.values = values
        self.url = sa.make_url("postgresql://pvm@db/shop")

    @contextmanager
    def connect(self) -> Iterator[_Settings]:
        self._answers = iter(self.values)
        yield self

    def exec_driver_sql(self, statement: str) -> _Settings:
        return self

    def scalar_one(self) -> object:
        return next(self._answers)


def test_server_settings_are_checked_by_name() -> None:
    with pytest.raises(WrapperError, match=r"needs wal_level = logical, the server has replica \(ALTER SYSTEM SET"):
        check_server(_Settings("replica", "10", "10", True, "pvm"))  # type: ignore[arg-type]
    with pytest.raises(WrapperError, match="max_replication_slots of at least 1"):
        check_server(_Settings("logical", "0", "10", True, "pvm"))  # type: ignore[arg-type]
    with pytest.raises(WrapperError, match="max_wal_senders of at least 1"):
        check_server(_Settings("logical", "10", "0", True, "pvm"))  # type: ignore[arg-type]
    check_server(_Settings("logical", "10", "10", True, "pvm"))  # type: ignore[arg-type]


def test_a_role_without_replication_is_told_what_to_grant(pg_log_url: str) -> None:
    role = f"pvm_t_{uuid.uuid4().hex[:10]}"
    schema = sa.make_url(pg_log_url).query["options"].split("=")[-1]  # type: ignore[union-attr]
    run_sql(
        PG_ADMIN,
        f"CREATE ROLE {role} LOGIN",
        f"CREATE TABLE {schema}.r (id INT PRIMARY KEY)",
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"GRANT SELECT ON {schema}.r TO {role}",
    )
    try:
        engine = postgresql.open_engine(pg_schema_url(schema, user=role))
        with pytest.raises(WrapperError, match=rf"needs the REPLICATION attribute for role '{role}' \(ALTER ROLE"):
            install_log(LOG, engine, ["r"])
        engine.dispose()
    finally:
        run_sql(PG_ADMIN, f"DROP OWNED BY {role}", f"DROP ROLE {role}")


def test_a_slot_in_use_and_a_table_without_full_identity_are_refused_at_start(pg_log_url: str) -> None:
    url = pg_log_url
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY)")
    engine = postgresql.open_engine(url)
    slot = install_log(LOG, engine, ["r"])
    schema = SourceSchema.reflect(engine, ["r"])
    consumer = subprocess.Popen(
        ["pg_recvlogical", "-h", "127.0.0.1", "-U", "postgres", "-d", "test", "--slot", slot, "--start",
         "-o", "proto_version=1", "-o", f"publication_names={slot}", "-f", "/dev/null"],
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not (slot_row(url) or (None, False))[1]:
            assert time.monotonic() < deadline and consumer.poll() is None, "pg_recvlogical did not take the slot"
            time.sleep(0.05)
        with pytest.raises(WrapperError, match=rf"replication slot '{slot}' is in use by another process \(PID"):
            PgLog(engine, schema, slot)
    finally:
        consumer.terminate()
        consumer.wait(10)
    deadline = time.monotonic() + 20
    while (slot_row(url) or (None, False))[1]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    PgLog(engine, schema, slot)
    run_sql(url, "ALTER TABLE r REPLICA IDENTITY DEFAULT")
    with pytest.raises(WrapperError, match=r"table\(s\) r lack REPLICA IDENTITY FULL"):
        PgLog(engine, schema, slot)
    run_sql(url, "ALTER TABLE r REPLICA IDENTITY FULL")
    with pytest.raises(WrapperError, match="does not exist: run pvm wrapper install --capture log"):
        PgLog(engine, schema, "pvm_no_such_slot")
    engine.dispose()


def test_the_command_line_installs_and_releases_a_slot(pg_log_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = pg_log_url
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY)")
    base = ["wrapper", "install", "--capture", "log", "--url", url, "--tables", "r"]
    assert pvm_main(base) == 0
    assert f"slot and publication {pg_log_slot(url)}" in capsys.readouterr().out
    assert slot_row(url) is not None
    assert pvm_main(["wrapper", "uninstall", *base[2:]]) == 0
    assert slot_row(url) is None and "goes with the last table" in capsys.readouterr().out
    assert pvm_main([*base, "--slot", "Bad-Name"]) == 2
    assert "invalid slot name 'Bad-Name'" in capsys.readouterr().err
    assert pvm_main(["wrapper", "install", "--url", url, "--tables", "r", "--slot", "pvm_x"]) == 2
    assert "a replication slot belongs to log capture" in capsys.readouterr().err


def test_polls_of_a_quiet_log_are_spaced_out_and_a_change_still_ships(pg_log_url: str, tmp_path: Path) -> None:
    """While polls find nothing the wrapper reads the slot ever less often (``PollPacing``),
    up to ``IDLE_POLL_MAX_SECONDS`` apart; the first change after the quiet spell ships."""
    url = pg_log_url
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY)")

    async def scenario(manager: FakeManager) -> tuple[int, float]:
        config = WrapperConfig(
            "pg", url, ("r",), manager.url, state_dir=tmp_path / "state", poll_interval=0.01, capture=LOG
        )
        wrapper = Wrapper(config)
        reads: list[float] = []
        capture_now = wrapper._capture_now

        def counted() -> None:
            reads.append(time.monotonic())
            capture_now()

        wrapper._capture_now = counted  # type: ignore[method-assign]
        await wrapper.start()
        try:
            await asyncio.sleep(1.5)  # quiet: 150 poll intervals
            quiet_reads = len(reads)
            await asyncio.to_thread(run_sql, url, "INSERT INTO r VALUES (1)")
            committed = time.monotonic()
            while manager.through("pg") < 1:
                assert time.monotonic() - committed < 10, "the change was never shipped"
                await asyncio.sleep(0.005)
            return quiet_reads, time.monotonic() - committed
        finally:
            await wrapper.stop()

    with FakeManager() as manager:
        quiet_reads, shipped_after = asyncio.run(scenario(manager))
        assert [c.row for u in manager.updates("pg") for c in u.changes] == [{"id": 1}]
    assert quiet_reads <= 20, quiet_reads  # 4 at the poll interval, then 0.02, 0.04, ... 0.4 s apart
    assert shipped_after < IDLE_POLL_MAX_SECONDS + 1.0, shipped_after


@pytest.mark.parametrize("server", ["postgresql", "mariadb"])
def test_a_transaction_arriving_from_the_log_is_captured_without_a_poll(
    server: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log's stream wakes the ship loop: with no poll ever due after the first two (the
    first read of a fresh MariaDB state only notes where the log starts), a committed change
    still ships, captured by the read its arrival started."""
    url = request.getfixturevalue("pg_log_url" if server == "postgresql" else "maria_url")
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY)")
    reads: list[float] = []
    two_polls = threading.Event()
    monkeypatch.setattr(PollPacing, "due", lambda self, now: len(reads) < 2)

    async def scenario(manager: FakeManager) -> tuple[int, int]:
        config = WrapperConfig(
            "src", url, ("r",), manager.url, state_dir=tmp_path / "state", poll_interval=0.01, capture=LOG
        )
        wrapper = Wrapper(config)
        capture_now = wrapper._capture_now

        def counted() -> None:
            reads.append(time.monotonic())
            capture_now()
            if len(reads) == 2:
                two_polls.set()

        wrapper._capture_now = counted  # type: ignore[method-assign]
        await wrapper.start()
        try:
            assert await asyncio.to_thread(two_polls.wait, 10)
            await asyncio.sleep(0.3)
            before = len(reads)
            await asyncio.to_thread(run_sql, url, "INSERT INTO r VALUES (1)")
            committed = time.monotonic()
            while manager.through("src") < 1:
                assert time.monotonic() - committed < 10, "the change was never shipped"
                await asyncio.sleep(0.005)
            return before, len(reads)
        finally:
            await wrapper.stop()

    with FakeManager() as manager:
        before, after = asyncio.run(scenario(manager))
        assert [c.row for u in manager.updates("src") for c in u.changes] == [{"id": 1}]
    assert before == 2 and after > before  # no read while nothing arrived; the arrival started one
