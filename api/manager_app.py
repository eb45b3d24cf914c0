"""The manager's HTTP API (FastAPI): wrappers post updates; administrators define sources and
views; analysts read views. Every error is a JSON body ``{"detail": "…"}`` with a 4xx
status naming what is wrong; nothing accepted before a bad request is touched by it."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.schemas import Ack, UpdateBatch
from warehouse.manager import Manager, ManagerError
from warehouse.receiver import ReceiveError
from warehouse.sources import SourceError

MAX_PAGE = 10_000


class SourceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, examples=["shop"])
    wrapper_url: str = Field(min_length=1, max_length=500, examples=["http://127.0.0.1:8101"])
    capture: str = Field(default="trigger", max_length=50, examples=["trigger"])
    tables: list[str] | None = Field(default=None, examples=[["orders", "customers"]])


class ViewIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sql: str = Field(
        min_length=1,
        max_length=100_000,
        examples=["SELECT o.id, c.name FROM shop.orders o, crm.customers c WHERE o.customer = c.id"],
    )
    name: str | None = Field(default=None, max_length=64, examples=["order_customers"])
    parallelism: int = Field(default=4, ge=1, le=256, description="PPU size p; 1 is SWEEP")
    batch_size: int = Field(default=1, ge=1, le=10_000, description="queued updates of one source per unit")
    commit_mode: str = Field(default="out_of_order", examples=["out_of_order", "arrival"])


class RowsOut(BaseModel):
    view: str
    columns: list[str]
    watermark: int
    as_of: int | None
    total: int
    offset: int
    rows: list[list[Any]]


def create_app(manager: Manager) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await manager.start()
        yield
        await manager.stop()

    app = FastAPI(
        title="PVM warehouse manager",
        version="1",
        description="Parallel view maintenance of SPJ views over several relational sources.",
        lifespan=lifespan,
    )
    app.state.manager = manager

    @app.exception_handler(ManagerError)
    async def _manager_error(request: Request, exc: ManagerError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(ReceiveError)
    async def _receive_error(request: Request, exc: ReceiveError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(SourceError)
    async def _source_error(request: Request, exc: SourceError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=502)

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"ok": True, "sources": len(manager.clients), "views": len(manager.views)}

    @app.post("/v1/updates", response_model=Ack)
    async def post_updates(batch: UpdateBatch) -> Ack:
        """A wrapper ships updates; the answer acknowledges everything durable through ``through``."""
        return await manager.receive(batch.source, batch.updates)

    @app.post("/v1/sources", status_code=201)
    async def add_source(body: SourceIn) -> dict[str, Any]:
        await manager.add_source(body.name, body.wrapper_url, body.capture, body.tables)
        return _source(manager, body.name)

    @app.get("/v1/sources")
    async def list_sources() -> list[dict[str, Any]]:
        return [_source(manager, name) for name in sorted(manager.clients)]

    @app.get("/v1/sources/{name}")
    async def show_source(name: str) -> dict[str, Any]:
        if name not in manager.clients:
            raise ManagerError(f"unknown source {name!r}", 404)
        return _source(manager, name)

    @app.post("/v1/views", status_code=201)
    async def define_view(body: ViewIn) -> dict[str, Any]:
        info = await manager.define_view(body.sql, body.name, body.parallelism, body.batch_size, body.commit_mode)
        return manager.status(info.name)

    @app.get("/v1/views")
    async def list_views() -> list[dict[str, Any]]:
        return [manager.status(name) for name in sorted(manager.views)]

    @app.get("/v1/views/{name}")
    async def show_view(name: str) -> dict[str, Any]:
        return manager.status(name)

    @app.delete("/v1/views/{name}", status_code=204)
    async def drop_view(name: str) -> None:
        await manager.drop_view(name)

    @app.post("/v1/views/{name}/pause")
    async def pause_view(name: str) -> dict[str, Any]:
        manager.view(name).maintainer.pause()
        return manager.status(name)

    @app.post("/v1/views/{name}/resume")
    async def resume_view(name: str) -> dict[str, Any]:
        manager.view(name).maintainer.resume()
        return manager.status(name)

    @app.get("/v1/views/{name}/rows", response_model=RowsOut)
    async def view_rows(
        name: str,
        as_of: int | None = Query(default=None, ge=0, description="an order number <= the watermark"),
        latest: bool = Query(default=False, description="include effects committed out of order"),
        offset: int = Query(default=0, ge=0),
        limit: int = Query(default=1000, ge=1, le=MAX_PAGE),
    ) -> RowsOut:
        handle = manager.view(name)
        if latest and as_of is not None:
            raise ManagerError("give either as_of or latest, not both", 422)
        rows = sorted(manager.read(name, as_of, latest).expand(), key=_sort_key)
        return RowsOut(
            view=name,
            columns=list(handle.plan.output_names),
            watermark=manager.watermark(name),
            as_of=None if latest else (manager.watermark(name) if as_of is None else as_of),
            total=len(rows),
            offset=offset,
            rows=[list(r) for r in rows[offset : offset + limit]],
        )

    return app


def _source(manager: Manager, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "wrapper_url": manager.wrapper_urls[name],
        "relations": {t: list(r.columns) for t, r in manager.relations[name].items()},
        "last_seq": manager.receiver.released_through(name),
    }


def _sort_key(row: tuple) -> tuple:
    return tuple((v is None, str(type(v)), v if v is not None else 0) for v in row)
