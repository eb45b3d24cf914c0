"""The protocol finds concurrent updates through an index (``warehouse/update_index.py``):
under any sequence of arrivals, starts (batched or not), finishes, failures, restarts,
shelving and reading back, it must find exactly what the definition says: every update of
the answering source with seq <= w, in a numbered unit still running, waiting or retained,
or queued (in memory, or spilled to the update log past the queue budget), whose (order,
position) is after the asking term's."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from contract.zset import ZSet
from tests.sim import WithoutRetention
from warehouse.protocol import Unit, ViewProtocol, ViewUpdate

SOURCES = ("a", "b", "c")


@dataclass
class Log:
    """The update log of a test: every update received, in arrival order, and those ever
    numbered into a unit."""

    received: list[ViewUpdate] = field(default_factory=list)
    numbered: set[int] = field(default_factory=set)

    def spilled(self, p: ViewProtocol) -> list[ViewUpdate]:
        """Queued updates not in memory, by the definition: received, never numbered, not in the UMQ."""
        in_memory = {u.log_id for u in p.umq}
        return [u for u in self.received if u.log_id not in self.numbered and u.log_id not in in_memory]

    def read_back(self, p: ViewProtocol, most: int) -> int:
        """What the manager's read of the shelf does: the first ``most`` logged updates after
        the shelf's seqs, in arrival order."""
        read = p.read_back()
        after = read.after
        found = [u for u in self.received if u.source in after and u.seq > after[u.source]]
        chunk = found[:most]
        through = {u.source: u.seq for u in chunk}
        return p.take_back(read, chunk, through, exhausted=len(found) <= most)


def definition(
    p: ViewProtocol, log: Log, unit: Unit, term: int, position: int, source: str, watermark: int
) -> list[int]:
    """Log ids of the concurrent deltas, straight from the definition (a scan of everything)."""
    mine = (unit.order, term)
    numbered = [*p.ppu.values(), *p.waiting.values(), *p.rpu.values()]
    later = [u for v in numbered if (v.order, position) > mine for u in v.updates]
    later += list(p.umq) + log.spilled(p)
    return sorted(u.log_id for u in later if u.source == source and u.seq <= watermark and position in u.deltas)


def found(p: ViewProtocol, log: Log, unit: Unit, term: int, position: int, source: str, watermark: int) -> list[int]:
    """What the protocol names: deltas in memory, and a range of the log to read."""
    deltas = p.concurrent_deltas(unit, term, position, source, watermark)
    ids = {
        id(d): u.log_id
        for v in [*p.ppu.values(), *p.waiting.values(), *p.rpu.values()]
        for u in v.updates
        for d in u.deltas.values()
    }
    ids |= {id(d): u.log_id for u in p.umq for d in u.deltas.values()}
    named = [ids[id(d)] for d in deltas]
    spilled = p.spilled_range(source, watermark)
    if spilled is not None:
        named += [
            u.log_id
            for u in log.received
            if u.source == source and spilled.after < u.seq <= spilled.through and position in u.deltas
        ]
    return sorted(named)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("receive"), st.sampled_from(SOURCES), st.sets(st.integers(0, 2), min_size=1)),
        st.tuples(st.just("start"), st.integers(1, 4)),
        st.tuples(st.just("finish"), st.integers(0, 10)),
        st.tuples(st.just("fail"), st.integers(0, 10)),
        st.tuples(st.just("restart")),
        st.tuples(st.just("read_back"), st.integers(1, 4)),
        st.tuples(st.just("shelve")),
        st.tuples(
            st.just("check"),
            st.integers(0, 10),
            st.integers(-1, 2),
            st.integers(0, 2),
            st.sampled_from(SOURCES),
            st.integers(0, 30),
        ),
    ),
    max_size=80,
)


