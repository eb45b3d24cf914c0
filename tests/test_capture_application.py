"""Application capture: the application posts its transactions to the wrapper, which applies
them to its replica (old values come from there), ships each as one update, answers
subqueries from the replica with exact watermarks, and survives a restart."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest

from pvm.wrapper_process import WrapperProcess, start_wrapper
from tests.fake_manager import FakeManager
from wrappers.errors import InvalidRequest, WrapperError
from wrappers.replica import Replica, RowChange
from wrappers.schema import SourceSchema, TableSchema

SOURCE = "app"
APP_TOKEN = "app-secret"


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT, balance INTEGER)")
        conn.executemany("INSERT INTO accounts VALUES (?, ?, ?)", [(1, "ann", 10), (2, "bob", 20)])
    return path


def start(db: Path, manager: FakeManager, tmp_path: Path) -> WrapperProcess:
    return start_wrapper(
        SOURCE, f"sqlite:///{db}", ["accounts"], manager.url, state_dir=tmp_path / "state",
        log_path=tmp_path / "wrapper.log", capture_args=["--capture", "application", "--application-token", APP_TOKEN],
    )  # fmt: skip


def post(url: str, *changes: dict, token: str = APP_TOKEN) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/changes", json={"changes": list(changes)}, headers={"Authorization": f"Bearer {token}"}
    )


def balances(url: str) -> tuple[int, set[tuple]]:
    body = {"relation": "accounts", "alias": "a", "keys": [[]], "select": ["id", "owner", "balance"]}
    answer = httpx.post(f"{url}/v1/subquery", json=body).json()
    return answer["watermark"], {tuple(r[1:-1]) for r in answer["rows"]}


def test_posted_transactions_ship_with_old_values_and_answers_follow_the_watermark(db: Path, tmp_path: Path) -> None:
    with FakeManager() as manager:
        with start(db, manager, tmp_path) as wrapper:
            transfer = (
                {"relation": "accounts", "op": "update", "key": {"id": 1}, "row": {"balance": 5}},
                {"relation": "accounts", "op": "update", "key": {"id": 2}, "row": {"balance": 25}},
            )
            assert post(wrapper.url, *transfer).json() == {"applied": 2}
            manager.wait_through(SOURCE, 1)
            assert [(c.sign, c.row) for c in manager.updates(SOURCE)[0].changes] == [
                (-1, {"id": 1, "owner": "ann", "balance": 10}),
                (1, {"id": 1, "owner": "ann", "balance": 5}),
                (-1, {"id": 2, "owner": "bob", "balance": 20}),
                (1, {"id": 2, "owner": "bob", "balance": 25}),
            ]
            assert balances(wrapper.url) == (1, {(1, "ann", 5), (2, "bob", 25)})

            bad = post(
                wrapper.url,
                {"relation": "accounts", "op": "insert", "row": {"id": 3, "owner": "cy", "balance": 1}},
                {"relation": "accounts", "op": "delete", "key": {"id": 9}},
            )
            assert bad.status_code == 400 and bad.json()["detail"] == "change 1: 'accounts' has no row with key (9,)"
            assert post(wrapper.url, {"relation": "accounts", "op": "insert", "row": {"id": 1}}).json()["detail"] == (
                "change 0: 'accounts' already has a row with key (1,)"
            )
            assert post(wrapper.url, {"relation": "accounts", "op": "insert", "row": {"iban": 1}}).status_code == 400
            assert (
                post(wrapper.url, {"relation": "accounts", "op": "delete", "key": {"id": 1}}, token="wrong").status_code
                == 401
            )
            assert balances(wrapper.url) == (1, {(1, "ann", 5), (2, "bob", 25)})  # refused transactions left no trace
            manager.down = True
            rename = {"relation": "accounts", "op": "update", "key": {"id": 2}, "row": {"id": 20}}  # a key change
            assert (
                post(wrapper.url, rename, {"relation": "accounts", "op": "delete", "key": {"id": 1}}).status_code == 200
            )
        manager.down = False
        with start(db, manager, tmp_path) as wrapper:  # durable: shipped after the restart
            manager.wait_through(SOURCE, 2)
            assert [(c.sign, c.row["id"]) for c in manager.updates(SOURCE)[1].changes] == [(-1, 2), (1, 20), (-1, 1)]
            assert balances(wrapper.url) == (2, {(20, "bob", 25)})
    with sqlite3.connect(db) as conn:  # the source itself is only read, once
        assert conn.execute("SELECT * FROM accounts ORDER BY id").fetchall() == [(1, "ann", 10), (2, "bob", 20)]


def test_replica_applies_all_or_nothing_and_refuses_what_does_not_fit(tmp_path: Path) -> None:
    schema = SourceSchema({"t": TableSchema("t", ("a", "b", "c"), ("", "", ""), ("a", "b"))})
    replica = Replica(tmp_path / "r.sqlite3", schema)
    replica.load({"t": [{"a": 1, "b": "x", "c": 1.5}]})
    with pytest.raises(WrapperError, match="already loaded"):
        replica.load({})
    replica.apply([RowChange("t", "insert", row={"a": 2, "b": "y"})], {"cursor": "7"})
    with pytest.raises(
        InvalidRequest, match=r"change 1: a key of 't' names exactly its primary key columns \['a', 'b'\]"
    ):
        replica.apply([RowChange("t", "delete", key={"a": 2, "b": "y"}), RowChange("t", "delete", key={"a": 1})])
    with pytest.raises(InvalidRequest, match="lacks key column"):
        replica.apply([RowChange("t", "insert", row={"a": 3})])
    with pytest.raises(InvalidRequest, match="key of 't' row .* is taken"):
        replica.apply([RowChange("t", "update", key={"a": 2, "b": "y"}, row={"a": 1, "b": "x"})])
    assert replica.rows("t", [(1, "x"), (2, "y"), (3, "z")]) == {
        (1, "x"): {"a": 1, "b": "x", "c": 1.5},
        (2, "y"): {"a": 2, "b": "y", "c": None},
    }
    assert replica.meta("cursor") == "7" and replica.loaded
    replica.close()
    other = SourceSchema({"t": TableSchema("t", ("a", "b"), ("", ""), ("a",))})
    with pytest.raises(WrapperError, match="holds other relations or columns"):
        Replica(tmp_path / "r.sqlite3", other)
    with pytest.raises(WrapperError, match="no primary key"):
        Replica(tmp_path / "s.sqlite3", SourceSchema({"u": TableSchema("u", ("a",), ("",), ())}))
