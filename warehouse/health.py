"""Is the view store alive? A probe that never blocks the event loop.

Readiness and health ask the store (``ViewStore.health``: for Spark, a trivial call into
the JVM) on a daemon thread of the probe's own, never on the event loop or the shared pool:
a JVM that hangs holds that one thread, not the service, nor its exit. An answer is reused for ``ttl_s``
seconds, and a question not answered within ``timeout_s`` is an answer too (the store does
not answer); while it still hangs no second question is asked.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future


class StoreProbe:
    """Asks ``check`` (a store's ``health``) whether the store is alive.

    >>> probe = StoreProbe(lambda: None)
    >>> asyncio.run(probe.problem()) is None
    True
    """

    def __init__(self, check: Callable[[], str | None], timeout_s: float = 5.0, ttl_s: float = 5.0) -> None:
        self._check = check  # None when alive, else what is wrong
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self._asking: Future | None = None
        self._asked_at = 0.0
        self._answer: str | None = None
        self._answered_at: float | None = None

    def last(self) -> str | None:
        """The latest known answer, at once; asks again in the background once it is old."""
        self._ask()
        if self._asking is not None and not self._asking.done() and time.monotonic() - self._asked_at > self.timeout_s:
            return self._no_answer()
        return self._answer

    async def problem(self) -> str | None:
        """What is wrong with the store (None: alive), asked now unless answered within the
        last ``ttl_s`` seconds; waits at most ``timeout_s``."""
        asking = self._ask()
        if asking is None:
            return self._answer
        remaining = self.timeout_s - (time.monotonic() - self._asked_at)
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(asking)), max(remaining, 0.0))
        except TimeoutError:
            return self._no_answer()
        return self._answer

    def _ask(self) -> Future | None:
        """The question being asked (a new one if the answer is old), or None if fresh."""
        if self._asking is not None and not self._asking.done():
            return self._asking
        if self._answered_at is not None and time.monotonic() - self._answered_at < self.ttl_s:
            return None
        self._asked_at = time.monotonic()
        self._asking = Future()
        threading.Thread(target=self._run, args=(self._asking,), name="store-probe", daemon=True).start()
        return self._asking

    def _run(self, asking: Future) -> None:
        try:
            answer = self._check()
        except Exception as exc:  # the check itself failed: that is the answer
            answer = f"{type(exc).__name__}: {exc}"[:500]
        self._answer, self._answered_at = answer, time.monotonic()
        asking.set_result(answer)

    def _no_answer(self) -> str:
        return f"the view store has not answered for {time.monotonic() - self._asked_at:.0f} s"
