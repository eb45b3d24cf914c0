"""Trigger capture on MariaDB: install/uninstall, what the outbox holds, clear errors."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from tests.capture_support import MARIADB_ADMIN, fetch, run_sql
from wrappers.capture import dialect_for
from wrappers.capture import mariadb as capture
from wrappers.errors import WrapperError

pytestmark = pytest.mark.servers


def objects(url: str) -> set[str]:
    return {
        name
        for (name,) in fetch(
            url,
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE '\\_pvm%' "
            "UNION ALL SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE()",
        )
    }


def test_install_is_idempotent_and_uninstall_removes_everything(maria_url: str) -> None:
    long_name = "t" * 60
    run_sql(maria_url, "CREATE TABLE r (id INT PRIMARY KEY, v TEXT)", f"CREATE TABLE {long_name} (x INT)")
    engine = capture.open_engine(maria_url)
    capture.install(engine, ["r", long_name])
    first = objects(maria_url)
    capture.install(engine, ["r", long_name])
    assert objects(maria_url) == first and len(first) == 7
    assert {"_pvm_outbox", "_pvm_r_insert", "_pvm_r_update", "_pvm_r_delete"} <= first
    capture.uninstall(engine, ["r"])
    assert objects(maria_url) == first - {"_pvm_r_insert", "_pvm_r_update", "_pvm_r_delete"}
    capture.uninstall(engine, [long_name])
    capture.uninstall(engine, [long_name])
    assert objects(maria_url) == set()
    engine.dispose()


def test_outbox_holds_committed_changes_only(maria_url: str) -> None:
    run_sql(maria_url, "CREATE TABLE r (id INT PRIMARY KEY, b INT, n DECIMAL(8, 2), d DATE, v VARCHAR(10))")
    engine = capture.open_engine(maria_url)
    capture.install(engine, ["r"])
    with engine.connect() as a, engine.connect() as b:
        a.exec_driver_sql("INSERT INTO r VALUES (1, 10, 1.50, '2024-02-29', 'it''s')")
        b.exec_driver_sql("INSERT INTO r VALUES (2, 20, 2, NULL, 'A\\\\b')")
        b.commit()
        snapshot = capture.begin_snapshot(engine)
        a.exec_driver_sql("UPDATE r SET b = 11 WHERE id = 1")
        a.commit()
        assert [r.new["id"] for r in capture.read_outbox(snapshot, 0)] == [2]  # the snapshot is fixed
        snapshot.close()
        b.exec_driver_sql("DELETE FROM r WHERE id = 1")
        b.rollback()
    snapshot = capture.begin_snapshot(engine)
    rows = list(capture.read_outbox(snapshot, 0))
    snapshot.close()
    assert [(r.op, r.relation) for r in rows] == [("I", "r"), ("I", "r"), ("U", "r")]
    assert rows[0].new == {"id": 1, "b": 10, "n": 1.5, "d": "2024-02-29", "v": "it's"}
    assert rows[1].new["v"] == "A\\b" and rows[1].new["n"] == 2
    assert rows[2].old == rows[0].new and rows[2].new["b"] == 11
    assert capture.outbox_high_water(engine) == 4  # the rolled-back delete took id 4
    capture.delete_outbox_ids(engine, [rows[0].id])
    assert [r[0] for r in fetch(maria_url, "SELECT id FROM _pvm_outbox ORDER BY id")] == [rows[1].id, rows[2].id]
    engine.dispose()


def test_clear_errors(maria_url: str) -> None:
    with pytest.raises(WrapperError, match="cannot connect to mysql"):
        capture.open_engine("mysql://root@127.0.0.1:1/test")
    with pytest.raises(WrapperError, match="names no database"):
        capture.open_engine("mysql://root@127.0.0.1:3306")
    assert dialect_for(maria_url) is capture and dialect_for("mariadb://h/d") is capture
    run_sql(
        maria_url,
        "CREATE TABLE r (id INT PRIMARY KEY, data BLOB, at DATETIME)",
        "CREATE TABLE m (id INT PRIMARY KEY) ENGINE=MyISAM",
    )
    engine = capture.open_engine(maria_url)
    with pytest.raises(WrapperError, match=r"cannot ship: data \(BLOB\), at \(DATETIME\)"):
        capture.install(engine, ["r"])
    with pytest.raises(WrapperError, match=r"transactional \(InnoDB\) tables: m \(MyISAM\)"):
        capture.install(engine, ["m"])
    with pytest.raises(WrapperError, match="no such table"):
        capture.install(engine, ["nope"])
    engine.dispose()
    assert objects(maria_url) == set()


def test_missing_privileges_are_named(maria_url: str) -> None:
    user = f"pvm_t_{uuid.uuid4().hex[:10]}"
    database = sa.make_url(maria_url).database
    run_sql(maria_url, "CREATE TABLE r (id INT PRIMARY KEY)")
    run_sql(
        MARIADB_ADMIN,
        f"CREATE USER '{user}'@'%'",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {database}.* TO '{user}'@'%'",
    )
    try:
        engine = capture.open_engine(f"mysql+pymysql://{user}@127.0.0.1:3306/{database}")
        with pytest.raises(WrapperError, match=r"denied .*needs CREATE and TRIGGER"):
            capture.install(engine, ["r"])
        engine.dispose()
    finally:
        run_sql(MARIADB_ADMIN, f"DROP USER '{user}'@'%'")


def test_captured_rows_are_left_out_by_the_server(maria_url: str) -> None:
    """The longest runs of captured ids stay on the server (``skip_clause``): of 20 rows,
    10 and 4 captured in runs are not sent, a lone captured one is sent and skipped here."""
    run_sql(maria_url, "CREATE TABLE r (id INT PRIMARY KEY)")
    engine = capture.open_engine(maria_url)
    capture.install(engine, ["r"])
    with engine.begin() as conn:
        for key in range(20):
            conn.exec_driver_sql(f"INSERT INTO r VALUES ({key})")
    ids = [i for (i,) in fetch(maria_url, "SELECT id FROM _pvm_outbox ORDER BY id")]
    skip = {*ids[:10], ids[11], *ids[14:18]}
    statements: list[tuple[str, object]] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a: statements.append((a[2], a[3])))
    snapshot = capture.begin_snapshot(engine)
    read = [row.id for row in capture.read_outbox(snapshot, 0, skip=skip)]
    statement, parameters = next((s, p) for s, p in statements if "_pvm_outbox" in s)
    sent = snapshot.exec_driver_sql(f"SELECT COUNT(*) FROM ({statement}) AS t", parameters).scalar_one()
    snapshot.close()
    assert read == [i for i in ids if i not in skip] and len(read) == 5
    assert sent == 6
    engine.dispose()
