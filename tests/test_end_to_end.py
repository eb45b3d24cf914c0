"""The oracle over the real parts: SQLite sources with trigger capture, wrapper processes,
the manager's HTTP API, concurrent writer threads and injected subquery delays.

The source states the view passes through are rebuilt from the manager's durable update
log (what the wrappers shipped) applied to the initial contents; the view as of every W
must equal recomputation over them, and at quiescence the view must equal recomputation
over the live databases.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time

import pytest

from contract.zset import ZSet
from pvm.local_deployment import LocalDeployment
from warehouse.catalog.db import Catalog
from warehouse.recompute import recompute

SOURCES = {
    "sa": ("R", "CREATE TABLE R (id INTEGER PRIMARY KEY, b INTEGER, note TEXT)"),
    "sb": ("S", "CREATE TABLE S (id INTEGER PRIMARY KEY, b INTEGER, c INTEGER)"),
    "sc": ("T", "CREATE TABLE T (id INTEGER PRIMARY KEY, c INTEGER, d TEXT)"),
}
VIEW = (
    "SELECT R.id AS rid, R.b, R.note, S.id AS sid, S.c, T.id AS tid, T.d "
    "FROM sa.R, sb.S, sc.T WHERE R.b = S.b AND S.c = T.c AND T.d <> 'hidden' AND R.note LIKE 'n%'"
)
DOMAIN = 5


def make_sources(tmp_path, rng: random.Random) -> dict:
    paths = {}
    for source, (table, ddl) in SOURCES.items():
        path = tmp_path / f"{source}.db"
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(ddl)
            db.executemany(f"INSERT INTO {table} VALUES (?, ?, ?)", [random_row(table, i, rng) for i in range(1, 9)])
        paths[source] = path
    return paths


def random_row(table: str, key: int, rng: random.Random) -> tuple:
    if table == "R":
        return (key, rng.randrange(DOMAIN), rng.choice(["n1", "n2", "x"]))
    if table == "S":
        return (key, rng.randrange(DOMAIN), rng.randrange(DOMAIN))
    return (key, rng.randrange(DOMAIN), rng.choice(["d1", "d2", "hidden"]))


def writer(paths: dict, seed: int, transactions: int, errors: list) -> None:
    rng = random.Random(seed)
    try:
        for _ in range(transactions):
            source = rng.choice(list(paths))
            table = SOURCES[source][0]
            with sqlite3.connect(paths[source], timeout=30) as db:  # one transaction, 1-3 statements
                for _ in range(rng.randint(1, 3)):
                    key = rng.randint(1, 14)
                    action = rng.random()
                    if action < 0.4:
                        db.execute(f"INSERT OR IGNORE INTO {table} VALUES (?, ?, ?)", random_row(table, key, rng))
                    elif action < 0.75:
                        row = random_row(table, key, rng)
                        cols = {"R": ("b", "note"), "S": ("b", "c"), "T": ("c", "d")}[table]
                        db.execute(f"UPDATE {table} SET {cols[0]} = ?, {cols[1]} = ? WHERE id = ?", (*row[1:], key))
                    else:
                        db.execute(f"DELETE FROM {table} WHERE id = ?", (key,))
            time.sleep(rng.uniform(0, 0.004))
    except Exception as exc:  # surfaced by the test
        errors.append(exc)


def read_live(paths: dict) -> dict:
    out = {}
    for source, (table, _) in SOURCES.items():
        with sqlite3.connect(paths[source]) as db:
            out[(source, table)] = ZSet.from_rows(db.execute(f"SELECT * FROM {table}").fetchall())
    return out


COLUMNS = {("sa", "R"): ("id", "b", "note"), ("sb", "S"): ("id", "b", "c"), ("sc", "T"): ("id", "c", "d")}


@pytest.mark.parametrize(
    "seed, parallelism, commit_mode", [(1, 4, "out_of_order"), (2, 8, "out_of_order"), (3, 3, "arrival")]
)
async def test_real_wrappers_match_recomputation(tmp_path, seed, parallelism, commit_mode):
    rng = random.Random(seed)
    paths = make_sources(tmp_path, rng)
    initial = read_live(paths)
    async with LocalDeployment(tmp_path) as deployment:
        manager = deployment.manager
        for source, (table, _) in SOURCES.items():
            await deployment.add_sqlite_source(
                source, paths[source], [table], query_delay_ms=8, max_concurrent_queries=2
            )
        errors: list = []

        def wave(base: int) -> list[threading.Thread]:
            threads = [threading.Thread(target=writer, args=(paths, base + i, 25, errors)) for i in range(3)]
            for t in threads:
                t.start()
            return threads

        during = wave(seed * 10)  # the initial load runs while these write
        await manager.define_view(VIEW, "v", parallelism=parallelism, commit_mode=commit_mode)
        after = wave(seed * 10 + 5)  # and these are surely maintained after it
        while any(t.is_alive() for t in during + after):
            await _sleep(0.05)
        assert not errors, errors
        await deployment.wait_shipped()
        await manager.wait_idle("v", timeout=120)
        assert manager.view("v").maintainer.failed is None

        plan, bases = manager.view("v").plan, manager.view("v").bases
        units = await manager.db(Catalog.units, "v")
        log = {s: await manager.db(Catalog.log_entries, s, 0) for s in SOURCES}
        entries = {e.id: e for s in log for e in log[s]}
        upto = dict(bases)
        checked = 0
        for unit in units:
            for i in unit.log_ids:
                upto[entries[i].source] = max(upto[entries[i].source], entries[i].seq)
            contents = {k: z.copy() for k, z in initial.items()}
            for source, (table, _) in SOURCES.items():
                for entry in log[source]:
                    if entry.seq <= upto[source]:
                        for change in entry.changes:
                            row = tuple(change["row"][c] for c in COLUMNS[(source, table)])
                            contents[(source, table)].add(row, change["sign"])
            assert manager.read("v", as_of=unit.order) == recompute(plan, contents, COLUMNS), f"as of W={unit.order}"
            checked += 1
        assert checked == manager.watermark("v") > 1
        assert manager.view("v").maintainer.counters.compensations > 0  # concurrency really happened
        final = manager.read("v")
        assert not final.has_negative()
        assert final == recompute(plan, read_live(paths), COLUMNS)


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
