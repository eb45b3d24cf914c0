"""The pull loop captures the replica only when a pull changed it (or failed after changing
it); each feeder's ``pull`` says whether it did; range-checksum capture writes its ranges
only when they changed; the differencing duplicate-key check reads no replica row by key."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from wrappers.capture import Capture, CaptureConfig, open_capture
from wrappers.capture.snapshots import SnapshotOptions
from wrappers.replica import META, RowChange
from wrappers.wrapper import Wrapper, WrapperConfig

CONFIGS = {
    "timestamp": CaptureConfig("timestamp", timestamp_column="modified", settle_seconds=0),
    "snapshot": CaptureConfig("snapshot", snapshot=SnapshotOptions(interval=0.01, algorithm="window")),
    "range-checksums": CaptureConfig(
        "snapshot", snapshot=SnapshotOptions(interval=0.01, algorithm="range-checksums", range_rows=5)
    ),
}


def _source(tmp_path: Path, rows: int = 30) -> str:
    db = tmp_path / "src.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, qty INTEGER, modified INTEGER)")
        conn.executemany("INSERT INTO items VALUES (?, ?, 1)", [(i, i % 7) for i in range(rows)])
    return f"sqlite:///{db}"


def _execute(url: str, *statements: str) -> None:
    with sqlite3.connect(sa.make_url(url).database) as conn:
        for statement in statements:
            conn.execute(statement)


def _pull(capture: Capture) -> Any:
    """Pull once the snapshot interval passed."""
    time.sleep(0.011)
    assert capture.pull is not None
    return capture.pull()


def _statements(engine: sa.Engine, wanted: str) -> list[str]:
    """The statements run on ``engine`` from now on that contain ``wanted``."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if wanted in statement:
            seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    return seen


@pytest.mark.parametrize("method", list(CONFIGS))
def test_each_pull_says_whether_it_changed_the_replica(tmp_path: Path, method: str) -> None:
    url = _source(tmp_path)
    capture = open_capture(CONFIGS[method], url, ["items"], tmp_path / "state" / "src.replica.sqlite3")
    try:
        assert _pull(capture) is False  # the source is as loaded
        _execute(url, "UPDATE items SET qty = 100, modified = 5 WHERE id = 3")
        assert _pull(capture) is True
        with capture.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT qty FROM items WHERE id = 3").scalar_one() == 100
        assert _pull(capture) is False  # read again (timestamp: at the bound), unchanged
    finally:
        capture.close()


def test_range_checksums_write_their_ranges_only_when_they_change(tmp_path: Path) -> None:
    url = _source(tmp_path)
    path = tmp_path / "state" / "src.replica.sqlite3"
    capture = open_capture(CONFIGS["range-checksums"], url, ["items"], path)
    try:
        assert capture.replica is not None
        writes = _statements(capture.replica.engine, f"INTO {META}")
        _pull(capture)
        _pull(capture)
        assert writes == []  # nothing changed: not even the (same) ranges are written
        _execute(url, "UPDATE items SET qty = 100 WHERE id = 3")
        assert _pull(capture) is True
        assert len(writes) == 1  # one range's checksum changed, written with the change
    finally:
        capture.close()
    capture = open_capture(CONFIGS["range-checksums"], url, ["items"], path)  # the ranges as written
    try:
        assert _pull(capture) is False and capture.status is not None
        assert capture.status()["ranges_shipped"] == 0
    finally:
        capture.close()


def test_the_duplicate_key_check_reads_no_replica_row_by_key(tmp_path: Path) -> None:
    url = _source(tmp_path)
    capture = open_capture(CONFIGS["snapshot"], url, ["items"], tmp_path / "state" / "src.replica.sqlite3")
    try:
        assert capture.replica is not None
        lookups = _statements(capture.replica.engine, "WHERE items.id =")
        _execute(url, *(f"INSERT INTO items VALUES ({i}, 0, 1)" for i in range(100, 140)))
        assert _pull(capture) is True
        assert lookups == []  # the inserts' own primary-key check is the only one
        with capture.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM items").scalar_one() == 70
    finally:
        capture.close()


@pytest.fixture()
def wrapper(tmp_path: Path) -> Any:
    config = WrapperConfig(
        "legacy", _source(tmp_path), ("items",), "http://127.0.0.1:9", state_dir=tmp_path / "state",
        capture=CONFIGS["snapshot"],
    )  # fmt: skip
    made = Wrapper(config)
    yield made
    asyncio.run(made.stop())


def _count_captures(wrapper: Wrapper) -> list[int]:
    """Count the wrapper's captures of the replica's outbox (they still run)."""
    calls: list[int] = []
    capture_now = wrapper._capture_now

    def counted() -> None:
        calls.append(1)
        capture_now()

    wrapper._capture_now = counted  # type: ignore[method-assign]
    return calls


def test_the_pull_loop_captures_only_what_a_pull_applied(wrapper: Wrapper) -> None:
    captures = _count_captures(wrapper)
    time.sleep(0.011)
    asyncio.run(wrapper.pull_once())
    assert captures == [] and wrapper.state.last_seq == 0  # the source is as loaded
    assert wrapper.config.url is not None
    _execute(wrapper.config.url, "DELETE FROM items WHERE id = 4")
    time.sleep(0.011)
    asyncio.run(wrapper.pull_once())
    assert captures == [1] and wrapper.state.last_seq == 1
    time.sleep(0.011)
    asyncio.run(wrapper.pull_once())
    assert captures == [1]


def test_a_pull_that_fails_after_changing_the_replica_is_captured(wrapper: Wrapper) -> None:
    replica = wrapper.capture.replica
    assert replica is not None

    def fails_after_applying() -> bool:
        replica.apply([RowChange("items", "insert", row={"id": 500, "qty": 1})])
        raise OSError("the old snapshot file cannot be removed")

    wrapper.capture.pull = fails_after_applying
    with pytest.raises(OSError):
        asyncio.run(wrapper.pull_once())
    assert wrapper.state.last_seq == 1
    [update] = wrapper.state.pending(10)
    assert [(c.sign, c.row["id"]) for c in wrapper.state.part(update.seq, 0)] == [(1, 500)]
