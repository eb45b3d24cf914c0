"""Helpers for tests against the real PostgreSQL and MariaDB servers (``pytest.mark.servers``).

The fixtures ``pg_url`` and ``maria_url`` (in ``tests/conftest.py``) give each test a fresh PostgreSQL schema (the URL sets it as ``search_path``) or MariaDB
database with a unique name, dropped afterwards, so tests can run again and side by side
against the shared servers. ``bash scripts/services.sh`` starts the servers.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Sequence

import pytest
import sqlalchemy as sa

from contract.expr import Col, compile_filter
from contract.schemas import Update
from contract.zset import ZSet

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
MARIADB_ADMIN = "mysql+pymysql://root@127.0.0.1:3306/test"


def unique_name() -> str:
    return f"pvm_t_{uuid.uuid4().hex[:12]}"


def admin_engine(url: str) -> sa.Engine:
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError as exc:
        engine.dispose()
        pytest.fail(f"cannot reach {url} (start the servers: bash scripts/services.sh): {exc.orig}")
    return engine


def pg_schema_url(schema: str, user: str = "postgres") -> str:
    return f"postgresql+psycopg://{user}@127.0.0.1:5432/test?options=-csearch_path%3D{schema}"


def pg_log_slot(url: str) -> str:
    """The slot (and publication) log capture names by default for ``url``'s schema."""
    schema = sa.make_url(url).query["options"].split("=")[-1]  # type: ignore[union-attr]
    return f"pvm_test_{schema}"


def drop_log_capture(url: str) -> None:
    """Drop the slot and publication of ``url``'s schema, whatever state a test left them in:
    an abandoned slot would keep the server's WAL for ever."""
    slot = pg_log_slot(url)
    admin = admin_engine(PG_ADMIN)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP PUBLICATION IF EXISTS {slot}")
            for _ in range(100):
                pid = conn.execute(
                    sa.text("SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = :s"),
                    {"s": slot},
                ).scalar()
                if pid is None:
                    return
                if pid:
                    conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
                    continue
                try:
                    conn.execute(sa.text("SELECT pg_drop_replication_slot(:s)"), {"s": slot})
                    return
                except sa.exc.OperationalError:
                    continue
    finally:
        admin.dispose()


def run_sql(url: str, *statements: str, params: dict | None = None) -> None:
    """``statements`` as one committed transaction."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(sa.text(statement), params or {})
    finally:
        engine.dispose()


def fetch(url: str, statement: str) -> list[tuple]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(statement))]
    finally:
        engine.dispose()


# -- a random workload and the invariant-3 oracle, for any SQLAlchemy source ---------------------
R_DDL = "CREATE TABLE r (id INTEGER PRIMARY KEY, b INTEGER, v VARCHAR(20))"
R_COLUMNS = ("id", "b", "v")
VALUES = ["xa", "Xb", "xc", "x\\y", "y", "X", None]


def random_transaction(conn: sa.Connection, rng: random.Random, fresh_ids: Iterator[int], known: range) -> bool:
    """One transaction of 1-4 statements on ``r`` (inserts, updates, key changes, deletes),
    committed or (one in ten) rolled back. Returns whether it committed; a deadlock or
    serialization failure rolls it back and counts as not committed."""
    try:
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            target = rng.choice(known)
            if op < 0.35:
                conn.execute(
                    sa.text("INSERT INTO r VALUES (:id, :b, :v)"),
                    {"id": next(fresh_ids), "b": rng.randint(0, 5), "v": rng.choice(VALUES)},
                )
            elif op < 0.65:
                conn.execute(
                    sa.text("UPDATE r SET b = :b, v = :v WHERE id = :id"),
                    {"b": rng.randint(0, 5), "v": rng.choice(VALUES), "id": target},
                )
            elif op < 0.8:
                conn.execute(sa.text("UPDATE r SET id = :new WHERE id = :id"), {"new": next(fresh_ids), "id": target})
            else:
                conn.execute(sa.text("DELETE FROM r WHERE id = :id"), {"id": target})
    except sa.exc.DBAPIError:
        conn.rollback()
        return False
    if rng.random() < 0.1:
        conn.rollback()
        return False
    try:
        conn.commit()
    except sa.exc.DBAPIError:
        conn.rollback()
        return False
    return True


def expected_answer(keys: list[list], where, rows: ZSet, select: Sequence[str]) -> dict[tuple, int]:
    """The subquery ``r.b = $key.k0 AND where`` computed in Python over ``rows`` (of ``r``)."""
    layout = {Col("r", c): i for i, c in enumerate(R_COLUMNS)}
    keep = compile_filter(where, layout)
    out: dict[tuple, int] = {}
    for i, (key,) in enumerate(keys):
        for row, weight in rows.items():
            if key is not None and row[1] == key and keep(row):
                picked = (i, *(row[R_COLUMNS.index(c)] for c in select))
                out[picked] = out.get(picked, 0) + weight
    return {k: v for k, v in out.items() if v}


def replay(initial: ZSet, updates: Sequence[Update], relation: str = "r", columns: Sequence[str] = R_COLUMNS) -> ZSet:
    out = initial.copy()
    for update in updates:
        for change in update.changes:
            if change.relation == relation:
                out.add(tuple(change.row[c] for c in columns), change.sign)
    return out


def contents(url: str, table: str = "r", columns: Sequence[str] = R_COLUMNS) -> ZSet:
    return ZSet.from_rows(fetch(url, f"SELECT {', '.join(columns)} FROM {table}"))
