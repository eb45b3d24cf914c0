"""The concurrency oracle: randomized schedules against first-principles recomputation.

Each schedule runs three in-process sources under a concurrent insert/delete workload with
random delays in shipping, before snapshots and during subquery evaluation, so that updates
are maintenance-concurrent and effects commit out of order. Two views are maintained at
once (a chain over three sources, and a four-relation view where one source holds two
relations and changes both in one transaction), each with a random parallelism, batch size
and commit mode, defined while the workload runs (initial load under concurrent updates).
More schedules run two self-join views instead (``SELF_JOIN_VIEWS``: one table under two
aliases), and two LEFT JOIN views (``OUTER_JOIN_VIEWS``), with the same checks and checks of
their own (a unit's ΔR ⋈ ΔR counted twice; partner counts not compensated; no NULL-extended
rows added or removed for a change of the right relation).

The delays are drawn from the schedule's seed and slept in virtual time, and the manager's
catalog and store calls run inline (``tests.virtual_time``): a seed gives the same
interleaving in every run, so a failing schedule is replayed by running its test again
(docs/protocol.md says how).

Checked after quiescence, for every watermark W the view reached: the view as of W equals
the view recomputed from the updates ordered <= W applied to the initial contents; and at
the end every weight is positive and the view equals recomputation from the live sources.
The last tests break compensation, retention (subclasses of ViewProtocol, in tests/sim.py)
and signed counts (a clamping store) and require the oracle to notice.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from contract.zset import ZSet
from tests.sim import (
    Delays,
    SimSource,
    WithoutChainRule,
    WithoutCompensation,
    WithoutLoggedCompensation,
    WithoutRetention,
    WithoutSpilledCompensation,
    recompute,
    start_sim_manager,
)
from tests.virtual_time import InlineExecutor, run_in_virtual_time
from warehouse import outer_join, unit_parts, view_change
from warehouse.aggregate import visible
from warehouse.catalog.db import Catalog
from warehouse.manager import Manager
from warehouse.protocol import DEFAULT_BATCH_SIZE, DEFAULT_QUEUE_BUDGET, ViewProtocol
from warehouse.store.base import ViewStore
from warehouse.store.memory import MemoryStore

SCHEDULES = 200
TABLES = {
    "s1": {"R1": ("A", "B"), "T1": ("A", "B")},
    "s2": {"R2": ("A", "B")},
    "s3": {"R3": ("A", "B", "C")},
}
VIEWS = {
    "chain": "SELECT R1.A AS a1, R2.A AS a2, R3.C AS c3 FROM s1.R1, s2.R2, s3.R3 "
    "WHERE R1.B = R2.A AND R2.B = R3.A AND R3.C <> 3",
    "four": "CREATE VIEW four AS SELECT R1.A, T1.B AS tb, R2.B AS b2, R3.C FROM s1.R1, s2.R2, s1.T1, s3.R3 "
    "WHERE R1.B = R2.A AND R2.B = T1.A AND T1.B = R3.A AND R1.A IN (0, 1, 2)",
}
# Aggregate and DISTINCT views over the same sources: groups, MIN/MAX whose extreme is
# deleted often (a domain of 4 values), an aggregate without GROUP BY, HAVING, DISTINCT.
AGGREGATE_VIEWS = {
    "per_group": "SELECT R2.B AS g, COUNT(*) AS n, COUNT(R3.C) AS nc, SUM(R1.A) AS s, AVG(R3.C) AS mean, "
    "MIN(R3.C) AS lo, MAX(R1.A) AS hi FROM s1.R1, s2.R2, s3.R3 WHERE R1.B = R2.A AND R2.B = R3.A GROUP BY R2.B",
    "overall": "SELECT COUNT(*) AS n, SUM(R3.C) AS s, MIN(R3.B) AS lo, MAX(R3.B) AS hi "
    "FROM s2.R2, s3.R3 WHERE R2.B = R3.A AND R3.C <> 3",
    "busy": "SELECT R3.A, COUNT(*) AS n, MAX(R2.A) AS top FROM s2.R2, s3.R3 WHERE R2.B = R3.A "
    "GROUP BY R3.A HAVING COUNT(*) > 2",
    "pairs": "SELECT DISTINCT R1.B, R2.B AS b2 FROM s1.R1, s2.R2 WHERE R1.B = R2.A",
}
SELF_JOIN_VIEWS = {
    # R3 twice, as employee and manager: different columns (e: A, B, C; m: A, C) and local
    # predicates, then two more sources
    "pairs": "SELECT e.A AS ea, m.A AS ma, R2.B AS b2 FROM s3.R3 e JOIN s3.R3 m ON e.B = m.A "
    "JOIN s1.R1 ON m.C = R1.A JOIN s2.R2 ON R1.B = R2.A WHERE e.C <> 3 AND m.C IN (0, 1, 2)",
    # R1 twice with another source between, and T1 of the same source after: one s1
    # transaction changes positions 0, 2 and 3 at once
    "around": "SELECT p.A AS pa, q.B AS qb, T1.B AS tb FROM s1.R1 p, s2.R2, s1.R1 q, s1.T1 "
    "WHERE p.B = R2.A AND R2.B = q.A AND q.B = T1.A AND p.A IN (0, 1, 2)",
}
OUTER_JOIN_VIEWS = {
    # an inner join over two sources, then a LEFT JOIN to a third, with a local ON predicate
    "optional": "SELECT R1.A AS a1, R2.A AS a2, R3.C AS c3 FROM s1.R1 JOIN s2.R2 ON R1.B = R2.A "
    "LEFT JOIN s3.R3 ON R2.B = R3.A AND R3.C <> 3",
    # the right side is the left side's own table (a self-join), under an inequality too
    "managers": "SELECT e.A AS ea, m.B AS mb, R1.A AS ra FROM s1.R1 JOIN s3.R3 e ON R1.B = e.A "
    "LEFT JOIN s3.R3 m ON e.B = m.A AND e.C < m.C",
}
DOMAIN = 4


@dataclass
class Outcome:
    mismatches: list[str]
    watermarks: dict[str, int]
    compensations: int
    answers: list[tuple]  # every subquery answer in the order given: (time, source, relation, keys, watermark)
    commits: list[tuple[str, tuple[int, ...]]]  # every store write in write order: (view, its orders)
    set_units: int = 0  # units of more than one update
    measured_crossovers: int = 0  # sources whose crossover came from measured costs, not the prior
    compensations_from_log: int = 0  # compensated updates read from the update log (spilled)
    read_back: int = 0  # spilled updates queued in memory again
    unit_parts: int = 0  # parts of units swept and stored one at a time
    past_answers: int = 0  # answers from a state older than the source's current one (``at_least``)

    @property
    def interleaving(self) -> tuple:
        """What the schedule did, in order: equal for two runs of one seed."""
        return (self.answers, self.commits, self.compensations)

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(repr(self.interleaving).encode()).hexdigest()[:16]

    @property
    def out_of_order(self) -> bool:
        """Some view committed an order after a larger one."""
        highest: dict[str, int] = {}
        for view, orders in self.commits:
            for order in orders:
                if order < highest.get(view, 0):
                    return True
                highest[view] = max(highest.get(view, 0), order)
        return False


def random_row(rng: random.Random, width: int) -> tuple:
    return tuple(rng.randrange(DOMAIN) for _ in range(width))


def random_transaction(rng: random.Random, source: SimSource) -> list[tuple[str, int, tuple]]:
    changes = []
    state = {t: z.copy() for t, z in source.state.items()}
    for _ in range(rng.randint(1, 3)):
        table = rng.choice(list(source.tables))
        present = list(state[table].rows())
        if present and rng.random() < 0.45:
            row = rng.choice(present)
            state[table].add(row, -1)
            changes.append((table, -1, row))
        else:
            row = random_row(rng, len(source.tables[table]))
            state[table].add(row, 1)
            changes.append((table, 1, row))
    return changes


def load_random(sources: Iterable[SimSource], rng: random.Random, rows: int = 6) -> None:
    """Every table of every source starts with ``rows`` random rows."""
    for source in sources:
        for table, cols in source.tables.items():
            source.load(table, [random_row(rng, len(cols)) for _ in range(rows)])


async def random_workload(sources: Mapping[str, SimSource], rng: random.Random, transactions: int) -> None:
    """``transactions`` random source transactions, each on a random source; about a third
    shipped at once, the rest left to a shipper; a short random pause after each."""
    for _ in range(transactions):
        source = rng.choice(list(sources.values()))
        source.commit(random_transaction(rng, source))
        if rng.random() < 0.3:
            await source.ship()
        await asyncio.sleep(rng.uniform(0, 0.002))


@functools.cache
def migrated_catalog() -> Path:
    """An empty catalog, migrated once per process: every schedule starts from a copy.
    Migrating took a sixth of each schedule's time; the migrations are tested elsewhere."""
    directory = Path(tempfile.mkdtemp(prefix="oracle-catalog-"))
    atexit.register(shutil.rmtree, directory, True)
    path = directory / "catalog.db"
    Catalog(f"sqlite:///{path}").close()
    return path


