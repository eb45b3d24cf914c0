"""Laws of ``warehouse.consistent_cut``, checked against first principles.

A random history per view: the seqs of each source it reads that change it (the others are
filtered out), the seq its initial load read each source at, those seqs numbered into units
of one source each (interleaved across sources, in seq order per source) and the rest
queued. From first principles, the view as of order ``o`` reflects, of each source, every
seq up to the base (its initial load read them all) and the relevant ones in units ``<= o``; it shows the source at state ``t``
when that set is exactly its relevant seqs ``<= t``. Every combination of orders and states
is tried by brute force: the cut must be one of them, and at or above every other.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warehouse.consistent_cut import NoConsistentCut, Span, ViewSeqs, consistent_cut

SOURCES = ("s", "t", "u")


@dataclass(frozen=True)
class History:
    seqs: ViewSeqs
    relevant: dict[str, frozenset[int]]  # per source, the seqs that change the view

    def reflects(self, order: int, source: str) -> frozenset[int]:
        """The relevant seqs of ``source`` the state as of ``order`` holds."""
        base = {x for x in self.relevant[source] if x <= self.seqs.base[source]}
        numbered = {
            x
            for span in self.seqs.spans
            if span.order <= order and span.source == source
            for x in self.relevant[source]
            if span.first <= x <= span.last
        }
        return frozenset(base | numbered)

    def shows(self, order: int, source: str, state: int) -> bool:
        return self.reflects(order, source) == {x for x in self.relevant[source] if x <= state}


@st.composite
def histories(draw: st.DrawFn, released: dict[str, int]) -> History:
    sources = draw(st.lists(st.sampled_from(SOURCES), min_size=1, max_size=3, unique=True))
    base_order = draw(st.integers(1, 3))
    base: dict[str, int] = {}
    relevant: dict[str, frozenset[int]] = {}
    units: dict[str, list[list[int]]] = {}
    queued: dict[str, int] = {}
    for s in sources:
        base[s] = draw(st.integers(0, released[s]))
        later = range(base[s] + 1, released[s] + 1)
        seqs = sorted(draw(st.sets(st.sampled_from(later)))) if later else []
        relevant[s] = frozenset([*range(1, base[s] + 1), *seqs])  # the initial load read every seq up to its base
        numbered = draw(st.integers(0, len(seqs)))
        if numbered < len(seqs):
            queued[s] = seqs[numbered]
        chunks: list[list[int]] = []
        rest = seqs[:numbered]
        while rest:
            size = draw(st.integers(1, 3))
            chunks.append(rest[:size])
            rest = rest[size:]
        units[s] = chunks
    pending = [s for s in sources for _ in units[s]]
    interleaved = draw(st.permutations(pending))
    taken = dict.fromkeys(sources, 0)
    spans = []
    for order, s in enumerate(interleaved, start=base_order + 1):
        chunk = units[s][taken[s]]
        taken[s] += 1
        spans.append(Span(order, s, chunk[0], chunk[-1]))
    last = base_order + len(spans)
    watermark = draw(st.integers(base_order, last))
    readable_from = draw(st.integers(0, watermark))
    return History(ViewSeqs(base_order, base, watermark, tuple(spans), queued, readable_from), relevant)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, History]]:
    released = {s: draw(st.integers(0, 6)) for s in SOURCES}
    views = {f"v{i}": draw(histories(released)) for i in range(draw(st.integers(1, 3)))}
    return released, views


def consistent_states(views: dict[str, History], orders: dict[str, int], released: dict[str, int]) -> bool:
    """Whether one state per source exists that every view shows at its order."""
    for s in SOURCES:
        readers = [name for name, h in views.items() if s in h.seqs.sources]
        if readers and not any(
            all(views[name].shows(orders[name], s, t) for name in readers) for t in range(released[s] + 1)
        ):
            return False
    return True


def every_cut(views: dict[str, History], released: dict[str, int]) -> list[dict[str, int]]:
    names = sorted(views)
    ranges = [range(views[n].seqs.oldest, views[n].seqs.watermark + 1) for n in names]
    found = []
    for combo in itertools.product(*ranges):
        orders = dict(zip(names, combo))
        if consistent_states(views, orders, released):
            found.append(orders)
    return found


@settings(max_examples=250, deadline=None)
@given(worlds())
def test_the_cut_is_consistent_and_the_greatest(world):
    released, views = world
    cuts = every_cut(views, released)
    try:
        cut = consistent_cut({name: h.seqs for name, h in views.items()}, released)
    except NoConsistentCut as exc:
        assert not cuts, f"a cut exists: {cuts[0]}"
        assert exc.views and set(exc.views) <= set(views)
        return
    for name, h in views.items():
        assert h.seqs.oldest <= cut.orders[name] <= h.seqs.watermark
        for s in h.seqs.sources:  # the states it names: every view shows them
            assert h.shows(cut.orders[name], s, cut.seqs[s]), (name, s, cut)
    for other in cuts:
        assert all(other[name] <= cut.orders[name] for name in views), (other, cut)


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_a_view_alone_is_read_at_its_watermark(world):
    released, views = world
    for name, h in views.items():
        assert consistent_cut({name: h.seqs}, released).orders == {name: h.seqs.watermark}


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_views_without_common_sources_do_not_hold_each_other_back(world):
    released, views = world
    names = sorted(views)
    for a, b in itertools.combinations(names, 2):
        if views[a].seqs.sources.isdisjoint(views[b].seqs.sources):
            cut = consistent_cut({a: views[a].seqs, b: views[b].seqs}, released)
            assert cut.orders == {a: views[a].seqs.watermark, b: views[b].seqs.watermark}


def test_intervals_between_units_cover_the_filtered_seqs():
    """Seqs the view never received (filtered out) lie inside the intervals: a view that
    sees few of a source's updates does not hold one that sees them all back."""
    sparse = ViewSeqs(1, {"s": 0}, 2, (Span(2, "s", 9, 9),))
    dense = ViewSeqs(1, {"s": 0}, 9, tuple(Span(o + 1, "s", o, o) for o in range(1, 9)), queued={"s": 9})
    cut = consistent_cut({"sparse": sparse, "dense": dense}, {"s": 12})
    assert cut.orders == {"sparse": 1, "dense": 9} and cut.seqs == {"s": 8}


def test_no_cut_names_the_view_and_sources():
    ahead = ViewSeqs(1, {"s": 5, "t": 0}, 1)
    behind = ViewSeqs(1, {"s": 0}, 1, (Span(2, "s", 1, 1),))
    with pytest.raises(NoConsistentCut, match="'ahead'") as caught:
        consistent_cut({"ahead": ahead, "behind": behind}, {"s": 5, "t": 0})
    assert caught.value.views == ["ahead"] and caught.value.sources == ["s"]
