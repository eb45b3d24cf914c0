"""How the manager's API answers errors: each exception type mapped to a status (the core's
refusals by kind, in ``REFUSALS``), and every error a JSON body ``{"detail": "<message>"}``
(validation errors add ``errors``; a refused part of an update adds what the manager holds,
``contract.schemas.PartRefusal``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from contract.schemas import PartRefusal
from warehouse.catalog.db import CatalogError, UnknownName
from warehouse.errors import Busy, Conflict, Invalid, NotFound, Refused, Unsupported
from warehouse.receiver import PartRefused, ReceiveError
from warehouse.sources import SourceError

REFUSALS: dict[type[Refused], int] = {
    Refused: 400,
    Invalid: 422,
    NotFound: 404,
    Conflict: 409,
    Busy: 429,
    Unsupported: 501,
}
"""The HTTP status of each kind of refusal (``warehouse.errors``); a ``retry_after`` is sent
as ``Retry-After``."""


def status_of(exc: Refused) -> int:
    """The status a refusal is answered with: that of its nearest kind in ``REFUSALS``.

    >>> status_of(NotFound("unknown view 'v'")), status_of(Refused("no"))
    (404, 400)
    """
    return next(REFUSALS[kind] for kind in type(exc).__mro__ if kind in REFUSALS)


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(Refused)
    async def _refused(request: Request, exc: Refused) -> JSONResponse:
        headers = None if exc.retry_after is None else {"Retry-After": str(int(exc.retry_after))}
        return JSONResponse({"detail": str(exc)}, status_code=status_of(exc), headers=headers)

    @app.exception_handler(ReceiveError)
    async def _receive_error(request: Request, exc: ReceiveError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(PartRefused)
    async def _part_refused(request: Request, exc: PartRefused) -> Response:
        refusal = PartRefusal(detail=str(exc), **exc.holding.model_dump())
        return Response(refusal.model_dump_json(), status_code=exc.status, media_type="application/json")

    @app.exception_handler(SourceError)
    async def _source_error(request: Request, exc: SourceError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=502)

    @app.exception_handler(CatalogError)
    async def _catalog_error(request: Request, exc: CatalogError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404 if isinstance(exc, UnknownName) else 409)

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