def schedule(
    tmp_path,
    seed: int,
    protocol: type[ViewProtocol] | None = None,
    store: RecordingStore | None = None,
    views: dict[str, str] = VIEWS,
    **options,
) -> Outcome:
    """Run schedule ``seed`` on a loop of its own, in virtual time (``options``: of ``run_schedule``)."""
    return run_in_virtual_time(run_schedule(tmp_path, seed, protocol, store, views=views, **options))


async def run_schedule(
    tmp_path,
    seed: int,
    protocol: type[ViewProtocol] | None = None,
    store: ViewStore | None = None,
    transactions: int = 24,
    inline: bool = True,
    batch_sizes: tuple[int, ...] = (1, 1, 2, 3, DEFAULT_BATCH_SIZE),  # the default: adaptive
    views: dict[str, str] = VIEWS,
    queue_budget: int | None = DEFAULT_QUEUE_BUDGET,
    part_size: int | None = None,
    floor_ignored: bool = False,
    lazy_interest: bool = False,
) -> Outcome:
    """The schedule of ``seed``; replays only on a ``VirtualTimeLoop`` (``schedule``), with the
    blocking calls ``inline`` (a store of real jobs, Spark's, runs them on threads instead,
    on the real clock). ``queue_budget``: the changes a view's UMQ holds in memory before
    its tail spills to the update log; ``part_size``: the sources ship every update in
    parts of this many changes (None: whole); ``floor_ignored``: the sources answer from
    states below a subquery's ``at_least`` too (broken on purpose); ``lazy_interest``: a
    new interest's boundary is numbered at once and shipped with the next ship, as a
    wrapper does, so a view's first units may start before the manager holds its bases."""
    rng = random.Random(seed)
    store = store or RecordingStore()
    delays = Delays(before_snapshot=0.004, evaluation=0.004, shipping=0.002)
    catalog = tmp_path / f"catalog-{seed}-{uuid.uuid4().hex[:8]}.db"
    shutil.copy(migrated_catalog(), catalog)
    answers: list[tuple] = []
    manager, sources = await start_sim_manager(
        catalog,
        TABLES,
        store,
        protocol,
        seed,
        delays,
        trace=answers,
        blocking_executor=InlineExecutor() if inline else None,
        max_queued_changes=queue_budget,
    )
    load_random(sources.values(), rng)
    for source in sources.values():
        source.part_size = part_size
        source.past = random.Random(f"{seed}-{source.name}")  # answers from a standing snapshot too
        source.floor_ignored = floor_ignored
        source.lazy_interest = lazy_interest

    async def workload() -> None:
        await random_workload(sources, rng, transactions)

    done = asyncio.Event()

    async def shipper(source: SimSource) -> None:
        while not done.is_set():
            await asyncio.sleep(rng.uniform(0, 0.004))
            await source.ship()

    shippers = [asyncio.create_task(shipper(s)) for s in sources.values()]
    load = asyncio.create_task(workload())
    await asyncio.sleep(rng.uniform(0, 0.01))
    for name, sql in views.items():
        await manager.define_view(
            sql,
            name=name,
            parallelism=rng.choice([1, 2, 3, 4, 8]),
            batch_size=rng.choice(batch_sizes),
            commit_mode=rng.choice(["out_of_order", "out_of_order", "arrival"]),
        )
    await load
    done.set()
    await asyncio.gather(*shippers)
    for s in sources.values():
        await s.ship()
    for name in views:
        await manager.wait_idle(name, timeout=60)
    outcome = Outcome([], {}, 0, answers, store.writes if isinstance(store, RecordingStore) else [])
    outcome.past_answers = sum(s.past_answers for s in sources.values())
    for name in views:
        outcome.mismatches += await check_view(
            manager, name, sources, check_history=not isinstance(store, ClampingStore)
        )
        outcome.watermarks[name] = manager.watermark(name)
        counters = manager.views[name].maintainer.counters
        outcome.compensations += counters.compensations
        outcome.compensations_from_log += counters.compensations_from_log
        outcome.read_back += counters.updates_read_back
        outcome.unit_parts += counters.unit_parts
        outcome.set_units += sum(len(u.log_ids) > 1 for u in await manager.db(Catalog.units, name))
        costs = manager.views[name].maintainer.protocol.costs.values()
        outcome.measured_crossovers += sum(c.c1 is not None and c.line() is not None for c in costs)
    await manager.stop()
    return outcome


