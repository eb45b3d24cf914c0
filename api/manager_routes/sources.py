"""The manager's routes of sources: register, list and show them, with their wrapper's health."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path

from api.auth import Principal
from api.manager_models import (
    SourceIn,
    SourceOut,
    UnfinishedUpdate,
    WrapperHealth,
)
from api.manager_routes.error_docs import AUTH, errors
from api.manager_routes.roles import ADMIN, ANALYST
from warehouse.catalog.db import Catalog
from warehouse.errors import NotFound
from warehouse.manager import Manager


def router_for(manager: Manager) -> APIRouter:
    router = APIRouter(tags=["sources"])

    async def describe(name: str, capture: str | None = None, health: bool = False) -> SourceOut:
        if capture is None:
            info = (await manager.db(Catalog.sources)).get(name)
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
            unfinished=None
            if received.unfinished is None
            else UnfinishedUpdate(
                seq=received.unfinished[0], parts=received.unfinished[1], changes=received.unfinished[2]
            ),
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
        infos = await manager.db(Catalog.sources)
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
            raise NotFound(f"unknown source {name!r}")
        return await describe(name, health=True)

    return router


async def _wrapper_health(manager: Manager, name: str) -> WrapperHealth:
    try:
        data = await manager.clients[name].health()
    except Exception as exc:  # unreachable, refused, malformed: all reported, never raised
        return WrapperHealth(reachable=False, error=f"{type(exc).__name__}: {exc}"[:500])
    fields = {k: data.get(k) for k in ("last_seq", "acked_through", "pending") if isinstance(data.get(k), int)}
    fields |= {
        k: data.get(k) for k in ("blocked", "shipping_error", "quarantine", "held") if isinstance(data.get(k), dict)
    }
    if isinstance(data.get("ok"), bool):
        fields["ok"] = data["ok"]
    return WrapperHealth(reachable=True, **fields)
