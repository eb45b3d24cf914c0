"""A self-join end to end: a real SQLite source with trigger capture, its wrapper process, and
the view defined, read and verified through the manager's HTTP API while writers change the
table. The view must equal what SQLite itself answers for the same SELECT, and the manager's
own verification (snapshot rolled back to the view's cut, recomputed) must find it equal."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
import time
from pathlib import Path

import httpx

from contract.zset import ZSet
from pvm.local_deployment import LocalDeployment
from tests.deployment_support import settle, view_rows

VIEW = "bosses"

DDL = "CREATE TABLE emp (id INTEGER PRIMARY KEY, name TEXT, boss INTEGER, salary INTEGER)"
SELECT = (
    "SELECT e.name AS employee, m.name AS manager, m.salary FROM {src}emp e JOIN {src}emp m ON e.boss = m.id "
    "WHERE e.salary < 50 AND m.salary >= 20"
)


def live(path: Path) -> ZSet:
    """The view as SQLite computes it over the live table."""
    with sqlite3.connect(path) as db:
        return ZSet.from_rows(db.execute(SELECT.format(src="")).fetchall())


def writer(path: Path, seed: int, transactions: int, errors: list) -> None:
    rng = random.Random(seed)
    try:
        for _ in range(transactions):
            with sqlite3.connect(path, timeout=30) as db:  # one transaction: 1-3 statements
                for _ in range(rng.randint(1, 3)):
                    key, action = rng.randint(1, 12), rng.random()
                    row = (key, f"n{rng.randrange(4)}", rng.randint(1, 12), rng.randrange(0, 80, 10))
                    if action < 0.4:
                        db.execute("INSERT OR IGNORE INTO emp VALUES (?, ?, ?, ?)", row)
                    elif action < 0.8:
                        db.execute("UPDATE emp SET boss = ?, salary = ? WHERE id = ?", (row[2], row[3], key))
                    else:
                        db.execute("DELETE FROM emp WHERE id = ?", (key,))
            time.sleep(rng.uniform(0, 0.004))
    except Exception as exc:  # surfaced by the test
        errors.append(exc)


async def test_a_self_join_over_sqlite_through_the_api(tmp_path: Path) -> None:
    path = tmp_path / "hr.db"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(DDL)
        db.executemany(
            "INSERT INTO emp VALUES (?, ?, ?, ?)",
            [(1, "ann", 1, 70), (2, "bob", 1, 30), (3, "cat", 2, 10), (4, "dan", 2, 40), (5, "eve", 9, 5)],
        )
    async with LocalDeployment(tmp_path) as deployment:
        await deployment.add_sqlite_source("hr", path, ["emp"], query_delay_ms=5, max_concurrent_queries=2)
        async with httpx.AsyncClient(base_url=deployment.url, headers=deployment.headers(), timeout=30) as api:
            errors: list = []
            threads = [threading.Thread(target=writer, args=(path, seed, 30, errors)) for seed in range(3)]
            for t in threads:
                t.start()  # the initial load runs while they write
            created = await api.post("/v1/views", json={"sql": f"CREATE VIEW {VIEW} AS " + SELECT.format(src="hr.")})
            assert created.status_code == 201, created.text
            await asyncio.gather(*(asyncio.to_thread(t.join) for t in threads))
            assert not errors, errors
            await settle(deployment, VIEW)
            assert await view_rows(api, VIEW) == live(path)

            # one transaction inserting a manager and their report: the ΔR ⋈ ΔR term; and a
            # row that is its own manager, which joins itself in the same update
            with sqlite3.connect(path) as db:
                db.execute("INSERT INTO emp VALUES (20, 'max', 20, 45)")
                db.execute("INSERT INTO emp VALUES (21, 'liz', 22, 15)")
                db.execute("INSERT INTO emp VALUES (22, 'kim', 20, 60)")
            await settle(deployment, VIEW)
            expected = live(path)
            assert expected.weight(("max", "max", 45)) == 1 and expected.weight(("liz", "kim", 60)) == 1
            assert await view_rows(api, VIEW) == expected

            with sqlite3.connect(path) as db:  # the manager leaves: both rows that read it change
                db.execute("DELETE FROM emp WHERE id = 20")
                db.execute("UPDATE emp SET salary = 25 WHERE id = 22")
            await settle(deployment, VIEW)
            final = await view_rows(api, VIEW)
            assert final == live(path) and final.weight(("max", "max", 45)) == 0

            report = (await api.post(f"/v1/views/{VIEW}/verify", json={})).json()
            assert report["equal"] is True, report
            assert [s["relation"] for s in report["sources"]] == ["emp"]  # the table is read once

            status = (await api.get(f"/v1/views/{VIEW}")).json()
            assert status["state"] == "active" and status["counters"]["subqueries"] > 0, status