async def check_view(manager: Manager, view: str, sources: dict[str, SimSource], check_history: bool) -> list[str]:
    handle = manager.views[view]
    plan, bases = handle.plan, handle.bases
    assert handle.maintainer.failed is None, handle.maintainer.failed
    columns = {(s, t): cols for s, src in sources.items() for t, cols in src.tables.items()}
    units = await manager.db(Catalog.units, view)
    entries = {e.id: e for e in await manager.db(Catalog.log_entries, None, 0, [i for u in units for i in u.log_ids])}
    watermark = manager.watermark(view)
    mismatches = []
    if watermark != len(units) or not all(u.committed for u in units):
        mismatches.append(f"{view}: W={watermark} but {len(units)} units")
    if check_history:
        upto = {s: bases.get(s, 0) for s in sources}  # sources the view does not read stay at 0
        for unit in units:  # units come in order: W grows by one per iteration
            for i in unit.log_ids:
                upto[entries[i].source] = max(upto[entries[i].source], entries[i].seq)
            contents = {(s, t): z for s in plan.sources for t, z in sources[s].state_at(upto[s]).items()}
            expected = recompute(plan, contents, columns)
            got = read_view(manager, view, as_of=unit.order)
            if got != expected:
                mismatches.append(f"{view} as of W={unit.order}: got {got}, expected {expected}")
    final = read_view(manager, view)
    live = recompute(plan, {(s, t): z for s in sources for t, z in sources[s].state.items()}, columns)
    if final.has_negative():
        mismatches.append(f"{view}: negative weights at quiescence: {final}")
    if final != live:
        mismatches.append(f"{view} at quiescence: got {final}, expected {live}")
    return mismatches


