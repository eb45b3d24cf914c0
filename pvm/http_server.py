"""Serving an ASGI app: bind first, announce the address once it accepts requests.

``pvm serve`` and ``pvm wrapper run`` print exactly one line on stdout once they accept
requests (``… listening on http://HOST:PORT``), so a parent process can start them with
port 0 and read the address. Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise


def listen(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A TCP socket listening on ``host:port`` (port 0: a free port).

    The socket is created with ``proto=IPPROTO_TCP``: asyncio only sets TCP_NODELAY on
    accepted connections of such sockets, and without it every HTTP response waits ~40 ms
    for a delayed ACK (Nagle) before its body goes out.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def http_url(sock: socket.socket) -> str:
    """``http://HOST:PORT`` of a listening socket (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"


def uvicorn_server(app):
    import uvicorn

    return uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=5))


async def start_serving(server, sock: socket.socket) -> asyncio.Task:
    """Run ``server`` on ``sock`` in the background; returns once it accepts requests."""
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            await serving
            raise RuntimeError("the HTTP server did not start")
        await asyncio.sleep(0.01)
    return serving


def stop_on_signals(server) -> None:
    """SIGTERM and SIGINT shut ``server`` down (a second one: at once), and nothing more.

    uvicorn's own handling raises the signal again once the server has shut down, which
    ends the process by the signal before the caller's cleanup runs (``pvm serve``'s: the
    analysts' query process, Spark Connect, the compactor)."""
    import contextlib
    import signal

    def shut_down() -> None:
        if server.should_exit:
            server.force_exit = True
        server.should_exit = True

    server.capture_signals = contextlib.nullcontext
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, shut_down)


async def serve_until_stopped(server, sock: socket.socket, announcement: str, own_signals: bool = False) -> int:
    """Run ``server`` on ``sock``; announce on stdout once it accepts requests. With
    ``own_signals`` a SIGTERM or SIGINT ends it with 0, and the caller's cleanup runs
    (``stop_on_signals``)."""
    if own_signals:
        stop_on_signals(server)
    try:
        serving = await start_serving(server, sock)
    except RuntimeError:
        return 1  # uvicorn logged why
    print(announcement, flush=True)
    await serving
    return 0
