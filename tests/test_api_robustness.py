"""Bad requests get a 4xx with a JSON message and change nothing: malformed JSON, wrong
types, unknown names, oversized bodies, unsupported SQL, wrong roles. What was accepted
before them is intact and maintenance goes on."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI

from api.manager_errors import add_error_handlers
from tests.api_support import VIEW, api_env
from warehouse.catalog.db import Catalog, CatalogError, UnknownName


def update(seq: int, relation: str, row: dict, sign: int = 1, source: str = "a") -> dict:
    return {"source": source, "updates": [{"seq": seq, "changes": [{"relation": relation, "sign": sign, "row": row}]}]}


def refused(response, status: int, *words: str) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    detail = response.json()["detail"]
    assert isinstance(detail, str) and detail
    for w in words:
        assert w in detail, (w, detail)
    return detail


async def test_bad_requests_are_refused_and_lose_nothing(tmp_path):
    async with api_env(tmp_path, max_body_bytes=4096, max_update_bytes=8192) as env:
        c, admin, wrapper = env.client, env.auth("admin"), env.auth("wrapper_a")
        env.sources["a"].load("R", [(1, "x")])
        env.sources["b"].load("S", [(1, 10), (2, 20)])
        assert (await c.post("/v1/views", json={"sql": VIEW, "name": "v"}, headers=admin)).status_code == 201
        await env.manager.wait_idle("v")
        base = env.manager.receiver.released_through("a")
        assert (await c.post("/v1/updates", json=update(base + 1, "R", {"k": 2, "v": "y"}), headers=wrapper)).json()[
            "through"
        ] == base + 1
        await env.manager.wait_idle("v")
        before = (await c.get("/v1/views/v/rows", headers=admin)).json()
        assert before["rows"] == [[1, "x", 10], [2, "y", 20]]
        log_before = await env.manager.db(Catalog.log_entries, "a", 0)

        json_headers = {**admin, "content-type": "application/json"}
        refused(await c.post("/v1/views", content=b"{not json", headers=json_headers), 400, "malformed JSON")
        refused(
            await c.post(
                "/v1/updates",
                content=b'{"source": "a", "updates": [',
                headers={**wrapper, "content-type": "application/json"},
            ),
            400,
            "malformed JSON",
        )
        r = await c.post("/v1/views", json={"sql": VIEW, "parallelism": "many"}, headers=admin)
        refused(r, 422, "parallelism")
        assert r.json()["errors"][0]["loc"] == ["body", "parallelism"]
        refused(await c.post("/v1/views", json={"sql": VIEW, "colour": "red"}, headers=admin), 422, "colour")
        refused(await c.post("/v1/updates", json=update("first", "R", {"k": 3, "v": "z"}), headers=wrapper), 422, "seq")
        refused(
            await c.post("/v1/updates", json=update(base + 2, "R", {"k": 3, "v": "z"}, sign=2), headers=wrapper),
            422,
            "sign",
        )
        refused(
            await c.post("/v1/updates", json=update(base + 2, "Nope", {"k": 3}), headers=wrapper),
            422,
            "unknown relation 'Nope'",
        )
        refused(await c.post("/v1/updates", json=update(base + 2, "R", {"k": 3, "zz": 1}), headers=wrapper), 422, "zz")
        refused(
            await c.post("/v1/updates", json=update(1, "T", {"k": 3}, source="nowhere"), headers=admin),
            422,
            "unknown source 'nowhere'",
        )
        refused(await c.get("/v1/views/nope", headers=admin), 404, "unknown view 'nope'")
        refused(await c.get("/v1/views/nope/rows", headers=admin), 404, "nope")
        refused(await c.delete("/v1/views/nope", headers=admin), 404, "nope")
        refused(await c.get("/v1/sources/nope", headers=admin), 404, "unknown source 'nope'")
        refused(await c.get("/v1/nothing-here", headers=admin), 404)
        refused(await c.put("/v1/views", headers=admin), 405)
        refused(await c.get("/v1/views/v/rows", params={"as_of": 10_000}, headers=admin), 422, "watermark")
        refused(await c.get("/v1/views/v/rows", params={"as_of": 1, "latest": "true"}, headers=admin), 422, "either")
        refused(await c.get("/v1/views/v/rows", params={"limit": 0}, headers=admin), 422, "limit")
        refused(
            await c.post(
                "/v1/views", json={"sql": "SELECT COUNT(DISTINCT R.k) FROM a.R", "name": "agg"}, headers=admin
            ),
            422,
        )
        refused(
            await c.post(
                "/v1/views", json={"sql": "SELECT R.k FROM a.R FULL JOIN b.S ON R.k = S.k", "name": "oj"}, headers=admin
            ),
            422,
        )
        refused(await c.post("/v1/views", json={"sql": "DROP TABLE a.R"}, headers=admin), 422)
        refused(await c.post("/v1/views", json={"sql": "SELECT X.k FROM nowhere.X"}, headers=admin), 422)
        refused(await c.post("/v1/views", json={"sql": VIEW, "name": "v"}, headers=admin), 409, "already exists")
        refused(
            await c.post("/v1/sources", json={"name": "a", "wrapper_url": "http://127.0.0.1:9"}, headers=admin),
            409,
            "already registered",
        )
        refused(await c.post("/v1/sources", json={"name": "x y", "wrapper_url": "ftp://somewhere"}, headers=admin), 422)
        r = await c.post(
            "/v1/sources", json={"name": "c", "wrapper_url": "http://c.invalid", "capture": "binlog"}, headers=admin
        )
        refused(r, 422, "capture", "'trigger'", "'timestamp'", "'application'", "'snapshot'")
        assert "c" not in env.manager.clients and "c" not in await env.manager.db(Catalog.sources)
        # oversized: declared by Content-Length, or streamed without one
        refused(await c.post("/v1/views", json={"sql": "SELECT " + "x" * 5000}, headers=admin), 413, "4096")
        big = update(base + 2, "R", {"k": 3, "v": "z" * 9000})

        async def chunks():
            import json

            body = json.dumps(big).encode()
            for i in range(0, len(body), 1000):
                yield body[i : i + 1000]

        refused(
            await c.post("/v1/updates", content=chunks(), headers={**wrapper, "content-type": "application/json"}),
            413,
            "8192",
        )
        refused(await c.post("/v1/updates", json=big, headers=wrapper), 413, "8192")
        # wrong role
        refused(await c.post("/v1/views", json={"sql": VIEW, "name": "w"}, headers=env.auth("analyst")), 403, "admin")
        refused(
            await c.post("/v1/updates", json=update(base + 2, "R", {"k": 3, "v": "z"}), headers=env.auth("wrapper_b")),
            403,
            "'a'",
            "'b'",
        )

        # nothing accepted before is lost, nothing refused got in, and maintenance goes on
        assert await env.manager.db(Catalog.log_entries, "a", 0) == log_before
        assert env.manager.receiver.released_through("a") == base + 1
        assert set(env.manager.views) == {"v"}
        assert (await c.get("/v1/views/v/rows", headers=admin)).json() == before
        ack = await c.post("/v1/updates", json=update(base + 2, "R", {"k": 1, "v": "x"}, sign=-1), headers=wrapper)
        assert ack.json()["through"] == base + 2
        await env.manager.wait_idle("v")
        after = (await c.get("/v1/views/v/rows", headers=admin)).json()
        assert after["rows"] == [[2, "y", 20]] and after["watermark"] > before["watermark"]
        # a count that took long is reused for a couple of seconds while W moves on (a busy
        # machine makes even the memory store's slow): the count of the view as of its W
        for _ in range(50):
            status = (await c.get("/v1/views/v", headers=admin)).json()
            if status["row_count_as_of"] == status["watermark"]:
                break
            await asyncio.sleep(0.1)
        assert status["state"] == "active" and status["row_count"] == 1 and status["lag_updates"] == 0
        assert status["row_count_as_of"] == status["watermark"]


async def test_a_wrapper_address_that_is_not_http_is_refused_with_a_hint(tmp_path):
    """wrapper_url without its scheme, or the source database's URL: 422 naming the field and
    saying what goes where (as ``pvm source add`` does), not quoting a pattern; nothing registered."""
    async with api_env(tmp_path) as env:
        c, admin = env.client, env.auth("admin")
        r = await c.post("/v1/sources", json={"name": "c", "wrapper_url": "127.0.0.1:8101"}, headers=admin)
        detail = refused(
            r,
            422,
            "wrapper_url",
            "the wrapper's HTTP address",
            "did you mean 'http://127.0.0.1:8101'",
            "pvm wrapper run --url",
        )
        assert "pattern" not in detail and r.json()["errors"][0]["loc"] == ["body", "wrapper_url"]
        r = await c.post("/v1/sources", json={"name": "c", "wrapper_url": "sqlite:///shop.db"}, headers=admin)
        refused(r, 422, "wrapper_url", "not 'sqlite:///shop.db'", "the source database's URL goes to the wrapper")
        assert "c" not in env.manager.clients and "c" not in await env.manager.db(Catalog.sources)
        assert [s["name"] for s in (await c.get("/v1/sources", headers=admin)).json()] == ["a", "b"]


@pytest.mark.parametrize("length", ["12abc", "-5"])
async def test_invalid_content_length_is_refused(tmp_path, length):
    async with api_env(tmp_path) as env:
        import httpx

        request = env.client.build_request(
            "POST", "/v1/views", content=b"{}", headers={**env.auth("admin"), "content-type": "application/json"}
        )
        request.headers["content-length"] = length
        response = await env.client.send(request)
        assert response.status_code == 400 and "Content-Length" in response.json()["detail"]
        assert isinstance(response, httpx.Response)


@pytest.mark.parametrize(
    ("raised", "status"),
    [(UnknownName("unknown view 'v'"), 404), (CatalogError("view 'v' already exists"), 409)],
)
async def test_a_catalog_refusal_is_answered_by_its_kind(raised: CatalogError, status: int) -> None:
    """A name removed between the manager's check and the catalog's write (a race with a
    drop) is answered as unknown, not as a conflict."""
    app = FastAPI()
    add_error_handlers(app)

    @app.get("/raise")
    async def _raise() -> None:
        raise raised

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://manager") as client:
        refused(await client.get("/raise"), status, str(raised))