def read_view(manager: Manager, view: str, as_of: int | None = None) -> ZSet:
    """The view's rows from the store: an aggregate view's through its groups' sums."""
    stored = manager.store.read(view, as_of=as_of)
    summary = manager.views[view].plan.summary
    return stored if summary is None else visible(summary, stored)


@dataclass(frozen=True)
class Shape:
    """Views of one shape the oracle runs ``schedules`` schedules of (seeds from
    ``first_seed``), and how much concurrency ten of them (from ``busy_seed``) must show."""

    views: dict[str, str]
    schedules: int
    first_seed: int
    busy_seed: int
    compensations: int  # at least, over the ten busy schedules
    out_of_order: int  # schedules that commit out of order, at least


SHAPES = {
    "spj": Shape(VIEWS, SCHEDULES, 0, 1000, compensations=100, out_of_order=3),
    # GROUP BY with every aggregate (extremes deleted often: a domain of 4 values), no GROUP
    # BY, HAVING, DISTINCT (docs/aggregates.md)
    "aggregate": Shape(AGGREGATE_VIEWS, 60, 0, 1000, compensations=50, out_of_order=2),
    # a table under two aliases: every update of it is an update of both positions,
    # maintained as the chain rule's terms in position order (docs/protocol.md, "Self-joins")
    "self_join": Shape(SELF_JOIN_VIEWS, 60, 9000, 9000, compensations=50, out_of_order=3),
    # NULL-extended rows appear and go as partners come and go (docs/protocol.md, "Outer joins")
    "outer_join": Shape(OUTER_JOIN_VIEWS, 60, 11000, 11000, compensations=50, out_of_order=3),
}
BROKEN = {  # what the oracle must catch, for every shape
    "compensation": lambda: (WithoutCompensation, None),
    "retention": lambda: (WithoutRetention, None),
    "signed_counts": lambda: (None, ClampingStore()),
}


@pytest.mark.parametrize(
    ("shape", "seed"),
    [
        (name, seed)
        for name, shape in SHAPES.items()
        for seed in range(shape.first_seed, shape.first_seed + shape.schedules)
    ],
)
def test_schedule_matches_recomputation(tmp_path, shape, seed):
    """Every view as of every W equals its recomputation from the sources at the states its
    units describe (for an aggregate: the body, then the aggregate straight from that bag)."""
    outcome = schedule(tmp_path, seed, views=SHAPES[shape].views)
    replay = f"replay: pytest 'tests/test_oracle.py::test_schedule_matches_recomputation[{shape}-{seed}]'"
    assert not outcome.mismatches, "\n".join([*outcome.mismatches, replay])
    assert all(w >= 1 for w in outcome.watermarks.values())


