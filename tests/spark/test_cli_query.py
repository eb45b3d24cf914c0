"""``pvm query`` against a manager whose views live in Spark: the analyst's command prints the
answer of ``POST /v1/query`` (as a table or JSON) and a refusal as one error line."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
import uvicorn

from api.auth import issue
from api.manager_app import create_app
from pvm.cli import main
from pvm.http_server import http_url, listen, start_serving
from tests.spark.analyst_support import change, join_sql, settle, sim_manager
from warehouse.store.spark import SparkStore

pytestmark = pytest.mark.spark


async def test_pvm_query_over_a_spark_view(analyst_store: SparkStore, analysts, tmp_path, view: str, capsys) -> None:
    manager, sources = await sim_manager(tmp_path, analyst_store, seed=3, analysts=analysts)
    sock = listen("127.0.0.1", 0)
    # the manager already runs: serve its app without the lifespan that would start it again
    server = uvicorn.Server(uvicorn.Config(create_app(manager), lifespan="off", log_config=None, access_log=False))
    serving = await start_serving(server, sock)
    try:
        await manager.define_view(join_sql(view), name=view, parallelism=2)
        rng = random.Random(3)
        change(sources["s1"], rng)
        await sources["s1"].ship()
        await settle(manager, analyst_store, view)
        expected = sorted(analyst_store.read_rows(view))
        analyst = ["--manager", http_url(sock), "--token", (await issue(manager, "analyst"))[1]]

        async def pvm(*argv: str) -> tuple[int, str, str]:
            capsys.readouterr()
            code = await asyncio.to_thread(main, list(argv))  # the server answers on this loop
            out, err = capsys.readouterr()
            return code, out, err

        code, out, err = await pvm("query", f"SELECT id, b, c FROM {view} ORDER BY id, b, c", "--json", *analyst)
        assert code == 0, err
        answer = json.loads(out)
        assert answer["columns"] == ["id", "b", "c"] and [tuple(r) for r in answer["rows"]] == expected
        code, out, err = await pvm("query", f"SELECT count(*) AS n FROM {view}", *analyst)
        assert code == 0 and "n" in out and str(len(expected)) in out, (out, err)
        code, out, err = await pvm("query", f"DROP VIEW {view}", *analyst)
        assert code == 2 and out == "" and err.startswith("pvm: error: ") and "only a SELECT" in err
        assert view in manager.views
    finally:
        server.should_exit = True
        await serving
        await manager.stop()
