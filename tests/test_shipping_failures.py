"""A failed post of updates (wrappers/shipper.py).

An update in parts goes on after a failure from the first part the manager holds no longer,
as the manager says: after a post that never reached it (the connection refused, a 503 on
the way), the same part again; after a post it took whose answer was lost (a timeout), the
next part, once the manager has refused the same part again saying what it holds. A manager
that forgot its staged parts (an older one that restarted), saying so or not, gets the update
from part 0. Either way the update is logged once, whole. The posts the manager receives
are counted.

A manager that refuses posts for good (413, 422) is retried for as long as the wrapper runs,
and the wrapper's health names the error and since when.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.wrapper_app import Health
from contract.schemas import Change
from tests.api_support import ApiEnv, api_env
from tests.fake_manager import FakeManager
from warehouse.catalog.db import Catalog
from wrappers.parts import UpdateHead
from wrappers.shipper import Shipper
from wrappers.wrapper import Wrapper, WrapperConfig

PARTS, PART = 8, 20  # an update of 8 parts of 20 changes
CHANGES = [Change(relation="R", sign=1, row={"k": k, "v": f"r{k}"}) for k in range(PARTS * PART)]
HEAD = UpdateHead(seq=1, txid="t1", captured_at=None, parts=PARTS, changes=len(CHANGES), bytes=0)


class Faults(httpx.AsyncBaseTransport):
    """The wrapper's connection to the manager, failing once at the parts ``plan`` names:

    * ``refused``: the connection is refused, nothing reaches the manager;
    * ``unavailable``: a 503 on the way (a proxy's), nothing reaches the manager;
    * ``timeout``: the manager takes the part, its answer is lost;
    * ``restarted``: the manager restarts meanwhile, without its staged parts (``forget``),
      and the connection is refused."""

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        plan: dict[int, str],
        forget: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.inner, self.plan, self.forget = inner, dict(plan), forget

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        fault = self.plan.pop(json.loads(request.content)["updates"][0]["part"]["index"], None)
        if fault == "restarted":
            assert self.forget is not None
            await self.forget()
        if fault in ("refused", "restarted"):
            raise httpx.ConnectError("connection refused", request=request)
        if fault == "unavailable":
            return httpx.Response(503, json={"detail": "no upstream"}, request=request)
        response = await self.inner.handle_async_request(request)
        if fault == "timeout":
            await response.aread()
            raise httpx.ReadTimeout("timed out", request=request)
        return response


async def ship(url: str, transport: httpx.AsyncBaseTransport, token: str | None = None) -> tuple[int, Shipper]:
    """Ship ``CHANGES`` as seq 1 in ``PARTS`` parts; the seq acknowledged through, and the shipper."""

    async def read_part(index: int) -> list[Change]:
        return CHANGES[index * PART : (index + 1) * PART]

    async with httpx.AsyncClient(transport=transport, base_url=url) as client:
        shipper = Shipper("a", url, client, token, first_wait=0.001, max_wait=0.01, encoding="json")
        through = await asyncio.wait_for(shipper.send_parts(HEAD, read_part, last_seq=lambda: 1), 30)
    return through, shipper


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[ApiEnv]:
    async with api_env(tmp_path) as e:
        yield e


def parts_received(env: ApiEnv) -> list[int]:
    """The index of every part the manager receives."""
    receiver = env.manager.receiver
    received: list[int] = []
    original = receiver._receive_part

    async def counting(source: str, update: Any) -> Any:
        received.append(update.part.index)
        return await original(source, update)

    receiver._receive_part = counting
    return received


async def forgetting(env: ApiEnv) -> None:
    """The manager restarts without the staged parts of source ``a``."""
    await env.manager.db(Catalog.drop_staged, "a")
    receiver = env.manager.receiver
    receiver.recover("a", receiver.released_through("a"), staged=None)


async def logged_whole_once(env: ApiEnv) -> None:
    [entry] = await env.manager.db(Catalog.log_entries, "a", 0)
    assert (entry.seq, entry.changes) == (1, [c.model_dump() for c in CHANGES])
    assert await env.manager.db(Catalog.staged, "a") is None


@pytest.mark.parametrize(
    ("plan", "received"),
    [
        ({3: "refused"}, [*range(8)]),
        ({3: "unavailable"}, [*range(8)]),
        ({3: "timeout"}, [0, 1, 2, 3, 3, *range(4, 8)]),  # part 3 again: refused, the manager holds 0-3
        ({7: "timeout"}, [*range(8), 7]),  # the last part again: refused, the update is logged
        ({2: "refused", 5: "timeout", 6: "unavailable"}, [0, 1, 2, 3, 4, 5, 5, 6, 7]),
    ],
    ids=["refused", "unavailable", "timeout", "last-timeout", "several"],
)
async def test_a_failed_post_of_a_part_goes_on_from_the_first_part_the_manager_lacks(
    env: ApiEnv, plan: dict[int, str], received: list[int]
) -> None:
    posts = parts_received(env)
    through, shipper = await ship("http://pvm.test", Faults(env.client._transport, plan), env.tokens["wrapper_a"])
    assert through == 1
    assert posts == received
    await logged_whole_once(env)
    assert (shipper.held.now, shipper.held.peak) == (0, PART)  # one part at a time
    assert shipper.failing is None  # the last post was acknowledged


async def test_a_manager_that_forgot_its_staged_parts_gets_the_update_from_part_0(env: ApiEnv) -> None:
    posts = parts_received(env)
    faults = Faults(env.client._transport, {4: "restarted"}, forget=lambda: forgetting(env))
    through, _ = await ship("http://pvm.test", faults, env.tokens["wrapper_a"])
    assert through == 1
    assert posts == [0, 1, 2, 3, 4, *range(8)]  # part 4 refused: the manager holds none of the update
    await logged_whole_once(env)


@pytest.mark.parametrize("older", [False, True], ids=["saying-so", "older-manager"])
async def test_a_fake_manager_that_forgot_its_parts_gets_the_update_from_part_0(older: bool) -> None:
    """Also a manager whose refusal does not say what it holds (one older than ``PartRefusal``)."""
    with FakeManager() as manager:
        manager.old_refusals = older

        async def forget() -> None:
            manager.forget_parts("a")

        faults = Faults(httpx.AsyncHTTPTransport(), {4: "restarted"}, forget=forget)
        assert (await ship(manager.url, faults))[0] == 1
    indexes = [u.part.index for b in manager.posts for u in b.updates if u.part is not None]
    assert indexes == [0, 1, 2, 3, 4, *range(8)]
    [update] = manager.updates("a")
    assert update.changes == CHANGES and manager.conflicts == []


async def test_a_post_refused_for_good_is_retried_and_shows_in_health(tmp_path: Path) -> None:
    path = tmp_path / "src.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE r (id INTEGER PRIMARY KEY, v TEXT)")
    with FakeManager() as manager:
        manager.refuse_status = 413
        config = WrapperConfig("src", f"sqlite:///{path}", ("r",), manager.url, state_dir=tmp_path / "state")
        wrapper = Wrapper(config)
        await wrapper.start()
        try:
            assert wrapper.health()["shipping_error"] is None
            with sqlite3.connect(path) as db:
                db.execute("INSERT INTO r VALUES (1, 'x')")
            first = await until(lambda: wrapper.health()["shipping_error"])
            assert first["status"] == 413 and first["error"].startswith("HTTP 413: ") and first["attempts"] >= 1
            later = await until(lambda: (e := wrapper.health()["shipping_error"]) and e["attempts"] >= 4 and e)
            assert later["since"] == first["since"] <= time.time()  # one record, since the streak began
            health = Health.model_validate(wrapper.health())  # as GET /v1/health answers it
            assert health.shipping_error is not None and health.shipping_error.status == 413
            assert health.ok and manager.through("src") == 0

            manager.refuse_status = None  # the manager fixed: the retries get through
            await asyncio.to_thread(manager.wait_through, "src", 1, 30)
            await until(lambda: wrapper.health()["shipping_error"] is None)
        finally:
            await wrapper.stop()
    assert [u.changes[0].row for u in manager.updates("src")] == [{"id": 1, "v": "x"}]


async def until(value: Callable[[], Any], timeout: float = 30.0) -> Any:
    """The first truthy ``value()``, asked every few milliseconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (found := value()):
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)
    return found
