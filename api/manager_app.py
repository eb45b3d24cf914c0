"""The manager's HTTP API (FastAPI): wrappers post updates; administrators define sources and
views; analysts read views.

Every route but health, readiness, ``/metrics`` and the docs needs a bearer token of a role
that may use it (``api/auth.py``). Every error is a JSON body ``{"detail": "<message>"}``
(validation errors add the field list under ``errors``) with a 4xx status naming what is
wrong, 502 when a source's wrapper refused or could not be reached; nothing accepted before
a bad request is touched by it. Request bodies are limited in size (413).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import analyst
from api.auth import ROLES, Principal, TokenVerifier, check_role, issue, require_role, require_source, verifier_for
from api.ingest import BODY_DOCS, collector_paused, document_update_batch, drop, read_update_batch
from api.metrics import registry_for, render
from contract.schemas import CAPTURE_METHODS, WRAPPER_URL_PATTERN, Ack, AnyValue, wrapper_url_problem
from warehouse.analysts.supervisor import AnalystError
from warehouse.catalog.db import CatalogError
from warehouse.manager import Manager, ManagerError
from warehouse.protocol import DEFAULT_BATCH_SIZE
from warehouse.receiver import ReceiveError
from warehouse.sources import SourceError

MAX_PAGE = 10_000
MAX_BODY_BYTES = 1 << 20  # every request body but a wrapper's updates
MAX_UPDATE_BODY_BYTES = 64 << 20  # POST /v1/updates
ROW_COUNT_REFRESH_SECONDS = 2.0
STARTING_RETRY_AFTER_S = 5  # what a client hears while the manager starts (Spark: 10-35 s)
NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"

ADMIN = require_role("admin")
ANALYST = require_role("analyst")  # analysts and administrators
WRAPPER = require_role("wrapper")  # wrappers (of the batch's source) and administrators


# -- wire models ----------------------------------------------------------------------------------
class ErrorOut(BaseModel):
    detail: str = Field(description="what is wrong, for a person")
    errors: list[dict[str, Any]] | None = Field(default=None, description="validation errors: loc, msg, type")


class SourceIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "shop",
                    "wrapper_url": "http://127.0.0.1:8101",
                    "tables": ["orders"],
                    "manager_token": "…the wrapper's --manager-token…",
                }
            ]
        },
    )
    name: str = Field(min_length=1, max_length=64, pattern=NAME, examples=["shop"])
    wrapper_url: str = Field(
        min_length=8,
        max_length=500,
        pattern=WRAPPER_URL_PATTERN,
        description="the wrapper's HTTP address (`pvm wrapper run --port`), not the source database's URL",
        examples=["http://127.0.0.1:8101"],
    )
    capture: Literal[CAPTURE_METHODS] = Field(  # type: ignore[valid-type]
        default="trigger",
        description="the wrapper's capture method; refused (422) if the wrapper reports another one in its health",
        examples=["trigger"],
    )
    tables: list[str] | None = Field(
        default=None,
        max_length=1000,
        description="tables to use (default: every captured table)",
        examples=[["orders"]],
    )
    manager_token: str | None = Field(
        default=None,
        min_length=16,
        max_length=300,
        description="the secret the wrapper was started with (`--manager-token`, `PVM_MANAGER_TOKEN`); the manager "
        "sends it with every request to the wrapper. Omit it only for a wrapper that runs without one.",
    )

    @field_validator("wrapper_url", mode="before")
    @classmethod
    def _wrapper_address(cls, value: Any) -> Any:
        """Runs before the pattern (which stays in the schema for clients): a bare host:port or
        a database URL is refused saying what goes where, as ``pvm source add`` does, instead of
        quoting the pattern."""
        problem = wrapper_url_problem(value, "wrapper_url") if isinstance(value, str) else None
        if problem is not None:
            raise PydanticCustomError("wrapper_url", problem)
        return value


class WrapperHealth(BaseModel):
    reachable: bool
    error: str | None = None
    last_seq: int | None = Field(default=None, description="the last seq the wrapper assigned")
    acked_through: int | None = None
    pending: int | None = Field(default=None, description="captured updates not acknowledged yet")
    ok: bool | None = Field(default=None, description="the wrapper's own verdict: false while its capture is blocked")
    blocked: dict[str, Any] | None = Field(
        default=None, description="capture keeps failing: the error, since when (unix time)"
    )
    quarantine: dict[str, Any] | None = Field(
        default=None,
        description="captured rows left out because the views cannot take them: count, per relation, last reason",
    )


class SourceOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "shop",
                    "wrapper_url": "http://127.0.0.1:8101",
                    "capture": "trigger",
                    "relations": {"orders": ["id", "customer_id", "product_id", "qty"]},
                    "last_seq": 412,
                    "held": 0,
                    "health": {"reachable": True, "last_seq": 412, "acked_through": 412, "pending": 0},
                }
            ]
        }
    )
    name: str
    wrapper_url: str
    capture: str
    relations: dict[str, list[str]] = Field(description="captured tables and their columns")
    last_seq: int = Field(description="every update of the source with seq <= last_seq is received and durable")
    held: int = Field(
        default=0, description="updates received above a gap in seq: durable, released once the gap is filled"
    )
    waiting_for_seq: int | None = Field(default=None, description="while updates are held: the first missing seq")
    held_through: int | None = Field(default=None, description="while updates are held: the highest seq held")
    health: WrapperHealth | None = Field(default=None, description="the wrapper's own report (shown for one source)")


class ViewIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "sql": "CREATE VIEW big_orders AS SELECT o.id, c.name, o.qty FROM shop.orders o, crm.customers c "
                    "WHERE o.customer_id = c.id AND o.qty > 3",
                    "parallelism": 4,
                    "commit_mode": "out_of_order",
                }
            ]
        },
    )
    sql: str = Field(
        min_length=1,
        max_length=100_000,
        description="`[CREATE VIEW name AS] SELECT … FROM src.table [alias], … WHERE …` (select-project-join)",
        examples=["SELECT o.id, c.name FROM shop.orders o, crm.customers c WHERE o.customer_id = c.id"],
    )
    name: str | None = Field(default=None, max_length=64, pattern=NAME, examples=["order_customers"])
    parallelism: int = Field(default=4, ge=1, le=256, description="PPU size p; 1 is SWEEP")
    batch_size: int = Field(
        default=DEFAULT_BATCH_SIZE,
        ge=1,
        le=10_000,
        description="at most this many queued updates of one source per unit: a backlog is spread over the free PPU "
        "slots and maintained set-oriented; 1 maintains one update per unit",
    )
    commit_mode: Literal["out_of_order", "arrival"] = Field(
        default="out_of_order",
        description="`out_of_order` (PVM) or `arrival` (PVM-CC: raw tables hold legal states only)",
    )


class ViewCountersOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    updates_received: int
    units_started: int
    units_maintained: int
    units_committed: int
    subqueries: int
    compensations: int
    commit_groups: int
    peak_running: int
    retries: int = Field(description="steps repeated after a transient fault")


class RetryOut(BaseModel):
    steps: int = Field(description="steps being retried now: units (each keeps its PPU slot), the commit, a publish")
    attempts: int = Field(description="failed attempts of the step retried longest")
    error: str = Field(description="the latest error")
    since: float = Field(description="when the first of these faults happened (Unix time)")


VIEW_EXAMPLE: dict[str, Any] = {
    "name": "big_orders",
    "state": "active",
    "error": None,
    "sql": "CREATE VIEW big_orders AS SELECT o.id, c.name, o.qty FROM shop.orders o, crm.customers c WHERE o.customer_id = c.id AND o.qty > 3",
    "parallelism": 4,
    "batch_size": 1000,
    "commit_mode": "out_of_order",
    "watermark": 318,
    "paused": False,
    "idle": False,
    "retrying": None,
    "stalled": False,
    "no_progress_seconds": 0.12,
    "updates_queued": 3,
    "units_running": 4,
    "units_waiting": 0,
    "units_retained": 1,
    "updates_pending": 7,
    "lag_updates": 9,
    "lag_seconds": 0.42,
    "row_count": 1840,
    "row_count_as_of": 318,
    "counters": {
        "updates_received": 326,
        "units_started": 322,
        "units_maintained": 319,
        "units_committed": 318,
        "subqueries": 611,
        "compensations": 57,
        "commit_groups": 240,
        "peak_running": 4,
        "retries": 0,
    },
}


class ViewOut(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [VIEW_EXAMPLE]})
    name: str
    state: str = Field(
        description="initializing (initial load running), active, or failed: a fault that needs a person (a source "
        "refusing subqueries, e.g. its schema no longer matches; a value the store cannot hold; a bug). Fix the cause, "
        "then resume the view. Transient faults do not fail a view: see `retrying`"
    )
    error: str | None = Field(description="why the view failed")
    sql: str
    parallelism: int
    batch_size: int
    commit_mode: str
    watermark: int = Field(description="visibility watermark W: reads default to the view as of W")
    paused: bool
    idle: bool
    retrying: RetryOut | None = Field(
        description="steps retried after a transient fault (a source unreachable past its client's retries, the store "
        "or the catalog failing), with backoff for as long as the fault lasts; null when none is"
    )
    stalled: bool = Field(
        description="the watchdog: work pending and no progress for the manager's limit (60 s by default)"
    )
    no_progress_seconds: float = Field(
        description="how long the view has had work pending with no unit started, maintained or committed; 0 when it has "
        "none, or is paused or failed"
    )
    updates_queued: int = Field(
        description="updates received and in no unit yet (a paused or failed view keeps them in the catalog only)"
    )
    units_running: int = Field(description="units in the PPU (its occupancy)")
    units_waiting: int = Field(
        description="numbered units waiting for a PPU slot: recovered after a restart, or stopped by a fault until resume"
    )
    units_retained: int = Field(description="units in the RPU")
    updates_pending: int = Field(description="updates queued or being maintained")
    lag_updates: int = Field(description="updates received but not visible at W yet")
    lag_seconds: float = Field(
        description="age of the oldest update not visible at W: received, but in no unit committed at or below W "
        "(queued, being maintained, or maintained above W); 0 when every received update is visible"
    )
    row_count: int | None = Field(
        description="rows of the view as of row_count_as_of (W; a slow store recounts every few seconds)"
    )
    row_count_as_of: int | None
    counters: ViewCountersOut = Field(
        description="running totals since the manager started: like Prometheus counters, they restart from zero "
        "when the manager restarts"
    )


class RowsOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "view": "big_orders",
                    "columns": ["id", "name", "qty"],
                    "watermark": 318,
                    "as_of": 318,
                    "total": 1840,
                    "offset": 0,
                    "rows": [[7, "customer-3", 4], [9, "customer-12", 5]],
                }
            ]
        }
    )
    view: str
    columns: list[str]
    watermark: int
    as_of: int | None = Field(description="the order the rows are as of; null for a latest read")
    total: int = Field(description="rows in the view (a row with weight n counts n times)")
    offset: int
    rows: list[list[AnyValue]] = Field(description='non-finite floats as {"$float": "NaN" | "Infinity" | "-Infinity"}')


class HealthOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"ok": True, "starting": False, "sources": 3, "views": 1, "problems": []},
                {"ok": True, "starting": True, "sources": 0, "views": 0, "problems": []},
            ]
        }
    )
    ok: bool
    starting: bool = Field(default=False, description="the view store and the manager are still starting")
    sources: int
    views: int
    problems: list[str] = Field(
        default_factory=list,
        description="what needs attention, one sentence each: the view store not answering, views failed, retrying or stalled",
    )


class ReadyOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"ready": True, "catalog": "ok", "store": "ok", "views": {"active": 2, "initializing": 1}}]
        }
    )
    ready: bool
    catalog: str
    store: str = Field(default="ok", description="the view store answers")
    views: dict[str, int] = Field(description="how many views are in each state (initializing, active, failed)")
    sources: list[str] = Field(
        default_factory=list,
        description="sources whose wrapper does not answer or whose capture is blocked: reported, but they do not "
        "make the manager unready (their views stay readable as of W; the fix is at the source)",
    )


class TokenIn(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"role": "wrapper", "source": "shop", "name": "shop wrapper on db-host-1"},
                {"role": "analyst", "name": "bi team"},
            ]
        },
    )
    role: Literal["admin", "analyst", "wrapper"]
    source: str | None = Field(default=None, max_length=64, pattern=NAME, description="for a wrapper token: its source")
    name: str | None = Field(default=None, max_length=200, description="a label to recognize the token by")


class TokenOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 3,
                    "role": "wrapper",
                    "source": "shop",
                    "name": "wrapper of shop",
                    "created_at": 1764400000.0,
                    "revoked_at": None,
                }
            ]
        }
    )
    id: int
    role: str
    source: str | None
    name: str
    created_at: float
    revoked_at: float | None


class TokenCreated(TokenOut):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 3,
                    "role": "wrapper",
                    "source": "shop",
                    "name": "wrapper of shop",
                    "created_at": 1764400000.0,
                    "revoked_at": None,
                    "token": "pvm_3_2mJ4b8x-Qv3…",
                }
            ]
        }
    )
    token: str = Field(description="the bearer token; shown only now")


ERROR_EXAMPLES = {
    400: ("malformed request", "malformed JSON body: Expecting value (at position 0)"),
    401: ("no valid bearer token", "the bearer token is unknown, malformed or revoked"),
    403: ("the token's role may not do this", "token 4 (analyst) may not POST /v1/views: that needs the admin role"),
    404: ("unknown name", "unknown view 'nope'"),
    409: ("conflicts with what exists", "view 'big_orders' already exists"),
    413: ("request body too large", "request body larger than 1048576 bytes"),
    422: ("invalid request", "unsupported SQL: aggregates are not supported (COUNT)"),
    429: (
        "too many failed authentication attempts from this address",
        "too many failed authentication attempts from this address; try again in 1 s",
    ),
    502: (
        "the source's wrapper refused or is unreachable",
        "could not read the schema of source 'shop' at http://127.0.0.1:8101: …",
    ),
    503: ("not ready, or still starting (then with `Retry-After`)", "not ready: the view store does not answer: …"),
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries of error responses, each with an example body."""
    return {
        code: {
            "model": ErrorOut,
            "description": ERROR_EXAMPLES[code][0],
            "content": {"application/json": {"example": {"detail": ERROR_EXAMPLES[code][1]}}},
        }
        for code in codes
    }


