"""ViewChange: compute the effect of one maintenance unit with SWEEP and local compensation.

For every chain-rule term of the unit (a changed relation, or the initial load) the partial
result starts as the relation's delta and is joined with the other relations one subquery
at a time in SWEEP order. When an answer arrives, the protocol names the updates it
reflects that are ordered after this term; ``partial ⋈ ΔR`` of each is subtracted
(ProcessSubQuery in the paper's Fig. 14), as one join with the sum of their deltas. Terms
of one unit run concurrently: each one's compensation is exact on its own, so their sum is
the unit's effect.

Every subquery carries the time its unit started as its priority: a source with more
subqueries waiting than it answers at once serves the oldest unit first
(``wrappers.priority``).

A step whose partial result has more distinct keys than ``KEYS_PER_SUBQUERY`` is asked in
parts (``join.key_chunks``), one after the other: each part is a subquery of its own, with
its own snapshot and watermark, and is compensated against its own watermark. The parts
share no key, so the sum of their exact joins is the step's exact join; no key list is ever
too long for the wire, and a source never holds one huge request.

A view with a LEFT JOIN adds its NULL-extended rows from partner counts taken in the same
compensated states (``warehouse.outer_join``; docs/protocol.md, "Outer joins"): the step
asking the right relation counts each key's partners too, and the right relation's own term
asks the counts of the keys its delta touches.

In the Spark store the initial load does not run here but in the store's engine
(``warehouse.engine_load``), with the same compensation: ``initial_load``.

A unit whose deltas hold more than ``part_rows`` rows (``unit_parts.PART_ROWS`` unless the
manager is given another bound) is swept in parts, one part of one term at a time, and each
part's effect goes to the store at once (``parts``, ``warehouse.unit_parts``): the unit's
effect is then empty, and its commit only records the order. A view with a LEFT JOIN is
swept whole: its NULL-extended rows depend on every row of a key's delta at once. A unit
with updates whose deltas are in the log only (``ViewUpdate.logged``) spools them to disk by
part first (``warehouse.part_spool``), and answers subtract such updates read from the log:
no delta is held whole (docs/protocol.md, "Updates left in the log").
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from contract import expr
from contract.schemas import KEY_RELATION, Subquery, SubqueryAnswer
from contract.zset import ZSet, total
from warehouse import outer_join, unit_parts
from warehouse.engine_load import EngineLoad
from warehouse.join import distinct_keys, extend, key_chunks, key_function, local_join, matching
from warehouse.part_spool import Spool
from warehouse.plan import SweepStep, ViewPlan
from warehouse.protocol import INITIAL_TERM, Unit, ViewProtocol
from warehouse.sources import SourceClient, SourceError
from warehouse.spill import SpillLog, deltas_from_log

T = TypeVar("T")

KEYS_PER_SUBQUERY = 20_000
"""The most keys one subquery ships (the wire takes ``MAX_SUBQUERY_KEYS``): a larger step is
asked in parts, so a request and its answer stay a size a source and the manager handle
in one piece."""


@dataclass
class ChangeStats:
    """What maintaining one unit cost; summed into the view's counters."""

    subqueries: int = 0
    compensations: int = 0
    compensations_from_log: int = 0  # of them, spilled updates read from the update log
    parts: int = 0  # parts swept and stored (0: the unit was swept whole, or its parts were stored before)
    subquery_seconds: dict[str, list[float]] = field(default_factory=dict)


class PartSink(Protocol):
    """Where a unit swept in parts puts each part's effect: the view's store, under the
    unit's order (``store.base.PartStore``)."""

    async def keep(self, order: int, parts: Collection[str]) -> set[str]:
        """Of ``parts``, those of ``order`` stored already; stored parts of it under other
        names are dropped."""
        ...

    async def put(self, order: int, part: str, effect: ZSet) -> None:
        """Store ``effect`` (the view's rows) as part ``part`` of ``order``."""
        ...


