"""Subqueries that wait for the handshake together share the next one.

A subquery's handshake (an exact snapshot, then every update through its watermark shipped
and acknowledged: docs/design.md, invariant 3) takes its snapshot under the wrapper's
capture lock, so a wrapper takes one at a time. Under a steady write load each takes a
snapshot, a capture and often a round trip to the manager, and subqueries queue behind one
another's handshakes, however cheap their own SQL: the handshake, not the database, limits
how many subqueries a source answers.

So every subquery that arrives while a handshake runs joins the next one, and that one
serves them all: one snapshot, one capture, one shipment. Each then evaluates in the
shared snapshot, one after the other on the snapshot's thread (a wrapper evaluates one
subquery at a time by default: q = 1), and the last one to finish closes it.

Why a shared snapshot is exact for every member: a subquery may be answered in any snapshot
taken after it arrived, because every update the manager had when it asked was captured,
and so committed and visible, before that. A handshake closes its group when it holds the
capture lock, just before its snapshot (``cutoff``), so every member joined before the
snapshot; who arrives after that joins the group behind it, whose handshake waits for the
lock meanwhile (and may take its snapshot while the one before still ships).

>>> async def demo():
...     taken = []
...     async def handshake(cutoff):
...         cutoff()
...         taken.append("snapshot")
...         await asyncio.sleep(0.01)
...         return Closing(), len(taken)
...     groups = SharedHandshakes(handshake)
...     joined = await asyncio.gather(*(groups.join() for _ in range(5)))
...     for shared, _ in joined:
...         shared.close()
...     return taken, sorted({watermark for _, watermark in joined})
>>> class Closing:
...     def close(self): pass
>>> asyncio.run(demo())  # five subqueries, one handshake
(['snapshot'], [1])
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar


class Closable(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=Closable)


class _Group(Generic[S]):
    """One handshake and the subqueries that share it."""

    def __init__(self) -> None:
        self.result: asyncio.Future[tuple[S, int]] = asyncio.get_running_loop().create_future()
        self.result.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "not retrieved"
        self.waiting = 0  # members waiting for the handshake
        self.holding = 0  # members holding the snapshot
        self.closed = False


class Shared(Generic[S]):
    """A member's hold on a group's snapshot: ``snapshot`` to use, ``close`` when done (the
    last member's close closes the snapshot)."""

    def __init__(self, owner: SharedHandshakes[S], group: _Group[S], snapshot: S) -> None:
        self._owner = owner
        self._group: _Group[S] | None = group
        self.snapshot = snapshot

    def close(self) -> None:
        if self._group is not None:
            group, self._group = self._group, None
            group.holding -= 1
            self._owner._close_if_unused(group)


class SharedHandshakes(Generic[S]):
    """Groups the handshakes of subqueries: ``join`` returns the snapshot and watermark of a
    ``handshake(cutoff)``, shared with every subquery that joined before the handshake
    called ``cutoff`` (just before it takes its snapshot)."""

    def __init__(self, handshake: Callable[[Callable[[], None]], Awaitable[tuple[S, int]]]) -> None:
        self._handshake = handshake
        self._forming: _Group[S] | None = None  # the group new subqueries join
        self._running: set[asyncio.Task[None]] = set()

    async def join(self) -> tuple[Shared[S], int]:
        group = self._forming
        if group is None:
            group = self._forming = _Group()
            task = asyncio.create_task(self._run(group), name="pvm-shared-handshake")
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        group.waiting += 1
        try:
            snapshot, watermark = await asyncio.shield(group.result)
        except BaseException:
            group.waiting -= 1
            self._close_if_unused(group)
            raise
        group.waiting -= 1
        group.holding += 1
        return Shared(self, group, snapshot), watermark

    async def _run(self, group: _Group[S]) -> None:
        def cutoff() -> None:
            if self._forming is group:
                self._forming = None  # from here on, arrivals wait for the next handshake

        try:
            result = await self._handshake(cutoff)
        except asyncio.CancelledError:
            self._abandon(group)
            group.result.cancel()
            raise
        except BaseException as exc:
            self._abandon(group)
            group.result.set_exception(exc)
            return
        group.result.set_result(result)
        self._close_if_unused(group)  # its members may all have gone meanwhile

    def _abandon(self, group: _Group[S]) -> None:
        if self._forming is group:
            self._forming = None

    def _close_if_unused(self, group: _Group[S]) -> None:
        result = group.result
        if group.closed or group.waiting or group.holding or not result.done() or result.cancelled():
            return
        if result.exception() is None:
            group.closed = True
            result.result()[0].close()
