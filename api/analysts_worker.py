"""The analysts' query process (``python -m api.analysts_worker``), started by
``pvm serve`` (``warehouse/analysts/supervisor.py``); nobody else starts it.

It runs its own Spark application (``warehouse/analysts/engine.py``) (its own JVM, capped by ``--memory``), shows the views as
the manager's store records them (``PublishedViews``) and answers, over HTTP on a Unix
socket:

* ``POST /publish``: new store records;
* ``POST /query``: checked analyst SQL, at most ``limit`` rows and ``max_bytes`` of answer;
* ``POST /rows``: a sorted page of one view's rows, read from the files a record names;
* ``POST /verify``: a view recomputed from the relations sent, compared with the view as of
  W read from the files a record names (a verification's engine part);
* ``POST /cancel``: cancel the Spark jobs of a running query (its tasks are interrupted);
* ``GET /health``: ready, the queries running, the Connect port.

Queries run on a pool of ``--concurrency`` threads, never on the event loop, so health and
cancellation answer while every thread is busy. When the JVM dies (an out-of-memory error
ends it: ``-XX:+ExitOnOutOfMemoryError``), or tasks of cancelled jobs keep running past
``--reap-after`` (a tight loop never looks at its interrupt, and it holds a core), the
process exits, and the manager starts a new one.

It reads the store's files and writes only under ``--work-dir`` (Spark's scratch space);
run as an OS user of its own (``pvm serve --analyst-user``), it can do nothing else.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from warehouse.analysts.engine import (
    CONNECT_TOKEN_ENV,
    Engine,
    QueryFailed,
    exit_with_parent,
    spark_message,
    start_spark,
    watch_jvm,
)
from warehouse.analysts.messages import (
    Cancel,
    Published,
    QueryRequest,
    QueryResult,
    RowsRequest,
    RowsResult,
    VerifyRequest,
    VerifyResult,
    WorkerHealth,
)

log = logging.getLogger("pvm.analysts")


def create_app(engine: Engine, connect_port: int | None) -> FastAPI:
    app = FastAPI(title="pvm analysts' query process", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(QueryFailed)
    async def failed(_: Any, exc: QueryFailed) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(Exception)
    async def broken(_: Any, exc: Exception) -> JSONResponse:
        log.exception("analysts' query process: unexpected error")
        return JSONResponse({"detail": f"{type(exc).__name__}: {spark_message(exc)}"}, status_code=503)

    @app.get("/health")
    async def health() -> WorkerHealth:
        zombies = await engine.in_control(engine.zombie_tasks)
        return WorkerHealth(
            ready=True,
            running=engine.running(),
            zombie_tasks=zombies,
            views=len(engine.views.names()),
            connect_port=connect_port,
        )

    @app.post("/publish")
    async def publish(body: Published) -> dict[str, int]:
        await engine.publish(body)
        return {"views": len(engine.views.names())}

    @app.post("/query")
    async def query(body: QueryRequest) -> QueryResult:
        return await engine.in_pool(engine.query, body)

    @app.post("/rows")
    async def rows(body: RowsRequest) -> RowsResult:
        return await engine.in_pool(engine.rows, body)

    @app.post("/verify")
    async def verify(request: Request) -> VerifyResult:
        # The relations may be large: parsed on a query thread, not on the loop that
        # answers health checks.
        body = await request.body()
        return await engine.in_pool(lambda: engine.verify(VerifyRequest.model_validate_json(body)))

    @app.post("/cancel")
    async def cancel(body: Cancel) -> dict[str, bool]:
        await engine.in_control(engine.cancel, body.tag)
        return {"cancelled": True}

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api.analysts_worker")
    parser.add_argument("--socket", required=True, help="the Unix socket to answer on")
    parser.add_argument("--work-dir", required=True, help="Spark's scratch space")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--memory", default="1g", help="the JVM's heap (spark.driver.memory)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--connect-port", type=int, default=-1, help="Spark Connect on loopback; -1: none")
    parser.add_argument("--spark-conf", action="append", default=[])
    parser.add_argument("--reap-after", type=float, default=10.0, help="seconds cancelled tasks may keep running")
    parser.add_argument("--parent-pid", type=int, help="end when this process (the manager) is no longer the parent")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    exit_with_parent(args.parent_pid)  # before Spark starts: an orphan must not get as far as a JVM of its own

    spark = start_spark(args)
    connect_port = None
    if args.connect_port >= 0:
        from warehouse.store.spark_connect import start_connect_server

        token = os.environ.get(CONNECT_TOKEN_ENV) or None
        connect_port = start_connect_server(spark, "127.0.0.1", args.connect_port, token).port
    engine = Engine(spark, args.concurrency)
    watch_jvm(engine, args.reap_after)

    import uvicorn

    socket_path = Path(args.socket)
    socket_path.unlink(missing_ok=True)
    config = uvicorn.Config(create_app(engine, connect_port), uds=str(socket_path), log_config=None, access_log=False)
    log.info("analysts' query process ready on %s", socket_path)
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
