"""Capture never stalls on one row: non-finite floats ship (tagged on the wire), rows the views
cannot take (a wrong-typed value in SQLite, an oversized value) are left out the same way
from captured updates and from subquery answers, counted and reported in health, and the
rest of the source keeps flowing. Real wrapper processes over real SQLite files."""

from __future__ import annotations

import math
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contract.schemas import Subquery, SubqueryAnswer, Update
from pvm.wrapper_process import WrapperProcess, start_wrapper
from tests.capture_support import run_sql
from tests.fake_manager import FakeManager
from wrappers import query
from wrappers.capture import sqlite as capture
from wrappers.quarantine import Fitness
from wrappers.schema import SourceSchema, TableSchema

SOURCE = "shop"
DDL = "CREATE TABLE items (id INTEGER PRIMARY KEY, val REAL, qty INTEGER, flag BOOLEAN, name TEXT)"


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "src.db"
    with sqlite3.connect(path) as conn:
        conn.execute(DDL)
        conn.execute("INSERT INTO items VALUES (1, 1.5, 1, 0, 'a')")
    return path


@pytest.fixture()
def manager() -> Iterator[FakeManager]:
    with FakeManager() as m:
        yield m


def start(db: Path, manager: FakeManager, *capture_args: str) -> WrapperProcess:
    return start_wrapper(
        SOURCE, f"sqlite:///{db}", ["items"], manager.url, state_dir=db.parent / "state",
        log_path=db.parent / "wrapper.log", capture_args=capture_args,
    )  # fmt: skip


def execute(db: Path, *statements: str) -> None:
    with sqlite3.connect(db, timeout=10) as conn:
        for statement in statements:
            conn.execute(statement)


def health(url: str) -> dict:
    return httpx.get(f"{url}/v1/health", timeout=5).json()


