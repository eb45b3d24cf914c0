"""Trigger capture on SQLite: install/uninstall, what the outbox holds, clear errors."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from wrappers.capture import dialect_for
from wrappers.capture import sqlite as capture
from wrappers.errors import WrapperError


def make_db(path: Path, ddl: str = "CREATE TABLE r (id INTEGER PRIMARY KEY, b INTEGER, v TEXT)") -> str:
    with sqlite3.connect(path) as db:
        db.executescript(ddl)
    return f"sqlite:///{path}"


def objects(path: Path) -> set[tuple[str, str]]:
    with sqlite3.connect(path) as db:
        return set(db.execute("SELECT type, name FROM sqlite_master WHERE name LIKE '\\_pvm%' ESCAPE '\\'"))


def outbox(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT relation, op, old, new FROM _pvm_outbox ORDER BY id").fetchall()
    return [(rel, op, old and json.loads(old), new and json.loads(new)) for rel, op, old, new in rows]


def test_install_is_idempotent_and_uninstall_removes_everything(tmp_path: Path) -> None:
    path = tmp_path / "src.db"
    engine = capture.open_engine(make_db(path, "CREATE TABLE r (id INTEGER PRIMARY KEY); CREATE TABLE s (x TEXT)"))
    capture.install(engine, ["r", "s"])
    first = objects(path)
    capture.install(engine, ["r", "s"])
    assert objects(path) == first
    assert ("table", "_pvm_outbox") in first and len([o for o in first if o[0] == "trigger"]) == 6
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    capture.uninstall(engine, ["r"])
    assert ("table", "_pvm_outbox") in objects(path)  # s is still captured
    capture.uninstall(engine, ["s"])
    capture.uninstall(engine, ["s"])
    assert objects(path) == set()
    engine.dispose()


def test_outbox_holds_committed_changes_only(tmp_path: Path) -> None:
    path = tmp_path / "src.db"
    engine = capture.open_engine(make_db(path))
    capture.install(engine, ["r"])
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("INSERT INTO r VALUES (1, 10, 'a')")
    db.execute("UPDATE r SET v = 'b' WHERE id = 1")
    db.execute("BEGIN")
    db.execute("INSERT INTO r VALUES (2, 20, 'rolled back')")
    db.execute("ROLLBACK")
    db.execute("DELETE FROM r WHERE id = 1")
    db.close()
    assert outbox(path) == [
        ("r", "I", None, {"id": 1, "b": 10, "v": "a"}),
        ("r", "U", {"id": 1, "b": 10, "v": "a"}, {"id": 1, "b": 10, "v": "b"}),
        ("r", "D", {"id": 1, "b": 10, "v": "b"}, None),
    ]
    with engine.connect() as conn:
        rows = list(capture.read_outbox(conn, after=1))
    assert [(r.op, r.id) for r in rows] == [("U", 2), ("D", 3)]
    capture.delete_outbox(engine, through=2)
    assert [op for _, op, _, _ in outbox(path)] == ["D"]
    assert capture.outbox_high_water(engine) == 3
    engine.dispose()


def test_blobs_odd_names_and_wide_tables_never_break_a_write(tmp_path: Path) -> None:
    wide = ", ".join(f"c{i} INTEGER" for i in range(150))
    path = tmp_path / "src.db"
    engine = capture.open_engine(
        make_db(path, f'CREATE TABLE "odd ""name" ("the key" INTEGER, "it\'s" BLOB); CREATE TABLE w ({wide})')
    )
    capture.install(engine, ['odd "name', "w"])
    with sqlite3.connect(path) as db:
        db.execute('INSERT INTO "odd ""name" VALUES (1, x\'00ff\')')
        db.execute(f"INSERT INTO w VALUES ({', '.join(str(i) for i in range(150))})")
    (rel, _, _, blob_row), (_, _, _, wide_row) = outbox(path)
    assert rel == 'odd "name' and blob_row == {"the key": 1, "it's": "00FF"}
    assert wide_row == {f"c{i}": i for i in range(150)}
    engine.dispose()


def test_snapshot_does_not_see_later_commits(tmp_path: Path) -> None:
    path = tmp_path / "src.db"
    engine = capture.open_engine(make_db(path))
    capture.install(engine, ["r"])
    conn = capture.begin_snapshot(engine)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO r VALUES (1, 1, 'late')")
    assert list(capture.read_outbox(conn, 0)) == []
    assert conn.execute(sa.text("SELECT count(*) FROM r")).scalar_one() == 0
    conn.close()
    with engine.connect() as fresh:
        assert len(list(capture.read_outbox(fresh, 0))) == 1
    engine.dispose()


def test_clear_errors(tmp_path: Path) -> None:
    url = make_db(tmp_path / "src.db")
    with pytest.raises(WrapperError, match="no such database file"):
        capture.open_engine(f"sqlite:///{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(WrapperError, match="in-memory"):
        capture.open_engine("sqlite://")
    with pytest.raises(WrapperError, match="not implemented for oracle"):
        dialect_for("oracle://localhost/db")
    with pytest.raises(WrapperError, match="not a database URL"):
        dialect_for("no url at all")
    engine = capture.open_engine(url)
    with pytest.raises(WrapperError, match="no such table in .*: nope"):
        capture.install(engine, ["r", "nope"])
    with pytest.raises(WrapperError, match="own tables"):
        capture.install(engine, ["_pvm_outbox"])
    engine.dispose()
    read_only = capture.open_engine(f"sqlite:///file:{tmp_path / 'src.db'}?mode=ro&uri=true")
    with pytest.raises(WrapperError, match="cannot install capture .*readonly"):
        capture.install(read_only, ["r"])
    read_only.dispose()


def test_case_sensitive_like_on_wrapper_connections(tmp_path: Path) -> None:
    engine = capture.open_engine(make_db(tmp_path / "src.db"))
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT 'Abc' LIKE 'a%', 'abc' LIKE 'a%'")).one() == (0, 1)
    engine.dispose()
