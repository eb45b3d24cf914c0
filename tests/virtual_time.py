"""An event loop on virtual time, and an executor that runs calls inline: what makes a
simulated schedule replay.

On ``VirtualTimeLoop`` a ``sleep`` costs no wall-clock time: when no callback is ready, the
clock jumps to the next timer. Together with ``InlineExecutor`` for every call that would
go to a thread (the catalog, the store, checking received batches), nothing but the loop
orders the schedule's steps, and the loop is deterministic: the same seeded delays give the
same interleaving every run, however busy the machine is.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

DEADLOCK_S = 30.0
"""How long (wall clock) the loop waits for outside I/O when it has no timer left; the
schedules have none, so waiting that long means nothing will ever run again."""


class InlineExecutor(Executor):
    """Runs each call at once, on the caller's thread, and returns its settled future: the
    loop resumes the awaiting task on its next turn, in the order the calls were made."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


class _FastForwardSelector(selectors.DefaultSelector):
    """Never waits for a timer: it polls, and when nothing happened it moves the clock on
    by the timeout the loop asked for, which is the delay of the loop's next timer."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:  # no timer: only outside I/O could wake the loop
            events = super().select(DEADLOCK_S)
            if not events:
                raise RuntimeError(f"deadlock: no callback, no timer and no I/O for {DEADLOCK_S} s")
            return events
        events = super().select(0)
        if not events:
            self.now += timeout
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is virtual, starting at 0."""

    def __init__(self) -> None:
        self._clock = _FastForwardSelector()
        super().__init__(self._clock)
        self._inline = InlineExecutor()

    def time(self) -> float:
        return self._clock.now

    def run_in_executor(self, executor: Executor | None, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """The default executor runs inline too: a stray ``asyncio.to_thread`` does not bring
        a thread's timing back into the schedule."""
        return super().run_in_executor(executor or self._inline, func, *args)


def run_in_virtual_time(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a fresh ``VirtualTimeLoop``."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main)
