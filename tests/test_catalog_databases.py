"""The catalog on PostgreSQL and MariaDB: migrated on start, and a maintained view is
right, exactly as with the default SQLite file."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from tests.sim import Delays, start_sim_manager
from tests.test_oracle import check_view

pytestmark = pytest.mark.servers

SERVERS = {
    "postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/{db}",
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/{db}",
}
TABLES = {"a": {"R": ("k", "v TEXT")}, "b": {"S": ("k", "w")}, "c": {"T": ("w", "x TEXT")}}


@pytest.fixture(params=sorted(SERVERS))
def catalog_url(request):
    name = f"pvm_catalog_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(SERVERS[request.param].format(db="test"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield SERVERS[request.param].format(db=name)
    finally:
        with admin.connect() as conn:
            if request.param == "postgresql":
                conn.exec_driver_sql(f"DROP DATABASE {name} WITH (FORCE)")
            else:
                conn.exec_driver_sql(f"DROP DATABASE {name}")
        admin.dispose()


async def test_view_maintained_with_catalog_on_server(catalog_url):
    delays = Delays(before_snapshot=0.003, evaluation=0.003)
    manager, sources = await start_sim_manager(None, TABLES, delays=delays, catalog_url=catalog_url)
    try:
        sources["a"].load("R", [(1, "x"), (2, "y")])
        sources["b"].load("S", [(1, 10), (2, 20)])
        sources["c"].load("T", [(10, "p"), (20, "q")])
        await manager.define_view(
            "SELECT R.v, S.w, T.x FROM a.R, b.S, c.T WHERE R.k = S.k AND S.w = T.w", "v", parallelism=3
        )
        for i in range(12):
            src, table, row = [
                ("a", "R", (i % 3, f"r{i}")),
                ("b", "S", (i % 3, 10 * (i % 3))),
                ("c", "T", (10 * (i % 3), f"t{i}")),
            ][i % 3]
            sources[src].commit([(table, 1, row)])
            await sources[src].ship()
        for s in sources.values():
            await s.ship()
        await manager.wait_idle("v", timeout=60)
        assert await check_view(manager, "v", sources, check_history=True) == []
        assert manager.watermark("v") >= 2
    finally:
        await manager.stop()
