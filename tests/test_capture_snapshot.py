"""Snapshot-differential capture: a live database or dump files differenced into the replica,
with every algorithm; bad dumps refused with the previous snapshot kept; the automatic
algorithm choice; crash leftovers; a real wrapper process shipping dump changes."""

from __future__ import annotations

import os
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from pvm.cli import main as pvm_main
from pvm.wrapper_process import start_wrapper
from tests.fake_manager import FakeManager
from wrappers.capture import Capture, CaptureConfig, open_capture
from wrappers.capture.snapshots import SnapshotOptions
from wrappers.differential import Schema, write_csv, write_parquet
from wrappers.errors import WrapperError

ALGORITHMS = ["window", "partitioned-hash", "sort-merge", "auto"]


def replica_rows(capture: Capture, table: str = "t") -> set[tuple[Any, ...]]:
    with capture.engine.connect() as conn:
        return set(conn.exec_driver_sql(f"SELECT * FROM {table}").fetchall())


def outbox_count(capture: Capture) -> int:
    with capture.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM _pvm_outbox").scalar_one()


def pulled(capture: Capture) -> dict[str, Any]:
    """Pull now (the interval of these captures is tiny) and return the status."""
    time.sleep(0.011)
    assert capture.pull is not None and capture.status is not None
    capture.pull()
    return capture.status()


def snapshot_capture(tmp_path: Path, url: str | None, tables: list[str], **options: Any) -> Capture:
    config = CaptureConfig("snapshot", snapshot=SnapshotOptions(interval=0.01, **options))
    return open_capture(config, url, tables, tmp_path / "state" / "src.replica.sqlite3")


# -- a live database ---------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_random_changes_of_a_database_reach_the_replica_exactly(tmp_path: Path, algorithm: str) -> None:
    db = tmp_path / "src.db"
    rng = random.Random(algorithm)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, price REAL)")
        conn.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", [(i, f"n{i}", i % 7, i / 4) for i in range(300)])
    capture = snapshot_capture(tmp_path, f"sqlite:///{db}", ["t"], algorithm=algorithm, aging_records=64)
    try:
        assert replica_rows(capture) == live(db)
        for _ in range(4):
            with sqlite3.connect(db) as conn:
                for _ in range(40):
                    key, action = rng.randrange(400), rng.random()
                    if action < 0.4:
                        conn.execute(
                            "INSERT OR IGNORE INTO t VALUES (?, ?, ?, ?)", (key, f"x{key}", rng.randrange(9), None)
                        )
                    elif action < 0.8:
                        conn.execute("UPDATE t SET qty = ?, name = name || '!' WHERE id = ?", (rng.randrange(9), key))
                    else:
                        conn.execute("DELETE FROM t WHERE id = ?", (key,))
                conn.execute("DELETE FROM t WHERE id IN (SELECT id FROM t ORDER BY random() LIMIT 30)")
                conn.execute(
                    "INSERT INTO t SELECT id + 1000, name, qty, price FROM t WHERE id < 20 AND id + 1000 NOT IN (SELECT id FROM t)"
                )
            status = pulled(capture)
            assert status["last_error"] is None and status["algorithms"]["t"] in (
                "window",
                "partitioned-hash",
                "sort-merge",
            )
            assert replica_rows(capture) == live(db)
        changes = status["last_changes"]["t"]
        assert changes["delete"] > 0 and changes["insert"] > 0 and changes["update"] > 0
        shipped = outbox_count(capture)
        assert pulled(capture)["last_changes"] == {"t": {"insert": 0, "delete": 0, "update": 0}}
        assert outbox_count(capture) == shipped  # an unchanged snapshot changes nothing
    finally:
        capture.close()


