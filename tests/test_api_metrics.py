"""Prometheus metrics: what a scrape shows after some maintenance, per app registry."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from tests.api_support import VIEW, api_env


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_follow_maintenance(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    async with api_env(tmp_path / "one") as env, api_env(tmp_path / "two") as other:
        c = env.client
        env.sources["a"].load("R", [(1, "x")])
        env.sources["b"].load("S", [(1, 10)])
        assert (
            await c.post("/v1/views", json={"sql": VIEW, "name": "v", "parallelism": 3}, headers=env.auth("admin"))
        ).status_code == 201
        await env.manager.wait_idle("v")
        view = (("view", "v"),)
        first = samples((await c.get("/metrics")).text)
        assert first[("pvm_view_units_maintained_total", view)] == 1  # the initial load
        assert first[("pvm_view_compensations_total", view)] == 0
        for i in range(2, 6):
            env.sources["a"].commit([("R", 1, (i, f"r{i}"))])
            await env.sources["a"].ship()
        await env.manager.wait_idle("v")
        r = await c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        got = samples(r.text)
        assert got[("pvm_source_updates_received_total", (("source", "a"),))] == 4
        assert got[("pvm_view_updates_received_total", view)] == 4
        assert got[("pvm_view_units_committed_total", view)] == 5  # the initial load and 4 updates
        assert got[("pvm_view_watermark", view)] == 5
        assert got[("pvm_view_ppu_size", view)] == 3
        assert got[("pvm_view_ppu_occupancy", view)] == 0 and got[("pvm_view_updates_pending", view)] == 0
        assert got[("pvm_view_lag_updates", view)] == 0
        assert got[("pvm_view_state", (("state", "active"), ("view", "v")))] == 1
        assert got[("pvm_view_units_maintained_total", view)] == 5  # the initial load and 4 updates
        subqueries = got[("pvm_view_subqueries_total", view)]
        by_source = {k[1][0][1]: v for k, v in got.items() if k[0] == "pvm_subquery_seconds_count"}
        assert sum(by_source.values()) == subqueries > 0 and by_source["b"] >= 4
        assert got[("pvm_commit_group_size_count", view)] >= 1
        # the count is cumulative across scrapes, not re-added
        again = samples((await c.get("/metrics")).text)
        assert again[("pvm_subquery_seconds_count", (("source", "b"), ("view", "v")))] == by_source["b"]
        # another app in the same process has its own registry
        assert "pvm_view_watermark{" not in (await other.client.get("/metrics")).text

        # a maintenance-concurrent update: b's answer to a's unit reflects a later update of b
        answer, asked, answering = env.sources["b"].subquery, asyncio.Event(), asyncio.Event()

        async def held(q):
            asked.set()
            await answering.wait()
            return await answer(q)

        env.sources["b"].subquery = held
        env.sources["a"].commit([("R", 1, (1, "late"))])
        await env.sources["a"].ship()
        await asyncio.wait_for(asked.wait(), 10)  # a's unit waits for b's answer
        env.sources["b"].subquery = answer
        env.sources["b"].commit([("S", 1, (1, 11))])
        await env.sources["b"].ship()  # ordered after a's unit, yet in b's answer to it
        answering.set()
        await env.manager.wait_idle("v")
        after = samples((await c.get("/metrics")).text)
        assert after[("pvm_view_units_maintained_total", view)] == 7
        assert after[("pvm_view_compensations_total", view)] > got[("pvm_view_compensations_total", view)]
        assert after[("pvm_view_compensations_total", view)] == env.manager.view("v").maintainer.counters.compensations
        rows = (await c.get("/v1/views/v/rows", headers=env.auth("analyst"))).json()["rows"]
        assert sorted(map(tuple, rows)) == [
            (1, "late", 10),
            (1, "late", 11),
            (1, "x", 10),
            (1, "x", 11),
        ]  # compensated: no double count


async def test_a_status_request_or_scrape_computes_the_lag_once(tmp_path, monkeypatch):
    """A view's status (one view or the list) and a scrape each compute its lag_seconds once
    and show that value: status and gauges share one view_progress per view."""
    import warehouse.manager
    from warehouse.protocol import ViewProtocol

    async with api_env(tmp_path) as env:
        c, admin, analyst = env.client, env.auth("admin"), env.auth("analyst")
        env.sources["a"].load("R", [(1, "x")])
        env.sources["b"].load("S", [(1, 10)])
        assert (await c.post("/v1/views", json={"sql": VIEW, "name": "v"}, headers=admin)).status_code == 201
        await env.manager.wait_idle("v")
        assert (await c.post("/v1/views/v/pause", headers=admin)).status_code == 200
        env.sources["a"].commit([("R", 1, (2, "y"))])
        await env.sources["a"].ship()  # queued while paused: not visible at W, so the lag grows
        await asyncio.sleep(0.05)
        computed: list[float] = []
        real = warehouse.manager.lag_seconds

        def counted(protocol: ViewProtocol, now: float | None = None) -> float:
            computed.append(real(protocol, now))
            return computed[-1]

        monkeypatch.setattr(warehouse.manager, "lag_seconds", counted)
        shown = (await c.get("/v1/views/v", headers=analyst)).json()["lag_seconds"]
        assert computed == [shown] and shown >= 0.05
        computed.clear()
        listed = (await c.get("/v1/views", headers=analyst)).json()
        assert computed == [listed[0]["lag_seconds"]]
        computed.clear()
        scraped = samples((await c.get("/metrics")).text)
        assert computed == [scraped[("pvm_view_lag_seconds", (("view", "v"),))]]
