"""The load of ``pvm bench capture``'s freshness runs, in a process of its own.

The writers of random transactions (``three_sources.Writers``) and the marker writer run in
a child process, never as threads of the process they measure: the manager runs in the
benchmark's process, and writer threads there would take its GIL from the event loop that
answers the wrappers' posts, adding their wait to every handshake (and more to whichever
capture method posts more often).

The child reports through a queue: when its writers began (``time.perf_counter``: the
system's monotonic clock on Linux, the same in both processes), each marker as it commits,
and each writer's count when they are done. The markers go on until ``finish``; the
writers, with ``until``, until ``release``.
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from pvm.bench.three_sources import Flag

MARKERS = {"pg": (50_000_000, 0), "my": (60_000_000, 3), "lite": (70_000_000, 5)}
"""Per source: the first key of its markers, and the view column that key lands in. Markers
are rows whose join partners (anchors) no random writer touches."""

JOIN_SECONDS = 60.0
"""How long ``finish`` waits for the child to end (the markers' last transaction, mostly)."""


def write_markers(urls: dict[str, str], interval: float, stop: Flag, committed: Callable[[str, int], None]) -> None:
    """Round-robin over the sources, one marker row per transaction, every ``interval``
    seconds until ``stop``; ``committed(source, key)`` right after each commit."""
    from pvm.bench.three_sources import TABLES

    rows = {
        "pg": lambda k: {"id": k, "b": 77, "note": "n-marker"},
        "my": lambda k: {"id": k, "b": 78, "c": 78},
        "lite": lambda k: {"id": k, "c": 79, "d": "d1"},
    }
    engines = {s: sa.create_engine(u, connect_args={"timeout": 30} if s == "lite" else {}) for s, u in urls.items()}
    try:
        for n in itertools.count():
            if stop.is_set():
                return
            source = list(MARKERS)[n % len(MARKERS)]
            key = MARKERS[source][0] + n
            row = rows[source](key)
            table = TABLES[source][0]
            with engines[source].begin() as conn:
                conn.execute(
                    sa.text(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(':' + c for c in row)})"), row
                )
            committed(source, key)
            time.sleep(interval)
    finally:
        for engine in engines.values():
            engine.dispose()


def _child(
    urls: dict[str, str],
    writing: dict[str, Any],
    marker_interval: float,
    until: Flag | None,
    stop: Flag,
    out: multiprocessing.Queue[tuple[Any, ...]],
) -> None:
    from pvm.bench.three_sources import Writers

    writers = Writers(urls, until=until, **writing)
    out.put(("started", time.perf_counter()))
    threads = writers.start()
    marker = threading.Thread(
        target=write_markers,
        args=(urls, marker_interval, stop, lambda source, key: out.put(("marker", source, key, time.perf_counter()))),
    )
    marker.start()
    for thread in threads:
        thread.join()
    out.put(("writers", list(writers.committed), [f"{type(e).__name__}: {e}" for e in writers.errors]))
    marker.join()
    out.put(("end",))


class LoadProcess:
    """The child process: ``start``, then read ``commits`` (``(source, key, committed_at)``
    of each marker, in commit order), ``started_at``, and once ``writers_done``,
    ``committed`` and ``errors``."""

    def __init__(
        self,
        urls: dict[str, str],
        *,
        transactions: int,
        connections: int,
        seed: int,
        pause: float,
        marker_interval: float,
        until: bool,
    ) -> None:
        context = multiprocessing.get_context("spawn")  # no copy of the manager's threads and loop
        self._until = context.Event() if until else None
        self._stop = context.Event()
        self._queue: multiprocessing.Queue[tuple[Any, ...]] = context.Queue()
        writing = {"transactions": transactions, "connections": connections, "seed": seed, "pause": pause}
        self._process = context.Process(
            target=_child,
            args=(urls, writing, marker_interval, self._until, self._stop, self._queue),
            name="pvm-bench-capture-load",
            daemon=True,
        )
        self._reader = threading.Thread(target=self._read, name="pvm-bench-capture-load-reader", daemon=True)
        self.commits: list[tuple[str, int, float]] = []
        self.started_at: float | None = None
        self.committed: list[int] = []
        self.errors: list[str] = []
        self.writers_done = False
        self._began = threading.Event()

    def start(self) -> None:
        """Start the child; returns once its writers have begun."""
        self._process.start()
        self._reader.start()
        while not self._began.wait(0.5):
            if not self._process.is_alive():
                raise RuntimeError(f"the load process ended at once (exit code {self._process.exitcode})")

    def release(self) -> None:
        """Let writers that wait for ``until`` stop once they wrote their share."""
        if self._until is not None:
            self._until.set()

    def finish(self) -> None:
        """Stop the markers (and release the writers), and wait for the child to end."""
        self.release()
        self._stop.set()
        self._process.join(JOIN_SECONDS)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._reader.join(JOIN_SECONDS)

    def _read(self) -> None:
        while True:
            try:
                message = self._queue.get(timeout=1.0)
            except queue.Empty:
                if not self._process.is_alive() and self._process.exitcode is not None:
                    self.writers_done = True  # it died: what it reported stands, the run fails on ``errors``
                    if not self.committed and not self.errors:
                        self.errors.append(f"the load process died (exit code {self._process.exitcode})")
                    self._began.set()
                    return
                continue
            kind = message[0]
            if kind == "started":
                self.started_at = message[1]
                self._began.set()
            elif kind == "marker":
                self.commits.append((message[1], message[2], message[3]))
            elif kind == "writers":
                self.committed, self.errors = message[1], message[2]
                self.writers_done = True
            else:
                return
