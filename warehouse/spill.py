"""The UMQ's spilled tail: what maintenance reads back from the durable update log.

A view's queued updates past its memory budget stay in the update log only (the protocol's
shelf, ``warehouse.protocol``). Two readers need them again, and neither holds them whole:

* the MaintenanceManager takes the next chunk back into the UMQ when it runs low
  (``SpillLog.read_back``), in arrival order;
* an answer that reflects spilled updates subtracts them (``SpillLog.spilled``), a chunk
  of the log at a time.

The manager implements ``SpillLog`` over the catalog; the protocol decides what is read.

Arrival order is release order: the receiver releases a source's updates in seq order, an
update held behind a gap when the gap fills. So a source's chunk comes in seq order, and
chunks of several sources merge by when each update could be released: the largest log id
among its source's updates up to it (``release_order``).

An update logged from parts may be of any size: the receiver hands it to the views by name
only, and each view queues it here (``ViewProtocol.receive_logged``). A read of the log
holds one such update at most (``Catalog.log_range_read`` ends a chunk with it), read a part at
a time into what the view reads of it, so what a read back or a compensation step holds is
the budget's chunk plus that one update's delta. Past the bound a unit sweeps at once, not
even that: the view keeps the update's row counts only (``ViewUpdate.logged``), and whoever
needs its deltas reads them a part of the log at a time (``SpillLog.logged``): a unit that
maintains it spools them to disk by part (``warehouse.part_spool``), a compensation keeps
the rows that join its partial result.
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from contract.zset import ZSet, total
from warehouse.catalog.db import Catalog, CatalogCall, LogEntry
from warehouse.protocol import SpilledRange, ViewUpdate

READ_BACK_UPDATES = 500
"""Updates one read of the shelf takes back into the UMQ at most."""

SPILLED_CHUNK = 1000
"""Log entries one step of a compensation from the log reads at most."""


@dataclass(frozen=True)
class LoggedEntry:
    """One logged update of a source, as the read back sees it: ``update`` is None where
    it holds nothing the view reads (it is passed over, not queued); ``parted``: logged from
    parts, so its source's read of the log ended with it."""

    log_id: int
    seq: int
    update: ViewUpdate | None
    parted: bool = False


@dataclass(frozen=True)
class Chunk:
    """A read of the shelf: the updates to queue, in arrival order; per source the last seq
    read (updates the view does not read included); whether the log had no more."""

    updates: list[ViewUpdate]
    through: dict[str, int]
    exhausted: bool


class SpillLog(Protocol):
    async def read_back(self, after: Mapping[str, int], most: int) -> Chunk:
        """The first ``most`` updates after ``after[source]`` of each source, released and in
        arrival order."""
        ...

    def spilled(self, spilled: SpilledRange) -> AsyncIterator[list[ViewUpdate]]:
        """The view's updates of ``spilled``, in chunks of the log."""
        ...

    def logged(self, update: ViewUpdate) -> AsyncIterator[dict[int, ZSet]]:
        """The deltas of an update kept in the log only (``ViewUpdate.logged``), by
        position, one part of the log at a time: their sum is the update's deltas."""
        ...


async def deltas_from_log(
    log: SpillLog, position: int, spilled: SpilledRange | None, logged: Sequence[ViewUpdate]
) -> AsyncIterator[tuple[ZSet, int]]:
    """What an answer subtracts of relation ``position`` from the update log, named when it
    arrived: the queued updates of ``spilled`` a chunk of the log at a time, then those kept
    in the log only (``logged``, and any met among the spilled ones) a part at a time. Each
    delta comes with how many updates it is the first read of, so that every update is
    counted once however it is cut."""
    logged = list(logged)
    if spilled is not None:
        async for updates in log.spilled(spilled):
            deltas = [u.deltas[position] for u in updates if position in u.deltas]
            logged.extend(u for u in updates if u.logged is not None and position in u.logged)
            if deltas:
                yield total(deltas), len(deltas)
    for update in logged:
        first = 1
        async for part in log.logged(update):
            yield part.get(position, ZSet()), first
            first = 0


