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

In the Spark store the initial load does not run here but in the store's engine
(``warehouse.engine_load``), with the same compensation: ``initial_load``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from contract import expr
from contract.schemas import KEY_RELATION, Subquery, SubqueryAnswer
from contract.zset import ZSet, total
from warehouse.engine_load import EngineLoad
from warehouse.join import distinct_keys, extend, key_chunks, local_join
from warehouse.plan import SweepStep, ViewPlan
from warehouse.protocol import INITIAL_TERM, Unit, ViewProtocol
from warehouse.sources import SourceClient, SourceError

KEYS_PER_SUBQUERY = 20_000
"""The most keys one subquery ships (the wire takes ``MAX_SUBQUERY_KEYS``): a larger step is
asked in parts, so a request and its answer stay a size a source and the manager handle
in one piece."""


@dataclass
class ChangeStats:
    """What maintaining one unit cost; summed into the view's counters."""

    subqueries: int = 0
    compensations: int = 0
    subquery_seconds: dict[str, list[float]] = field(default_factory=dict)


class ViewChange:
    def __init__(self, plan: ViewPlan, protocol: ViewProtocol, sources: Mapping[str, SourceClient]) -> None:
        self.plan = plan
        self.protocol = protocol
        self.sources = sources
        self.initial_load: EngineLoad | None = None  # set where the store joins the load itself

    async def run(self, unit: Unit) -> tuple[ZSet, ChangeStats]:
        stats = ChangeStats()
        if unit.initial and self.initial_load is not None:
            effect, stats.compensations = await self.initial_load.run(unit)
            return effect, stats
        started = time.time()
        effects = await asyncio.gather(*(self._sweep(unit, term, started, stats) for term in unit.terms()))
        return total(effects), stats

    async def _sweep(self, unit: Unit, term: int, started: float, stats: ChangeStats) -> ZSet:
        changed = None if term == INITIAL_TERM else term
        partial = ZSet.unit() if changed is None else unit.delta(changed)
        for step in self.plan.sweep(changed):
            if not partial:
                return ZSet()
            partial = await self._process_subquery(unit, term, step, partial, started, stats)
        return partial.map_rows(self.plan.projection(changed))

    async def _process_subquery(
        self, unit: Unit, term: int, step: SweepStep, partial: ZSet, priority: float, stats: ChangeStats
    ) -> ZSet:
        keys = distinct_keys(partial, step)
        if len(keys) <= KEYS_PER_SUBQUERY:
            return await self._ask(unit, term, step, partial, keys, priority, stats)
        result = ZSet()
        for part, part_keys in key_chunks(partial, step, KEYS_PER_SUBQUERY):
            result.add_all(await self._ask(unit, term, step, part, part_keys, priority, stats))
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
    ) -> ZSet:
        """``partial ⋈ R`` for one subquery of ``keys`` (every key of ``partial``), compensated
        against its answer's watermark."""
        relation = self.plan.relations[step.relation]
        started = time.perf_counter()
        answer = await self.sources[relation.source].subquery(self._request(step, keys, priority))
        stats.subqueries += 1
        stats.subquery_seconds.setdefault(relation.source, []).append(time.perf_counter() - started)
        result = extend(partial, step, keys, _answer_rows(answer, len(keys), len(relation.columns)))
        concurrent = self.protocol.concurrent_deltas(unit, term, step.relation, relation.source, answer.watermark)
        if concurrent:
            # Σ (partial ⋈ ΔR_k) = partial ⋈ Σ ΔR_k: one join, however many updates it undoes
            result.add_all(local_join(partial, step, total(concurrent), relation.cols()), -1)
            stats.compensations += len(concurrent)
        return result

    def _request(self, step: SweepStep, keys: list[tuple], priority: float) -> Subquery:
        relation = self.plan.relations[step.relation]
        shipped = {col: expr.Col(KEY_RELATION, f"k{i}") for i, col in enumerate(step.keys)}
        on = expr.substitute(step.on, shipped) if step.on is not None else None
        return Subquery(
            relation=relation.table,
            alias=relation.alias,
            keys=[list(k) for k in keys],
            on=expr.to_wire(on) if on is not None else None,
            where=expr.to_wire(relation.where) if relation.where is not None else None,
            select=list(relation.columns),
            priority=priority,
        )


def _answer_rows(answer: SubqueryAnswer, n_keys: int, n_columns: int):
    for row in answer.rows:
        if len(row) != n_columns + 2 or not (0 <= row[0] < n_keys):
            raise SourceError(f"malformed subquery answer row {row!r}")
        yield int(row[0]), tuple(row[1:-1]), int(row[-1])
