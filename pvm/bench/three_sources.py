"""A view over three real databases: PostgreSQL, MariaDB and SQLite, each with a trigger-
captured wrapper process, random concurrent writers, and the maintenance oracle.

Shared by ``pvm bench capture`` and tests/test_real_sources_oracle.py. The oracle rebuilds
the source states the view passed through from the manager's durable update log (what the
wrappers shipped) applied to the initial contents: the view as of every watermark W must
equal recomputation over them, and at quiescence the view must equal recomputation over
the live databases. ``crash_and_restart`` is the failure both put the view through while
the writers run: wrappers killed and restarted, then the manager restarted.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa

from contract.zset import ZSet
from warehouse.catalog.db import Catalog, LogEntry, UnitInfo
from warehouse.counters import ViewCounters
from warehouse.recompute import recompute

if TYPE_CHECKING:
    from pvm.local_deployment import LocalDeployment

TABLES = {
    "pg": ("r", "CREATE TABLE r (id INTEGER PRIMARY KEY, b INTEGER, note VARCHAR(20))", ("id", "b", "note")),
    "my": ("s", "CREATE TABLE s (id INTEGER PRIMARY KEY, b INTEGER, c INTEGER)", ("id", "b", "c")),
    "lite": ("t", "CREATE TABLE t (id INTEGER PRIMARY KEY, c INTEGER, d VARCHAR(20))", ("id", "c", "d")),
}
COLUMNS = {(source, table): columns for source, (table, _, columns) in TABLES.items()}
VIEW = (
    "SELECT r.id AS rid, r.b, r.note, s.id AS sid, s.c, t.id AS tid, t.d FROM pg.r, my.s, lite.t "
    "WHERE r.b = s.b AND s.c = t.c AND t.d <> 'hidden' AND r.note LIKE 'n%'"
)
DOMAIN = 5
KEYS = range(1, 15)
"""Writers touch rows with these keys (and the fresh keys they insert or move rows to)."""


def random_row(table: str, key: int, rng: random.Random) -> dict[str, Any]:
    if table == "r":
        return {"id": key, "b": rng.randrange(DOMAIN), "note": rng.choice(["n1", "n2", "N3", "x"])}
    if table == "s":
        return {"id": key, "b": rng.randrange(DOMAIN), "c": rng.randrange(DOMAIN)}
    return {"id": key, "c": rng.randrange(DOMAIN), "d": rng.choice(["d1", "d2", "hidden"])}


def create(urls: dict[str, str], rng: random.Random, rows: int = 8) -> None:
    """Create each source's table with ``rows`` random rows."""
    for source, url in urls.items():
        table, ddl, columns = TABLES[source]
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql(ddl)
            insert = sa.text(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})"
            )
            conn.execute(insert, [random_row(table, k, rng) for k in range(1, rows + 1)])
        engine.dispose()


def read_live(urls: dict[str, str]) -> dict[tuple[str, str], ZSet]:
    out = {}
    for source, url in urls.items():
        table, _, columns = TABLES[source]
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            out[(source, table)] = ZSet.from_rows(
                tuple(r) for r in conn.execute(sa.text(f"SELECT {', '.join(columns)} FROM {table}"))
            )
        engine.dispose()
    return out


def transaction(conn: sa.Connection, table: str, rng: random.Random, fresh: itertools.count) -> bool:
    """1-3 random statements (insert, update, key change, delete), committed or (one in ten)
    rolled back; a lock conflict rolls back too. Whether it committed."""
    columns = TABLES[next(s for s, t in TABLES.items() if t[0] == table)][2]
    try:
        for _ in range(rng.randint(1, 3)):
            key, action = rng.choice(KEYS), rng.random()
            if action < 0.3:
                row = random_row(table, key, rng)
                if conn.execute(sa.text(f"SELECT 1 FROM {table} WHERE id = :id"), {"id": key}).first() is None:
                    conn.execute(sa.text(f"INSERT INTO {table} VALUES ({', '.join(':' + c for c in columns)})"), row)
            elif action < 0.65:
                row = random_row(table, key, rng)
                sets = ", ".join(f"{c} = :{c}" for c in columns[1:])
                conn.execute(sa.text(f"UPDATE {table} SET {sets} WHERE id = :id"), row)
            elif action < 0.8:
                target = rng.choice(KEYS)  # a key change, into the keys writers use or out of them
                new = (
                    target
                    if conn.execute(sa.text(f"SELECT 1 FROM {table} WHERE id = :id"), {"id": target}).first() is None
                    else next(fresh)
                )
                conn.execute(sa.text(f"UPDATE {table} SET id = :new WHERE id = :id"), {"new": new, "id": key})
            else:
                conn.execute(sa.text(f"DELETE FROM {table} WHERE id = :id"), {"id": key})
        if rng.random() < 0.1:
            conn.rollback()
            return False
        conn.commit()
        return True
    except sa.exc.DBAPIError:  # deadlock, lock timeout, duplicate key of a racing writer
        conn.rollback()
        return False