@settings(max_examples=400, deadline=None)
@given(operations, st.booleans(), st.integers(1, 4), st.one_of(st.none(), st.integers(1, 6)))
def test_the_index_finds_what_the_definition_says(ops, retention: bool, parallelism: int, budget: int | None) -> None:
    p = (ViewProtocol if retention else WithoutRetention)(parallelism=parallelism, batch_size=3, queue_budget=budget)
    log = Log()
    seqs = dict.fromkeys(SOURCES, 0)
    log_id = 0
    for op in ops:
        kind = op[0]
        if kind == "receive":
            _, source, positions = op
            seqs[source] += 1
            log_id += 1
            update = ViewUpdate(log_id, source, seqs[source], {j: ZSet({(log_id, j): 1}) for j in positions})
            log.received.append(update)
            p.receive(update)
        elif kind == "start":
            for _ in range(op[1]):
                if p.can_start():
                    unit = p.restart() or p.start()
                    log.numbered.update(u.log_id for u in unit.updates)
        elif kind == "read_back" and p.wants_read_back():
            log.read_back(p, op[1])
        elif kind == "shelve":
            p.shelve()
        elif kind in ("finish", "fail") and p.ppu:
            unit = sorted(p.ppu.values(), key=lambda u: u.order)[op[1] % len(p.ppu)]
            p.finish(unit) if kind == "finish" else p.set_aside(unit)
        elif kind == "restart":
            if p.can_start():
                p.restart()
        elif kind == "check" and p.ppu:
            _, pick, term, position, source, watermark = op
            unit = sorted(p.ppu.values(), key=lambda u: u.order)[pick % len(p.ppu)]
            assert found(p, log, unit, term, position, source, watermark) == definition(
                p, log, unit, term, position, source, watermark
            )
    for unit in list(p.ppu.values()):
        for source in SOURCES:
            for position in range(3):
                for term in (-1, 0, 1, 2):
                    got = found(p, log, unit, term, position, source, seqs[source])
                    assert got == definition(p, log, unit, term, position, source, seqs[source])
    # nothing is kept for updates no unit or queue holds any more
    held = sum(len(u.updates) for u in [*p.ppu.values(), *p.waiting.values(), *p.rpu.values()]) + len(p.umq)
    assert len(p.live) == held
    # the UMQ stays within its budget, but for an update that enters it empty and a chunk read back
    if budget is not None:
        assert p.umq.changes <= max(budget, 3) + 4 * 3
    # reading the shelf back to its end queues every spilled update again, in arrival order
    while p.shelf is not None:
        log.read_back(p, 4)
    assert [u.log_id for u in p.umq] == [u.log_id for u in log.received if u.log_id not in log.numbered]


def test_shelving_and_reading_back_keep_the_index() -> None:
    p = ViewProtocol(parallelism=2)
    log = Log()
    updates = [ViewUpdate(i, "a", i, {0: ZSet({(i,): 1})}) for i in range(1, 7)]
    for u in updates[:3]:
        log.received.append(u)
        p.receive(u)
    p.shelve()
    assert len(p.live) == 0
    for u in updates[3:]:
        log.received.append(u)
        p.receive(u)
    assert p.shelf is not None and p.shelf.after == {"a": 0} and p.queued == 6
    assert log.read_back(p, 4) == 4 and p.shelf is not None
    assert log.read_back(p, 4) == 2 and p.shelf is None
    assert [u.seq for u in p.umq] == [1, 2, 3, 4, 5, 6]
    unit = p.start()
    assert len(p.concurrent_deltas(unit, 0, 0, "a", 6)) == 6 - len(unit.updates)


def test_a_read_that_races_an_arrival_keeps_the_shelf() -> None:
    """The log had nothing more when read, but an update was shelved since the read began:
    the shelf stays, and the next read finds it."""
    p = ViewProtocol(parallelism=1, queue_budget=1)
    updates = [ViewUpdate(i, "a", i, {0: ZSet({(i,): 1})}) for i in range(1, 4)]
    for u in updates[:2]:
        p.receive(u)
    read = p.read_back()
    p.receive(updates[2])  # logged after the read looked
    p.take_back(read, [updates[1]], {"a": 2}, exhausted=True)
    assert p.shelf is not None and p.shelf.after == {"a": 2} and p.queued == 3
    read = p.read_back()
    p.take_back(read, [updates[2]], {"a": 3}, exhausted=True)
    assert p.shelf is None and [u.seq for u in p.umq] == [1, 2, 3]
