"""``GET /v1/cut`` and the views' ``frontier`` (docs/api.md, Reading several views at one state)."""

from __future__ import annotations

from tests.api_support import VIEW, api_env

OTHER = "SELECT S.k, S.w FROM b.S WHERE S.w > 5"


async def test_a_cut_of_two_views_and_where_each_stands(tmp_path):
    async with api_env(tmp_path) as env:
        c, manager = env.client, env.manager
        env.sources["a"].load("R", [(1, "x")])
        env.sources["b"].load("S", [(1, 10)])
        for name, sql in (("v", VIEW), ("w", OTHER)):
            r = await c.post("/v1/views", json={"sql": sql, "name": name}, headers=env.auth("admin"))
            assert r.status_code == 201, r.text
        env.sources["b"].commit([("S", 1, (1, 11)), ("S", 1, (2, 3))])
        await env.sources["b"].ship()
        for name in ("v", "w"):
            await manager.wait_idle(name)

        r = await c.get("/v1/cut", params={"view": ["v", "w"]}, headers=env.auth("analyst"))
        assert r.status_code == 200, r.text
        assert r.json() == {
            "orders": {"v": manager.watermark("v"), "w": manager.watermark("w")},
            "seqs": {"a": 0, "b": 1},
        }
        shown = (await c.get("/v1/views/w", headers=env.auth("analyst"))).json()
        assert shown["frontier"] == {"b": [1, 1]}

        r = await c.get("/v1/cut", params={"view": ["v", "nope"]}, headers=env.auth("analyst"))
        assert r.status_code == 404 and "'nope'" in r.json()["detail"]
        assert (await c.get("/v1/cut", headers=env.auth("analyst"))).status_code == 422
        r = await c.get("/v1/cut", params={"view": ["v"]}, headers=env.auth("wrapper_a"))
        assert r.status_code == 403

        # v is held before an update of a that a view defined now loads: none in common yet
        assert (await c.post("/v1/views/v/pause", headers=env.auth("admin"))).status_code == 200
        env.sources["a"].commit([("R", 1, (1, "y"))])
        await env.sources["a"].ship()
        r = await c.post("/v1/views", json={"sql": "SELECT R.k FROM a.R", "name": "late"}, headers=env.auth("admin"))
        assert r.status_code == 201, r.text
        await manager.wait_idle("late")
        r = await c.get("/v1/cut", params={"view": ["v", "late"]}, headers=env.auth("analyst"))
        assert r.status_code == 409 and r.headers["Retry-After"] == "1", r.text
        assert "'late'" in r.json()["detail"] and "'a'" in r.json()["detail"]
        assert (await c.post("/v1/views/v/resume", headers=env.auth("admin"))).status_code == 200
        await manager.wait_idle("v")
        r = await c.get("/v1/cut", params={"view": ["v", "late"]}, headers=env.auth("analyst"))
        assert r.status_code == 200 and r.json()["seqs"]["a"] == 1, r.text
