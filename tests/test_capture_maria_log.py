"""Log capture of MariaDB (``--capture log``): what a read of the binary log yields, the
snapshot's position, and clear errors. The wrapper end to end runs in
``test_capture_handshake.py``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa

from tests.capture_support import run_sql
from wrappers.capture import CaptureConfig, install_log, mariadb, uninstall_log
from wrappers.capture.log import LogRead
from wrappers.capture.maria_log import MariaLog, check_server, file_and_offset
from wrappers.errors import WrapperError
from wrappers.schema import SourceSchema

pytestmark = pytest.mark.servers
LOG = CaptureConfig("log")


@contextmanager
def reader(url: str, tables: list[str]) -> Iterator[tuple[sa.Engine, MariaLog]]:
    engine = mariadb.open_engine(url)
    try:
        install_log(LOG, engine, tables)
        log = MariaLog(engine, SourceSchema.reflect(engine, tables))
        try:
            yield engine, log
        finally:
            log.close()
    finally:
        engine.dispose()


def read(engine: sa.Engine, log: MariaLog, after: int) -> LogRead:
    conn = mariadb.begin_snapshot(engine)
    try:
        return log.read(conn, after, exact=True)
    finally:
        conn.close()


def test_a_read_yields_the_transactions_before_the_snapshot_position(maria_url: str) -> None:
    url = maria_url
    run_sql(
        url,
        "CREATE TABLE r (id INT PRIMARY KEY, b INT, v VARCHAR(20), n DECIMAL(8, 2), d DATE, ok BOOLEAN, f DOUBLE)",
        "CREATE TABLE s (x INT PRIMARY KEY)",
        "CREATE TABLE other (x INT)",
    )
    with reader(url, ["r", "s"]) as (engine, log):
        start = read(engine, log, 0)
        assert start.transactions == [] and start.through > 0  # a fresh state starts at its snapshot
        with engine.connect() as a, engine.connect() as b:
            a.exec_driver_sql("INSERT INTO r VALUES (1, 10, 'x', 1.50, '2024-02-29', true, 0.1)")
            b.exec_driver_sql("INSERT INTO r VALUES (2, 20, 'y', 2, NULL, false, NULL)")
            b.commit()
            b.exec_driver_sql("INSERT INTO r VALUES (3, 30, NULL, NULL, NULL, NULL, NULL)")
            b.rollback()
            a.exec_driver_sql("INSERT INTO s VALUES (7)")
            a.exec_driver_sql("INSERT INTO other VALUES (7)")
            a.commit()
            snapshot = mariadb.begin_snapshot(engine)  # sees the two transactions so far, not the next
            a.exec_driver_sql("UPDATE r SET id = 5 WHERE id = 2")
            a.exec_driver_sql("DELETE FROM s")
            a.commit()
            try:
                first = log.read(snapshot, start.through, exact=True)
            finally:
                snapshot.close()
        assert [[(r.relation, r.op) for r in t.rows] for t in first.transactions] == [
            [("r", "I")],
            [("r", "I"), ("s", "I")],
        ]
        assert next(iter(first.transactions[0].rows)).new == {
            "id": 2, "b": 20, "v": "y", "n": 2.0, "d": None, "ok": 0, "f": None,
        }  # fmt: skip
        assert next(iter(first.transactions[1].rows)).new == {
            "id": 1, "b": 10, "v": "x", "n": 1.5, "d": "2024-02-29", "ok": 1, "f": 0.1,
        }  # fmt: skip
        assert first.through >= first.transactions[-1].end  # the snapshot's position (others may write meanwhile)
        second = read(engine, log, first.through)
        [key_change] = second.transactions
        update = next(iter(key_change.rows))
        assert update.op == "U" and update.old is not None and update.new is not None
        assert (update.old["id"], update.new["id"]) == (2, 5)
        assert list(key_change.rows)[1].op == "D" and list(key_change.rows)[1].old == {"x": 7}
        assert read(engine, log, second.through).transactions == []
        assert log.status()["position"].startswith("mysql-bin.")
        uninstall_log(LOG, engine, ["r", "s"])  # nothing to remove


def test_a_stream_whose_connection_is_lost_is_started_again(maria_url: str) -> None:
    """The server ends the binary log dump (here: killed): the read after it starts a new one
    from the position the reads handled, and nothing is lost or delivered twice."""
    url = maria_url
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY)")
    with reader(url, ["r"]) as (engine, log):
        start = read(engine, log, 0)
        run_sql(url, "INSERT INTO r VALUES (1)")
        first = read(engine, log, start.through)
        dumps = dump_threads(log)
        assert len(dumps) == 2  # the stream's connections
        with engine.connect() as conn:
            conn.exec_driver_sql(f"KILL {dumps[0]}")  # the dump (the other one goes with it)
        run_sql(url, "INSERT INTO r VALUES (2)")
        second = read(engine, log, first.through)
        assert [next(iter(t.rows)).new for t in first.transactions + second.transactions] == [{"id": 1}, {"id": 2}]
        assert dump_threads(log) and not set(dump_threads(log)) & set(dumps)


def dump_threads(log: MariaLog) -> list[int]:
    """The server's thread ids of the stream's connections (its dump first, then the
    library's query connection): other work on the server may have dumps of its own."""
    dump = log._stream._source
    return [int(connection.thread_id()) for connection in dump._opened] if dump is not None else []  # type: ignore[attr-defined]


def test_truncate_and_column_changes_stop_capture_with_a_clear_error(maria_url: str) -> None:
    url = maria_url
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY, v TEXT)", "CREATE TABLE s (id INT PRIMARY KEY)")
    with reader(url, ["r", "s"]) as (engine, log):
        start = read(engine, log, 0)
        run_sql(url, "ALTER TABLE s ADD COLUMN w INT", "INSERT INTO s VALUES (1, 2)")
        with pytest.raises(WrapperError, match=r"table 's' changed in the source \(columns now: id, w; captured: id\)"):
            read(engine, log, start.through)
    with reader(url, ["r"]) as (engine, log):  # the change of s does not concern it
        assert read(engine, log, start.through).transactions == []
        run_sql(url, "INSERT INTO r VALUES (1, 'a')")
        run_sql(url, "TRUNCATE TABLE r")
        with pytest.raises(WrapperError, match=r"TRUNCATE of r cannot be captured from the log"):
            read(engine, log, start.through)