def live(db: Path, table: str = "t") -> set[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return set(conn.execute(f"SELECT * FROM {table}").fetchall())


def test_a_table_without_primary_key_needs_a_key(tmp_path: Path) -> None:
    db = tmp_path / "src.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (code TEXT, v INTEGER)")
        conn.execute("INSERT INTO t VALUES ('a', 1), ('b', 2)")
    with pytest.raises(WrapperError, match="--key t=COLUMN"):
        snapshot_capture(tmp_path, f"sqlite:///{db}", ["t"])
    capture = snapshot_capture(tmp_path, f"sqlite:///{db}", ["t"], keys={"t": ("code",)})
    try:
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE t SET v = 5 WHERE code = 'b'")
            conn.execute("INSERT INTO t VALUES ('b', 6)")  # the key is not unique any more
        status = pulled(capture)
        assert "not applied" in status["last_error"] and replica_rows(capture) == {("a", 1), ("b", 2)}
        with sqlite3.connect(db) as conn:
            conn.execute("DELETE FROM t WHERE v = 6")
        assert pulled(capture)["last_error"] is None and replica_rows(capture) == {("a", 1), ("b", 5)}
    finally:
        capture.close()


def test_auto_switches_to_the_hash_while_records_move_beyond_the_aging_buffer(tmp_path: Path) -> None:
    db = tmp_path / "src.db"
    with sqlite3.connect(db) as conn:  # rows come back in insertion (rowid) order
        conn.execute("CREATE TABLE t (id INTEGER NOT NULL, v INTEGER)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, i) for i in range(2000)])
    capture = snapshot_capture(tmp_path, f"sqlite:///{db}", ["t"], keys={"t": ("id",)}, aging_records=2 * 128 + 100)
    try:
        assert pulled(capture)["algorithms"] == {"t": "window"}  # nothing moved
        with sqlite3.connect(db) as conn:  # a rebuilt table: the same rows, physical order reversed
            conn.execute("CREATE TEMP TABLE u AS SELECT * FROM t")
            conn.execute("DELETE FROM t")
            conn.execute("INSERT INTO t SELECT id, CASE WHEN id = 7 THEN -7 ELSE v END FROM u ORDER BY id DESC")
        status = pulled(capture)  # still the window (the last measure said nothing moves), exact after its second pass
        assert status["algorithms"] == {"t": "window"} and status["last_changes"]["t"] == {
            "insert": 0,
            "delete": 0,
            "update": 1,
        }
        assert pulled(capture)["algorithms"] == {"t": "partitioned-hash"}  # records moved ~2000 > 100
        assert pulled(capture)["algorithms"] == {"t": "window"}  # and stopped moving
        assert replica_rows(capture) == live(db) and len(live(db)) == 2000
    finally:
        capture.close()


# -- dump files ------------------------------------------------------------------------------------
SCHEMA = Schema(("id", "name", "qty"), ("id",))


def dump(directory: Path, records: list[tuple[Any, ...]], fmt: str = "csv", table: str = "t") -> Path:
    """Write a dump atomically, as a well-behaved exporter does (write, then rename)."""
    path = directory / f"{table}.{fmt}"
    part = directory / f".{table}.{fmt}.part"
    rows = [((r[0],), tuple(r[1:])) for r in records]
    (write_csv if fmt == "csv" else write_parquet)(part, SCHEMA, rows)
    os.replace(part, path)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a new signature even within a clock tick
    return path


def dump_capture(tmp_path: Path, dumps: Path, **options: Any) -> Capture:
    options.setdefault("keys", {"t": ("id",)})
    options.setdefault("dump_types", {"t": {"id": "integer", "qty": "integer"}})
    return snapshot_capture(tmp_path, None, ["t"], dump_dir=dumps, **options)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_dumps_are_differenced_against_the_previous_one(tmp_path: Path, fmt: str, algorithm: str) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    rng = random.Random(f"{fmt}-{algorithm}")
    state = {i: (i, f"n{i}", i % 5) for i in range(200)}
    dump(dumps, list(state.values()), fmt)
    capture = dump_capture(tmp_path, dumps, algorithm=algorithm, aging_records=300)
    try:
        assert replica_rows(capture) == set(state.values())
        for round_ in range(3):
            for _ in range(30):
                key = rng.randrange(260)
                if key in state and rng.random() < 0.4:
                    del state[key]
                else:
                    state[key] = (key, f"r{round_}-{key}", rng.randrange(5))
            records = list(state.values())
            rng.shuffle(records[:50])  # some reordering within a small displacement
            dump(dumps, records, fmt)
            status = pulled(capture)
            assert status["last_error"] is None, status
            assert replica_rows(capture) == set(state.values())
        assert status["snapshots"] == 4
    finally:
        capture.close()


def test_bad_dumps_are_refused_and_the_previous_snapshot_kept(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    first = [(1, "a", 1), (2, "b", 2), (3, "c", 3)]
    dump(dumps, first)
    capture = dump_capture(tmp_path, dumps)
    try:
        shipped = outbox_count(capture)
        bad = {
            "truncated": b"id,name,qty\n1,a,1\n2,b,",
            "duplicate key": b"id,name,qty\n1,a,1\n1,b,2\n",
            "schema changed": b"id,name,qty,extra\n1,a,1,x\n",
            "key missing": b"ident,name,qty\n1,a,1\n",
            "not a number": b"id,name,qty\n1,a,one\n",
        }
        for what, content in bad.items():
            (dumps / "t.csv").write_bytes(content)
            status = pulled(capture)
            assert status["last_error"] and "not applied" in status["last_error"], what
            assert replica_rows(capture) == set(first) and outbox_count(capture) == shipped, what
            assert pulled(capture)["last_error"] == status["last_error"]  # not read again while unchanged
        dump(dumps, [(1, "a", 1), (3, "C", 3), (4, "d", 4)])  # differenced against the last good one
        status = pulled(capture)
        assert status["last_error"] is None and status["last_changes"]["t"] == {"insert": 1, "delete": 1, "update": 1}
        assert replica_rows(capture) == {(1, "a", 1), (3, "C", 3), (4, "d", 4)}
        (dumps / "t.csv").unlink()
        dump(dumps, [(1, "a", 1)], "parquet")
        assert "not applied" in pulled(capture)["last_error"]  # int64 from Parquet is not the CSV's text columns
    finally:
        capture.close()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_far_apart_duplicate_keys_are_refused_by_every_algorithm(tmp_path: Path, algorithm: str) -> None:
    """Duplicates further apart than the window's aging buffer never meet in it; they are
    still refused as duplicates (not as a replica conflict), and the kept snapshot stays."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    first = [(i, f"n{i}", i % 5) for i in range(300)]
    dump(dumps, first)
    capture = dump_capture(tmp_path, dumps, algorithm=algorithm, aging_records=8)
    try:
        shipped = outbox_count(capture)
        cases = {
            "an unchanged key again at the end": (5, [*first, (5, "again", 0)]),
            "a changed key again at the end": (7, [(7, "seven", 1), *first[1:7], *first[8:], (7, "n7", 2)]),
            "a new key twice": (1000, [(1000, "x", 1), *first, (1000, "y", 2)]),
        }
        for what, (key, records) in cases.items():
            dump(dumps, records)
            status = pulled(capture)
            assert status["last_error"] and f"duplicate key ({key},)" in status["last_error"], (what, status)
            assert "not applied" in status["last_error"], what
            assert replica_rows(capture) == set(first) and outbox_count(capture) == shipped, what
        good = [*first[:100], (100, "changed", 1), *first[101:]]
        dump(dumps, good)  # differenced against the last good snapshot
        status = pulled(capture)
        assert status["last_error"] is None and status["last_changes"]["t"] == {"insert": 0, "delete": 0, "update": 1}
        assert replica_rows(capture) == set(good)
    finally:
        capture.close()


def test_a_restart_differences_against_the_kept_snapshot_and_removes_leftovers(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    dump(dumps, [(1, "a", 1), (2, "b", 2)], "parquet")
    capture = dump_capture(tmp_path, dumps, dump_types={})
    dump(dumps, [(1, "a", 1), (2, "B", 2)], "parquet")
    assert pulled(capture)["last_changes"]["t"]["update"] == 1
    shipped = outbox_count(capture)
    capture.close()
    kept_dir = tmp_path / "state" / "src.snapshots"
    kept = sorted(p.name for p in kept_dir.iterdir())
    assert kept == ["t.2.parquet"]
    (kept_dir / "t.3.parquet").write_bytes(b"a crash left this")  # taken, never applied
    (dumps / "t.parquet").unlink()  # the schema comes from the kept snapshot
    capture = dump_capture(tmp_path, dumps, dump_types={})
    try:
        assert sorted(p.name for p in kept_dir.iterdir()) == kept
        assert (
            replica_rows(capture) == {(1, "a", 1), (2, "B", 2)} and outbox_count(capture) == shipped
        )  # not loaded again
        dump(dumps, [(2, "B", 2), (5, "e", 5)], "parquet")
        status = pulled(capture)
        assert status["last_changes"]["t"] == {"insert": 1, "delete": 1, "update": 0}
        assert replica_rows(capture) == {(2, "B", 2), (5, "e", 5)}
    finally:
        capture.close()


def test_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    base = ["wrapper", "install", "--capture", "snapshot", "--tables", "t"]
    assert pvm_main([*base, "--dump-dir", str(dumps), "--key", "t=id"]) == 2
    assert "no dump of table 't'" in capsys.readouterr().err
    dump(dumps, [(1, "a", 1)])
    assert pvm_main([*base, "--dump-dir", str(dumps)]) == 2
    assert "--key t=COLUMN" in capsys.readouterr().err
    assert pvm_main([*base, "--dump-dir", str(dumps), "--key", "t=ident"]) == 2
    assert "key column(s) ['ident'] not among the columns" in capsys.readouterr().err
    assert pvm_main([*base, "--dump-dir", str(dumps), "--key", "t=id", "--dump-types", "t=qty:money"]) == 2
    assert "unknown dump type(s) money" in capsys.readouterr().err
    assert pvm_main([*base, "--dump-dir", str(dumps), "--key", "t=id", "--url", "sqlite:///x.db"]) == 2
    assert "exactly one" in capsys.readouterr().err
    assert pvm_main(["wrapper", "install", "--tables", "t", "--url", "sqlite:///x.db", "--dump-dir", str(dumps)]) == 2
    assert "need --capture snapshot" in capsys.readouterr().err
    assert pvm_main([*base, "--dump-dir", str(dumps), "--key", "t=id", "--dump-types", "t=qty:integer"]) == 0
    assert "installs nothing" in capsys.readouterr().out


def test_a_wrapper_process_ships_the_changes_of_dropped_dumps(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    dump(dumps, [(1, "a", 1), (2, "b", 2)])
    args = ["--capture", "snapshot", "--dump-dir", str(dumps), "--key", "t=id", "--dump-types", "t=id:integer,qty:integer",
            "--snapshot-interval", "0.1"]  # fmt: skip
    with FakeManager() as manager, start_wrapper(
        "legacy", None, ["t"], manager.url, state_dir=tmp_path / "state", log_path=tmp_path / "wrapper.log",
        capture_args=args,
    ) as wrapper:  # fmt: skip
        schema = httpx.get(f"{wrapper.url}/v1/schema").json()["tables"]["t"]
        assert [(c["name"], c["type"]) for c in schema["columns"]] == [
            ("id", "BIGINT"),
            ("name", "TEXT"),
            ("qty", "BIGINT"),
        ]
        assert schema["primary_key"] == ["id"]
        dump(dumps, [(2, "b", 3), (3, "c", 3)])
        manager.wait_through("legacy", 1)
        [update] = manager.updates("legacy")
        assert sorted((c.sign, tuple(c.row.values())) for c in update.changes) == [
            (-1, (1, "a", 1)), (-1, (2, "b", 2)), (1, (2, "b", 3)), (1, (3, "c", 3)),
        ]  # fmt: skip
        body = {"relation": "t", "alias": "t", "keys": [[]], "select": ["id", "qty"]}
        answer = httpx.post(f"{wrapper.url}/v1/subquery", json=body, timeout=30).json()
        assert answer["watermark"] == 1 and sorted(tuple(r[1:-1]) for r in answer["rows"]) == [(2, 3), (3, 3)]
        health = httpx.get(f"{wrapper.url}/v1/health").json()
        assert health["capture"]["method"] == "snapshot" and health["capture"]["snapshots"] == 2
        assert health["capture"]["last_changes"] == {"t": {"insert": 1, "delete": 1, "update": 1}}
