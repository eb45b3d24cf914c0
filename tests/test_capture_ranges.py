"""Range-checksum capture (Carnes ID/RCS) over real SQLite, PostgreSQL and MariaDB tables:
after every refresh the replica equals the source, and only ranges with changed rows are
shipped."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from pvm.wrapper_process import start_wrapper
from tests.capture_support import run_sql
from tests.fake_manager import FakeManager
from wrappers.capture import dialect_for
from wrappers.capture.ranges import RangeCapture
from wrappers.capture.snapshots import SnapshotOptions, database_schema
from wrappers.errors import WrapperError
from wrappers.replica import META, Replica

ROWS = 300
PER_RANGE = 20


def _contents(engine: sa.Engine, table: str = "items") -> dict[int, tuple]:
    with engine.connect() as conn:
        return {r[0]: tuple(r[1:]) for r in conn.exec_driver_sql(f"SELECT id, name, qty FROM {table}")}


def _capture(url: str, tmp_path: Path) -> tuple[RangeCapture, Replica, sa.Engine]:
    dialect = dialect_for(url)
    engine = dialect.open_engine(url)
    schema = database_schema(engine, ["items"], {})
    replica = Replica(tmp_path / "items.replica.sqlite3", schema)
    capture = RangeCapture(dialect, engine, schema, replica, interval=0.001, rows_per_range=PER_RANGE)
    capture.load()
    return capture, replica, engine


def _sqlite_url(tmp_path: Path) -> str:
    path = tmp_path / "src.db"
    sqlite3.connect(path).close()
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def source_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = _sqlite_url(tmp_path)
    else:
        url = request.getfixturevalue("pg_url" if request.param == "postgresql" else "maria_url")
    run_sql(url, "CREATE TABLE items (id INTEGER PRIMARY KEY, name VARCHAR(40), qty INTEGER)")
    rng = random.Random(5)
    values = ", ".join(f"({i}, 'item-{i}', {rng.randrange(100)})" for i in range(0, 2 * ROWS, 2))
    run_sql(url, f"INSERT INTO items VALUES {values}")
    return url


@pytest.mark.servers
def test_only_changed_ranges_are_shipped_and_the_replica_follows(source_url: str, tmp_path: Path) -> None:
    capture, replica, source = _capture(source_url, tmp_path)
    try:
        assert _contents(replica.engine) == _contents(source)
        status = capture.status()
        assert status["ranges"] == {"items": ROWS // PER_RANGE}

        # one update deep inside, one delete, one insert between existing keys, one past the end
        run_sql(
            source_url,
            "UPDATE items SET qty = qty + 1000 WHERE id = 100",
            "DELETE FROM items WHERE id = 302",
            "INSERT INTO items VALUES (101, 'new', 1)",
            f"INSERT INTO items VALUES ({10 * ROWS}, 'last', NULL)",
        )
        capture.pull()
        after = capture.status()
        assert after["last_error"] is None
        assert after["last_changes"]["items"] == {"insert": 2, "update": 1, "delete": 1}
        # id 100 and 101 share a range, 302 is in another, the new last key in the last one
        assert after["ranges_shipped"] == 3
        assert after["rows_shipped"] <= 3 * PER_RANGE + 2  # those three ranges, not the table
        assert _contents(replica.engine) == _contents(source)

        capture._next_at = 0.0
        capture.pull()  # nothing changed: nothing shipped
        assert capture.status()["ranges_shipped"] == 3
        assert capture.status()["last_changes"]["items"] == {"insert": 0, "update": 0, "delete": 0}
    finally:
        replica.close()
        source.dispose()


@pytest.mark.servers
def test_a_range_that_grows_is_split_and_restart_keeps_the_checksums(source_url: str, tmp_path: Path) -> None:
    capture, replica, source = _capture(source_url, tmp_path)
    try:
        values = ", ".join(f"({i}, 'burst', 1)" for i in range(100_000, 100_000 + 3 * PER_RANGE))
        run_sql(source_url, f"INSERT INTO items VALUES {values}")
        capture.pull()
        assert capture.status()["ranges"]["items"] > ROWS // PER_RANGE
        assert _contents(replica.engine) == _contents(source)
    finally:
        replica.close()
        source.dispose()
    # a new capture over the same replica reads the ranges and checksums back: nothing to ship
    dialect = dialect_for(source_url)
    engine = dialect.open_engine(source_url)
    schema = database_schema(engine, ["items"], {})
    replica = Replica(tmp_path / "items.replica.sqlite3", schema)
    try:
        again = RangeCapture(dialect, engine, schema, replica, interval=0.001, rows_per_range=PER_RANGE)
        again.pull()
        assert again.status()["ranges_shipped"] == 0
        assert again.status()["last_error"] is None
    finally:
        replica.close()
        engine.dispose()


def test_text_keys_are_refused(tmp_path: Path) -> None:
    url = _sqlite_url(tmp_path)
    run_sql(url, "CREATE TABLE items (code TEXT PRIMARY KEY, qty INTEGER)")
    dialect = dialect_for(url)
    engine = dialect.open_engine(url)
    schema = database_schema(engine, ["items"], {})
    replica = Replica(tmp_path / "r.sqlite3", schema)
    try:
        with pytest.raises(WrapperError, match="integer key columns"):
            RangeCapture(dialect, engine, schema, replica, interval=1, rows_per_range=10)
    finally:
        replica.close()
        engine.dispose()


@pytest.mark.servers
def test_a_wrapper_process_ships_what_the_range_checksums_find(pg_url: str, tmp_path: Path) -> None:
    run_sql(pg_url, "CREATE TABLE items (id INTEGER PRIMARY KEY, name VARCHAR(40), qty INTEGER)")
    run_sql(pg_url, "INSERT INTO items SELECT g, 'item-' || g, g % 7 FROM generate_series(1, 500) g")
    args = [
        "--capture",
        "snapshot",
        "--diff-algorithm",
        "range-checksums",
        "--range-rows",
        "50",
        "--snapshot-interval",
        "0.1",
    ]
    with FakeManager() as manager, start_wrapper(
        "legacy", pg_url, ["items"], manager.url, state_dir=tmp_path / "state", log_path=tmp_path / "wrapper.log",
        capture_args=args,
    ) as wrapper:  # fmt: skip
        run_sql(pg_url, "UPDATE items SET qty = 99 WHERE id = 250", "DELETE FROM items WHERE id = 7")
        manager.wait_through("legacy", 1)
        [update] = manager.updates("legacy")
        assert sorted((c.sign, c.row["id"], c.row["qty"]) for c in update.changes) == [
            (-1, 7, 0), (-1, 250, 5), (1, 250, 99),
        ]  # fmt: skip
        health = httpx.get(f"{wrapper.url}/v1/health").json()["capture"]
        assert health["method"] == "snapshot" and health["ranges"] == {"items": 10}
        assert health["ranges_shipped"] == 2 and health["rows_shipped"] <= 100
        body = {"relation": "items", "alias": "i", "keys": [[]], "select": ["id", "qty"]}
        answer = httpx.post(f"{wrapper.url}/v1/subquery", json=body, timeout=30).json()
        assert answer["watermark"] == 1 and len(answer["rows"]) == 499


def test_range_checksums_need_a_live_database(tmp_path: Path) -> None:
    with pytest.raises(WrapperError, match="give --url, not --dump-dir"):
        SnapshotOptions(algorithm="range-checksums", dump_dir=tmp_path)


@pytest.mark.servers
def test_a_copy_loaded_without_its_ranges_is_read_whole_once(source_url: str, tmp_path: Path) -> None:
    """A crash between loading the copy and recording its ranges: the next refresh reads the
    table once, ships only the real changes, and records ranges again."""
    capture, replica, source = _capture(source_url, tmp_path)
    try:
        with replica.engine.begin() as conn:
            conn.exec_driver_sql(f"DELETE FROM {META} WHERE key = 'range_checksums'")
        dialect = dialect_for(source_url)
        schema = database_schema(source, ["items"], {})
        again = RangeCapture(dialect, source, schema, replica, interval=0.001, rows_per_range=PER_RANGE)
        run_sql(source_url, "UPDATE items SET qty = -1 WHERE id = 4")
        again.pull()
        status = again.status()
        assert status["last_error"] is None
        assert status["last_changes"]["items"] == {"insert": 0, "update": 1, "delete": 0}
        assert status["rows_shipped"] == ROWS and status["ranges"]["items"] == ROWS // PER_RANGE
        assert _contents(replica.engine) == _contents(source)
    finally:
        replica.close()
        source.dispose()
