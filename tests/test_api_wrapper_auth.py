"""A wrapper started with a manager token answers only requests bearing it (health aside),
and the manager's client sends the token it was registered with."""

from __future__ import annotations

import sqlite3

import httpx

from pvm.wrapper_process import start_wrapper
from tests.fake_manager import FakeManager
from warehouse.sources import HttpSourceClient

MANAGER_TOKEN = "m" * 40


async def test_wrapper_answers_only_the_manager(tmp_path):
    db = tmp_path / "src.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE r (id INTEGER PRIMARY KEY, v TEXT)")
    with FakeManager(token="w" * 40) as manager:
        wrapper = start_wrapper(
            "src",
            f"sqlite:///{db}",
            ["r"],
            manager.url,
            state_dir=tmp_path / "state",
            token="w" * 40,
            manager_token=MANAGER_TOKEN,
            log_path=tmp_path / "wrapper.log",
        )
        try:
            assert httpx.get(f"{wrapper.url}/v1/health").status_code == 200
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                r = httpx.get(f"{wrapper.url}/v1/schema", headers=headers)
                assert r.status_code == 401 and "manager" in r.json()["detail"]
                r = httpx.post(
                    f"{wrapper.url}/v1/subquery",
                    json={"relation": "r", "alias": "r", "keys": [], "select": []},
                    headers=headers,
                )
                assert r.status_code == 401
            client = HttpSourceClient("src", wrapper.url, MANAGER_TOKEN)
            try:
                assert (await client.schema())["r"].columns == ("id", "v")
                assert (await client.health())["source"] == "src"
            finally:
                await client.aclose()
        finally:
            wrapper.stop()
