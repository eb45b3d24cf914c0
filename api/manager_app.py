"""The manager's HTTP API (FastAPI): wrappers post updates; administrators define sources and
views; analysts read views.

Every route but health, readiness, ``/metrics`` and the docs needs a bearer token of a role
that may use it (``api/auth.py``). Every error is a JSON body ``{"detail": "<message>"}``
(validation errors add the field list under ``errors``) with a 4xx status naming what is
wrong, 502 when a source's wrapper refused or could not be reached; nothing accepted before
a bad request is touched by it. Request bodies are limited in size (413).

``create_app`` composes the parts: the routers of each group (``api/manager_routes``), the
error mapping (``api/manager_errors.py``) and the middleware (``api/manager_middleware.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI

from api import analyst
from api.auth import TokenVerifier, verifier_for
from api.docs import serve_docs_offline
from api.ingest import document_update_batch
from api.manager_errors import add_error_handlers
from api.manager_middleware import BodyLimit, StartingGate
from api.manager_routes import service, sources, tokens, updates, views
from api.manager_routes.error_docs import AUTH, errors
from api.manager_routes.roles import ANALYST
from api.metrics import registry_for
from warehouse.manager import Manager

MAX_BODY_BYTES = 1 << 20  # every request body but a wrapper's updates
MAX_UPDATE_BODY_BYTES = 64 << 20  # POST /v1/updates


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
        docs_url=None,  # FastAPI's docs pages load their scripts from a CDN: serve_docs_offline below
        redoc_url=None,
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
    add_error_handlers(app)
    serve_docs_offline(app)
    app.include_router(service.router_for(manager, app))
    app.include_router(updates.router_for(manager))
    document_update_batch(app)
    app.include_router(sources.router_for(manager))
    app.include_router(views.router_for(manager))
    app.include_router(tokens.router_for(manager, app))
    # Analyst routes (read-only queries, verification) go in with their role:
    app.include_router(analyst.router, dependencies=[Depends(ANALYST)], responses=errors(*AUTH))
    return app