@pytest.mark.parametrize("shape", SHAPES)
def test_schedules_exercise_concurrency(tmp_path, shape):
    """The workload is concurrent enough that compensation happens and effects commit out
    of order, in virtual time as on the wall clock, for every shape."""
    s = SHAPES[shape]
    outcomes = [schedule(tmp_path, s.busy_seed + seed, views=s.views) for seed in range(10)]
    assert sum(o.compensations for o in outcomes) > s.compensations
    assert sum(o.out_of_order for o in outcomes) >= s.out_of_order
    assert sum(o.past_answers for o in outcomes) > 20  # from a standing snapshot: older than now


def test_answers_reach_the_bases_a_wrapper_has_not_shipped_yet(tmp_path, monkeypatch):
    """A wrapper numbers a new interest's boundary at once and ships it with its next
    poll, so a view's first units may start before the manager holds the view's bases,
    which its initial load reflects. Their floor includes the bases: the schedules match;
    with the released seq alone as the floor, some schedule fails."""
    for seed in range(5000, 5020):
        assert not schedule(tmp_path, seed, lazy_interest=True).mismatches, seed
    with monkeypatch.context() as broken:
        broken.setattr(Manager, "_floor", lambda self, handle, source: self.receiver.released_through(source))
        seed = next((s for s in range(5000, 5100) if schedule(tmp_path, s, lazy_interest=True).mismatches), None)
    assert seed is not None
    assert not schedule(tmp_path, seed, lazy_interest=True).mismatches


@pytest.mark.parametrize("shape", SHAPES)
def test_oracle_fails_when_answers_come_from_below_the_floor(tmp_path, shape):
    """Sources that answer from any older state, below the subquery's ``at_least`` too,
    miss updates ordered before the unit, which nothing adds back: some schedule of every
    shape fails, and the same schedule passes when they keep to the floor."""
    views = SHAPES[shape].views
    seed = next(
        (s for s in range(5000, 5060) if schedule(tmp_path, s, views=views, floor_ignored=True).mismatches), None
    )
    assert seed is not None
    assert not schedule(tmp_path, seed, views=views).mismatches


@pytest.mark.parametrize("broken", BROKEN)
@pytest.mark.parametrize("shape", SHAPES)
def test_oracle_fails_when_the_protocol_is_broken(tmp_path, shape, broken):
    """Switching compensation, retention or signed counts off fails some schedule of every
    shape; the same schedule passes with them on (with signed counts: the same bookkeeping,
    unclamped), so the failure is the broken protocol's. Clamped group counts, applied in
    commit order, lose a group when a delete commits before its insert."""
    views = SHAPES[shape].views
    seed = first_failure(tmp_path, BROKEN[broken], views=views)
    assert seed is not None
    store = ClampingStoreOff() if broken == "signed_counts" else None
    outcome = schedule(tmp_path, seed, store=store, views=views)
    assert not outcome.mismatches, outcome.mismatches


SPILLING_BUDGET = 2  # changes: a view's UMQ spills from its second or third update on


@pytest.mark.parametrize("shape", SHAPES)
def test_spilled_queues_match_recomputation(tmp_path, shape):
    """With a queue budget of a few changes, every view's queue spills to the update log
    and is read back a chunk at a time, and answers subtract spilled updates read from the
    log: the views still equal recomputation as of every W, for every shape."""
    s = SHAPES[shape]
    seeds = range(s.busy_seed, s.busy_seed + 8)
    outcomes = [schedule(tmp_path, seed, views=s.views, queue_budget=SPILLING_BUDGET) for seed in seeds]
    for seed, outcome in zip(seeds, outcomes):
        assert not outcome.mismatches, (seed, outcome.mismatches)
    assert sum(o.read_back for o in outcomes) > 50
    assert sum(o.compensations_from_log for o in outcomes) > 5


@pytest.mark.parametrize("shape", SHAPES)
def test_oracle_fails_when_spilled_updates_are_not_compensated(tmp_path, shape):
    """Answers that leave out the spilled updates they reflect fail some schedule of every
    shape; the same schedule passes with them subtracted."""
    views = SHAPES[shape].views
    seed = next(
        (
            seed
            for seed in range(5000, 5060)
            if schedule(
                tmp_path, seed, WithoutSpilledCompensation, views=views, queue_budget=SPILLING_BUDGET
            ).mismatches
        ),
        None,
    )
    assert seed is not None
    outcome = schedule(tmp_path, seed, views=views, queue_budget=SPILLING_BUDGET)
    assert not outcome.mismatches, outcome.mismatches


