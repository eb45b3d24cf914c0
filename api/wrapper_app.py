"""The wrapper's HTTP API (FastAPI): subqueries, Interest, health and schema of one source.

Errors are ``{"detail": "<message>"}``: 400 for names the source does not have or malformed
expressions, 422 for bodies that do not match the wire schema, 503 when the source cannot be
used right now.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from api.schemas import Interest, InterestAck, Subquery, SubqueryAnswer
from wrappers.errors import InvalidRequest, WrapperError
from wrappers.wrapper import Wrapper


class Health(BaseModel):
    ok: bool
    source: str
    last_seq: int
    shipped_through: int
    acked_through: int
    pending: int


class ColumnInfo(BaseModel):
    name: str
    type: str


class TableInfo(BaseModel):
    columns: list[ColumnInfo]
    primary_key: list[str]


class SourceInfo(BaseModel):
    source: str
    tables: dict[str, TableInfo]


def create_app(wrapper: Wrapper) -> FastAPI:
    """The API of ``wrapper``; the app's lifespan starts and stops it."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await wrapper.start()
        try:
            yield
        finally:
            await wrapper.stop()

    app = FastAPI(
        title=f"PVM wrapper of source {wrapper.config.source}",
        description="Captures committed changes of one source and answers maintenance subqueries.",
        lifespan=lifespan,
    )

    @app.exception_handler(InvalidRequest)
    async def invalid_request(_: Request, exc: InvalidRequest) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(WrapperError)
    async def unavailable(_: Request, exc: WrapperError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    @app.exception_handler(RequestValidationError)
    async def malformed(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors()
        )
        return JSONResponse({"detail": f"invalid request body: {problems}"}, status_code=422)

    @app.post("/v1/subquery", response_model=SubqueryAnswer, summary="Join keys with a relation, with a watermark")
    async def subquery(body: Subquery) -> SubqueryAnswer:
        return await wrapper.answer(body)

    @app.put("/v1/interest", response_model=InterestAck, summary="Replace what is shipped of each relation")
    async def interest(body: Interest) -> InterestAck:
        return await wrapper.set_interest(body)

    @app.get("/v1/health", response_model=Health)
    async def health() -> Health:
        return Health.model_validate(wrapper.health())

    @app.get("/v1/schema", response_model=SourceInfo, summary="Columns, SQL types and primary keys")
    async def schema() -> SourceInfo:
        return SourceInfo(
            source=wrapper.config.source,
            tables={
                name: TableInfo(
                    columns=[ColumnInfo(name=c, type=t) for c, t in zip(table.columns, table.types)],
                    primary_key=list(table.primary_key),
                )
                for name, table in wrapper.schema.tables.items()
            },
        )

    return app
