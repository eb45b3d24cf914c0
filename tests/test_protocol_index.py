"""The protocol finds concurrent updates through an index (``warehouse/update_index.py``):
under any sequence of arrivals, starts (batched or not), finishes, failures, restarts and
shelving, it must find exactly what the definition says: every update of the answering
source with seq <= w, in a numbered unit still running, waiting or retained, or queued,
whose (order, position) is after the asking term's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contract.zset import ZSet
from tests.sim import WithoutRetention
from warehouse.protocol import Unit, ViewProtocol, ViewUpdate

SOURCES = ("a", "b", "c")


def definition(p: ViewProtocol, unit: Unit, term: int, position: int, source: str, watermark: int) -> list[int]:
    """Log ids of the concurrent deltas, straight from the definition (a scan of everything)."""
    mine = (unit.order, term)
    numbered = [*p.ppu.values(), *p.waiting.values(), *p.rpu.values()]
    later = [u for v in numbered if (v.order, position) > mine for u in v.updates]
    later += list(p.umq)
    return sorted(u.log_id for u in later if u.source == source and u.seq <= watermark and position in u.deltas)


def found(p: ViewProtocol, unit: Unit, term: int, position: int, source: str, watermark: int) -> list[int]:
    deltas = p.concurrent_deltas(unit, term, position, source, watermark)
    ids = {
        id(d): u.log_id
        for v in [*p.ppu.values(), *p.waiting.values(), *p.rpu.values()]
        for u in v.updates
        for d in u.deltas.values()
    }
    ids |= {id(d): u.log_id for u in p.umq for d in u.deltas.values()}
    return sorted(ids[id(d)] for d in deltas)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("receive"), st.sampled_from(SOURCES), st.sets(st.integers(0, 2), min_size=1)),
        st.tuples(st.just("start"), st.integers(1, 4)),
        st.tuples(st.just("finish"), st.integers(0, 10)),
        st.tuples(st.just("fail"), st.integers(0, 10)),
        st.tuples(st.just("restart")),
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


@settings(max_examples=300, deadline=None)
@given(operations, st.booleans(), st.integers(1, 4))
def test_the_index_finds_what_the_definition_says(ops, retention: bool, parallelism: int) -> None:
    p = (ViewProtocol if retention else WithoutRetention)(parallelism=parallelism, batch_size=3)
    seqs = dict.fromkeys(SOURCES, 0)
    log_id = 0
    for op in ops:
        kind = op[0]
        if kind == "receive":
            _, source, positions = op
            seqs[source] += 1
            log_id += 1
            p.receive(ViewUpdate(log_id, source, seqs[source], {j: ZSet({(log_id, j): 1}) for j in positions}))
        elif kind == "start":
            for _ in range(op[1]):
                if p.can_start():
                    p.restart() or p.start()
        elif kind in ("finish", "fail") and p.ppu:
            unit = sorted(p.ppu.values(), key=lambda u: u.order)[op[1] % len(p.ppu)]
            p.finish(unit) if kind == "finish" else p.set_aside(unit)
        elif kind == "restart":
            if p.can_start():
                p.restart()
        elif kind == "check" and p.ppu:
            _, pick, term, position, source, watermark = op
            unit = sorted(p.ppu.values(), key=lambda u: u.order)[pick % len(p.ppu)]
            assert found(p, unit, term, position, source, watermark) == definition(
                p, unit, term, position, source, watermark
            )
    for unit in list(p.ppu.values()):
        for source in SOURCES:
            for position in range(3):
                for term in (-1, 0, 1, 2):
                    got = found(p, unit, term, position, source, seqs[source])
                    assert got == definition(p, unit, term, position, source, seqs[source])
    # nothing is kept for updates no unit or queue holds any more
    held = sum(len(u.updates) for u in [*p.ppu.values(), *p.waiting.values(), *p.rpu.values()]) + len(p.umq)
    assert len(p.live) == held


def test_shelving_and_reading_back_keep_the_index() -> None:
    p = ViewProtocol(parallelism=2)
    updates = [ViewUpdate(i, "a", i, {0: ZSet({(i,): 1})}) for i in range(1, 7)]
    for u in updates[:3]:
        p.receive(u)
    p.shelve()
    assert len(p.live) == 0
    for u in updates[3:]:
        p.receive(u)
    shelf = p.unshelve()
    assert shelf is not None and shelf.after == {"a": 0}
    p.receive(updates[5])  # arrived after the unshelve: already queued when the log is read
    p.requeue(updates[:5])
    assert [u.seq for u in p.umq] == [1, 2, 3, 4, 5, 6]
    unit = p.start()
    assert len(p.concurrent_deltas(unit, 0, 0, "a", 6)) == 6 - len(unit.updates)