def test_adaptive_batching_matches_recomputation(tmp_path):
    """Every view with the default batch size (adaptive, ``warehouse.batching``), on schedules
    long enough that backlogs are maintained as sets and crossovers are measured: the views
    still equal recomputation as of every W."""
    seeds = range(3000, 3006)
    outcomes = [schedule(tmp_path, seed, batch_sizes=(DEFAULT_BATCH_SIZE,), transactions=80) for seed in seeds]
    for seed, outcome in zip(seeds, outcomes):
        assert not outcome.mismatches, (seed, outcome.mismatches)
    assert sum(o.set_units for o in outcomes) > 10
    assert sum(o.measured_crossovers for o in outcomes) >= 1
    assert sum(o.compensations for o in outcomes) > 0


REPLAYED_SEED = 1003  # one that compensates and commits out of order


def test_a_seed_replays_its_interleaving(tmp_path):
    """The same seed gives the same answers (time, source, keys, watermark), the same
    store writes in the same order and the same compensations, run after run; another
    seed gives another schedule."""
    runs = [schedule(tmp_path, REPLAYED_SEED) for _ in range(3)]
    first = runs[0]
    assert first.compensations > 0 and first.out_of_order and not first.mismatches
    for again in runs[1:]:
        assert again.answers == first.answers
        assert again.commits == first.commits
        assert again.compensations == first.compensations
        assert again.fingerprint == first.fingerprint
    others = {schedule(tmp_path, REPLAYED_SEED + d).fingerprint for d in (1, 2)}
    assert first.fingerprint not in others and len(others) == 2


