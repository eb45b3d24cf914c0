"""The order of a ViewChange's subqueries and the order in which a source admits them.

SWEEP's order, except that a relation sharing no join predicate with the partial result is
never joined while one that does is left; and a source with more subqueries waiting than it
answers at once serves the oldest maintenance unit first."""

from __future__ import annotations

import asyncio

from contract.schemas import Subquery, SubqueryAnswer
from contract.zset import ZSet
from warehouse.plan import ViewPlan
from warehouse.protocol import ViewProtocol, ViewUpdate
from warehouse.sql_views import parse_view
from warehouse.view_change import ViewChange
from wrappers.priority import PriorityLimiter

CHAIN = "SELECT R1.A AS a1, R2.A AS a2, R3.A AS a3 FROM s1.R1, s2.R2, s3.R3 WHERE R1.A = R2.B AND R2.A = R3.B"
# a star whose centre c is not between its points in FROM order: SWEEP's fixed order would
# join a's delta with b first, a cross product
STAR = "SELECT a.x, b.x AS bx, d.x AS dx FROM s1.a, s2.b, s3.c, s4.d WHERE a.k = c.k AND b.k = c.k AND c.k = d.k"


def plan_of(sql: str) -> ViewPlan:
    return parse_view(sql, lambda source, table: ("A", "B") if table.startswith("R") else ("k", "x"), "v")


def test_a_chain_is_swept_in_sweeps_order() -> None:
    plan = plan_of(CHAIN)
    assert [s.relation for s in plan.sweep(1)] == [0, 2]
    assert [s.relation for s in plan.sweep(2)] == [1, 0]
    assert [s.relation for s in plan.sweep(None)] == [0, 1, 2]


def test_a_star_is_never_joined_without_a_predicate() -> None:
    plan = plan_of(STAR)
    assert [r.alias for r in plan.relations] == ["a", "b", "c", "d"]  # not a path: FROM order kept
    for changed in range(4):
        steps = plan.sweep(changed)
        assert sorted(s.relation for s in steps) == sorted(set(range(4)) - {changed})
        assert all(s.on is not None and s.keys for s in steps), (changed, steps)
    initial = plan.sweep(None)  # the whole relations: a cross product would be the largest
    assert all(s.on is not None and s.keys for s in initial[1:]), initial
    assert [s.relation for s in plan.sweep(0)] == [2, 1, 3]  # the centre first, then SWEEP's order


class RecordingSource:
    """Answers every subquery with one matching row per key and records its priority."""

    def __init__(self, priorities: list[float]) -> None:
        self.priorities = priorities

    async def subquery(self, request: Subquery) -> SubqueryAnswer:
        self.priorities.append(request.priority)
        await asyncio.sleep(0)
        rows = [[i, *([key[0]] * len(request.select)), 1] for i, key in enumerate(request.keys)]
        return SubqueryAnswer(watermark=0, rows=rows)


def test_every_subquery_of_a_unit_carries_the_units_start_as_priority() -> None:
    async def run() -> tuple[list[float], ZSet, ZSet]:
        priorities: list[float] = []
        plan = plan_of(CHAIN)
        protocol = ViewProtocol(parallelism=2)
        protocol.receive(ViewUpdate(1, "s2", 1, {1: ZSet({(7, 7): 1})}))
        protocol.receive(ViewUpdate(2, "s1", 1, {0: ZSet({(7,): 1})}))
        sources = {s: RecordingSource(priorities) for s in ("s1", "s2", "s3")}
        change = ViewChange(plan, protocol, sources)
        first, _ = await change.run(protocol.start())
        await asyncio.sleep(0.01)
        second, _ = await change.run(protocol.start())
        return priorities, first, second

    priorities, first, second = asyncio.run(run())
    assert len(priorities) == 4 and priorities[0] == priorities[1] < priorities[2] == priorities[3]
    assert first == ZSet({(7, 7, 7): 1}) and second == ZSet({(7, 7, 7): 1})


def test_a_busy_source_admits_the_oldest_unit_first() -> None:
    async def run() -> list[str]:
        gate, served = PriorityLimiter(1), []

        async def ask(name: str, priority: float, delay: float) -> None:
            await asyncio.sleep(delay)
            async with gate.admit(priority):
                served.append(name)
                await asyncio.sleep(0.02)

        await asyncio.gather(
            ask("running", 5.0, 0), ask("young", 9.0, 0.001), ask("old", 1.0, 0.002), ask("middle", 4.0, 0.003)
        )
        return served

    assert asyncio.run(run()) == ["running", "old", "middle", "young"]


def test_a_cancelled_waiter_gives_its_turn_away() -> None:
    async def run() -> list[str]:
        gate, served = PriorityLimiter(1), []

        async def ask(name: str, priority: float) -> None:
            async with gate.admit(priority):
                served.append(name)
                await asyncio.sleep(0.02)

        holder = asyncio.create_task(ask("holder", 0))
        await asyncio.sleep(0.001)
        cancelled = asyncio.create_task(ask("cancelled", 1))
        waiting = asyncio.create_task(ask("waiting", 2))
        await asyncio.sleep(0.001)
        cancelled.cancel()
        await asyncio.gather(holder, waiting, return_exceptions=True)
        async with gate.admit(3):  # the slot came back: nothing is leaked
            served.append("after")
        return served

    assert asyncio.run(run()) == ["holder", "waiting", "after"]
