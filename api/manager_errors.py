"""How the manager's API answers errors: each exception type mapped to a status, and every
error a JSON body ``{"detail": "<message>"}`` (validation errors add ``errors``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from warehouse.catalog.db import CatalogError
from warehouse.manager import ManagerError
from warehouse.receiver import ReceiveError
from warehouse.sources import SourceError


def add_error_handlers(app: FastAPI) -> None:
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