class TakePart(Protocol):
    """Part ``index`` of term ``term``'s delta, taken once, when it is swept."""

    def __call__(self, term: int, index: int) -> Awaitable[ZSet]: ...


def _held_parts(deltas: dict[int, ZSet], counts: Mapping[int, int]) -> TakePart:
    """``TakePart`` of deltas held in memory: each term's delta (taken out of ``deltas``)
    cut when its first part is taken, held as its parts only, each part no longer than
    its sweep."""
    pieces: dict[int, list[ZSet]] = {}

    async def take(term: int, index: int) -> ZSet:
        if term not in pieces:
            pieces.clear()
            pieces[term] = unit_parts.cut(deltas.pop(term), counts[term])
        piece, pieces[term][index] = pieces[term][index], ZSet()
        return piece

    return take


class ViewChange:
    def __init__(
        self,
        plan: ViewPlan,
        protocol: ViewProtocol,
        sources: Mapping[str, SourceClient],
        spill_log: SpillLog | None = None,
    ) -> None:
        """``spill_log``: where spilled queued updates are read from, to subtract them."""
        self.plan = plan
        self.protocol = protocol
        self.sources = sources
        self.spill_log = spill_log
        self.initial_load: EngineLoad | None = None  # set where the store joins the load itself
        self.parts: PartSink | None = None  # set where a large unit's effect is stored in parts
        self.part_rows = unit_parts.PART_ROWS  # the most delta rows swept at once, with ``parts``
        self.executor: Executor | None = None  # runs a spool's file I/O (None: the loop's threads)
        self.floor: Callable[[str], int] | None = None
        """Each source's seq that every answer to a unit starting now must reflect (the
        updates the manager has released, and the view's bases); None: subqueries carry no
        ``at_least``, and are answered in a snapshot taken after they arrive."""
        self._floors: dict[int, dict[str, int]] = {}  # by unit order, while it runs

    @property
    def sweeps_in_parts(self) -> bool:
        """Whether a unit larger than ``part_rows`` is swept in parts: where the store takes
        parts, and the view has no LEFT JOIN (a key's NULL-extended rows depend on all of
        its delta). Only such a view's updates may keep their deltas in the log
        (``ViewUpdate.logged``)."""
        return self.parts is not None and self.plan.outer is None

    async def run(self, unit: Unit, again: bool = False) -> tuple[ZSet, ChangeStats]:
        """The unit's effect, and what computing it cost. ``again``: the unit ran before (a
        restart, or a fault that set it aside), so parts of it may be stored: a run in parts
        skips them, a whole run drops them (its effect, empty perhaps, replaces them)."""
        stats = ChangeStats()
        if unit.initial and self.initial_load is not None:
            effect, stats.compensations, stats.compensations_from_log = await self.initial_load.run(unit)
            return effect, stats
        if not unit.initial and self.floor is not None:
            self._floors[unit.order] = {s: self.floor(s) for s in self.plan.sources}
        try:
            return await self._run(unit, again, stats)
        finally:
            self._floors.pop(unit.order, None)

    async def _run(self, unit: Unit, again: bool, stats: ChangeStats) -> tuple[ZSet, ChangeStats]:
        started = time.time()
        if unit.logged:
            assert self.sweeps_in_parts, "only a view that sweeps in parts leaves deltas in the log"
            await self._run_logged_in_parts(unit, started, stats)
            return ZSet(), stats
        deltas = self._deltas_in_parts(unit)
        if deltas:
            counts = {term: unit_parts.part_count(len(delta), self.part_rows) for term, delta in deltas.items()}
            await self._run_in_parts(unit, counts, _held_parts(deltas, counts), started, stats)
            return ZSet(), stats
        if again and self.parts is not None and not unit.initial:
            await self.parts.keep(unit.order, ())  # cut into parts before (a larger part bound then)
        effects = await asyncio.gather(*(self._sweep(unit, term, started, stats) for term in unit.terms()))
        return total(effects), stats

    def _deltas_in_parts(self, unit: Unit) -> dict[int, ZSet]:
        """Each term's delta if ``unit`` is swept in parts; empty if whole."""
        if not self.sweeps_in_parts or unit.initial:
            return {}
        most = self.part_rows
        if sum(u.rows() for u in unit.updates) <= most:
            return {}  # the deltas' sum has no more rows than its summands: whole
        deltas = {term: unit.delta(term) for term in unit.terms()}
        return deltas if sum(map(len, deltas.values())) > most else {}

    async def _run_logged_in_parts(self, unit: Unit, started: float, stats: ChangeStats) -> None:
        """Sweep a unit with updates whose deltas are in the log only: each term's rows, held
        or read from the log a part of it at a time, are spooled to disk by part
        (``warehouse.part_spool``), and swept a part at a time. The parts are counted from
        the updates' row counts (not merged: no sum is ever held), and nothing is spooled
        when the store holds every part already."""
        rows: dict[int, int] = {}
        for u in unit.updates:
            for term in u.positions():
                rows[term] = rows.get(term, 0) + (u.logged[term] if u.logged is not None else len(u.deltas[term]))
        counts = {term: unit_parts.part_count(n, self.part_rows) for term, n in rows.items()}
        with tempfile.TemporaryDirectory(prefix="pvm-unit-parts-") as directory:
            spools: dict[int, Spool] = {}

            async def take(term: int, index: int) -> ZSet:
                if not spools:
                    spools.update(await self._spool(unit, counts, Path(directory)))
                return await self._off_loop(spools[term].part, index)

            await self._run_in_parts(unit, counts, take, started, stats)

    async def _spool(self, unit: Unit, counts: dict[int, int], directory: Path) -> dict[int, Spool]:
        """Every term's rows of ``unit`` on disk, by part: one pass over each logged update."""
        spools = {}
        for term, count in counts.items():
            (directory / f"t{term}").mkdir()
            spools[term] = Spool(directory / f"t{term}", count)
        assert self.spill_log is not None, "updates were left in the log without a log to read them from"
        for u in unit.updates:
            if u.logged is None:
                for term, delta in u.deltas.items():
                    await self._off_loop(spools[term].add, delta)
                continue
            async for deltas in self.spill_log.logged(u):
                for term, delta in deltas.items():
                    await self._off_loop(spools[term].add, delta)
        return spools

    async def _off_loop(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def _run_in_parts(
        self, unit: Unit, counts: dict[int, int], take: TakePart, started: float, stats: ChangeStats
    ) -> None:
        """Sweep each term's delta (``counts`` parts of it, each from ``take``) part by part,
        one part at a time, and store each part's effect; the parts the store holds already
        (a run before a fault or a restart) are skipped, and any other stored part of the
        unit's order is dropped."""
        assert self.parts is not None
        stored = await self.parts.keep(unit.order, unit_parts.names(sorted(counts.items())))
        for term, count in sorted(counts.items()):
            for index in range(count):
                name = unit_parts.part_name(term, index, count)
                if name not in stored:
                    piece = await take(term, index)
                    await self.parts.put(unit.order, name, await self._sweep(unit, term, started, stats, piece))
                    stats.parts += 1

    async def _sweep(
        self, unit: Unit, term: int, started: float, stats: ChangeStats, delta: ZSet | None = None
    ) -> ZSet:
        """Term ``term``'s share of the unit's effect: for ``delta``, a part of the term's
        delta, if given."""
        changed = None if term == INITIAL_TERM else term
        partial = ZSet.unit() if changed is None else delta if delta is not None else unit.delta(changed)
        for i, step in enumerate(self.plan.sweep(changed)):
            if not partial:
                return ZSet()
            if step.relation == self.plan.outer:  # the last step of a left term: whole left rows
                partial = await self._outer_step(unit, term, step, partial, started, stats)
            else:
                partial = await self._process_subquery(unit, term, step, partial, started, stats)
            if i == 0 and changed is not None and changed == self.plan.outer:
                partial.add_all(await self._flipped_left_rows(unit, term, step, partial, started, stats))
        return partial.map_rows(self.plan.projection(changed))

    async def _outer_step(
        self, unit: Unit, term: int, step: SweepStep, partial: ZSet, priority: float, stats: ChangeStats
    ) -> ZSet:
        """``partial ⟕ S``: the inner join, plus the rows of ``partial`` whose key has no
        partner in S's state before the term, extended with NULLs."""
        partners: dict[tuple, int] = {}
        result = await self._process_subquery(unit, term, step, partial, priority, stats, partners)
        result.add_all(outer_join.null_extend(partial, step, partners, len(self.plan.relations[step.relation].columns)))
        return result

    async def _flipped_left_rows(
        self, unit: Unit, term: int, step: SweepStep, joined: ZSet, priority: float, stats: ChangeStats
    ) -> ZSet:
        """For a change ΔS of an outer join's right relation, after its first step (``joined``
        is ``ΔS ⋈ Left``): the NULL-extended left rows that appear or go, because their key's
        partner count falls to 0 or rises from it. The counts after the term are asked (the
        unit's own ΔS kept, as for any relation of a term at or before its own position);
        ΔS's own counts give those before."""
        count = self.plan.partner_step
        layout = step.layout + self.plan.relations[step.relation].cols()
        key = key_function(SweepStep(step.relation, layout, count.keys, None))
        keys = list(dict.fromkeys(key(row) for row in joined.rows()))
        if not keys:
            return ZSet()
        delta = unit.delta(term)
        after: dict[tuple, int] = {}
        for start in range(0, len(keys), KEYS_PER_SUBQUERY):
            after.update(await self._ask_counts(unit, term, keys[start : start + KEYS_PER_SUBQUERY], priority, stats))
        own = outer_join.local_counts(keys, count, self.plan.relations[term].cols(), delta)
        return outer_join.left_rows(joined, delta, key, outer_join.flips(after, own))

    async def _ask_counts(
        self, unit: Unit, term: int, keys: list[tuple], priority: float, stats: ChangeStats
    ) -> dict[tuple, int]:
        """The partner counts of ``keys`` in the outer relation, compensated against the
        answer's watermark: a subquery selecting no column, answered with one count per key."""
        step = self.plan.partner_step
        relation = self.plan.relations[step.relation]
        answer = await self._answer(unit, step, keys, priority, stats, select=())
        undone = await self._undone(unit, term, step, None, answer.watermark, stats)
        return outer_join.count_partners(keys, _answer_rows(answer, len(keys), 0), step, relation.cols(), undone)

    async def _process_subquery(
        self,
        unit: Unit,
        term: int,
        step: SweepStep,
        partial: ZSet,
        priority: float,
        stats: ChangeStats,
        partners: dict[tuple, int] | None = None,
    ) -> ZSet:
        """``partial ⋈ R`` of one step, compensated; with ``partners``, also the partner
        count of each key of ``partial`` in the same compensated state (an outer join's)."""
        keys = distinct_keys(partial, step)
        if len(keys) <= KEYS_PER_SUBQUERY:
            return await self._ask(unit, term, step, partial, keys, priority, stats, partners)
        result = ZSet()
        for part, part_keys in key_chunks(partial, step, KEYS_PER_SUBQUERY):
            result.add_all(await self._ask(unit, term, step, part, part_keys, priority, stats, partners))
        return result

    async def _ask(
        self,
        unit: Unit,
        term: int,
        step: SweepStep,
        partial: ZSet,
        keys: list[tuple],
        priority: float,
        stats: ChangeStats,
        partners: dict[tuple, int] | None = None,
    ) -> ZSet:
        """``partial ⋈ R`` for one subquery of ``keys`` (every key of ``partial``), compensated
        against its answer's watermark; with ``partners``, the keys' partner counts too."""
        relation = self.plan.relations[step.relation]
        answer = await self._answer(unit, step, keys, priority, stats, relation.columns)
        rows = list(_answer_rows(answer, len(keys), len(relation.columns)))
        result = extend(partial, step, keys, rows)
        undone = await self._undone(unit, term, step, partial, answer.watermark, stats)
        if undone is not None:
            # Σ (partial ⋈ ΔR_k) = partial ⋈ Σ ΔR_k: one join, however many updates it undoes
            result.add_all(local_join(partial, step, undone, relation.cols()), -1)
        if partners is not None:
            partners.update(outer_join.count_partners(keys, rows, self.plan.partner_step, relation.cols(), undone))
        return result

    async def _undone(
        self, unit: Unit, term: int, step: SweepStep, partial: ZSet | None, watermark: int, stats: ChangeStats
    ) -> ZSet | None:
        """The sum of the deltas of ``step``'s relation that an answer with ``watermark``
        reflects and term ``term`` of ``unit`` must not (None: none): queued or numbered
        ones from memory, spilled ones and those kept in the log only
        (``ViewUpdate.logged``) from the update log. All are named at the instant the answer
        arrived, before anything is read. Of those read from the log only the rows that
        join ``partial`` are kept (all with ``partial`` None), so a long spilled tail or a
        huge update costs reading, not memory."""
        relation = self.plan.relations[step.relation]
        concurrent = self.protocol.concurrent_deltas(unit, term, step.relation, relation.source, watermark)
        logged = self.protocol.concurrent_logged(unit, term, step.relation, relation.source, watermark)
        spilled = self.protocol.spilled_range(relation.source, watermark)
        stats.compensations += len(concurrent)
        undone = total(concurrent) if concurrent else None
        if spilled is None and not logged:
            return undone
        assert self.spill_log is not None, "updates were spilled without a log to read them from"
        undone = undone if undone is not None else ZSet()
        async for read, updates in deltas_from_log(self.spill_log, step.relation, spilled, logged):
            stats.compensations += updates
            stats.compensations_from_log += updates
            if read:
                undone.add_all(read if partial is None else matching(partial, step, read, relation.cols()))
        return undone or None

    async def _answer(
        self,
        unit: Unit,
        step: SweepStep,
        keys: list[tuple],
        priority: float,
        stats: ChangeStats,
        select: tuple[str, ...],
    ) -> SubqueryAnswer:
        relation = self.plan.relations[step.relation]
        started = time.perf_counter()
        # Every update ordered before the unit was released before it started, or is in
        # the view's bases: an answer whose watermark reaches the floor of then reflects
        # all of them, and compensation subtracts what it reflects of the later ones
        # (docs/protocol.md, "Answers from a standing snapshot").
        floor = self._floors.get(unit.order, {}).get(relation.source)
        request = self._request(step, keys, priority, select, floor)
        answer = await self.sources[relation.source].subquery(request)
        stats.subqueries += 1
        stats.subquery_seconds.setdefault(relation.source, []).append(time.perf_counter() - started)
        return answer

    def _request(
        self, step: SweepStep, keys: list[tuple], priority: float, select: tuple[str, ...], at_least: int | None
    ) -> Subquery:
        relation = self.plan.relations[step.relation]
        shipped = {col: expr.Col(KEY_RELATION, f"k{i}") for i, col in enumerate(step.keys)}
        on = expr.substitute(step.on, shipped) if step.on is not None else None
        return Subquery(
            relation=relation.table,
            alias=relation.alias,
            keys=[list(k) for k in keys],
            on=expr.to_wire(on) if on is not None else None,
            where=expr.to_wire(relation.where) if relation.where is not None else None,
            select=list(select),
            priority=priority,
            at_least=at_least,
        )


def _answer_rows(answer: SubqueryAnswer, n_keys: int, n_columns: int):
    for row in answer.rows:
        if len(row) != n_columns + 2 or not (0 <= row[0] < n_keys):
            raise SourceError(f"malformed subquery answer row {row!r}")
        yield int(row[0]), tuple(row[1:-1]), int(row[-1])
