"""The route wrappers ship their source's committed updates to."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from api.auth import Principal, require_source
from api.ingest import ACCEPTED, BODY_DOCS, collector_paused, drop, is_update_stream, read_update_batch
from api.manager_routes.error_docs import AUTH, errors
from api.manager_routes.roles import WRAPPER
from contract.schemas import Ack, PartRefusal
from warehouse.manager import Manager

_PART_REFUSED = {
    "detail": "part 3 of update seq 7 of source 'shop' is out of order: the manager holds parts 0-3, the next is part 4",
    "through": 6,
    "held": [],
    "parts": 4,
}


def router_for(manager: Manager) -> APIRouter:
    router = APIRouter(tags=["updates"])

    @router.post(
        "/v1/updates",
        response_model=Ack,
        response_model_exclude_none=True,  # `parts` only in the answer to a part
        summary="Ship updates of a source",
        description="A wrapper ships committed updates of its source, numbered seq 1, 2, 3, … without gaps. "
        "The answer acknowledges everything durable through `through`; updates above a gap are stored and "
        "listed in `held`. Resending is safe; resending a seq with other content than was received is refused "
        "(409 naming the seq), and so is a seq more than the manager's window (100,000 by default) beyond "
        "`through` (422). An update larger than one message travels in parts of its one seq (`part`: "
        "`{index, last}`, each alone in its batch, in order); it is logged and released whole with its last part, "
        "and the answer to an earlier part counts the parts staged (`parts`); a part out of order or of a complete "
        "seq is 409, its body saying what the manager holds (`through`, `held`, and `parts`: the parts of that "
        "update staged, where the wrapper goes on); no update is refused for its size (its parts are staged in the catalog). The body is JSON, or an update stream (Arrow IPC, "
        "`application/vnd.apache.arrow.stream; version=1`) carrying the same batch: a version of the stream this "
        "manager does not read is 415; the answer's `Accept-Post` header lists what it reads. Needs the wrapper token of `source` (or an admin token).",
        responses={
            200: {"content": {"application/json": {"example": {"through": 42, "held": []}}}},
            **errors(400, *AUTH, 413, 415, 422),
            409: {
                "model": PartRefusal,
                "description": "a seq resent with other content (`detail` alone), or a part that does not continue "
                "what the manager holds of its update (with what it holds)",
                "content": {"application/json": {"example": _PART_REFUSED}},
            },
        },
        openapi_extra=BODY_DOCS,
    )
    async def post_updates(request: Request, response: Response, principal: Principal = Depends(WRAPPER)) -> Ack:
        response.headers["Accept-Post"] = ACCEPTED  # the bodies this manager reads: JSON, update streams
        stream = is_update_stream(request.headers.get("content-type"))  # 415 before the body is read
        body = await request.body()  # read once the token is checked; parsed off the event loop (api/ingest.py)
        with collector_paused(len(body)):
            batch = await read_update_batch(body, stream)
            try:
                require_source(principal, batch.source)
                return await manager.receive(batch.source, batch.updates)
            finally:
                await drop(batch.updates)

    return router
