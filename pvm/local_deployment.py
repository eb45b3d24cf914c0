"""A whole deployment on one machine: the manager served from this process and one wrapper
process per SQLite source, talking real HTTP. The demo and the benchmarks run on it.

It needs no setup: it creates its own tokens in the catalog (an admin and an analyst token
for its users, a wrapper token per source) and a manager token per wrapper, exactly as an
administrator would with ``pvm token create`` and ``--manager-token``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pvm.cli import CliError

if TYPE_CHECKING:
    from pvm.wrapper_process import WrapperProcess

T = TypeVar("T")


def catalog_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / 'catalog.db'}"


async def side_by_side(*starts: Awaitable[T]) -> list[T]:
    """Await ``starts`` at once (a wrapper process takes a second or more to start, mostly its
    imports), and all of them before raising the first failure: whatever did start is then
    known to its deployment, which stops it.

    >>> async def twice(x: int) -> int:
    ...     return 2 * x
    >>> asyncio.run(side_by_side(twice(1), twice(2)))
    [2, 4]
    """
    done = await asyncio.gather(*starts, return_exceptions=True)
    for outcome in done:
        if isinstance(outcome, BaseException):
            raise outcome
    return [outcome for outcome in done if not isinstance(outcome, BaseException)]


class LocalDeployment:
    def __init__(self, data_dir: Path, store=None, port: int = 0) -> None:
        from pvm.heap import arrow_from_the_c_allocator
        from warehouse.manager import Manager
        from warehouse.store.memory import MemoryStore

        arrow_from_the_c_allocator()  # as pvm serve does
        self.data_dir = data_dir
        self.manager = Manager(catalog_url(data_dir), store or MemoryStore())
        self.wrappers: dict[str, WrapperProcess] = {}
        self.url = ""
        self.port = port
        self.admin_token = ""
        self.analyst_token = ""

    async def __aenter__(self) -> LocalDeployment:
        from api.auth import issue
        from api.manager_app import create_app
        from pvm.http_server import http_url, listen, start_serving, uvicorn_server

        try:
            sock = listen("127.0.0.1", self.port)
        except OSError as exc:
            raise CliError(f"cannot listen on 127.0.0.1:{self.port}: {exc}") from exc
        self.url = http_url(sock)
        self._server = uvicorn_server(create_app(self.manager))
        self._server.capture_signals = contextlib.nullcontext  # Ctrl-C is the embedding program's
        try:
            self._serving = await start_serving(self._server, sock)
        except RuntimeError as exc:
            raise CliError(f"the manager did not start: {exc}") from exc
        self.admin_token = (await issue(self.manager, "admin", name="local deployment"))[1]
        self.analyst_token = (await issue(self.manager, "analyst", name="local deployment"))[1]
        return self

    def headers(self, role: str = "admin") -> dict[str, str]:
        """HTTP headers authenticating as this deployment's admin (or analyst)."""
        token = self.admin_token if role == "admin" else self.analyst_token
        return {"Authorization": f"Bearer {token}"}

    async def __aexit__(self, *exc) -> None:
        await asyncio.gather(*(asyncio.to_thread(w.stop) for w in self.wrappers.values()))
        self._server.should_exit = True
        await self._serving

    async def wrapper_token(self, source: str) -> str:
        """A new wrapper token of ``source`` (``pvm token create --role wrapper --source``)."""
        from api.auth import issue

        return (await issue(self.manager, "wrapper", source=source, name=f"local wrapper of {source}"))[1]

    async def register_source(
        self, name: str, wrapper_url: str, capture: str, tables: list[str], manager_token: str
    ) -> None:
        """Register a running wrapper with the manager (``pvm source add``)."""
        await self.manager.add_source(name, wrapper_url, capture, tables, manager_token=manager_token)

    async def add_sqlite_source(self, name: str, path: Path, tables: list[str], **wrapper_options):
        """Start a wrapper process for an SQLite database and register it with the manager."""
        import secrets

        from pvm.wrapper_process import start_wrapper

        wrapper_token = await self.wrapper_token(name)
        manager_token = secrets.token_urlsafe(32)
        wrapper = await asyncio.to_thread(
            start_wrapper,
            name,
            f"sqlite:///{path}",
            tables,
            self.url,
            state_dir=self.data_dir / "wrappers" / name,
            log_path=self.data_dir / f"wrapper-{name}.log",
            token=wrapper_token,
            manager_token=manager_token,
            **wrapper_options,
        )
        self.wrappers[name] = wrapper
        await self.register_source(name, wrapper.url, "trigger", tables, manager_token)
        return wrapper

    async def wait_shipped(self, timeout: float = 60.0) -> None:
        """Until every wrapper has shipped all it captured and the manager has it."""
        import httpx

        deadline = asyncio.get_running_loop().time() + timeout
        async with httpx.AsyncClient(timeout=10) as http:
            stable = 0
            while stable < 3:
                if asyncio.get_running_loop().time() > deadline:
                    raise CliError("the wrappers did not finish shipping in time")
                done = True
                for name, w in self.wrappers.items():
                    health = (await http.get(f"{w.url}/v1/health")).json()
                    done &= health["pending"] == 0 and health["last_seq"] == self.manager.receiver.released_through(
                        name
                    )
                stable = stable + 1 if done else 0
                await asyncio.sleep(0.05)
