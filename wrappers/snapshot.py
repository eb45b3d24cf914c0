"""A source read transaction that spans awaits: the snapshot of one subquery.

A subquery takes its snapshot, ships and waits for the acknowledgment, then evaluates, all in
one transaction. Its connection is used from one dedicated thread: database connections are
not meant to be shared between threads, and if the request is cancelled, closing is queued
behind whatever statement is still running instead of racing it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import sqlalchemy as sa

from wrappers.capture.base import CaptureDialect

T = TypeVar("T")


class Snapshot:
    def __init__(self, conn: sa.Connection, executor: ThreadPoolExecutor) -> None:
        self._conn = conn
        self._executor = executor

    @classmethod
    async def open(cls, dialect: CaptureDialect, engine: sa.Engine) -> Snapshot:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pvm-snapshot")
        try:
            conn = await asyncio.get_running_loop().run_in_executor(executor, dialect.begin_snapshot, engine)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(conn, executor)

    async def run(self, fn: Callable[[sa.Connection], T]) -> T:
        """``fn(connection)`` in the snapshot's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, self._conn)

    def close(self) -> None:
        """End the read transaction (after any statement still running) and the thread."""
        self._executor.submit(self._conn.close)
        self._executor.shutdown(wait=False)
