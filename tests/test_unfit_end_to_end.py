"""Rows with non-finite floats and rows the views cannot take, end to end: wrapper processes,
the manager's HTTP API and a view. The view must equal recomputation over the live source
minus its unfit rows, through the initial load, inserts, repairs and deletes; the source's
page in the manager shows what was quarantined and when capture is blocked."""

from __future__ import annotations

import asyncio
import math
import sqlite3
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from contract.schemas import NAN, loads_wire_json
from contract.zset import ZSet
from pvm.bench.three_sources import WrapperSet
from pvm.local_deployment import LocalDeployment

VIEW = "CREATE VIEW v AS SELECT i.id, i.val, i.name FROM {source}.items i WHERE i.val > 0"


def canonical(rows) -> ZSet:
    """A bag of rows with every NaN the wire's one NaN object (a database hands out fresh ones)."""
    return ZSet.from_rows(tuple(NAN if v != v else v for v in row) for row in rows)


def fit_sqlite_rows(path: Path) -> ZSet:
    """The view recomputed over the live SQLite source, leaving out rows whose val is no number."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT id, val, name FROM items WHERE typeof(val) IN ('real', 'integer', 'null')").fetchall()
    return canonical((i, v, n) for i, v, n in rows if v is not None and v > 0)


async def settle(deployment: LocalDeployment) -> None:
    await deployment.wait_shipped()
    await deployment.manager.wait_idle("v", timeout=60)


async def test_a_sqlite_source_with_infinities_and_unfit_rows(tmp_path: Path) -> None:
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, val REAL, name TEXT)")
        db.executemany(
            "INSERT INTO items VALUES (?, ?, ?)", [(1, 1.5, "a"), (2, "oops", "b"), (3, 9e999, "c"), (4, -9e999, "d")]
        )
    async with LocalDeployment(tmp_path) as deployment:
        manager = deployment.manager
        await deployment.add_sqlite_source("shop", path, ["items"])
        await manager.define_view(VIEW.format(source="shop"), "v")
        await settle(deployment)
        assert manager.read("v") == fit_sqlite_rows(path) == ZSet.from_rows([(1, 1.5, "a"), (3, math.inf, "c")])

        with sqlite3.connect(path) as db:
            db.execute("INSERT INTO items VALUES (5, 'bad', 'e')")  # unfit: left out
            db.execute("INSERT INTO items VALUES (6, 9e999, 'f')")
            db.execute("UPDATE items SET val = 2.5 WHERE id = 2")  # repaired: appears
            db.execute("UPDATE items SET val = 7 WHERE id = 3")  # inf -> 7.0: the inf row goes
        with sqlite3.connect(path) as db:
            db.execute("DELETE FROM items WHERE id = 6")  # an inf row's delete cancels its insert
            db.execute("INSERT INTO items VALUES (7, 1e308, 'g')")
        await settle(deployment)
        final = manager.read("v")
        assert final == fit_sqlite_rows(path) and not final.has_negative()
        assert final == ZSet.from_rows([(1, 1.5, "a"), (2, 2.5, "b"), (3, 7.0, "c"), (7, 1e308, "g")])
        assert manager.view("v").maintainer.failed is None

        async with httpx.AsyncClient(base_url=deployment.url, headers=deployment.headers(), timeout=10) as api:
            health = (await api.get("/v1/sources/shop")).json()["health"]
            assert health["ok"] is True and health["blocked"] is None
            assert health["quarantine"]["rows"] == 2 and health["quarantine"]["by_relation"] == {"items": 2}
            assert health["quarantine"]["last"]["reason"] == "a text value in a column declared REAL"
            assert health["held"]["part_changes"] == 100_000 and health["held"]["capturing_peak"] > 0  # passed on
            with sqlite3.connect(path) as db:
                db.execute("INSERT INTO items VALUES (8, -9e999, 'h')")
                db.execute("DROP TABLE _pvm_outbox")  # capture cannot go on
            for _ in range(100):
                health = (await api.get("/v1/sources/shop")).json()["health"]
                if health["blocked"] is not None:
                    break
                await asyncio.sleep(0.05)
            assert health["ok"] is False and "no such table" in health["blocked"]["error"], health


@pytest.mark.servers
async def test_a_postgresql_source_with_nan_and_infinities(pg_url: str, tmp_path: Path) -> None:
    """PostgreSQL holds NaN and infinities in double precision (its to_jsonb writes them as
    strings). They reach the view as floats; NaN compares as PostgreSQL compares it (above
    every number), so the predicate val > 0 holds for it on both the capture and the
    subquery side; and the delete of a NaN row cancels its insert."""
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE items (id INTEGER PRIMARY KEY, val DOUBLE PRECISION, name TEXT)")
        conn.exec_driver_sql(
            "INSERT INTO items VALUES (1, 'NaN', 'a'), (2, 'Infinity', 'b'), (3, '-Infinity', 'c'), (4, 1.5, 'd')"
        )

    def live() -> ZSet:
        with engine.connect() as conn:
            return canonical(conn.exec_driver_sql("SELECT id, val, name FROM items WHERE val > 0").fetchall())

    try:
        async with LocalDeployment(tmp_path) as deployment:
            manager = deployment.manager
            await WrapperSet(deployment).add("pg", pg_url, ["items"])
            await manager.define_view(VIEW.format(source="pg"), "v")
            await settle(deployment)
            assert manager.read("v") == live() == canonical([(1, math.nan, "a"), (2, math.inf, "b"), (4, 1.5, "d")])

            with engine.begin() as conn:
                conn.exec_driver_sql("INSERT INTO items VALUES (5, 'NaN', 'e'), (6, -1, 'f')")
                conn.exec_driver_sql("UPDATE items SET val = 'NaN' WHERE id = 3")
                conn.exec_driver_sql("UPDATE items SET name = 'a2' WHERE id = 1")
            with engine.begin() as conn:
                conn.exec_driver_sql("DELETE FROM items WHERE id = 5")
                conn.exec_driver_sql("UPDATE items SET val = 2 WHERE id = 2")
            await settle(deployment)
            final = manager.read("v")
            assert final == live() and not final.has_negative()
            assert final == canonical([(1, math.nan, "a2"), (2, 2.0, "b"), (3, math.nan, "c"), (4, 1.5, "d")])

            async with httpx.AsyncClient(base_url=deployment.url, headers=deployment.headers(), timeout=10) as api:
                page = await api.get("/v1/views/v/rows")
                assert page.text.count('{"$float":"NaN"}') == 2  # tagged, not null
                rows = loads_wire_json(page.content)["rows"]
                assert canonical(rows) == final
    finally:
        engine.dispose()
