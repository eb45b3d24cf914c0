"""The manager's routes of views: define, list, show, drop, pause and resume them, and read
their rows."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from api import analyst
from api.auth import Principal
from api.manager_models import (
    CutOut,
    RowsOut,
    ViewIn,
    ViewOut,
)
from api.manager_routes.error_docs import AUTH, errors
from api.manager_routes.roles import ADMIN, ANALYST
from warehouse.analysts.supervisor import AnalystError
from warehouse.errors import Invalid
from warehouse.manager import Manager

MAX_PAGE = 10_000
ROW_COUNT_REFRESH_SECONDS = 2.0


def router_for(manager: Manager) -> APIRouter:
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
        description="Define a view from SQL over registered sources: select-project-join (self-joins and one "
        "trailing LEFT JOIN included), optionally with GROUP BY, COUNT/SUM/AVG/MIN/MAX and HAVING, or DISTINCT. The "
        "answer comes at once, in state `initializing`, while the initial load runs; the view turns `active` when it "
        "is committed. Unsupported SQL (window functions, RIGHT/FULL or nested outer joins, subqueries, UNION, "
        "SUM/AVG of non-numeric columns) is refused with 422 naming the construct. Admin only.",
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
        "/v1/cut",
        response_model=CutOut,
        summary="A consistent cut of several views",
        description="The latest orders at which the named views all show one state of their sources (per source, "
        "the seq of that state): read each view's rows as of its order and the rows of all of them reflect the same "
        "source updates (docs/protocol.md, 'Consistent reads across views'). Views that share no source are each "
        "at their W. 409 with `Retry-After` while a view has no state in common with the others yet (an initial "
        "load runs, or a view loaded later than what another has reached). Analysts and admins.",
        responses=errors(*AUTH, 404, 409),
    )
    async def cut(
        view: list[str] = Query(min_length=1, max_length=100, description="a view to read; repeat for each"),
        _: Principal = Depends(ANALYST),
    ) -> CutOut:
        found = manager.consistent_cut(view)
        return CutOut(orders=found.orders, seqs=found.seqs)

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
            raise Invalid("give either as_of or latest, not both")
        try:
            watermark, pinned, total, rows = await manager.read_page(
                name, as_of, latest, offset, limit, analyst.who(request)
            )
        except AnalystError as exc:
            raise analyst.analyst_error(exc) from exc
        return RowsOut(
            view=name,
            columns=list(handle.plan.view_names),
            watermark=watermark,
            as_of=pinned,
            total=total,
            offset=offset,
            rows=rows,
        )

    return router
