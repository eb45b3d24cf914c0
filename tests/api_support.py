"""Helpers of the API and CLI tests: a manager over in-process sources with its HTTP app,
tokens of every role, and either an in-process client (ASGI) or a live server (uvicorn on a
loopback port, in a thread) for clients that speak real HTTP (the CLI, schemathesis)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error

from api.auth import issue, issue_token
from api.manager_app import create_app
from tests.sim import SimSource, start_sim_manager

TABLES = {"a": {"R": ("k", "v TEXT")}, "b": {"S": ("k", "w")}}
VIEW = "SELECT R.k, R.v, S.w FROM a.R, b.S WHERE R.k = S.k"


@dataclass
class ApiEnv:
    manager: Any
    sources: dict[str, SimSource]
    app: Any
    client: httpx.AsyncClient
    tokens: dict[str, str] = field(default_factory=dict)

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}


@asynccontextmanager
async def api_env(
    tmp_path: Path, tables: dict[str, dict[str, tuple[str, ...]]] | None = None, **app_options: Any
) -> AsyncIterator[ApiEnv]:
    """The manager (started here: an ASGI client runs no lifespan) over sources ``a`` and
    ``b`` (``tables``, else ``TABLES``) and tokens: ``admin``, ``analyst``, ``wrapper_a`` and
    ``wrapper_b``."""
    manager, sources = await start_sim_manager(tmp_path / "catalog.db", tables or TABLES)
    try:
        app = create_app(manager, **app_options)
        tokens = {
            "admin": (await issue(manager, "admin"))[1],
            "analyst": (await issue(manager, "analyst"))[1],
            "wrapper_a": (await issue(manager, "wrapper", "a"))[1],
            "wrapper_b": (await issue(manager, "wrapper", "b"))[1],
        }
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://pvm.test") as client:
            yield ApiEnv(manager, sources, app, client, tokens)
    finally:
        await manager.stop()


class LiveManager:
    """A manager served by uvicorn from a thread on 127.0.0.1, over in-process sources that
    any registered name maps to (``tables`` of each new one: one relation T(k, v TEXT)). Tokens
    ``admin`` and ``analyst`` are made directly in the catalog, as ``pvm token create
    --data-dir`` does. The views are kept in memory unless ``store`` (with ``analysts``, its
    query process) says otherwise."""

    def __init__(
        self,
        data_dir: Path,
        tables: dict[str, dict[str, tuple[str, ...]]] | None = None,
        store: Any = None,
        analysts: Any = None,
    ) -> None:
        from warehouse.catalog.db import Catalog
        from warehouse.manager import Manager
        from warehouse.store.memory import MemoryStore

        self.data_dir = data_dir
        self.sources: dict[str, SimSource] = {}
        self.tables = tables or TABLES
        url = f"sqlite:///{data_dir / 'catalog.db'}"
        catalog = Catalog(url)
        try:
            self.tokens = {role: issue_token(catalog, role)[1] for role in ("admin", "analyst")}
        finally:
            catalog.close()
        self.manager = Manager(url, store if store is not None else MemoryStore(), connect=self._connect)
        self.manager.analysts = analysts  # the analysts' query process: Spark store only
        self.app = create_app(self.manager)
        self.url = ""

    def _connect(self, name: str, url: str) -> SimSource:
        if name not in self.sources:
            tables = self.tables.get(name, {"T": ("k", "v TEXT")})
            self.sources[name] = SimSource(name, tables, random.Random(len(self.sources)))
            self.sources[name].receive = self.manager.receive
        return self.sources[name]

    def __enter__(self) -> LiveManager:
        self.url, self._stop = serve_in_thread(self.app)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def auth(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}


def serve_in_thread(app) -> tuple[str, Callable[[], None]]:
    """Serve the ASGI ``app`` over real HTTP on a free loopback port from a thread; its URL
    and a function that stops it."""
    from pvm.http_server import http_url, listen, uvicorn_server

    sock = listen("127.0.0.1", 0)
    server = uvicorn_server(app)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    for _ in range(2000):
        if server.started:
            break
        if not thread.is_alive():
            raise RuntimeError("the server did not start")
        threading.Event().wait(0.01)
    else:
        raise RuntimeError("the server did not start in 20 s")

    def stop() -> None:
        server.should_exit = True
        thread.join(30)

    return http_url(sock), stop


SCHEMATHESIS_EXAMPLES = 30


def schemathesis_settings(examples: int) -> settings:
    """Hypothesis settings of every schemathesis run: ``examples`` requests per operation and
    mode, derandomized (CI sends the same requests every time), no deadline, no database."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


def exercise(
    operation: Any,
    mode: Any,
    live: LiveManager,
    statuses: Counter[int],
    path_parameters: dict[str, str] | None = None,
    examples: int = SCHEMATHESIS_EXAMPLES,
) -> None:
    """Schemathesis's generated requests (``mode``: valid or invalid ones) to one operation of
    ``live`` with an admin token, derandomized and bounded (``examples`` of them); fails on
    any 5xx. The answered statuses are counted in ``statuses``. ``path_parameters`` pins
    those parameters (a view that exists, so the rest of the request reaches past the 404)."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @schemathesis_settings(examples)
    def run(case) -> None:
        case.headers = {**(case.headers or {}), **live.auth("admin")}  # roles are tested on their own
        if path_parameters and case.path_parameters:
            case.path_parameters = {**case.path_parameters, **path_parameters}
        response = case.call(base_url=live.url, timeout=30)
        statuses[response.status_code] += 1
        if (case.method, case.path, response.status_code) == (
            "POST",
            "/v1/query",
            501,
        ) and live.manager.analysts is None:
            return  # analyst SQL runs on the Spark store only; this manager keeps views in memory
        if response.status_code >= 500:
            pytest.fail(f"{response.status_code} for {case.method} {case.formatted_path}: {response.text[:500]}")
        case.validate_response(response, checks=[not_a_server_error])

    run()
