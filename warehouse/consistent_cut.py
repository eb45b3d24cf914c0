"""Consistent cuts: one source state that several views are read at together.

Every view numbers its own units, so two views over the same sources reach unrelated states
at their watermarks. What they share are the sources' seqs. The receiver hands each
source's updates to every view in seq order, and a view numbers a source's updates in that
order (a unit is one source's updates, ``warehouse.protocol``), so a view's state as of an
order ``o`` is the view over, for each of its sources ``s``, the source's state after
exactly the updates with ``seq <= t`` for every ``t`` in an interval ``[lo, hi]``:

* ``lo``: the last seq of ``s`` in a unit ordered ``<= o`` (or the seq the initial load read
  the source at, its base);
* ``hi``: one before the first seq of ``s`` in a unit ordered ``> o`` or still queued, or,
  when there is none, the last seq the receiver has released (every update up to it was
  handed to the view: the ones it did not queue do not change it).

A seq in between changes nothing the view reads. A **cut** of a set of views is an order per
view and one seq ``T[s]`` per source such that ``T[s]`` lies in the interval of every view
reading ``s`` at its order: read at those orders, the views show the sources at state ``T``.

``consistent_cut`` finds the greatest one, each view at most at its watermark W and at least
at the oldest order it can still be read at. It starts every view at W and repeats two
steps until nothing changes: ``T[s]`` is the least ``hi`` of the views reading ``s``; each
view moves back to its last order whose ``lo`` are all within ``T``. Both steps only lower
things, so it ends; at the end every ``lo <= T[s] <= hi``. It is the greatest: a cut with
orders ``o'`` has ``o' <= o`` at every step (induction: its ``T'[s] <= hi`` at ``o'``, which
is at most ``hi`` at ``o``, so its ``lo`` at ``o'`` are within the new ``T``). Only views
that share a source (or are linked through views that do) hold each other back. A view that
would have to go back past the oldest order it can be read at has no state in common with
the others yet: ``NoConsistentCut`` names it and the sources, and asking again later helps
(``lo`` and W only grow, and ``hi`` grows as updates arrive).

>>> a = ViewSeqs(base_order=1, base={"s": 0}, watermark=3, spans=(Span(2, "s", 1, 1), Span(3, "s", 2, 2)))
>>> b = ViewSeqs(base_order=1, base={"s": 0}, watermark=2, spans=(Span(2, "s", 1, 1), Span(3, "s", 2, 2)))
>>> cut = consistent_cut({"a": a, "b": b}, released={"s": 2})
>>> cut.orders, cut.seqs  # b has committed seq 1 only: a is read back at order 2
({'a': 2, 'b': 2}, {'s': 1})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Cut", "NoConsistentCut", "Span", "ViewSeqs", "consistent_cut"]


@dataclass(frozen=True)
class Span:
    """The updates of one unit: seqs ``first`` to ``last`` of ``source`` (a unit holds one
    source's updates, in seq order)."""

    order: int
    source: str
    first: int
    last: int


@dataclass(frozen=True)
class ViewSeqs:
    """What one view's states reflect of its sources, order by order.

    ``base``: per source, the last seq the state as of ``base_order`` reflects (the initial
    load's, or where the record of spans starts); ``spans``: every unit numbered after
    ``base_order`` that holds updates, committed or not, in order; ``queued``: per source, the
    first seq queued in no unit yet; ``readable_from``: the oldest order the store can still
    read (a compacted one may be above ``base_order``)."""

    base_order: int
    base: Mapping[str, int]
    watermark: int
    spans: Sequence[Span] = ()
    queued: Mapping[str, int] = field(default_factory=dict)
    readable_from: int = 0

    @property
    def sources(self) -> frozenset[str]:
        return frozenset(self.base)

    @property
    def oldest(self) -> int:
        """The oldest order a cut may read the view at."""
        return max(self.base_order, self.readable_from)

    def interval(self, order: int, source: str, released: int) -> tuple[int, int]:
        """``(lo, hi)``: the seqs of ``source`` at which the state as of ``order`` is the view
        over the source (``released``: the last seq the receiver released of it).

        >>> v = ViewSeqs(1, {"s": 4}, 3, (Span(2, "s", 5, 6), Span(3, "t", 1, 1), Span(4, "s", 9, 9)))
        >>> v.interval(1, "s", 20), v.interval(3, "s", 20), v.interval(4, "s", 20)
        ((4, 4), (6, 8), (9, 20))
        """
        lo = self.base[source]
        nxt = self.queued.get(source)
        for span in self.spans:
            if span.source != source:
                continue
            if span.order <= order:
                lo = max(lo, span.last)
            else:
                nxt = span.first if nxt is None else min(nxt, span.first)
                break  # spans of one source come in seq order
        # released below lo: the receiver has not caught up with the initial load's base
        # yet, and the view knows nothing past it
        hi = max(released, lo) if nxt is None else nxt - 1
        return lo, hi

    def last_within(self, frontier: Mapping[str, int], below: int) -> int:
        """The last order ``<= below`` whose ``lo`` are all within ``frontier``: ``lo`` only
        grows with the order, so the orders that qualify are a prefix. ``oldest - 1`` if even
        the oldest order does not qualify.

        >>> v = ViewSeqs(1, {"s": 4}, 3, (Span(2, "s", 5, 6), Span(3, "s", 7, 7)))
        >>> v.last_within({"s": 6}, 3), v.last_within({"s": 3}, 3)
        (2, 0)
        """
        lo = dict(self.base)
        last = below
        if any(lo[s] > frontier[s] for s in lo):
            last = self.base_order - 1
        else:
            for span in self.spans:
                if span.order > below:
                    break
                lo[span.source] = max(lo[span.source], span.last)
                if lo[span.source] > frontier[span.source]:
                    last = span.order - 1
                    break
        return last if last >= self.oldest else self.oldest - 1


@dataclass(frozen=True)
class Cut:
    """An order per view and the source state ``seqs`` they all show at those orders."""

    orders: dict[str, int]
    seqs: dict[str, int]


class NoConsistentCut(Exception):
    """The views have no state in common yet: one of them would have to be read before the
    oldest order it can be read at. Retryable: it goes away as the views catch up."""

    def __init__(self, views: Sequence[str], sources: Sequence[str]) -> None:
        self.views = sorted(views)
        self.sources = sorted(sources)
        super().__init__(
            f"view(s) {', '.join(map(repr, self.views))} cannot be read at one state of source(s) "
            f"{', '.join(map(repr, self.sources))} with the others yet: their oldest readable state "
            "is ahead of what the others have reached; ask again once the views have caught up"
        )


def consistent_cut(views: Mapping[str, ViewSeqs], released: Mapping[str, int]) -> Cut:
    """The greatest cut of ``views``, each at most at its watermark (the module's docstring
    says how and why); ``released``: per source, the last seq the receiver released.
    ``NoConsistentCut`` when there is none yet.

    >>> a = ViewSeqs(1, {"s": 3}, 1)
    >>> b = ViewSeqs(1, {"s": 0}, 2, (Span(2, "s", 1, 2),))
    >>> cut = consistent_cut({"a": a, "b": b}, {"s": 5})  # a loaded at 3, b has 1 and 2 at order 2
    >>> cut.orders, cut.seqs  # seqs 3 to 5 change nothing b reads
    ({'a': 1, 'b': 2}, {'s': 5})
    >>> try:  # b has reached seq 0 only, and a was loaded at seq 3
    ...     consistent_cut({"a": a, "b": ViewSeqs(1, {"s": 0}, 1, (Span(2, "s", 1, 4),))}, {"s": 5})
    ... except NoConsistentCut as exc:
    ...     exc.views, exc.sources
    (['a'], ['s'])
    """
    orders = {name: view.watermark for name, view in views.items()}
    unloaded = [name for name, view in views.items() if view.watermark < view.oldest]
    if unloaded:
        raise NoConsistentCut(unloaded, sorted({s for name in unloaded for s in views[name].sources}))
    while True:
        seqs: dict[str, int] = {}
        for name, view in views.items():
            for source in view.sources:
                hi = view.interval(orders[name], source, released.get(source, 0))[1]
                seqs[source] = min(seqs.get(source, hi), hi)
        moved = False
        for name, view in views.items():
            order = view.last_within(seqs, orders[name])
            if order < view.oldest:
                behind = [s for s in view.sources if view.interval(view.oldest, s, released.get(s, 0))[0] > seqs[s]]
                raise NoConsistentCut([name], behind)
            if order != orders[name]:
                orders[name], moved = order, True
        if not moved:
            return Cut(orders, seqs)
