"""What stands before every route of the manager: the gate that answers 503 while the manager
starts, and the limit on request body sizes (413)."""

from __future__ import annotations

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from warehouse.manager import Manager

STARTING_RETRY_AFTER_S = 5  # what a client hears while the manager starts (Spark: 10-35 s)


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
