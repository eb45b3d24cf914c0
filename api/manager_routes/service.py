"""The manager's service routes: liveness, readiness and Prometheus metrics (no token needed)."""

from __future__ import annotations

from collections import Counter

from fastapi import APIRouter, FastAPI, Response
from fastapi.responses import JSONResponse

from api.manager_models import (
    HealthOut,
    ReadyOut,
)
from api.manager_routes.error_docs import errors
from api.metrics import render
from warehouse.catalog.db import Catalog
from warehouse.manager import Manager


def router_for(manager: Manager, app: FastAPI) -> APIRouter:
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
            await manager.db(Catalog.ping)
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
