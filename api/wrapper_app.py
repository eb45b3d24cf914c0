"""The wrapper's HTTP API (FastAPI): subqueries, Interest, health and schema of one source.

Errors are ``{"detail": "<message>"}``: 400 for names the source does not have, malformed
expressions or values the source cannot take, 401 without the manager's token (when the
wrapper has one), 422 for bodies that do not match the wire schema (keys that are not
scalars, of several widths or wider than ``MAX_KEY_COLUMNS``), 503 when the source cannot
be used right now (locked, unreachable, out of resources).

Started with ``manager_token`` (``--manager-token`` / ``PVM_MANAGER_TOKEN``), the wrapper
answers subqueries, interest and schema requests only with ``Authorization: Bearer <that
token>``: the manager sends it once the source is registered with it. Health stays open.
Without one, every request is answered: run such a wrapper on a trusted network only.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from api import application_changes
from api.docs import serve_docs_offline
from contract.relation_snapshot import SNAPSHOT_MEDIA_TYPE, RelationSnapshot
from contract.schemas import Interest, InterestAck, Subquery, SubqueryAnswer
from wrappers.capture.common import reason
from wrappers.errors import InvalidRequest, WrapperError
from wrappers.wrapper import Wrapper


class Blocked(BaseModel):
    """A loop of the wrapper whose steps keep failing: nothing it should capture moves."""

    loop: str = Field(description="capturing and shipping, or pulling the source into the replica")
    error: str
    since: float = Field(description="unix time of the first failure of the streak")
    attempts: int


class ShippingError(BaseModel):
    """Posts of updates to the manager failing in a row: the wrapper retries them for as long
    as it runs, and nothing more of the source is acknowledged meanwhile."""

    error: str = Field(description="the last failure: the manager's answer (`HTTP 413: …`), or the network's error")
    status: int | None = Field(description="the manager's HTTP status of the last failure; null: no answer")
    since: float = Field(description="unix time of the first failure of the streak")
    attempts: int = Field(description="failed tries since then")


class QuarantinedRow(BaseModel):
    relation: str
    column: str | None = Field(description="the column whose value does not fit (None: the row could not be read)")
    value: str | None = Field(description="a preview of the value")
    reason: str
    at: float = Field(description="unix time")


class Quarantine(BaseModel):
    """Captured rows left out of their updates because the views cannot take them
    (docs/capture.md, "Rows the views cannot take")."""

    rows: int = 0
    by_relation: dict[str, int] = {}
    last: QuarantinedRow | None = None


class Held(BaseModel):
    """Changes of updates the wrapper holds in memory: while it captures them (a read turned
    into parts) and while it ships them (a part, or a post of whole updates), each at most
    ``part_changes`` (docs/capture.md, "Updates of any size")."""

    capturing: int = Field(description="changes held by capture now")
    capturing_peak: int = Field(description="the most capture held at once since the wrapper started")
    shipping: int = Field(description="changes held by shipping now")
    shipping_peak: int = Field(description="the most shipping held at once since the wrapper started")
    part_changes: int = Field(description="the most changes per part and per post (--part-changes)")
    part_bytes: int = Field(description="the most bytes of changes as JSON per part and per post (--part-bytes)")


class StandingSnapshot(BaseModel):
    """The snapshot the wrapper keeps to answer subqueries (wrappers/standing_snapshot.py)."""

    watermark: int | None = Field(default=None, description="the standing snapshot's watermark (null: none stands)")
    seconds: float = Field(default=0.0, description="how long one stands at most (--standing-snapshot-seconds)")
    answers: int = Field(default=0, description="subqueries answered in a standing snapshot since the wrapper started")
    snapshots: int = Field(default=0, description="snapshots that stood since the wrapper started")


class Health(BaseModel):
    ok: bool = Field(description="false while a loop is blocked or has stopped")
    source: str
    last_seq: int
    shipped_through: int
    acked_through: int
    pending: int
    capture: dict[str, Any] = Field(
        default_factory=dict,
        description="the capture method, and for snapshot capture: snapshots applied, when the last was, "
        "the changes it found per table, the algorithm per table, and the last error (None if the last try worked)",
    )
    blocked: Blocked | None = Field(
        default=None, description="set while capture keeps failing (3 tries in a row or more)"
    )
    shipping_error: ShippingError | None = Field(
        default=None, description="set while posts to the manager keep failing (until one is acknowledged)"
    )
    quarantine: Quarantine = Field(default_factory=Quarantine)
    held: Held
    standing_snapshot: StandingSnapshot = Field(default_factory=StandingSnapshot)  # absent: none, as before it


class ColumnInfo(BaseModel):
    name: str
    type: str


class TableInfo(BaseModel):
    columns: list[ColumnInfo]
    primary_key: list[str]


class SourceInfo(BaseModel):
    source: str
    tables: dict[str, TableInfo]


log = logging.getLogger(__name__)
_bearer = HTTPBearer(auto_error=False, scheme_name="manager_token", description="the wrapper's --manager-token")


def _manager_only(token: str | None):
    """A dependency admitting only requests that carry ``token`` (anything if it is None)."""

    async def check(credentials: HTTPAuthorizationCredentials | None = Security(_bearer)) -> None:
        if token is None:
            return
        if credentials is None or not hmac.compare_digest(credentials.credentials.encode(), token.encode()):
            raise HTTPException(
                status_code=401,
                detail="this wrapper answers only the manager: send its --manager-token as a bearer token",
                headers={"WWW-Authenticate": 'Bearer realm="pvm-wrapper"'},
            )

    return check


def create_app(wrapper: Wrapper, manager_token: str | None = None, application_token: str | None = None) -> FastAPI:
    """The API of ``wrapper``; the app's lifespan starts and stops it. With ``manager_token``,
    only requests bearing it are answered (health excepted). With application capture,
    ``POST /v1/changes`` takes the application's changes (bearing ``application_token``)."""
    if not manager_token:
        manager_token = None
        log.warning(
            "wrapper of %s runs without --manager-token: anyone who reaches it can query it", wrapper.config.source
        )
    manager_only = [Depends(_manager_only(manager_token))]

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
        docs_url=None,  # served by serve_docs_offline, without a CDN
        redoc_url=None,
    )
    serve_docs_offline(app)

    @app.exception_handler(InvalidRequest)
    async def invalid_request(_: Request, exc: InvalidRequest) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(WrapperError)
    async def unavailable(_: Request, exc: WrapperError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    @app.exception_handler(sa.exc.OperationalError)
    async def source_unavailable(_: Request, exc: sa.exc.OperationalError) -> JSONResponse:
        # the database's own trouble (locked, disconnected, out of resources): try again later
        return JSONResponse({"detail": f"the source cannot answer right now: {reason(exc)}"}, status_code=503)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def malformed(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in exc.errors())
        return JSONResponse({"detail": f"invalid request body: {problems}"}, status_code=422)

    @app.post(
        "/v1/subquery",
        response_model=SubqueryAnswer,
        summary="Join keys with a relation, with a watermark",
        dependencies=manager_only,
    )
    async def subquery(body: Subquery) -> Response:
        # Serialized once, here: FastAPI would validate the answer's every value again first.
        return Response((await wrapper.answer(body)).model_dump_json(), media_type="application/json")

    @app.post(
        "/v1/snapshot",
        summary="A relation whole, as of a watermark, as an Arrow stream",
        response_class=StreamingResponse,
        responses={200: {"content": {SNAPSHOT_MEDIA_TYPE: {}}, "description": "contract/relation_snapshot.py"}},
        dependencies=manager_only,
    )
    async def snapshot(body: RelationSnapshot) -> StreamingResponse:
        return StreamingResponse(await wrapper.relation_snapshot(body), media_type=SNAPSHOT_MEDIA_TYPE)

    @app.put(
        "/v1/interest",
        response_model=InterestAck,
        summary="Replace what is shipped of each relation",
        dependencies=manager_only,
    )
    async def interest(body: Interest) -> InterestAck:
        return await wrapper.set_interest(body)

    @app.get("/v1/health", response_model=Health)
    async def health() -> Health:
        return Health.model_validate(wrapper.health())

    @app.get(
        "/v1/schema",
        response_model=SourceInfo,
        summary="Columns, SQL types and primary keys",
        dependencies=manager_only,
    )
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

    if wrapper.config.capture.method == "application":
        application_changes.add_routes(app, wrapper, application_token)
    return app
