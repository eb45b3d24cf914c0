"""Trigger capture on PostgreSQL: install/uninstall, what the outbox holds, clear errors."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from tests.capture_support import PG_ADMIN, fetch, pg_schema_url, run_sql
from wrappers.capture import dialect_for
from wrappers.capture import postgresql as capture
from wrappers.errors import WrapperError

pytestmark = pytest.mark.servers


def objects(url: str) -> set[str]:
    """The wrapper's tables, functions and triggers in the URL's schema."""
    return {
        name
        for (name,) in fetch(
            url,
            "SELECT c.relname FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace "
            "AND c.relname LIKE '\\_pvm%' UNION ALL SELECT p.proname FROM pg_proc p "
            "WHERE p.pronamespace = current_schema()::regnamespace UNION ALL "
            "SELECT t.tgname || ' on ' || c.relname FROM pg_trigger t JOIN pg_class c ON t.tgrelid = c.oid "
            "WHERE NOT t.tgisinternal AND c.relnamespace = current_schema()::regnamespace",
        )
    }


def test_install_is_idempotent_and_uninstall_removes_everything(pg_url: str) -> None:
    run_sql(pg_url, "CREATE TABLE r (id INT PRIMARY KEY, v TEXT)", "CREATE TABLE s (x INT)")
    engine = capture.open_engine(pg_url)
    capture.install(engine, ["r", "s"])
    first = objects(pg_url)
    capture.install(engine, ["r", "s"])
    assert objects(pg_url) == first
    assert {"_pvm_outbox", "_pvm_capture", "_pvm_capture_truncate", "_pvm_capture on r", "_pvm_capture on s"} <= first
    capture.uninstall(engine, ["r"])
    assert "_pvm_outbox" in objects(pg_url) and "_pvm_capture on r" not in objects(pg_url)  # s is still captured
    capture.uninstall(engine, ["s"])
    capture.uninstall(engine, ["s"])
    assert objects(pg_url) == set()
    engine.dispose()


def test_outbox_holds_committed_transactions_in_an_order_they_could_commit_in(pg_url: str) -> None:
    run_sql(pg_url, "CREATE TABLE r (id INT PRIMARY KEY, b INT, n NUMERIC(8, 2), d DATE, ok BOOLEAN)")
    engine = capture.open_engine(pg_url)
    capture.install(engine, ["r"])
    with engine.connect() as a, engine.connect() as b:
        a.exec_driver_sql("INSERT INTO r VALUES (1, 10, 1.50, '2024-02-29', true)")  # id 1, commits last
        b.exec_driver_sql("INSERT INTO r VALUES (2, 20, 2, NULL, false)")  # id 2
        snapshot = capture.begin_snapshot(engine)
        b.commit()
        assert list(capture.read_outbox(snapshot, 0)) == []  # a snapshot shows what committed before it
        snapshot.close()
        a.exec_driver_sql("UPDATE r SET b = 11 WHERE id = 1")  # id 3
        b.exec_driver_sql("INSERT INTO r VALUES (3, 30, NULL, NULL, NULL)")  # id 4, rolled back
        b.rollback()
        a.commit()
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE r")
    snapshot = capture.begin_snapshot(engine)
    rows = list(capture.read_outbox(snapshot, 0))
    snapshot.close()
    assert [(r.id, r.op) for r in rows] == [(2, "I"), (1, "I"), (3, "U"), (5, "D"), (6, "D")]
    assert rows[1].txid == rows[2].txid != rows[0].txid and rows[3].txid == rows[4].txid
    assert rows[1].new == {"id": 1, "b": 10, "n": 1.5, "d": "2024-02-29", "ok": True}
    assert rows[2].old == rows[1].new and rows[2].new["b"] == 11
    assert {r.old["id"] for r in rows[3:]} == {1, 2}
    assert capture.outbox_high_water(engine) == 6
    capture.delete_outbox_ids(engine, [1, 5])
    assert fetch(pg_url, "SELECT id FROM _pvm_outbox ORDER BY id") == [(2,), (3,), (6,)]
    engine.dispose()


def test_clear_errors(pg_url: str) -> None:
    with pytest.raises(WrapperError, match="cannot connect to postgresql"):
        capture.open_engine("postgresql://postgres@127.0.0.1:1/test")
    with pytest.raises(WrapperError, match="not a PostgreSQL URL"):
        capture.open_engine("sqlite:///x.db")
    assert dialect_for(pg_url) is capture
    run_sql(pg_url, "CREATE TABLE r (id INT PRIMARY KEY, at TIMESTAMP, tags TEXT[])", "CREATE TABLE ok (id INT)")
    engine = capture.open_engine(pg_url)
    with pytest.raises(WrapperError, match=r"no such table .*: nope"):
        capture.install(engine, ["ok", "nope"])
    with pytest.raises(
        WrapperError, match=r"'r' has column\(s\) the wrapper cannot ship: at \(TIMESTAMP\), tags \(ARRAY\)"
    ):
        capture.install(engine, ["r"])
    with pytest.raises(WrapperError, match="own tables"):
        capture.install(engine, ["_pvm_outbox"])
    engine.dispose()
    assert fetch(
        pg_url,
        "SELECT count(*) FROM pg_class WHERE relname = '_pvm_outbox' AND relnamespace = current_schema()::regnamespace",
    ) == [(0,)]


def test_missing_privileges_are_named(pg_url: str) -> None:
    """A user who may read and write the table but not create triggers gets a clear error."""
    role = f"pvm_t_{uuid.uuid4().hex[:10]}"
    schema = sa.make_url(pg_url).query["options"].split("=")[-1]
    run_sql(
        PG_ADMIN,
        f"CREATE ROLE {role} LOGIN",
        f"CREATE TABLE {schema}.r (id INT PRIMARY KEY)",
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.r TO {role}",
    )
    try:
        engine = capture.open_engine(pg_schema_url(schema, user=role))
        with pytest.raises(WrapperError, match=r"permission denied .*needs CREATE on schema"):
            capture.install(engine, ["r"])
        engine.dispose()
    finally:
        run_sql(PG_ADMIN, f"DROP OWNED BY {role}", f"DROP ROLE {role}")
