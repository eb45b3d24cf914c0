"""Timestamp capture (Carnes TS and TDI) through a real wrapper process: what it ships, what it
cannot see, answers from the replica with exact watermarks, restart, clear errors."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from pvm.cli import main as pvm_main
from pvm.wrapper_process import WrapperProcess, start_wrapper
from tests.capture_support import run_sql
from tests.fake_manager import FakeManager

SOURCE = "legacy"
DDL = "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, modified INTEGER, gone INTEGER DEFAULT 0)"
INITIAL = [(1, "bolt", 5, 1, 0), (2, "nut", 7, 1, 0), (3, "gear", 1, 1, 1)]


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "legacy.db"
    with sqlite3.connect(path) as conn:
        conn.execute(DDL)
        conn.executemany("INSERT INTO items VALUES (?, ?, ?, ?, ?)", INITIAL)
    return path


def start(url: str, manager: FakeManager, tmp_path: Path, *flags: str) -> WrapperProcess:
    return start_wrapper(
        SOURCE, url, ["items"], manager.url, state_dir=tmp_path / "state", log_path=tmp_path / "wrapper.log",
        poll_interval=0.05, capture_args=["--capture", "timestamp", "--timestamp-column", "modified",
                                          "--settle-seconds", "0.2", *flags],
    )  # fmt: skip


def execute(db: Path, *statements: str) -> None:
    with sqlite3.connect(db) as conn:
        for statement in statements:
            conn.execute(statement)


def rows_now(url: str) -> tuple[int, set[tuple]]:
    """A full-table subquery answered by the wrapper: (watermark, rows)."""
    body = {"relation": "items", "alias": "i", "keys": [[]], "select": ["id", "name", "qty"]}
    answer = httpx.post(f"{url}/v1/subquery", json=body, timeout=30).json()
    return answer["watermark"], {tuple(r[1:-1]) for r in answer["rows"]}


def wait_through(manager: FakeManager, seq: int) -> list:
    manager.wait_through(SOURCE, seq)
    return [[(c.sign, c.row) for c in u.changes] for u in manager.updates(SOURCE)]


def test_ts_ships_inserts_and_updates_with_old_values_but_cannot_see_deletes(db: Path, tmp_path: Path) -> None:
    with FakeManager() as manager:
        with start(f"sqlite:///{db}", manager, tmp_path) as wrapper:
            schema = httpx.get(f"{wrapper.url}/v1/schema").json()["tables"]["items"]
            assert [c["name"] for c in schema["columns"]] == ["id", "name", "qty", "gone"]  # the stamp is not shipped
            assert rows_now(wrapper.url)[1] == {(1, "bolt", 5), (2, "nut", 7), (3, "gear", 1)}
            execute(
                db,
                "UPDATE items SET qty = 6, modified = 2 WHERE id = 1",
                "INSERT INTO items VALUES (4, 'cog', 2, 2, 0)",
            )
            assert wait_through(manager, 1)[0] == [
                (-1, {"id": 1, "name": "bolt", "qty": 5, "gone": 0}),
                (1, {"id": 1, "name": "bolt", "qty": 6, "gone": 0}),
                (1, {"id": 4, "name": "cog", "qty": 2, "gone": 0}),
            ]
            execute(
                db, "DELETE FROM items WHERE id = 2", "UPDATE items SET modified = 3 WHERE id = 4"
            )  # nothing to ship
            time.sleep(0.5)
            watermark, rows = rows_now(wrapper.url)
            assert watermark == 1 and (2, "nut", 7) in rows  # TS cannot see the delete: the replica keeps the row
            assert len(manager.updates(SOURCE)) == 1
        # A restart reads rows again from the stored bound; unchanged rows produce nothing.
        with start(f"sqlite:///{db}", manager, tmp_path):
            execute(db, "UPDATE items SET name = 'cog2', modified = 4 WHERE id = 4")
            assert wait_through(manager, 2)[1] == [
                (-1, {"id": 4, "name": "cog", "qty": 2, "gone": 0}),
                (1, {"id": 4, "name": "cog2", "qty": 2, "gone": 0}),
            ]
            time.sleep(0.3)
            assert manager.through(SOURCE) == 2


def test_tdi_ships_flagged_rows_as_deletes(db: Path, tmp_path: Path) -> None:
    with (
        FakeManager() as manager,
        start(f"sqlite:///{db}", manager, tmp_path, "--delete-flag-column", "gone") as wrapper,
    ):
        assert rows_now(wrapper.url)[1] == {(1, "bolt", 5), (2, "nut", 7)}  # gear was already flagged
        execute(db, "UPDATE items SET gone = 1, modified = 2 WHERE id = 2")
        assert wait_through(manager, 1) == [[(-1, {"id": 2, "name": "nut", "qty": 7})]]
        assert rows_now(wrapper.url) == (1, {(1, "bolt", 5)})


def test_clear_errors(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{db}"
    execute(db, "CREATE TABLE nokey (a INTEGER, modified INTEGER)")
    base = ["wrapper", "install", "--url", url, "--capture", "timestamp"]
    assert pvm_main([*base, "--tables", "nokey", "--timestamp-column", "modified"]) == 2
    assert "'nokey' has no primary key, which this capture method needs" in capsys.readouterr().err
    assert pvm_main([*base, "--tables", "items", "--timestamp-column", "changed"]) == 2
    assert "'items' has no column 'changed' for timestamp capture" in capsys.readouterr().err
    assert pvm_main([*base, "--tables", "items"]) == 2
    assert "timestamp column is needed" in capsys.readouterr().err
    assert pvm_main([*base, "--tables", "items", "--timestamp-column", "modified"]) == 0
    assert "installs nothing" in capsys.readouterr().out
    assert pvm_main(["wrapper", "install", "--url", url, "--tables", "items", "--timestamp-column", "modified"]) == 2
    assert "only by, timestamp capture" in capsys.readouterr().err


@pytest.mark.servers
def test_ts_on_postgresql_with_a_timestamp_column(pg_url: str, tmp_path: Path) -> None:
    """The stamp may have a type the wrapper cannot ship: it is not shipped."""
    run_sql(
        pg_url,
        "CREATE TABLE items (id INT PRIMARY KEY, qty NUMERIC(6, 1), modified TIMESTAMP NOT NULL DEFAULT clock_timestamp())",
        "INSERT INTO items (id, qty) VALUES (1, 1.5)",
    )
    with FakeManager() as manager, start(pg_url, manager, tmp_path) as wrapper:
        run_sql(
            pg_url,
            "UPDATE items SET qty = 2.5, modified = clock_timestamp() WHERE id = 1",
            "INSERT INTO items (id, qty) VALUES (2, 3)",
        )
        assert wait_through(manager, 1) == [
            [(-1, {"id": 1, "qty": 1.5}), (1, {"id": 1, "qty": 2.5}), (1, {"id": 2, "qty": 3})]
        ]
        body = {"relation": "items", "alias": "i", "keys": [[]], "select": ["id", "qty"]}
        assert httpx.post(f"{wrapper.url}/v1/subquery", json=body).json()["rows"] == [[0, 1, 2.5, 1], [0, 2, 3, 1]]
