"""A source read transaction that spans awaits: the snapshot of one subquery.

A subquery takes its snapshot, ships and waits for the acknowledgment, then evaluates, all in
one transaction. Its connection is used from one dedicated thread: database connections are
not meant to be shared between threads, and if the request is cancelled, closing is queued
behind whatever statement is still running instead of racing it. The threads are reused:
starting one per subquery cost about as much CPU as the subquery's own SQL.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import sqlalchemy as sa

from wrappers.capture.base import CaptureDialect

T = TypeVar("T")


class _IdleThreads:
    """Single-thread executors whose snapshot is closed, kept for the next snapshots."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._idle: list[ThreadPoolExecutor] = []
        self._lock = threading.Lock()

    def take(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="pvm-snapshot")

    def release(self, executor: ThreadPoolExecutor, last: Callable[[], object] = lambda: None) -> None:
        """Run ``last`` in the executor, then keep it for another snapshot: whatever it still
        runs (a cancelled snapshot's statement) finishes first."""
        executor.submit(last).add_done_callback(lambda _: self._give_back(executor))

    def _give_back(self, executor: ThreadPoolExecutor) -> None:
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(executor)
                return
        executor.shutdown(wait=False)


_threads = _IdleThreads(keep=16)


class Snapshot:
    def __init__(self, conn: sa.Connection, executor: ThreadPoolExecutor) -> None:
        self._conn = conn
        self._executor = executor

    @classmethod
    async def open(
        cls, dialect: CaptureDialect, engine: sa.Engine, then: Callable[[sa.Connection], None] | None = None
    ) -> Snapshot:
        """Begin the read transaction and, in the same trip to its thread, run ``then`` in it."""
        executor = _threads.take()

        def begin() -> sa.Connection:
            conn = dialect.begin_snapshot(engine)
            if then is not None:
                try:
                    then(conn)
                except BaseException:
                    conn.close()
                    raise
            return conn

        try:
            conn = await asyncio.get_running_loop().run_in_executor(executor, begin)
        except BaseException:
            _threads.release(executor)
            raise
        return cls(conn, executor)

    async def run(self, fn: Callable[[sa.Connection], T]) -> T:
        """``fn(connection)`` in the snapshot's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, self._conn)

    def close(self) -> None:
        """End the read transaction (after any statement still running); the thread is kept
        for another snapshot once it has closed this one."""
        _threads.release(self._executor, self._conn.close)