def flush(url: str) -> int:
    """A subquery without keys ships everything captured so far; its watermark."""
    r = httpx.post(f"{url}/v1/subquery", json={"relation": "items", "alias": "i", "keys": [], "select": []}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["watermark"]


def rows_now(url: str, select: tuple[str, ...] = ("id", "val")) -> list[list]:
    """The relation's rows as a subquery answers it (the manager's initial load asks this
    way), decoded as the manager decodes them."""
    body = {"relation": "items", "alias": "i", "keys": [[]], "select": list(select)}
    r = httpx.post(f"{url}/v1/subquery", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return sorted(row[1:-1] for row in SubqueryAnswer.model_validate_json(r.content).rows)


def changes(updates: list[Update]) -> list[tuple]:
    return [(c.sign, c.row["id"], c.row["val"]) for u in updates for c in u.changes]


def test_infinite_reals_ship_and_the_source_keeps_flowing(db: Path, manager: FakeManager) -> None:
    """The review's case: UPDATE items SET val = 9e999 put Inf in the outbox's JSON, which the
    wrapper could not parse; nothing of the source shipped any more."""
    with start(db, manager) as wrapper:
        execute(db, "UPDATE items SET val = 9e999 WHERE id = 1", "INSERT INTO items VALUES (2, -9e999, 2, 1, 'b')")
        execute(db, "INSERT INTO items VALUES (3, 2.5, 3, 0, 'c')")
        manager.wait_through(SOURCE, flush(wrapper.url), timeout=20)
        assert changes(manager.updates(SOURCE)) == [(-1, 1, 1.5), (1, 1, math.inf), (1, 2, -math.inf), (1, 3, 2.5)]
        assert rows_now(wrapper.url) == [[1, math.inf], [2, -math.inf], [3, 2.5]]
        report = health(wrapper.url)
        assert report["ok"] and report["blocked"] is None and report["quarantine"]["rows"] == 0


def test_unfit_rows_are_left_out_of_updates_and_answers_alike(db: Path, manager: FakeManager) -> None:
    """Text in a REAL column, a blob in an INTEGER one, 2 in a BOOLEAN one, a text over
    --max-value-bytes: the views cannot take them (the Spark store failed the view for good
    on the first). Each is left out of its update while the rest of the transaction ships,
    and subquery answers leave the same rows out."""
    with start(db, manager, "--max-value-bytes", "40") as wrapper:
        execute(
            db,
            "INSERT INTO items VALUES (2, 'oops', 2, 0, 'b')",
            "INSERT INTO items VALUES (3, 3.5, x'00ff', 0, 'c')",
            "INSERT INTO items VALUES (4, 4.5, 4, 2, 'd')",
            f"INSERT INTO items VALUES (5, 5.5, 5, 1, '{'é' * 21}')",  # 21 characters, 42 bytes
            "INSERT INTO items VALUES (6, 6, 6, 1, 'f')",  # an integer in a REAL column: 6.0
        )
        execute(db, "INSERT INTO items VALUES (7, 7.5, 7, 1, 'g')")
        manager.wait_through(SOURCE, flush(wrapper.url), timeout=20)
        assert changes(manager.updates(SOURCE)) == [(1, 6, 6.0), (1, 7, 7.5)]
        assert [row[0] for row in rows_now(wrapper.url)] == [1, 6, 7]
        report = health(wrapper.url)
        assert report["ok"] and report["blocked"] is None
        assert report["quarantine"]["rows"] == 4 and report["quarantine"]["by_relation"] == {"items": 4}
        last = report["quarantine"]["last"]
        assert (last["relation"], last["column"]) == ("items", "name") and "above --max-value-bytes 40" in last[
            "reason"
        ]

        # Repairing a value: the delete of the unfit row is left out too, the insert ships.
        execute(db, "UPDATE items SET val = 2.25 WHERE id = 2")
        manager.wait_through(SOURCE, flush(wrapper.url), timeout=20)
        assert changes(manager.updates(SOURCE))[-1:] == [(1, 2, 2.25)]
        assert [row[0] for row in rows_now(wrapper.url)] == [1, 2, 6, 7]
        assert health(wrapper.url)["quarantine"]["rows"] == 5
        assert (db.parent / "wrapper.log").read_text().count("left a row of items out") == 1  # once a minute


def test_a_capture_that_keeps_failing_is_reported_blocked(db: Path, manager: FakeManager) -> None:
    with start(db, manager) as wrapper:
        assert health(wrapper.url)["ok"]
        execute(db, "DROP TABLE _pvm_outbox")
        deadline = time.monotonic() + 10
        while (report := health(wrapper.url))["blocked"] is None:
            assert time.monotonic() < deadline, report
            time.sleep(0.05)
        assert report["ok"] is False and report["blocked"]["loop"] == "capturing and shipping"
        assert "no such table: _pvm_outbox" in report["blocked"]["error"] and report["blocked"]["since"] <= time.time()


def test_an_adversarial_like_does_not_stall_the_wrapper(db: Path, manager: FakeManager) -> None:
    """The review's case: a view with LIKE '%a%b%c%d%e%f%' and a 2 KB text kept the interest
    filter's backtracking regex busy; nothing shipped, health stopped answering."""
    pattern = {"op": "like", "args": [{"col": ["items", "name"]}], "pattern": "%a%b%c%d%e%f%"}
    interest = {"relations": {"items": {"columns": ["id", "name"], "where": [pattern]}}}
    with start(db, manager) as wrapper:
        assert httpx.put(f"{wrapper.url}/v1/interest", json=interest, timeout=10).status_code == 200
        execute(
            db,
            f"INSERT INTO items VALUES (2, 1, 1, 0, '{'abcde' * 410}')",
            "INSERT INTO items VALUES (3, 1, 1, 0, 'abcdef')",
        )
        started = time.monotonic()
        manager.wait_through(SOURCE, flush(wrapper.url), timeout=10)
        assert time.monotonic() - started < 5 and health(wrapper.url)["ok"]
        assert [c.row for u in manager.updates(SOURCE) for c in u.changes] == [{"id": 3, "name": "abcdef"}]


# -- one rule on both paths ------------------------------------------------------------------
TYPES = ["INTEGER", "REAL", "NUMERIC", "BOOLEAN", "TEXT", "DATE", "STRING", "", "BLOB", "VARCHAR(10)"]
VALUES = [
    None, 0, 1, 2, -(2**63), 2**63 - 1, 0.0, 1.0, 2.5, -1e300, math.inf, -math.inf, "", "0", "1", "12", "2.5",
    "1e5", "abc", "2024-01-31", "é" * 9, "é" * 10, "x" * 20, "x" * 21, b"", b"\x00\xff", b"0123456789", b"\x01" * 11,
]  # fmt: skip


@pytest.mark.parametrize("storage", ["declared", "untyped"])
def test_captured_rows_and_answers_apply_the_same_rule(tmp_path: Path, storage: str) -> None:
    """Every value of every type family, through the trigger's JSON and the fitness check on
    one side and through the subquery's SQL on the other: the same rows are left out, and
    the rows kept hold the same values. In a SQLite source (declared types: SQLite's
    affinities convert some values on the way in) and in a replica (untyped columns that
    keep every value as given, with the source's types in the schema)."""
    path = tmp_path / "src.db"
    columns = [f"c{i}" for i in range(len(TYPES))]
    ddl = ", ".join(f"{c} {t}" if storage == "declared" else c for c, t in zip(columns, TYPES))
    with sqlite3.connect(path) as conn:
        conn.execute(f"CREATE TABLE t (id INTEGER PRIMARY KEY, {ddl})")
    engine = capture.open_engine(f"sqlite:///{path}")
    try:
        capture.install(engine, ["t"])
        rng = random.Random(7)
        rows = [(i, *(rng.choice(VALUES) for _ in columns)) for i in range(600)]
        rows += [
            (600 + i * len(TYPES) + j, *(v if k == j else None for k in range(len(TYPES))))
            for i, v in enumerate(VALUES)
            for j in range(len(TYPES))
        ]
        with sqlite3.connect(path) as conn:
            conn.executemany(f"INSERT INTO t VALUES ({', '.join('?' * (len(columns) + 1))})", rows)
        schema = SourceSchema({"t": TableSchema("t", ("id", *columns), ("INTEGER", *TYPES), ("id",))})
        fit = Fitness("src", schema, "sqlite", max_value_bytes=20)
        with engine.connect() as conn:
            captured = {row.new["id"]: row.new for row in capture.read_outbox(conn, 0) if fit("t", row.new) is not None}
        subquery = Subquery(relation="t", alias="t", keys=[[]], select=["id", *columns])
        prepared = query.prepare(subquery, schema, "sqlite", 20, affinities=storage == "declared")
        conn = capture.begin_snapshot(engine)
        try:
            answered = {row[1]: dict(zip(["id", *columns], row[1:-1])) for row in query.evaluate(conn, prepared)}
        finally:
            conn.close()
        assert 0 < len(answered) < len(rows)
        assert answered.keys() == captured.keys()
        for key, row in answered.items():
            assert row == {c: captured[key].get(c) for c in row}, key
            assert [type(v) for v in row.values()] == [type(captured[key].get(c)) for c in row], key
    finally:
        engine.dispose()


# -- application capture needs a token ------------------------------------------------------------
def test_application_capture_without_a_token_does_not_start(db: Path, manager: FakeManager) -> None:
    """It used to start and take changes from anyone, silently."""
    env = {k: v for k, v in os.environ.items() if k != "PVM_APPLICATION_TOKEN"}
    command = [sys.executable, "-m", "pvm", "wrapper", "run", "--source", SOURCE, "--url", f"sqlite:///{db}", "--tables", "items",
               "--capture", "application", "--manager", manager.url, "--state-dir", str(db.parent / "state")]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "application capture needs --application-token" in result.stderr, result.stderr


def test_application_capture_can_be_started_insecure_with_a_warning(db: Path, manager: FakeManager) -> None:
    with start(db, manager, "--capture", "application", "--insecure-no-application-token") as wrapper:
        change = {"relation": "items", "op": "insert", "row": {"id": 9, "val": {"$float": "-Infinity"}}}
        r = httpx.post(f"{wrapper.url}/v1/changes", json={"changes": [change]}, timeout=10)
        assert r.status_code == 200, r.text
        manager.wait_through(SOURCE, flush(wrapper.url), timeout=20)
        assert changes(manager.updates(SOURCE)) == [(1, 9, -math.inf)]
        nan = {"relation": "items", "op": "insert", "row": {"id": 10, "val": {"$float": "NaN"}}}
        r = httpx.post(f"{wrapper.url}/v1/changes", json={"changes": [nan]}, timeout=10)
        assert r.status_code == 400 and "cannot hold NaN (column 'val')" in r.json()["detail"]
    assert "takes application changes from anyone" in (db.parent / "wrapper.log").read_text()


# -- bad requests are 4xx ----------------------------------------------------------------------------
ON_ID = {"op": "=", "args": [{"col": ["$key", "k0"]}, {"col": ["i", "id"]}]}
BAD_SUBQUERIES = {
    "an object as a key value": ({"keys": [[{"a": 1}]], "on": ON_ID}, 422, "JSON scalar"),
    "an integer beyond 64 bits": ({"keys": [[10**30]], "on": ON_ID}, 400, "too large"),
    "3,000 key columns": ({"keys": [list(range(3000))], "on": ON_ID}, 422, "at most 1000"),
    "keys of two widths": ({"keys": [[1], [1, 2]], "on": ON_ID}, 422, "same number of columns"),
    "an object in an IN list": ({"keys": [[1]], "on": ON_ID, "where": {"op": "in", "args": [{"col": ["i", "id"]}], "values": [{}]}}, 400, "must be a scalar"),
    "a literal beyond 64 bits": ({"keys": [[1]], "on": ON_ID, "where": {"op": "=", "args": [{"col": ["i", "id"]}, {"lit": 10**30}]}}, 400, "too large"),
    "a column that is no pair": ({"keys": [[1]], "on": {"op": "=", "args": [{"col": "ab"}, {"col": ["i", "id"]}]}}, 400, "[relation, name]"),
    "5,000 conditions": ({"keys": [[1]], "where": {"op": "and", "args": [{"op": "=", "args": [{"col": ["i", "id"]}, {"lit": n}]} for n in range(5000)]}}, 400, "more than 500 nodes"),
    "5,000 selected columns": ({"keys": [[1]], "select": ["id"] * 5000}, 422, "at most 1000"),
    "a LIKE pattern of 100,000 characters": ({"keys": [[1]], "where": {"op": "like", "args": [{"col": ["i", "name"]}], "pattern": "%a" * 50000}}, 400, "more than 10000"),
    "an empty OR": ({"keys": [[1]], "where": {"op": "or", "args": []}}, 400, "malformed"),
}  # fmt: skip


def test_malformed_subqueries_are_refused_with_4xx(db: Path, manager: FakeManager) -> None:
    """The review's 500s: object values, 10^30 keys, 3,000-column keys; and their kin."""
    with start(db, manager) as wrapper:
        nested = {"op": "=", "args": [{"col": ["i", "id"]}, {"lit": 1}]}
        for _ in range(100):
            nested = {"op": "not", "args": [nested]}
        bad = {**BAD_SUBQUERIES, "100 nested NOTs": ({"keys": [[1]], "where": nested}, 400, "deeper than 64 levels")}
        answers = {}
        for name, (change, _status, words) in bad.items():
            body = {"relation": "items", "alias": "i", "select": ["id"], **change}
            r = httpx.post(f"{wrapper.url}/v1/subquery", json=body, timeout=30)
            answers[name] = (r.status_code, words in r.text)
        assert answers == {name: (status, True) for name, (_, status, _) in bad.items()}
        interest = {
            "relations": {
                "items": {
                    "columns": ["id"],
                    "where": [{"op": "in", "args": [{"col": ["items", "id"]}], "values": [[1]]}],
                }
            }
        }
        r = httpx.put(f"{wrapper.url}/v1/interest", json=interest, timeout=30)
        assert r.status_code == 400 and "must be a scalar" in r.json()["detail"], r.text
        assert health(wrapper.url)["ok"]


# -- PostgreSQL and MariaDB: sizes (their types they enforce themselves) -------------------------------
@pytest.mark.servers
@pytest.mark.parametrize("server", ["pg_url", "maria_url"])
def test_oversized_text_is_left_out_on_servers_too(
    server: str, request: pytest.FixtureRequest, manager: FakeManager, tmp_path: Path
) -> None:
    """A text over --max-value-bytes (counted in UTF-8 bytes: 21 'é' are 42) is left out of
    the update and of answers alike; on PostgreSQL a NaN and infinities ship as floats."""
    url = request.getfixturevalue(server)
    run_sql(url, "CREATE TABLE items (id INTEGER PRIMARY KEY, val DOUBLE PRECISION, name VARCHAR(100))")
    with start_wrapper(
        SOURCE, url, ["items"], manager.url, state_dir=tmp_path / "state", log_path=tmp_path / "wrapper.log",
        capture_args=["--max-value-bytes", "40"],
    ) as wrapper:  # fmt: skip
        odd = "'NaN'" if server == "pg_url" else "-1e308"
        run_sql(
            url,
            "INSERT INTO items VALUES (1, 1.5, 'short')",
            f"INSERT INTO items VALUES (2, 2.5, '{'é' * 21}')",
            f"INSERT INTO items VALUES (3, {odd}, '{'é' * 20}')",
        )
        manager.wait_through(SOURCE, flush(wrapper.url), timeout=20)
        shipped = [(c.row["id"], c.row["val"]) for u in manager.updates(SOURCE) for c in u.changes]
        assert [i for i, _ in shipped] == [1, 3] and [i for i, *_ in rows_now(wrapper.url)] == [1, 3]
        third = shipped[1][1], rows_now(wrapper.url)[1][1]
        assert all(math.isnan(v) for v in third) if server == "pg_url" else third == (-1e308, -1e308)
        assert health(wrapper.url)["quarantine"]["by_relation"] == {"items": 1}
