"""The API answers while the manager starts: 503 with ``Retry-After`` on every route but
health, over real HTTP (uvicorn on a loopback port), until the startup phase is done.
``tests/spark/test_serve_startup.py`` does the same with a real ``pvm serve --store spark``."""

from __future__ import annotations

import asyncio
import time

import httpx

from api.auth import issue_token
from api.manager_app import create_app
from pvm.http_server import http_url, listen, start_serving, uvicorn_server
from warehouse.catalog.db import Catalog
from warehouse.manager import Manager
from warehouse.store.memory import MemoryStore


async def test_the_api_answers_503_with_retry_after_until_the_manager_has_started(tmp_path):
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    catalog = Catalog(url)
    try:
        admin = {"Authorization": f"Bearer {issue_token(catalog, 'admin')[1]}"}
    finally:
        catalog.close()
    manager = Manager(url, None)
    store_opened = asyncio.Event()

    async def startup() -> None:  # the view store takes its time (Spark: 10-35 s)
        await store_opened.wait()
        await manager.start(MemoryStore())

    sock = listen("127.0.0.1", 0)
    server = uvicorn_server(create_app(manager, startup=startup))
    serving = await start_serving(server, sock)
    try:
        async with httpx.AsyncClient(base_url=http_url(sock), timeout=10) as http:
            for method, path in [
                ("GET", "/v1/views"),
                ("POST", "/v1/views"),
                ("GET", "/v1/ready"),
                ("GET", "/metrics"),
            ]:
                answer = await http.request(method, path, headers=admin)
                assert answer.status_code == 503, (path, answer.text)
                assert answer.headers["Retry-After"] == "5"
                assert "the manager is starting" in answer.json()["detail"]
            health = await http.get("/v1/health")
            assert health.status_code == 200 and health.json()["starting"] is True and health.json()["ok"] is True

            store_opened.set()
            deadline = time.monotonic() + 20
            while (await http.get("/v1/ready")).status_code != 200:
                assert time.monotonic() < deadline, "never ready"
                await asyncio.sleep(0.02)
            assert (await http.get("/v1/views", headers=admin)).json() == []
            assert (await http.get("/v1/health")).json()["starting"] is False
    finally:
        server.should_exit = True
        await serving
