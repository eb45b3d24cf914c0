"""A manager outage does not stop timestamp or snapshot capture (issue 4, item 5).

While the manager refuses every post, the wrapper's shipping waits (with backoff, holding
the ship lock); pulling the source into the replica and assigning seqs must go on, so the
pending updates grow with every new source transaction, and all of them ship, in seq
order and exactly once, when the manager is back.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from pvm.wrapper_process import start_wrapper
from tests.fake_manager import FakeManager

SOURCE = "legacy"
CAPTURE_ARGS = {
    "timestamp": ["--capture", "timestamp", "--timestamp-column", "modified", "--settle-seconds", "0.1"],
    "snapshot": ["--capture", "snapshot", "--snapshot-interval", "0.1", "--diff-algorithm", "window"],
}


def execute(db: Path, *statements: str) -> None:
    with sqlite3.connect(db, timeout=10) as conn:
        for statement in statements:
            conn.execute(statement)


def wait_for(condition, what: str, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("method", ["timestamp", "snapshot"])
def test_capture_goes_on_while_the_manager_is_down_and_ships_once_it_is_back(tmp_path: Path, method: str) -> None:
    db = tmp_path / "legacy.db"
    execute(
        db,
        "CREATE TABLE items (id INTEGER PRIMARY KEY, qty INTEGER, modified INTEGER)",
        "INSERT INTO items VALUES (1, 1, 1)",
    )
    with FakeManager() as manager:
        manager.down = True
        with start_wrapper(
            SOURCE, f"sqlite:///{db}", ["items"], manager.url, state_dir=tmp_path / "state",
            log_path=tmp_path / "wrapper.log", poll_interval=0.05, capture_args=CAPTURE_ARGS[method],
        ) as wrapper:  # fmt: skip

            def health() -> dict:
                return httpx.get(f"{wrapper.url}/v1/health", timeout=10).json()

            for n in range(2, 5):  # one transaction at a time, each captured while the manager is down
                execute(
                    db,
                    f"INSERT INTO items VALUES ({n}, {n}, {n})",
                    f"UPDATE items SET qty = qty + 10, modified = {n} WHERE id = 1",
                )
                wait_for(lambda n=n: health()["pending"] == n - 1, f"update {n - 1} to be captured during the outage")
                wait_for(lambda: len(manager.posts) >= 1, "a refused post")  # the ship loop is retrying meanwhile
                assert manager.through(SOURCE) == 0
            assert health()["last_seq"] == 3 and health()["acked_through"] == 0

            manager.down = False
            manager.wait_through(SOURCE, 3)
            wait_for(lambda: health()["pending"] == 0, "the backlog to be acknowledged")
    updates = manager.updates(SOURCE)
    assert [u.seq for u in updates] == [1, 2, 3]
    inserted = [sorted(c.row["id"] for c in u.changes if c.sign > 0) for u in updates]
    assert inserted == [[1, 2], [1, 3], [1, 4]]  # one source transaction per pull, in commit order
    assert [sorted(c.row["qty"] for c in u.changes if c.row["id"] == 1) for u in updates] == [
        [1, 11],
        [11, 21],
        [21, 31],
    ]
    assert manager.conflicts == []