def test_a_seed_replays_in_another_process(tmp_path):
    """A failure found in one run is replayed in the next: another interpreter, with other
    string hashes (set and dict orders), runs the same schedule."""
    root = Path(__file__).resolve().parents[1]
    code = (
        "import pathlib, sys; from tests.test_oracle import schedule; "
        f"print(schedule(pathlib.Path(sys.argv[1]), {REPLAYED_SEED}).fingerprint)"
    )
    env = {
        **os.environ,
        "PYTHONHASHSEED": "12345",
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    there = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert there.returncode == 0, there.stderr
    assert there.stdout.split()[-1] == schedule(tmp_path, REPLAYED_SEED).fingerprint


class RecordingStore(MemoryStore):
    """The in-process store, keeping which view each write was for (``writes``)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, tuple[int, ...]]] = []

    def commit(self, view, effects) -> None:
        super().commit(view, effects)
        self.writes.append((view, tuple(e.order for e in effects)))


class ClampingStore(RecordingStore):
    """Counters that never go below zero, applied in physical commit order: the
    positive-only representation the paper shows failing under out-of-order commits."""

    def __init__(self) -> None:
        super().__init__()
        self.current: dict[str, ZSet] = {}

        self.keys: dict[str, int] = {}  # an aggregate view's key width
        self.groups: dict[str, dict[tuple, list]] = {}  # an aggregate view's numbers per key

    def create(self, view, columns, types=None, summed=None) -> None:
        super().create(view, columns, types, summed)
        self.current.setdefault(view, ZSet())
        if summed is not None:
            self.keys[view] = summed.keys
            self.groups.setdefault(view, {})

    def commit(self, view, effects) -> None:
        super().commit(view, effects)
        if view in self.keys:
            self._commit_groups(view, effects)
            return
        state = self.current[view]
        for effect in effects:
            for row, weight in effect.delta.items():
                before = state.weight(row)
                state.add(row, max(0, before + weight) - before)

    def _commit_groups(self, view, effects) -> None:
        """An aggregate view kept as one row per key whose count (its first number) never
        goes below zero: a key whose count would is dropped, with its sums."""
        keys, groups = self.keys[view], self.groups[view]
        for effect in effects:
            for row, weight in effect.delta.items():
                key, numbers = row[:keys], row[keys:]
                if numbers[0] is None:
                    continue
                state = groups.get(key, [0] * len(numbers))
                state = [a + weight * b for a, b in zip(state, numbers)]
                if state[0] > 0:
                    groups[key] = state
                else:
                    groups.pop(key, None)

    def read(self, view, as_of=None) -> ZSet:
        if view in self.keys:
            return ZSet({(*key, *numbers): 1 for key, numbers in self.groups[view].items()})
        return self.current[view].copy()


def first_failure(tmp_path, make, attempts: int = 60, views: dict[str, str] = VIEWS) -> int | None:
    """The first seed from 5000 on whose schedule over ``views`` the oracle rejects."""
    for seed in range(5000, 5000 + attempts):
        protocol, store = make()
        if schedule(tmp_path, seed, protocol=protocol, store=store, views=views).mismatches:
            return seed
    return None


class ClampingStoreOff(ClampingStore):
    """The same bookkeeping with signed counts kept: must pass where clamping failed."""

    def commit(self, view, effects) -> None:
        RecordingStore.commit(self, view, effects)
        for effect in effects:
            self.current[view].add_all(effect.delta)

    def read(self, view, as_of=None) -> ZSet:
        return self.current[view].copy()


# -- steps asked in parts ------------------------------------------------------------------------
CHUNKED_SEEDS = range(7000, 7030)


def test_steps_asked_in_parts_match_recomputation(tmp_path, monkeypatch):
    """With at most two keys per subquery every step of more keys is asked in parts, each
    with its own snapshot and watermark and compensated against it: the views still equal
    recomputation at every W, with more subqueries than the same schedules asked whole."""
    whole = [schedule(tmp_path, seed) for seed in CHUNKED_SEEDS]
    monkeypatch.setattr(view_change, "KEYS_PER_SUBQUERY", 2)
    parted = [schedule(tmp_path, seed) for seed in CHUNKED_SEEDS]
    for seed, outcome in zip(CHUNKED_SEEDS, parted):
        assert not outcome.mismatches, (seed, outcome.mismatches)
    assert sum(len(o.answers) for o in parted) > sum(len(o.answers) for o in whole)
    assert sum(o.compensations for o in parted) > 0


def test_parts_without_compensation_are_caught(tmp_path, monkeypatch):
    """The oracle still sees a missing compensation when steps are asked in parts."""
    monkeypatch.setattr(view_change, "KEYS_PER_SUBQUERY", 2)
    assert first_failure(tmp_path, lambda: (WithoutCompensation, None), attempts=30) is not None


# -- units in parts ------------------------------------------------------------------------------
PART_SHAPES = ("spj", "aggregate", "self_join")  # a LEFT JOIN view's units are swept whole


@pytest.mark.parametrize("shape", PART_SHAPES)
def test_units_in_parts_match_recomputation(tmp_path, monkeypatch, shape):
    """With at most two delta rows swept at once, every unit of more is swept in parts, each
    part's effect stored under the unit's order as soon as it is computed: every view as of
    every W still equals recomputation (a part read before its unit commits would show)."""
    monkeypatch.setattr(unit_parts, "PART_ROWS", 2)
    s = SHAPES[shape]
    seeds = range(s.busy_seed, s.busy_seed + 10)
    outcomes = [schedule(tmp_path, seed, views=s.views) for seed in seeds]
    for seed, outcome in zip(seeds, outcomes):
        assert not outcome.mismatches, (seed, outcome.mismatches)
    assert sum(o.unit_parts for o in outcomes) > 50
    assert sum(o.compensations for o in outcomes) > s.compensations


class PartsSeenEarlyStore(RecordingStore):
    """A store that shows a unit's parts as of any W, before the unit is committed."""

    def read(self, view, as_of=None) -> ZSet:
        out = super().read(view, as_of)
        for order, parts in self._parts.get(view, {}).items():
            if as_of is not None and order > as_of:
                for delta in parts.values():
                    out.add_all(delta)
        return out


@pytest.mark.parametrize("broken", ["compensation", "parts_seen_early"])
def test_oracle_fails_when_units_in_parts_are_broken(tmp_path, monkeypatch, broken):
    """Swept in parts, a missing compensation still fails some schedule, and so do parts
    shown before their unit commits; the same schedule passes when nothing is broken."""
    monkeypatch.setattr(unit_parts, "PART_ROWS", 2)
    make = BROKEN["compensation"] if broken == "compensation" else lambda: (None, PartsSeenEarlyStore())
    seed = first_failure(tmp_path, make, attempts=30)
    assert seed is not None
    outcome = schedule(tmp_path, seed)
    assert not outcome.mismatches, outcome.mismatches
    assert outcome.unit_parts > 0


# -- updates left in the update log --------------------------------------------------------------
@dataclass
class LoggedUses:
    """How often updates kept in the log only were spooled by their unit, and subtracted
    from an answer."""

    spooled: int = 0
    subtracted: int = 0


@pytest.fixture
def logged_uses(monkeypatch: pytest.MonkeyPatch) -> LoggedUses:
    """At most two delta rows swept at once (so held at once), and the uses counted."""
    monkeypatch.setattr(unit_parts, "PART_ROWS", 2)
    uses = LoggedUses()
    spool, concurrent = view_change.ViewChange._spool, ViewProtocol.concurrent_logged

    async def counted_spool(self, *args):
        uses.spooled += 1
        return await spool(self, *args)

    def counted_concurrent(self, *args):
        found = concurrent(self, *args)
        uses.subtracted += len(found)
        return found

    monkeypatch.setattr(view_change.ViewChange, "_spool", counted_spool)
    monkeypatch.setattr(ViewProtocol, "concurrent_logged", counted_concurrent)
    return uses


@pytest.mark.parametrize("shape", PART_SHAPES)
def test_updates_left_in_the_log_match_recomputation(tmp_path, logged_uses, shape):
    """Every update shipped in parts, and at most two delta rows held at once: an update the
    view reads more rows of keeps them in the update log only (``ViewUpdate.logged``). Its
    unit spools them to disk by part, and answers that reflect it subtract it read from the
    log, from the queue or from its spilled tail (half the schedules spill): every view as
    of every W still equals recomputation."""
    s = SHAPES[shape]
    seeds = range(s.busy_seed, s.busy_seed + 10)
    outcomes = [
        schedule(tmp_path, seed, views=s.views, part_size=2, queue_budget=SPILLING_BUDGET if seed % 2 else None)
        for seed in seeds
    ]
    for seed, outcome in zip(seeds, outcomes):
        assert not outcome.mismatches, (seed, outcome.mismatches)
    assert logged_uses.spooled > 20 and logged_uses.subtracted > 20, logged_uses
    assert sum(o.unit_parts for o in outcomes) > 50


def test_oracle_fails_when_updates_left_in_the_log_are_not_compensated(tmp_path, logged_uses):
    """Answers that leave out the updates kept in the log only fail some schedule; the same
    schedule passes with them subtracted."""
    seed = next(
        (s for s in range(5000, 5030) if schedule(tmp_path, s, WithoutLoggedCompensation, part_size=2).mismatches),
        None,
    )
    assert seed is not None
    outcome = schedule(tmp_path, seed, part_size=2)
    assert not outcome.mismatches, outcome.mismatches


def test_left_join_units_are_swept_whole(tmp_path, monkeypatch):
    """A LEFT JOIN view's NULL-extended rows depend on every row of a key's delta at once:
    its units are never cut into parts, and its schedules still match."""
    monkeypatch.setattr(unit_parts, "PART_ROWS", 2)
    s = SHAPES["outer_join"]
    outcome = schedule(tmp_path, s.busy_seed, views=s.views)
    assert not outcome.mismatches and outcome.unit_parts == 0


# -- self-joins --------------------------------------------------------------------------------
def test_self_join_counts_the_delta_join_once(tmp_path):
    """In "pairs" the only relations of s3 are R3's two aliases, so a unit of s3 that changes
    both is a self-join's own ΔR ⋈ ΔR: keeping the unit's own deltas in both terms counts it
    twice, and the oracle notices."""
    pairs = {"pairs": SELF_JOIN_VIEWS["pairs"]}
    seed = first_failure(tmp_path, lambda: (WithoutChainRule, None), views=pairs)
    assert seed is not None
    assert schedule(tmp_path, seed, views=pairs).mismatches == []


# -- outer joins -------------------------------------------------------------------------------
def _uncompensated_counts(keys, answer, step, rel_cols, subtract):
    return COUNT_PARTNERS(keys, answer, step, rel_cols, None)


COUNT_PARTNERS = outer_join.count_partners


@pytest.mark.parametrize(
    "name, broken",
    [("count_partners", _uncompensated_counts), ("flips", lambda after, own: {})],
    ids=["uncompensated-partner-counts", "no-flips"],
)
def test_outer_join_oracle_catches_broken_null_extension(tmp_path, monkeypatch, name, broken):
    """Partner counts taken from an answer as it is (the concurrent updates it reflects not
    subtracted), or a change of the right relation that never adds or removes NULL-extended
    rows: the oracle notices, although the inner join's rows are still right."""
    monkeypatch.setattr(outer_join, name, broken)
    seed = first_failure(tmp_path, lambda: (None, None), views=OUTER_JOIN_VIEWS)
    assert seed is not None
    monkeypatch.undo()
    assert schedule(tmp_path, seed, views=OUTER_JOIN_VIEWS).mismatches == []


def test_self_and_left_join_steps_asked_in_parts(tmp_path, monkeypatch):
    """Two keys per subquery: partner counts gathered over the parts, each compensated against
    its own watermark, still decide the NULL-extended rows right."""
    monkeypatch.setattr(view_change, "KEYS_PER_SUBQUERY", 2)
    for views in (SELF_JOIN_VIEWS, OUTER_JOIN_VIEWS):
        for seed in range(7100, 7110):
            outcome = schedule(tmp_path, seed, views=views)
            assert not outcome.mismatches, (seed, outcome.mismatches)