def test_settings_a_purged_position_and_a_slot_are_refused(maria_url: str) -> None:
    url = maria_url
    run_sql(url, "CREATE TABLE r (id INT PRIMARY KEY)")
    with reader(url, ["r"]) as (engine, log):
        log.check_position(0)
        with pytest.raises(WrapperError, match=r"binary log mysql-bin.000000, where .* was purged"):
            log.check_position(4)
        current = read(engine, log, 0).through
        log.check_position(current)
        assert file_and_offset(current, "mysql-bin")[0] in {
            str(r[0]) for r in engine.connect().exec_driver_sql("SHOW BINARY LOGS")
        }
        run_sql(url, "CREATE TABLE m (id INT PRIMARY KEY) ENGINE=MyISAM")
        with pytest.raises(WrapperError, match=r"log capture needs transactional \(InnoDB\) tables: m \(MyISAM\)"):
            install_log(LOG, engine, ["r", "m"])
        with pytest.raises(WrapperError, match="--slot names a PostgreSQL replication slot"):
            install_log(CaptureConfig("log", slot="pvm_x"), engine, ["r"])


class _Variables:
    """An engine whose server reports ``variables``."""

    def __init__(self, **variables: str) -> None:
        self.variables = variables
        self.url = sa.make_url("mysql+pymysql://pvm@db/shop")

    @contextmanager
    def connect(self) -> Iterator[_Variables]:
        yield self

    def exec_driver_sql(self, statement: str) -> _Variables:
        self._rows = list(self.variables.items()) if statement.startswith("SHOW VARIABLES") else []
        return self

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._rows)

    def all(self) -> list[tuple[str, str]]:
        return self._rows


def test_binary_log_settings_are_checked_by_name() -> None:
    good = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}
    check_server(_Variables(**good))  # type: ignore[arg-type]
    with pytest.raises(
        WrapperError, match=r"needs binlog_format = ROW \(it is MIXED\), binlog_row_metadata = FULL \(it is MINIMAL\)"
    ):
        check_server(_Variables(**{**good, "binlog_format": "MIXED", "binlog_row_metadata": "MINIMAL"}))  # type: ignore[arg-type]
    with pytest.raises(WrapperError, match=r"log_bin = ON \(it is OFF\)"):
        check_server(_Variables(**{**good, "log_bin": "OFF"}))  # type: ignore[arg-type]
