"""The standing snapshot: the newest exact snapshot whose updates the manager holds.

A subquery's handshake (an exact snapshot, then every update through its watermark shipped
and acknowledged: docs/design.md, invariant 3) costs a capture and a round trip to the
manager, many times the subquery's own SQL under a write load. But an answer may come from
any exact snapshot whose updates through its watermark the manager holds, as long as its
watermark reaches every update ordered before the asking unit: the manager says which seq
that is (``Subquery.at_least``, docs/protocol.md "Answers from a standing snapshot"), and
subtracts what the answer reflects of the later ones, as always.

So the wrapper keeps the newest snapshot whose handshake is done, from a poll (which
captures in an exact snapshot and ships: ``shipping``) or a subquery (``offer``), for
``max_age`` seconds, and answers every subquery whose ``at_least`` it reaches in it, at the
cost of the SQL alone. A newer snapshot takes its place; one that is replaced or too old is
closed once the subqueries reading in it are done. Subqueries that share it evaluate one
after the other on its thread, as the members of a shared handshake do.

>>> async def demo():
...     standing = StandingSnapshots(max_age=60)
...     standing.offer(Closing("a"), 5).close()  # a poll's, shipped through seq 5
...     reused = standing.lease(4)  # a subquery that needs seq 4 at least: answered in it
...     missing = standing.lease(6)  # one that needs seq 6: a handshake of its own
...     standing.offer(Closing("b"), 7).close()  # "a" is replaced: closed once "reused" is
...     closed_before = list(Closing.closed)
...     reused.close()
...     standing.close()
...     return reused.watermark, missing, closed_before, Closing.closed
>>> class Closing:
...     closed = []
...     def __init__(self, name): self.name = name
...     def close(self): Closing.closed.append(self.name)
>>> asyncio.run(demo())
(5, None, [], ['a', 'b'])
"""

from __future__ import annotations

import asyncio
from typing import Generic, Protocol, TypeVar

STANDING_SECONDS = 1.0
"""How long a snapshot answers subqueries after its handshake, at most: long enough to
serve those that arrive between two polls, short enough that the source's old row versions
it holds on to (PostgreSQL's vacuum horizon, InnoDB's purge) stay few."""


class Closable(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=Closable)


class _Held(Generic[S]):
    """One snapshot, its watermark, and how many leases read in it."""

    def __init__(self, snapshot: S, watermark: int) -> None:
        self.snapshot = snapshot
        self.watermark = watermark
        self.leases = 0
        self.retired = False  # no new leases: replaced, too old, or never standing

    def release(self) -> None:
        self.leases -= 1
        self.close_if_done()

    def close_if_done(self) -> None:
        if self.retired and self.leases == 0:
            self.leases = -1  # closed once
            self.snapshot.close()


class Lease(Generic[S]):
    """A hold on a snapshot: read in ``snapshot`` (its ``watermark``), then ``close``."""

    def __init__(self, held: _Held[S]) -> None:
        held.leases += 1
        self._held: _Held[S] | None = held
        self.snapshot = held.snapshot
        self.watermark = held.watermark

    def close(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            held.release()


class Shipping(Generic[S]):
    """A poll's snapshot while what it captured is shipped: ``stand`` once shipping is done
    (it stands if the manager acknowledged through its watermark, else it closes), or
    ``close``. Closed by itself if shipping takes longer than a snapshot may stand (a
    manager that is down), so that the source's old row versions are not held that long."""

    def __init__(self, owner: StandingSnapshots[S], snapshot: S, watermark: int) -> None:
        self._owner = owner
        self._snapshot: S | None = snapshot
        self.watermark = watermark
        self._timer = asyncio.get_running_loop().call_later(owner.max_age, self.close)

    def stand(self, acked_through: int) -> None:
        if self._snapshot is not None and acked_through >= self.watermark:
            snapshot, self._snapshot = self._snapshot, None
            self._timer.cancel()
            self._owner.offer(snapshot, self.watermark).close()
        else:
            self.close()

    def close(self) -> None:
        self._timer.cancel()
        if self._snapshot is not None:
            snapshot, self._snapshot = self._snapshot, None
            snapshot.close()


class StandingSnapshots(Generic[S]):
    """Keeps the newest snapshot ``offer``ed (every update through its watermark
    acknowledged) for ``max_age`` seconds (0: none stands; a timer on the event loop
    retires it); ``lease`` answers in it. Event-loop only."""

    def __init__(self, max_age: float = STANDING_SECONDS) -> None:
        self.max_age = max_age
        self._current: _Held[S] | None = None
        self.reused = 0  # subqueries answered in a standing snapshot
        self.offered = 0  # snapshots that stood

    def offer(self, snapshot: S, watermark: int) -> Lease[S]:
        """``snapshot``, exact at ``watermark``, whose updates through it are acknowledged:
        it stands if it is the newest. A lease for the caller, who reads in it (or closes it
        at once)."""
        held = _Held(snapshot, watermark)
        current = self._current
        if self.max_age <= 0 or (current is not None and current.watermark > watermark):
            held.retired = True  # none stand; or an older handshake finished after a newer one
        else:
            self._retire()
            self._current = held
            self.offered += 1
            asyncio.get_running_loop().call_later(self.max_age, self._expire, held)
        return Lease(held)

    def shipping(self, snapshot: S, watermark: int) -> Shipping[S]:
        """``snapshot``, exact at ``watermark``, while the updates through it are shipped."""
        return Shipping(self, snapshot, watermark)

    def lease(self, at_least: int) -> Lease[S] | None:
        """A lease on the standing snapshot if its watermark reaches ``at_least`` (None:
        none does; the subquery takes a handshake of its own)."""
        current = self._current
        if current is None or current.watermark < at_least:
            return None
        self.reused += 1
        return Lease(current)

    @property
    def watermark(self) -> int | None:
        """The standing snapshot's watermark (None: none stands)."""
        return None if self._current is None else self._current.watermark

    def _expire(self, held: _Held[S]) -> None:
        if self._current is held:
            self._retire()

    def _retire(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            current.retired = True
            current.close_if_done()

    def close(self) -> None:
        """No snapshot stands any more (the wrapper stops); leased ones close when released."""
        self._retire()