class Flag(Protocol):
    """What ``Writers`` waits for: a ``threading.Event``, or a ``multiprocessing`` one."""

    def is_set(self) -> bool: ...


@dataclass
class Writers:
    """Threads committing random transactions, ``connections`` per source, until each has
    committed its share of ``transactions`` in total (and, with ``until``, until it is set)."""

    urls: dict[str, str]
    transactions: int
    connections: int = 2
    seed: int = 1
    pause: float = 0.003
    until: Flag | None = None
    committed: list[int] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def start(self) -> list[threading.Thread]:
        workers = [(s, i) for s in self.urls for i in range(self.connections)]
        share = -(-self.transactions // len(workers))
        threads = [threading.Thread(target=self._write, args=(s, i, share), daemon=True) for s, i in workers]
        for t in threads:
            t.start()
        return threads

    def _write(self, source: str, i: int, share: int) -> None:
        rng = random.Random(f"{self.seed}-{source}-{i}")
        fresh = itertools.count(1_000_000 * (i + 1))
        table = TABLES[source][0]
        engine = sa.create_engine(self.urls[source], connect_args={"timeout": 30} if source == "lite" else {})
        try:
            with engine.connect() as conn:
                done = 0
                while done < share or (self.until is not None and not self.until.is_set()):
                    done += transaction(conn, table, rng, fresh)
                    time.sleep(rng.random() * self.pause)
            self.committed.append(done)
        except BaseException as exc:  # surfaced by the caller
            self.errors.append(exc)
        finally:
            engine.dispose()


class Deployment(Protocol):
    """Where a ``WrapperSet`` runs its wrappers: a ``LocalDeployment``, or a manager served by
    ``pvm serve`` in another process (the tests' cluster deployment)."""

    url: str
    data_dir: Path
    wrappers: dict[str, Any]

    async def wrapper_token(self, source: str) -> str: ...

    async def register_source(
        self, name: str, wrapper_url: str, capture: str, tables: list[str], manager_token: str
    ) -> None: ...


class WrapperSet:
    """Wrapper processes of any source URLs, registered with a deployment's manager with
    tokens both ways (as ``LocalDeployment.add_sqlite_source`` does), and restartable."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self._started: dict[str, dict[str, Any]] = {}

    async def add(
        self, name: str, url: str, tables: list[str], capture: str = "trigger", **wrapper_options: Any
    ) -> Any:
        """Start and register a wrapper; ``capture`` names its method (its ``capture_args``
        among ``wrapper_options`` say how)."""
        token = await self.deployment.wrapper_token(name)
        manager_token = secrets.token_urlsafe(32)
        self._started[name] = dict(
            source=name, url=url, tables=tables, token=token, manager_token=manager_token,
            state_dir=self.deployment.data_dir / "wrappers" / name,
            log_path=self.deployment.data_dir / f"wrapper-{name}.log", **wrapper_options,
        )  # fmt: skip
        wrapper = await self._start(name, port=0)
        await self.deployment.register_source(name, wrapper.url, capture, tables, manager_token)
        return wrapper

    async def restart(self, name: str) -> Any:
        """Kill the wrapper (a crash) and start it again on the same port and state."""
        old = self.deployment.wrappers[name]
        await asyncio.to_thread(old.kill)
        return await self._start(name, port=int(old.url.rsplit(":", 1)[1]))

    async def _start(self, name: str, port: int) -> Any:
        from pvm.wrapper_process import start_wrapper

        options = dict(self._started[name])
        wrapper = await asyncio.to_thread(
            start_wrapper, options.pop("source"), options.pop("url"), options.pop("tables"), self.deployment.url,
            port=port, **options,
        )  # fmt: skip
        self.deployment.wrappers[name] = wrapper
        return wrapper


@dataclass
class Restarted:
    """What ``crash_and_restart`` did: the deployment of the new manager, the wrappers it
    killed and started again, and the view's counters of the manager it stopped (counters
    restart with the manager)."""

    deployment: LocalDeployment
    wrappers: list[str]
    counters: ViewCounters


async def crash_and_restart(
    deployment: LocalDeployment, wrappers: WrapperSet, crashing: Sequence[str], view: str, pause: float = 1.0
) -> Restarted:
    """Crash the sources' side, then the manager, while writers run: after ``pause`` seconds
    SIGKILL each wrapper of ``crashing`` and start it again on its port and state; after
    another ``pause``, stop the manager alone (the wrappers keep capturing and resend what
    it missed) and start a new one on the same port, catalog and store. The caller carries
    on with the returned deployment (``wrappers`` already starts wrappers for it)."""
    from pvm.local_deployment import LocalDeployment

    await asyncio.sleep(pause)
    await asyncio.gather(*(wrappers.restart(name) for name in crashing))  # SIGKILL, then the same state and port
    await asyncio.sleep(pause)
    counters = deployment.manager.view(view).maintainer.counters
    running = dict(deployment.wrappers)
    deployment.wrappers.clear()  # the manager goes down alone
    await deployment.__aexit__(None, None, None)
    await asyncio.sleep(0.5)
    port = int(deployment.url.rsplit(":", 1)[1])
    try:
        restarted = await LocalDeployment(deployment.data_dir, store=deployment.manager.store, port=port).__aenter__()
    except BaseException:
        await asyncio.gather(*(asyncio.to_thread(w.stop) for w in running.values()))  # no orphan wrappers
        raise
    restarted.wrappers.update(running)
    wrappers.deployment = restarted
    return Restarted(restarted, list(crashing), counters)


async def check_oracle(manager: Any, view: str, initial: dict[tuple[str, str], ZSet]) -> int:
    """Assert the view as of every watermark equals recomputation over the source states the
    shipped updates describe; the number of states checked."""
    units = await manager.db(Catalog.units, view)
    log = {s: await manager.db(Catalog.log_entries, s, 0) for s in TABLES}
    checked = 0
    for order, expected in expected_states(manager.view(view).plan, manager.view(view).bases, units, log, initial):
        assert manager.read(view, as_of=order) == expected, f"{view} as of W={order}"
        checked += 1
    return checked


def expected_states(
    plan: Any,
    bases: dict[str, int],
    units: list[UnitInfo],
    log: dict[str, list[LogEntry]],
    initial: dict[tuple[str, str], ZSet],
) -> Iterator[tuple[int, ZSet]]:
    """The oracle's side: for each maintenance unit in order, its order W and the view
    recomputed over the source states the updates of the units through W describe (each
    source's ``log`` applied to ``initial`` through the highest seq those units took)."""
    entries = {e.id: e for s in log for e in log[s]}
    upto = dict(bases)
    contents = {k: z.copy() for k, z in initial.items()}
    applied = dict.fromkeys(TABLES, 0)
    for unit in units:
        for i in unit.log_ids:
            upto[entries[i].source] = max(upto[entries[i].source], entries[i].seq)
        for source, (table, _, columns) in TABLES.items():
            for entry in log[source]:
                if applied[source] < entry.seq <= upto[source]:
                    for change in entry.changes:
                        contents[(source, table)].add(tuple(change["row"][c] for c in columns), change["sign"])
            applied[source] = max(applied[source], upto[source])
        yield unit.order, recompute(plan, contents, COLUMNS)


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def sqlite_file(path: Path) -> str:
    """A new SQLite database file in WAL mode (writers and the wrapper's reads do not block)."""
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    engine.dispose()
    return f"sqlite:///{path}"
