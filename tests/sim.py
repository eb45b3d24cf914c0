"""In-process sources for fast randomized schedules, and the first-principles oracle.

``SimSource`` keeps the wrapper's contract (docs/design.md, invariant 3) without a database:
committed transactions wait in an outbox, shipping assigns seq in shipping order and awaits
the manager's acknowledgment, and a subquery ships everything committed, takes its snapshot
and then evaluates the join on that snapshot while the source keeps changing. Random
delays before the snapshot and during evaluation force maintenance-concurrent updates and
out-of-order commits. The real wrappers are tested against the same oracle elsewhere.

The oracle itself is ``warehouse.recompute``: the view evaluated from scratch.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from contract import expr
from contract.schemas import Ack, Change, Interest, Subquery, SubqueryAnswer, Update, UpdatePart
from contract.zset import ZSet
from warehouse.protocol import Unit, ViewProtocol, ViewUpdate
from warehouse.recompute import recompute  # noqa: F401  (the tests' oracle)
from warehouse.sources import TableSchema


@dataclass
class Delays:
    before_snapshot: float = 0.0
    evaluation: float = 0.0
    shipping: float = 0.0


@dataclass
class SimSource:
    """``tables``: each table's columns, declared INTEGER unless named with a type
    (``"v TEXT"``); ``tables`` keeps the names, ``declared`` the types."""

    name: str
    tables: dict[str, tuple[str, ...]]
    rng: random.Random
    delays: Delays = field(default_factory=Delays)
    state: dict[str, ZSet] = field(default_factory=dict)
    initial: dict[str, ZSet] = field(default_factory=dict)
    outbox: list[list[tuple[str, int, tuple]]] = field(default_factory=list)
    shipped: list[list[tuple[str, int, tuple]]] = field(default_factory=list)
    receive: object = None  # async (source, [Update]) -> Ack, set once the manager exists
    trace: list[tuple] | None = None  # shared by a schedule's sources: (time, source, relation, keys, watermark)
    part_size: int | None = None  # ship every update in parts of this many changes (None: whole)
    past: random.Random | None = None  # half the answers with ``at_least`` come from an older state (the oracle's)
    floor_ignored: bool = False  # broken on purpose: those answers may come from below ``at_least``
    past_answers: int = 0  # answers given in a state older than the source's current one
    lazy_interest: bool = False  # a new interest's boundary is shipped with the next ship, as a wrapper does
    _unsent: int = 0  # the last updates numbered but not sent yet (``lazy_interest``)

    def __post_init__(self) -> None:
        self._lock = asyncio.Lock()
        specs = {t: [(*c.split(maxsplit=1), "INTEGER")[:2] for c in cols] for t, cols in self.tables.items()}
        self.tables = {t: tuple(name for name, _ in spec) for t, spec in specs.items()}
        self.declared = {t: tuple(declared for _, declared in spec) for t, spec in specs.items()}
        for t in self.tables:
            self.state.setdefault(t, ZSet())

    def load(self, table: str, rows: Sequence[tuple]) -> None:
        """Initial contents, present before any view exists."""
        for row in rows:
            self.state[table].add(tuple(row), 1)
        self.initial = {t: z.copy() for t, z in self.state.items()}

    # -- the source's own transactions -----------------------------------------------------
    def commit(self, changes: list[tuple[str, int, tuple]]) -> None:
        for table, sign, row in changes:
            assert sign == 1 or self.state[table].weight(row) > 0, "deleting a missing row"
            self.state[table].add(row, sign)
        self.outbox.append(changes)

    # -- SendUpdates ---------------------------------------------------------------------------
    async def ship(self) -> None:
        async with self._lock:
            await self._ship_locked()

    async def _ship_locked(self, table: str | None = None) -> ZSet | None:
        """Ship what is committed; with ``table``, also return its snapshot taken at the same
        instant as the outbox was drained (the wrapper's handshake: nothing committed in the
        snapshot is left unshipped, nothing shipped is missing from it)."""
        if self.delays.shipping and self.outbox:
            await asyncio.sleep(self.rng.uniform(0, self.delays.shipping))
        merged = [c for tx in self.outbox for c in tx]  # consecutive transactions: one update
        self.outbox = []
        snapshot = self.state[table].copy() if table is not None else None
        while self._unsent:  # numbered at an interest's boundary: they go first
            seq = len(self.shipped) - self._unsent + 1
            self._unsent -= 1
            await self._send(self.shipped[seq - 1], self.part_size, seq)
        if merged:
            self.shipped.append(merged)
            await self._send(merged, self.part_size)
        return snapshot

    async def _send(
        self, merged: list[tuple[str, int, tuple]], part_size: int | None, seq: int | None = None
    ) -> list[Ack]:
        """Send shipped update ``seq`` (the last one if None): whole, or in parts of
        ``part_size`` changes."""
        seq = len(self.shipped) if seq is None else seq
        wire = [Change(relation=t, sign=s, row=dict(zip(self.tables[t], row))) for t, s, row in merged]
        if part_size is None:
            acks = [await self.receive(self.name, [Update(seq=seq, changes=wire)])]
        else:
            count = -(-len(wire) // part_size)
            acks = []
            for index in range(count):
                part = UpdatePart(index=index, last=index == count - 1)
                chunk = wire[index * part_size : (index + 1) * part_size]
                acks.append(await self.receive(self.name, [Update(seq=seq, changes=chunk, txid=f"t{seq}", part=part)]))
        assert acks[-1].through == seq, acks[-1]
        return acks

    async def ship_in_parts(self, size: int) -> list[Ack]:
        """``ship``, the update sent in parts of ``size`` changes: under the source's lock, so
        that no subquery answer reflects it before it is acknowledged whole."""
        async with self._lock:
            merged = [c for tx in self.outbox for c in tx]
            self.outbox = []
            if not merged:
                return []
            self.shipped.append(merged)
            return await self._send(merged, size)

    # -- the wrapper contract ------------------------------------------------------------------
    async def schema(self) -> dict[str, TableSchema]:
        return {t: TableSchema(cols, self.declared[t], ()) for t, cols in self.tables.items()}

    async def set_interest(self, interest: Interest) -> int:
        self.interest = interest  # what the manager last asked this source to capture
        async with self._lock:
            if not self.lazy_interest:
                await self._ship_locked()
            elif merged := [c for tx in self.outbox for c in tx]:  # numbered now, sent later
                self.outbox = []
                self.shipped.append(merged)
                self._unsent += 1
            return len(self.shipped)

    async def health(self) -> dict:
        return {"ok": True, "source": self.name, "last_seq": len(self.shipped), "capture": {"method": "trigger"}}

    async def subquery(self, q: Subquery) -> SubqueryAnswer:
        if self.delays.before_snapshot:
            await asyncio.sleep(self.rng.uniform(0, self.delays.before_snapshot))
        async with self._lock:
            snapshot = await self._ship_locked(q.relation)
            watermark = len(self.shipped)
            if self.past is not None and q.at_least is not None and self.past.random() < 0.5:
                # a standing snapshot: any exact state from ``at_least`` on, all of it shipped
                assert q.at_least <= watermark, (q.at_least, watermark)
                lowest = 0 if self.floor_ignored else q.at_least
                older = lowest if self.past.random() < 0.5 else self.past.randint(lowest, watermark)  # the edge, often
                self.past_answers += older < watermark
                watermark, snapshot = older, self.state_at(older)[q.relation]
        if self.delays.evaluation:
            await asyncio.sleep(self.rng.uniform(0, self.delays.evaluation))
        if self.trace is not None:
            keys = tuple(tuple(k) for k in q.keys)
            self.trace.append((asyncio.get_running_loop().time(), self.name, q.relation, keys, watermark))
        return SubqueryAnswer(watermark=watermark, rows=evaluate(q, self.tables[q.relation], snapshot))

    async def aclose(self) -> None:
        pass

    def state_at(self, seq: int) -> dict[str, ZSet]:
        """The contents after exactly the shipped updates 1..seq."""
        out = {t: self.initial[t].copy() if t in self.initial else ZSet() for t in self.tables}
        for changes in self.shipped[:seq]:
            for table, sign, row in changes:
                out[table].add(row, sign)
        return out


def evaluate(q: Subquery, columns: tuple[str, ...], contents: ZSet) -> list[list]:
    """What a source computes for a subquery, by brute force over its contents."""
    key_cols = [expr.Col("$key", f"k{i}") for i in range(len(q.keys[0]) if q.keys else 0)]
    rel_cols = [expr.Col(q.alias, c) for c in columns]
    layout = {c: i for i, c in enumerate(key_cols + rel_cols)}
    on = expr.compile_filter(expr.from_wire(q.on) if q.on else None, layout)
    where = expr.compile_filter(expr.from_wire(q.where) if q.where else None, layout)
    select = [columns.index(c) for c in q.select]
    out = ZSet()
    for k, key in enumerate(q.keys):
        for row, weight in contents.items():
            joined = tuple(key) + row
            if where(joined) and on(joined):
                out.add((k, *(row[i] for i in select)), weight)
    return [[*row, w] for row, w in out.items()]


class WithoutCompensation(ViewProtocol):
    """PVM broken on purpose: answers are never compensated (isConcurrent always false)."""

    def concurrent_deltas(self, unit: Unit, term: int, position: int, source: str, watermark: int) -> list[ZSet]:
        return []

    def concurrent_logged(self, unit: Unit, term: int, position: int, source: str, watermark: int) -> list[ViewUpdate]:
        return []


class WithoutLoggedCompensation(ViewProtocol):
    """PVM broken on purpose: answers never subtract the updates whose deltas are kept in
    the update log only (``ViewUpdate.logged``), only those held in memory."""

    def concurrent_logged(self, unit: Unit, term: int, position: int, source: str, watermark: int) -> list[ViewUpdate]:
        return []


class WithoutSpilledCompensation(ViewProtocol):
    """PVM broken on purpose: answers never subtract the queued updates spilled to the
    update log (those past the queue budget), only those in memory."""

    def spilled_range(self, source: str, watermark: int) -> None:
        return None


class WithoutChainRule(ViewProtocol):
    """PVM broken on purpose: a unit's own deltas are never subtracted from its answers, so
    for a unit changing positions j < k (a self-join's two aliases) both terms see the other's
    delta, and ΔR_j ⋈ ΔR_k is counted twice."""

    def concurrent_deltas(self, unit: Unit, term: int, position: int, source: str, watermark: int) -> list[ZSet]:
        return super().concurrent_deltas(unit, 10**9, position, source, watermark)  # every position "earlier"


class WithoutRetention(ViewProtocol):
    """PVM broken on purpose: a finished unit leaves at once, never kept in the RPU for the
    earlier units still running to compensate with."""

    def finish(self, unit: Unit) -> None:
        super().finish(unit)
        if self.rpu.pop(unit.order, None) is not None:
            self.live.discard(unit.updates)


async def start_sim_manager(
    catalog_path,
    tables: dict[str, dict[str, tuple[str, ...]]],
    store=None,
    protocol=None,
    seed: int = 0,
    delays: Delays | None = None,
    sources: dict[str, SimSource] | None = None,
    catalog_url: str | None = None,
    trace: list[tuple] | None = None,
    **options,
):
    """A manager over in-process sources (new ones, or ``sources`` after a restart); the
    catalog is an SQLite file at ``catalog_path`` unless ``catalog_url`` names a database.
    ``trace``: where new sources record their answers; ``options`` go to the Manager."""
    from warehouse.manager import Manager
    from warehouse.store.memory import MemoryStore

    rng = random.Random(seed)
    sources = sources or {
        name: SimSource(name, t, random.Random(rng.random()), delays or Delays(), trace=trace)
        for name, t in tables.items()
    }
    for s in sources.values():
        s.receive = _unavailable
    manager = Manager(
        catalog_url or f"sqlite:///{catalog_path}",
        store or MemoryStore(),
        connect=lambda n, u: sources[n],
        **({"protocol": protocol} if protocol is not None else {}),
        **options,
    )
    await manager.start()
    for s in sources.values():
        s.receive = manager.receive
        if s.name not in manager.clients:
            await manager.add_source(s.name, f"sim://{s.name}")
    return manager, sources


async def _unavailable(source, updates):
    raise ConnectionError("the manager is not started yet")
