"""Serving an ASGI app from a command: bind first, announce the address once it accepts.

Both ``pvm serve`` and ``pvm wrapper run`` print exactly one line on stdout once they
accept requests (``… listening on http://HOST:PORT``), so a parent process can start them
with port 0 and read the address. Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys

from pvm.cli import CliError


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise


def listen(host: str, port: int) -> tuple[socket.socket, str]:
    """A listening socket and its ``http://`` address (port 0 picks a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family)
    except OSError as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc}") from exc
    bound_host, bound_port = sock.getsockname()[:2]
    address = f"http://[{bound_host}]:{bound_port}" if family == socket.AF_INET6 else f"http://{bound_host}:{bound_port}"
    return sock, address


def serve(app, sock: socket.socket, announcement: str) -> int:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=5))
    return asyncio.run(serve_until_stopped(server, sock, announcement))


async def serve_until_stopped(server, sock: socket.socket, announcement: str) -> int:
    """Run ``server`` on ``sock``; announce on stdout once it accepts requests."""
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            await serving
            return 1  # startup failed; uvicorn logged why
        await asyncio.sleep(0.01)
    print(announcement, flush=True)
    await serving
    return 0
