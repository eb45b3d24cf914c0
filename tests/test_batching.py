"""Adaptive batching (warehouse/batching.py) as the protocol applies it: one update per unit
at low load, sets under a backlog, Park's measured crossover in between, and a lag that stays
bounded where one update per unit falls behind.

The load is simulated in discrete events over ``ViewProtocol`` alone: updates of one source
arrive at a fixed rate, ``parallelism`` units run at once, and a unit of ``k`` updates takes
``fixed + per_update * k`` seconds (a round trip per subquery, then work per key), which the
protocol is told as the maintainer tells it."""

from __future__ import annotations

import heapq
import math

import pytest

from contract.zset import ZSet
from warehouse.batching import MAX_CROSSOVER, SourceCosts, unit_size
from warehouse.protocol import DEFAULT_BATCH_SIZE, Unit, ViewProtocol, ViewUpdate


def update(seq: int, at: float = 0.0, source: str = "s") -> ViewUpdate:
    return ViewUpdate(seq, source, seq, {0: ZSet({(seq,): 1})}, received_at=at)


def simulate(rate: float, seconds: float, batch_size: int, fixed: float = 0.02, per_update: float = 0.001) -> dict:
    """Run the load; the largest queue, the largest lag (arrival to end of its unit) and the
    mean unit size."""
    protocol = ViewProtocol(parallelism=4, batch_size=batch_size)
    events: list[tuple[float, int, int]] = []  # (time, kind: 0 finish, 1 arrival, order or seq)
    total = int(rate * seconds)
    for seq in range(1, total + 1):
        heapq.heappush(events, (seq / rate, 1, seq))
    arrived: dict[int, float] = {}
    running: dict[int, tuple[Unit, float]] = {}
    peak_queue, worst_lag, sizes = 0, 0.0, []
    while events:
        now, kind, key = heapq.heappop(events)
        if kind == 1:
            arrived[key] = now
            protocol.receive(update(key, now))
        else:
            unit, began = running.pop(key)
            protocol.measured(unit, now - began)
            protocol.finish(unit)
            worst_lag = max(worst_lag, max(now - arrived.pop(u.seq) for u in unit.updates))
        while protocol.can_start():
            unit = protocol.start()
            sizes.append(len(unit.updates))
            running[unit.order] = (unit, now)
            heapq.heappush(events, (now + fixed + per_update * len(unit.updates), 0, unit.order))
        peak_queue = max(peak_queue, len(protocol.umq))
    assert not arrived and protocol.quiet
    return {"peak_queue": peak_queue, "worst_lag": worst_lag, "mean_size": sum(sizes) / len(sizes)}


def test_low_load_runs_one_update_per_unit():
    """Below what single units clear (4 slots / 21 ms = 190/s) every unit is one update."""
    quiet = simulate(rate=50, seconds=4, batch_size=DEFAULT_BATCH_SIZE)
    assert quiet["mean_size"] == 1.0
    assert quiet["worst_lag"] < 0.05


def test_a_load_single_units_cannot_clear_stays_bounded():
    """At 400 updates/s single units fall further behind every second; the default batches
    the backlog and its lag stays near one unit's time."""
    singles = simulate(rate=400, seconds=6, batch_size=1)
    adaptive = simulate(rate=400, seconds=6, batch_size=DEFAULT_BATCH_SIZE)
    assert singles["worst_lag"] > 3.0  # growing: (400 - 190) * 6 updates behind at the end
    assert adaptive["worst_lag"] < 0.2
    assert adaptive["peak_queue"] < 50
    assert adaptive["mean_size"] > 1.5


def test_the_cap_bounds_a_set():
    capped = simulate(rate=400, seconds=2, batch_size=3)
    assert 1 < capped["mean_size"] <= 3


def test_measured_crossover_keeps_small_backlogs_one_per_unit():
    """Sets that cost more per update than the round trip they save: a backlog of 1.5 updates
    per free slot stays one per unit, though the prior would have made sets of 2."""
    protocol = ViewProtocol(parallelism=4, batch_size=DEFAULT_BATCH_SIZE)
    for seq in range(1, 7):
        protocol.receive(update(seq))
    assert protocol.batch("s") == 2  # the prior: any set beats its updates one by one
    for size, seconds in [(1, 0.020)] * 3 + [(4, 0.046), (16, 0.094), (64, 0.286)]:
        protocol.measured(Unit(0, tuple(update(100 + i) for i in range(size))), seconds)
    assert protocol.costs["s"].crossover() == pytest.approx(1.875)
    assert protocol.batch("s") == 1
    for seq in range(7, 41):  # 40 queued: 10 per free slot, beyond the crossover
        protocol.receive(update(seq))
    assert protocol.batch("s") == 10


def test_sets_dearer_than_single_updates_are_made_only_for_a_deep_backlog():
    """Sets measured dearer per update: a moderate backlog runs one update per unit, a deep
    one still in sets, which measure sets again and so can revise the verdict."""
    costs = SourceCosts()
    for size, seconds in [(1, 0.010)] * 3 + [(4, 0.060), (16, 0.240)]:
        costs.observe(size, seconds)
    assert costs.crossover() == MAX_CROSSOVER
    assert unit_size(queued=30, free_slots=1, crossover=costs.crossover(), cap=1000) == 1
    assert unit_size(queued=400, free_slots=1, crossover=costs.crossover(), cap=1000) == 400
    for _ in range(100):  # the sets, measured again, turn out cheap after all
        costs.observe(400, 0.5)
        costs.observe(100, 0.2)
    assert costs.crossover() < MAX_CROSSOVER / 2


def test_costs_are_running_aggregates():
    """A million observations leave the same few numbers behind."""
    costs = SourceCosts()
    for i in range(1_000_000 // 1000):
        costs.observe(1 + i % 7, 0.01 * (1 + i % 7))
    assert len(vars(costs)) == 6
    assert costs.line() is not None


def test_bad_measurements_are_ignored():
    costs = SourceCosts()
    for size, seconds in [(0, 1.0), (2, math.nan), (3, -1.0), (4, math.inf)]:
        costs.observe(size, seconds)
    assert costs == SourceCosts()
