"""Helpers of the end-to-end tests over a ``LocalDeployment`` (wrapper processes, the
manager's HTTP API): wait for a view to settle, and read its rows as a z-set."""

from __future__ import annotations

import httpx

from contract.zset import ZSet
from pvm.local_deployment import LocalDeployment


async def settle(deployment: LocalDeployment, view: str) -> None:
    """Every source's captured changes shipped, and ``view`` maintained through them."""
    await deployment.wait_shipped()
    await deployment.manager.wait_idle(view, timeout=120)


async def view_rows(api: httpx.AsyncClient, view: str) -> ZSet:
    """``view``'s rows as of its watermark, read through ``GET /v1/views/{view}/rows``."""
    page = await api.get(f"/v1/views/{view}/rows", params={"limit": 10_000})
    assert page.status_code == 200, page.text
    return ZSet.from_rows(tuple(r) for r in page.json()["rows"])