def release_order(by_source: Mapping[str, Sequence[LoggedEntry]], most: int) -> Chunk:
    """Merge each source's entries (in seq order, ``most`` at most per source, fewer if its
    log had no more or its read ended with an update logged from parts) into arrival order,
    and keep the first ``most``.

    >>> def e(log_id, seq, name, parted=False): return LoggedEntry(log_id, seq, ViewUpdate(log_id, name, seq, {}), parted)
    >>> chunk = release_order({"a": [e(5, 1, "a"), e(2, 2, "a")], "b": [e(3, 1, "b")]}, most=2)
    >>> [(u.source, u.seq) for u in chunk.updates], chunk.through, chunk.exhausted
    ([('b', 1), ('a', 1)], {'b': 1, 'a': 1}, False)

    ``a``'s seq 2 was logged (id 2) before seq 1 (id 5) and held behind the gap: it was
    released after seq 1, and comes after it.

    A source whose read stopped short (``most`` entries, or one logged from parts last)
    may have more in its log, released before the other sources' later entries: nothing
    after its last entry is taken.

    >>> chunk = release_order({"a": [e(4, 1, "a", parted=True)], "b": [e(3, 1, "b"), e(6, 2, "b")]}, most=5)
    >>> [(u.source, u.seq) for u in chunk.updates], chunk.through, chunk.exhausted
    ([('b', 1), ('a', 1)], {'b': 1, 'a': 1}, False)
    """
    keyed = []
    horizon: tuple[int, str, int] | None = None  # the earliest end of a read that stopped short
    for source, entries in by_source.items():
        released = 0
        run = []
        for entry in entries:
            released = max(released, entry.log_id)
            run.append((released, source, entry.seq, entry))
        if run and (len(run) >= most or run[-1][3].parted):
            end = run[-1][:3]
            horizon = end if horizon is None else min(horizon, end)
        keyed.append(run)
    merged = list(heapq.merge(*keyed, key=lambda item: item[:3]))
    taken = [item for item in merged if horizon is None or item[:3] <= horizon][:most]
    exhausted = horizon is None and len(merged) <= most
    through: dict[str, int] = {}
    updates = []
    for _, source, seq, entry in taken:
        through[source] = seq
        if entry.update is not None:
            updates.append(entry.update)
    return Chunk(updates, through, exhausted)


class CatalogSpillLog:
    """``SpillLog`` over the catalog's update log, for one view: ``extract`` makes of a
    logged update what the view received of it (None: nothing), ``released_through`` says
    up to which seq a source's updates are released (later ones may sit behind a gap).
    ``extract`` runs on the catalog's thread, going through an update logged from parts a
    part at a time (``Catalog.log_range_read``): what a read holds of it is the view's
    delta, never its changes joined."""

    def __init__(
        self,
        db: CatalogCall,
        extract: Callable[[LogEntry], ViewUpdate | None],
        released_through: Callable[[str], int],
        extract_part: Callable[[LogEntry], dict[int, ZSet]],
    ) -> None:
        """``extract_part``: what the view reads of one part of an update's changes."""
        self.db = db
        self.extract = extract
        self.released_through = released_through
        self.extract_part = extract_part

    async def read_back(self, after: Mapping[str, int], most: int) -> Chunk:
        by_source: dict[str, list[LoggedEntry]] = {}
        for source, seq in after.items():
            released = self.released_through(source)
            entries = (
                await self.db(Catalog.log_range_read, source, seq, released, most, self.extract)
                if released > seq
                else []
            )
            by_source[source] = [LoggedEntry(e.id, e.seq, e.value, e.parts > 0) for e in entries]
        return release_order(by_source, most)

    async def spilled(self, spilled: SpilledRange) -> AsyncIterator[list[ViewUpdate]]:
        after = spilled.after
        while after < spilled.through:
            entries = await self.db(
                Catalog.log_range_read, spilled.source, after, spilled.through, SPILLED_CHUNK, self.extract
            )
            if not entries:
                return
            yield [e.value for e in entries if e.value is not None]
            after = entries[-1].seq

    async def logged(self, update: ViewUpdate) -> AsyncIterator[dict[int, ZSet]]:
        index, parts = 0, 1  # the count comes with the first part
        while index < parts:
            read = await self.db(Catalog.log_part_read, update.log_id, index, self.extract_part)
            if read is None:
                return
            parts, deltas = read
            yield deltas
            index += 1
