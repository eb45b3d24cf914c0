"""Start a wrapper as a child process (for tests, demos and benchmarks). It needs a manager
to register with, so the example is not run as a doctest::

    w = start_wrapper("shop", "sqlite:///shop.db", ["orders"], "http://127.0.0.1:8000", state_dir=Path("state"))
    w.url  # 'http://127.0.0.1:41234'
    w.stop()
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from pvm.config_file import ENV as CONFIG_ENV
from pvm.wrapper import MANAGER_TOKEN_ENV, SOURCE_URL_ENV, TOKEN_ENV
from wrappers.errors import WrapperError

_LISTENING = re.compile(r"wrapper (\S+) listening on (http://\S+)")


class WrapperProcess:
    """A running ``pvm wrapper run`` child; ``url`` is its HTTP address."""

    def __init__(self, source: str, url: str, process: subprocess.Popen[bytes]) -> None:
        self.source = source
        self.url = url
        self.process = process

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 10.0) -> int:
        """Shut down gracefully (SIGTERM), killing it after ``timeout`` seconds; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        """Die at once, as in a crash (SIGKILL): no shutdown code runs."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def __enter__(self) -> WrapperProcess:
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


def start_wrapper(
    source: str,
    url: str | None,
    tables: Sequence[str],
    manager_url: str,
    *,
    state_dir: Path,
    token: str | None = None,
    manager_token: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    poll_interval: float = 0.05,
    query_delay_ms: float = 0.0,
    max_concurrent_queries: int = 1,
    capture_args: Sequence[str] = (),
    log_path: Path | None = None,
    startup_timeout: float = 30.0,
) -> WrapperProcess:
    """Spawn ``python -m pvm wrapper run …`` and return once it listens.

    The source's URL (it may hold a password) and the tokens (``token`` for posting updates,
    ``manager_token`` that the manager must send) travel in the environment, not on the
    command line (which other users can read). Logs go to ``log_path`` if given, else to
    this process's stderr. Raises WrapperError if the child exits or does not announce
    itself within ``startup_timeout``.
    """
    command = [
        sys.executable, "-m", "pvm", "wrapper", "run",
        "--source", source,
        "--tables", ",".join(tables),
        "--manager", manager_url,
        "--host", host,
        "--port", str(port),
        "--state-dir", str(state_dir),
        "--poll-interval", str(poll_interval),
        "--query-delay-ms", str(query_delay_ms),
        "--max-concurrent-queries", str(max_concurrent_queries),
        *capture_args,  # e.g. ["--capture", "timestamp", "--timestamp-column", "updated_at"]
    ]  # fmt: skip
    env = dict(os.environ)
    for name in (SOURCE_URL_ENV, TOKEN_ENV, MANAGER_TOKEN_ENV, CONFIG_ENV):  # the command line says it all
        env.pop(name, None)
    if url is not None:  # None: snapshot capture of --dump-dir
        env[SOURCE_URL_ENV] = url
    if token:
        env[TOKEN_ENV] = token
    if manager_token:
        env[MANAGER_TOKEN_ENV] = manager_token
    log_file = open(log_path, "ab") if log_path is not None else None
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_file, env=env)
    finally:
        if log_file is not None:
            log_file.close()  # the child holds its own descriptor
    assert process.stdout is not None
    line = _read_line(process, startup_timeout)
    match = _LISTENING.search(line)
    if match is None:
        process.kill()
        process.wait()
        raise WrapperError(f"wrapper {source} did not start: {_exit_report(process, line, log_path)}")
    # Keep draining stdout so a stray print can never block the child on a full pipe.
    threading.Thread(target=_drain, args=(process.stdout,), daemon=True).start()
    return WrapperProcess(source, match.group(2), process)


def _read_line(process: subprocess.Popen[bytes], timeout: float) -> str:
    """The child's first stdout line ('' if it exits first), killing it after ``timeout``."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            process.kill()
            process.wait()
            raise WrapperError(f"wrapper did not start within {timeout:.0f} s")
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").split("\n", 1)[0]


def _drain(stream: IO[bytes]) -> None:
    for _ in stream:
        pass


def _exit_report(process: subprocess.Popen[bytes], line: str, log_path: Path | None) -> str:
    status = process.wait()
    report = f"exit status {status}" + (f", printed {line!r}" if line else "")
    if log_path is not None and log_path.exists():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
        report += "; log: " + " | ".join(tail)
    return report