AUTH = (401, 403, 429)


# -- the app ---------------------------------------------------------------------------------------
def create_app(
    manager: Manager,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_update_bytes: int = MAX_UPDATE_BODY_BYTES,
    verifier: TokenVerifier | None = None,
    startup: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> FastAPI:
    """The manager's app. ``verifier`` resolves bearer tokens (shared with the Spark Connect
    gateway, so that revoking a token ends both kinds of access at once). ``startup``: what
    starts the manager, run in the background once the server listens (``pvm serve`` opens
    the view store, then starts the manager); until the manager has started every route but
    ``/v1/health`` answers 503 with ``Retry-After``. Without it the manager starts before the
    server accepts requests."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        starting = asyncio.create_task(startup(), name="startup") if startup is not None else None
        if starting is None:
            await manager.start()
        yield
        if starting is not None and not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        await manager.stop()

    app = FastAPI(
        title="PVM warehouse manager",
        version="1",
        description=(
            "Parallel view maintenance (PVM over SWEEP) of select-project-join views over several relational "
            "sources.\n\n"
            "**Authentication**: every `/v1` route but `/v1/health` and `/v1/ready` needs "
            "`Authorization: Bearer <token>`. Roles: `admin` (everything), `analyst` (read sources, views and "
            "rows, run read-only queries), `wrapper` of one source (post that source's updates). Create tokens "
            "with `pvm token create --role …`. `/metrics` (Prometheus) and these docs are open.\n\n"
            '**Errors** are JSON `{"detail": "<message>"}`: 400 malformed body, 401 no valid token, '
            "403 wrong role, 404 unknown name, 409 conflict, 413 body too large, 422 invalid request or "
            "unsupported SQL, 429 too many failed authentication attempts, analyst queries or verifications "
            "(see `Retry-After`), 502 a source's wrapper failed."
        ),
        lifespan=lifespan,
        openapi_tags=[
            {"name": "updates", "description": "Wrappers ship their source's committed changes."},
            {"name": "sources", "description": "Sources and their wrappers."},
            {"name": "views", "description": "SPJ views: define, inspect, read, drop."},
            {"name": "tokens", "description": "Bearer tokens of the roles (administrators only)."},
            {"name": "service", "description": "Health, readiness and metrics (no token needed)."},
        ],
    )
    app.state.manager = manager
    app.state.auth = verifier or verifier_for(manager)
    app.state.metrics = registry_for(manager)
    app.add_middleware(BodyLimit, default=max_body_bytes, limits={"/v1/updates": max_update_bytes})
    app.add_middleware(StartingGate, manager=manager)
    _error_handlers(app)
    app.include_router(_service_routes(manager, app))
    app.include_router(_update_routes(manager))
    document_update_batch(app)
    app.include_router(_source_routes(manager))
    app.include_router(_view_routes(manager))
    app.include_router(_token_routes(manager, app))
    # Analyst routes (read-only queries, verification) go in with their role:
    app.include_router(analyst.router, dependencies=[Depends(ANALYST)], responses=errors(*AUTH))
    return app


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ManagerError)
    async def _manager_error(request: Request, exc: ManagerError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(ReceiveError)
    async def _receive_error(request: Request, exc: ReceiveError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(SourceError)
    async def _source_error(request: Request, exc: SourceError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=502)

    @app.exception_handler(CatalogError)
    async def _catalog_error(request: Request, exc: CatalogError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error_response(exc.errors())

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)


def validation_error_response(problems: Sequence[Mapping[str, Any]]) -> JSONResponse:
    """FastAPI's validation errors as one message: 400 for a body that is not JSON, else 422."""
    for p in problems:
        if p.get("type") == "json_invalid":
            reason = (p.get("ctx") or {}).get("error", "not JSON")
            position = p.get("loc", ("body", "?"))[-1]
            return JSONResponse({"detail": f"malformed JSON body: {reason} (at position {position})"}, status_code=400)
    cleaned = [
        {"loc": [str(x) for x in p.get("loc", ())], "msg": str(p.get("msg", "")), "type": str(p.get("type", ""))}
        for p in problems
    ]
    shown = "; ".join(f"{'.'.join(p['loc'])}: {p['msg']}" for p in cleaned[:5])
    more = f" (and {len(cleaned) - 5} more)" if len(cleaned) > 5 else ""
    return JSONResponse({"detail": f"invalid request: {shown}{more}", "errors": cleaned[:100]}, status_code=422)


class StartingGate:
    """Until the manager has started (the view store opens: Spark takes 10-35 s), answers
    every request but ``/v1/health`` with 503, ``Retry-After`` and a JSON detail, so that
    clients see a manager that is coming rather than a refused connection."""

    def __init__(self, app, manager: Manager) -> None:
        self.app = app
        self.manager = manager

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self.manager.started or scope["path"] == "/v1/health":
            await self.app(scope, receive, send)
            return
        response = JSONResponse(
            {"detail": "the manager is starting (opening the view store); retry shortly"},
            status_code=503,
            headers={"Retry-After": str(STARTING_RETRY_AFTER_S)},
        )
        await response(scope, receive, send)


class BodyLimit:
    """Refuses request bodies over a size limit with 413, before they are read when the
    Content-Length says so, else as soon as the body read so far exceeds it."""

    def __init__(self, app, default: int, limits: dict[str, int]) -> None:
        self.app = app
        self.default = default
        self.limits = limits

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.get(scope["path"], self.default)
        message = f"request body larger than {limit} bytes"
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            detail = message if length.isdigit() else "invalid Content-Length header"
            response = JSONResponse({"detail": detail}, status_code=413 if length.isdigit() else 400)
            await response(scope, receive, send)
            return
        seen = 0

        async def limited_receive():
            nonlocal seen
            event = await receive()
            if event["type"] == "http.request":
                seen += len(event.get("body", b""))
                if seen > limit:
                    raise HTTPException(status_code=413, detail=message)
            return event

        await self.app(scope, limited_receive, send)


# -- routes ------------------------------------------------------------------------------------------
def _service_routes(manager: Manager, app: FastAPI) -> APIRouter:
    router = APIRouter(tags=["service"])

    @router.get(
        "/v1/health",
        response_model=HealthOut,
        summary="Liveness",
        description="The process answers (also while it starts: `starting`). `problems` lists what needs attention: the "
        "view store not answering (as last probed), views failed, retrying or stalled, sources whose wrapper does not "
        "answer or whose capture is blocked (as last asked, every 10 s). Never waits on the store or a wrapper. No "
        "token needed.",
    )
    async def health() -> HealthOut:
        if not manager.started:
            return HealthOut(ok=True, starting=True, sources=0, views=0)
        store = manager.store_probe.last() if manager.store_probe is not None else None
        problems = [f"the view store does not answer: {store}"] if store else []
        return HealthOut(
            ok=True,
            sources=len(manager.clients),
            views=len(manager.views),
            problems=problems + manager.view_problems() + manager.source_problems(),
        )

    @router.get(
        "/v1/ready",
        response_model=ReadyOut,
        summary="Readiness",
        description="Ready to serve: started, the catalog database answers, the view store answers a cheap probe (a "
        "trivial call into Spark's JVM, at most every 5 s, 5 s timeout) and no view's maintenance is stalled (work "
        "pending and no progress for the watchdog's limit). Counts the views in each state (a failed view does not "
        "make the manager unready; `/v1/health` lists it). Sources whose wrapper does not answer or whose capture is "
        "blocked are listed in `sources` without making it unready. 503 naming every reason when not ready. No token "
        "needed.",
        responses=errors(503),
    )
    async def ready() -> ReadyOut | JSONResponse:
        reasons = []
        try:
            await manager.db("ping")
        except Exception as exc:
            reasons.append(f"the catalog does not answer: {exc}")
        store = await manager.store_probe.problem() if manager.store_probe is not None else None
        if store is not None:
            reasons.append(f"the view store does not answer: {store}")
        reasons += manager.stalled_views()
        if reasons:
            return JSONResponse({"detail": "not ready: " + "; ".join(reasons), "problems": reasons}, status_code=503)
        states = Counter(h.info.state for h in manager.views.values())
        return ReadyOut(
            ready=True, catalog="ok", store="ok", views=dict(sorted(states.items())), sources=manager.source_problems()
        )

    @router.get(
        "/metrics",
        summary="Prometheus metrics",
        description="Updates received and maintained, pending updates, PPU occupancy, subquery latency by source, "
        "compensations, commit group sizes, watermark and lag per view. Text exposition format; no token needed.",
        response_class=Response,
        responses={
            200: {
                "content": {
                    "text/plain": {
                        "example": '# TYPE pvm_view_ppu_occupancy gauge\npvm_view_ppu_occupancy{view="big_orders"} 4.0\n'
                    }
                }
            }
        },
    )
    async def metrics() -> Response:
        body, content_type = render(app.state.metrics)
        return Response(body, media_type=content_type)

    return router


def _update_routes(manager: Manager) -> APIRouter:
    router = APIRouter(tags=["updates"])

    @router.post(
        "/v1/updates",
        response_model=Ack,
        summary="Ship updates of a source",
        description="A wrapper ships committed updates of its source, numbered seq 1, 2, 3, … without gaps. "
        "The answer acknowledges everything durable through `through`; updates above a gap are stored and "
        "listed in `held`. Resending is safe; resending a seq with other content than was received is refused "
        "(409 naming the seq), and so is a seq more than the manager's window (100,000 by default) beyond "
        "`through` (422). Needs the wrapper token of `source` (or an admin token).",
        responses={
            200: {"content": {"application/json": {"example": {"through": 42, "held": []}}}},
            **errors(400, *AUTH, 409, 413, 422),
        },
        openapi_extra=BODY_DOCS,
    )
    async def post_updates(request: Request, principal: Principal = Depends(WRAPPER)) -> Ack:
        body = await request.body()  # read once the token is checked; parsed off the event loop (api/ingest.py)
        with collector_paused(len(body)):
            batch = await read_update_batch(body)
            try:
                require_source(principal, batch.source)
                return await manager.receive(batch.source, batch.updates)
            finally:
                await drop(batch.updates)

    return router


def _source_routes(manager: Manager) -> APIRouter:
    router = APIRouter(tags=["sources"])

    async def describe(name: str, capture: str | None = None, health: bool = False) -> SourceOut:
        if capture is None:
            info = (await manager.db("sources")).get(name)
            capture = info.capture if info is not None else "unknown"
        received = manager.receiver.status(name)
        out = SourceOut(
            name=name,
            wrapper_url=manager.wrapper_urls[name],
            capture=capture,
            relations={t: list(r.columns) for t, r in manager.relations[name].items()},
            last_seq=received.released_through,
            held=received.held,
            waiting_for_seq=received.waiting_for,
            held_through=received.held_through,
        )
        if health:
            out.health = await _wrapper_health(manager, name)
        return out

    @router.post(
        "/v1/sources",
        status_code=201,
        response_model=SourceOut,
        summary="Register a source",
        description="Register a source whose wrapper runs at `wrapper_url`: the manager reads the schema of its "
        "captured tables from the wrapper. Give `manager_token` if the wrapper was started with "
        "`--manager-token`. Admin only.",
        responses=errors(*AUTH, 409, 413, 422, 502),
    )
    async def add_source(body: SourceIn, _: Principal = Depends(ADMIN)) -> SourceOut:
        await manager.add_source(
            body.name, body.wrapper_url, body.capture, body.tables, manager_token=body.manager_token
        )
        return await describe(body.name, body.capture)

    @router.get(
        "/v1/sources",
        response_model=list[SourceOut],
        summary="List sources",
        description="Every registered source with its wrapper address, capture method, relations and the last seq "
        "received. Analysts and admins.",
        responses=errors(*AUTH),
    )
    async def list_sources(_: Principal = Depends(ANALYST)) -> list[SourceOut]:
        infos = await manager.db("sources")
        return [await describe(n, infos[n].capture if n in infos else None) for n in sorted(manager.clients)]

    @router.get(
        "/v1/sources/{name}",
        response_model=SourceOut,
        summary="Show a source",
        description="One source, with its wrapper's health (asked now, with a 2 s timeout). Analysts and admins.",
        responses=errors(*AUTH, 404),
    )
    async def show_source(name: str = Path(max_length=200), _: Principal = Depends(ANALYST)) -> SourceOut:
        if name not in manager.clients:
            raise ManagerError(f"unknown source {name!r}", 404)
        return await describe(name, health=True)

    return router


async def _wrapper_health(manager: Manager, name: str) -> WrapperHealth:
    try:
        data = await manager.clients[name].health()
    except Exception as exc:  # unreachable, refused, malformed: all reported, never raised
        return WrapperHealth(reachable=False, error=f"{type(exc).__name__}: {exc}"[:500])
    fields = {k: data.get(k) for k in ("last_seq", "acked_through", "pending") if isinstance(data.get(k), int)}
    fields |= {k: data.get(k) for k in ("blocked", "quarantine") if isinstance(data.get(k), dict)}
    if isinstance(data.get("ok"), bool):
        fields["ok"] = data["ok"]
    return WrapperHealth(reachable=True, **fields)


def _view_routes(manager: Manager) -> APIRouter:
    router = APIRouter(tags=["views"])
    counts: dict[str, tuple[int, float, float, int | None]] = {}  # view -> (as of W, when, seconds taken, rows)

    async def row_count(name: str) -> tuple[int | None, int | None]:
        """Rows of the view as of W. Counting reads the store: a count that took long (a Spark
        job) is reused for a few seconds while W moves on; a quick one never."""
        watermark = manager.watermark(name)
        cached = counts.get(name)
        if cached is not None and (
            cached[0] == watermark or (cached[2] > 0.05 and time.monotonic() - cached[1] < ROW_COUNT_REFRESH_SECONDS)
        ):
            return cached[3], cached[0]
        started = time.monotonic()
        rows: int | None
        try:  # counted where the rows are read (the analysts' query process), not here
            rows = (await manager.read_page(name, watermark, False, 0, 0, "view status"))[2]
        except Exception:  # a view being dropped or failed, a busy query process: no count,
            return None, watermark  # and none kept: the next status asks again
        counts[name] = (watermark, time.monotonic(), time.monotonic() - started, rows)
        return rows, watermark

    async def status(name: str) -> ViewOut:
        out = dict(manager.status(name))  # with the lag, computed once
        out["row_count"], out["row_count_as_of"] = await row_count(name)
        return ViewOut.model_validate(out)

    @router.post(
        "/v1/views",
        status_code=201,
        response_model=ViewOut,
        summary="Define a view",
        description="Define an SPJ view from SQL over registered sources. The answer comes at once, in state "
        "`initializing`, while the initial load runs; the view turns `active` when it is committed. Unsupported "
        "SQL (aggregates, DISTINCT, outer joins, subqueries, UNION, self-joins) is refused with 422 naming the "
        "construct. Admin only.",
        responses=errors(400, *AUTH, 409, 413, 422, 502),
    )
    async def define_view(body: ViewIn, _: Principal = Depends(ADMIN)) -> ViewOut:
        info = await manager.define_view(body.sql, body.name, body.parallelism, body.batch_size, body.commit_mode)
        return await status(info.name)

    @router.get(
        "/v1/views",
        response_model=list[ViewOut],
        summary="List views",
        description="Every view with its status, watermark W, pending updates, lag, row count and maintenance "
        "counters. Analysts and admins.",
        responses=errors(*AUTH),
    )
    async def list_views(_: Principal = Depends(ANALYST)) -> list[ViewOut]:
        return [await status(name) for name in sorted(manager.views) if name in manager.views]

    @router.get(
        "/v1/views/{name}",
        response_model=ViewOut,
        summary="Show a view",
        description="Status (initializing, active, failed), watermark W, updates pending, lag in updates and "
        "seconds, row count and maintenance counters. Analysts and admins.",
        responses=errors(*AUTH, 404),
    )
    async def show_view(name: str = Path(max_length=200), _: Principal = Depends(ANALYST)) -> ViewOut:
        return await status(name)

    @router.delete(
        "/v1/views/{name}",
        status_code=204,
        summary="Drop a view",
        description="Stop maintaining the view and delete its contents. Admin only.",
        responses=errors(*AUTH, 404),
    )
    async def drop_view(name: str = Path(max_length=200), _: Principal = Depends(ADMIN)) -> Response:
        await manager.drop_view(name)
        counts.pop(name, None)
        return Response(status_code=204)

    @router.post(
        "/v1/views/{name}/pause",
        response_model=ViewOut,
        summary="Pause maintenance",
        description="Updates keep being received and queued; no new maintenance unit starts. Once nothing of the view "
        "runs, its queued updates stay in the catalog's update log only (not in memory). Admin only.",
        responses=errors(*AUTH, 404),
    )
    async def pause_view(name: str = Path(max_length=200), _: Principal = Depends(ADMIN)) -> ViewOut:
        manager.pause_view(name)
        return await status(name)

    @router.post(
        "/v1/views/{name}/resume",
        response_model=ViewOut,
        summary="Resume maintenance",
        description="Start maintaining queued updates again (read back from the update log). A failed view is retried: "
        "its unfinished units run again with their order numbers, then everything queued. Admin only.",
        responses=errors(*AUTH, 404),
    )
    async def resume_view(name: str = Path(max_length=200), _: Principal = Depends(ADMIN)) -> ViewOut:
        await manager.resume_view(name)
        return await status(name)

    @router.get(
        "/v1/views/{name}/rows",
        response_model=RowsOut,
        summary="Read a view's rows",
        description="The view as of its watermark W (a state the sources really had), as of an earlier order "
        "(`as_of`, while it is still stored), or with every committed effect (`latest=true`, may include "
        "out-of-order effects; rows with weight <= 0 are never shown). Rows are sorted and paged with "
        "`offset` and `limit`. Analysts and admins.",
        responses=errors(*AUTH, 404, 422),
    )
    async def view_rows(
        request: Request,
        name: str = Path(max_length=200),
        as_of: int | None = Query(default=None, ge=0, le=2**62, description="an order number <= the watermark"),
        latest: bool = Query(default=False, description="include effects committed out of order"),
        offset: int = Query(default=0, ge=0, le=2**62),
        limit: int = Query(default=1000, ge=1, le=MAX_PAGE),
        _: Principal = Depends(ANALYST),
    ) -> RowsOut:
        handle = manager.view(name)
        if latest and as_of is not None:
            raise ManagerError("give either as_of or latest, not both", 422)
        try:
            watermark, pinned, total, rows = await manager.read_page(
                name, as_of, latest, offset, limit, analyst.who(request)
            )
        except AnalystError as exc:
            raise analyst.analyst_error(exc) from exc
        return RowsOut(
            view=name,
            columns=list(handle.plan.output_names),
            watermark=watermark,
            as_of=pinned,
            total=total,
            offset=offset,
            rows=rows,
        )

    return router


def _token_routes(manager: Manager, app: FastAPI) -> APIRouter:
    router = APIRouter(tags=["tokens"])

    def out(info: Any) -> TokenOut:
        return TokenOut(
            id=info.id,
            role=info.role,
            source=info.source,
            name=info.name,
            created_at=info.created_at,
            revoked_at=info.revoked_at,
        )

    @router.post(
        "/v1/tokens",
        status_code=201,
        response_model=TokenCreated,
        summary="Create a token",
        description=f"Create a bearer token of a role ({', '.join(ROLES)}); a wrapper token is bound to one source "
        "(which need not be registered yet). The token is in the answer and nowhere else: only its salted hash "
        "is stored. Admin only.",
        responses=errors(*AUTH, 413, 422),
    )
    async def create_token(body: TokenIn, _: Principal = Depends(ADMIN)) -> TokenCreated:
        try:
            check_role(body.role, body.source)
        except ValueError as exc:
            raise ManagerError(str(exc), 422) from exc
        info, token = await issue(manager, body.role, body.source, body.name or "")
        app.state.auth.remember(info)
        return TokenCreated(**out(info).model_dump(), token=token)

    @router.get(
        "/v1/tokens",
        response_model=list[TokenOut],
        summary="List tokens",
        description="Every token, revoked ones included; never the secrets. Admin only.",
        responses=errors(*AUTH),
    )
    async def list_tokens(_: Principal = Depends(ADMIN)) -> list[TokenOut]:
        return [out(t) for t in await manager.db("tokens")]

    @router.delete(
        "/v1/tokens/{token_id}",
        response_model=TokenOut,
        summary="Revoke a token",
        description="The token stops working at once; its row stays listed with `revoked_at`. Admin only.",
        responses=errors(*AUTH, 404),
    )
    async def revoke_token(token_id: int = Path(ge=1, le=2**62), _: Principal = Depends(ADMIN)) -> TokenOut:
        try:
            info = await manager.db("revoke_token", token_id)
        except CatalogError as exc:
            raise ManagerError(str(exc), 404) from exc
        app.state.auth.remember(info)
        return out(info)

    return router
