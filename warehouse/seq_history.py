"""What a view's units hold of its sources' seqs: the bookkeeping behind consistent cuts.

Per view, the seq its initial load read each source at (its base) and, for every unit
numbered since, the seqs it holds (``Span``: a unit is one source's updates). With what the
view has queued, that tells the interval of seqs each of its states shows its sources at
(``warehouse.consistent_cut``). After a restart the manager reads the spans of the newest
units back from the update log (``Manager._recover_history``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

from warehouse.consistent_cut import Span, ViewSeqs
from warehouse.protocol import Unit

MAX_SPANS = 10_000
"""Spans kept per view; older committed ones are folded into the base, so a cut can read a
view back at most about this many units (a compacted store cannot read further anyway)."""


class SeqHistory:
    """The base and the spans of one view's units (no I/O, no awaits)."""

    def __init__(self) -> None:
        self.base_order: int | None = None  # None: no state yet (the initial load runs)
        self.base: dict[str, int] = {}
        self.spans: list[Span] = []

    def begin(self, order: int, base: Mapping[str, int]) -> None:
        """The initial load is unit ``order`` and reads each source at seq ``base[source]``."""
        self.base_order, self.base = order, dict(base)
        self.spans = [s for s in self.spans if s.order > order]

    def number(self, units: Iterable[Unit]) -> None:
        """Units numbered (or numbered before a restart): their spans, kept in order."""
        self.add(Span(u.order, u.updates[0].source, u.updates[0].seq, u.updates[-1].seq) for u in units if u.updates)

    def add(self, spans: Iterable[Span]) -> None:
        for span in spans:
            if self.spans and self.spans[-1].order > span.order:  # recovered units come in any order
                bisect.insort(self.spans, span, key=lambda s: s.order)
            else:
                self.spans.append(span)

    def fold(self, watermark: int) -> None:
        """Keep at most ``MAX_SPANS`` spans: past it, fold the older committed ones into the
        base, down to half of it, so that the list is rebuilt once per ``MAX_SPANS / 2``
        units rather than at every commit."""
        if self.base_order is None or len(self.spans) <= MAX_SPANS:
            return
        upto = min(watermark, self.spans[-(MAX_SPANS // 2)].order - 1)
        for span in self.spans:
            if span.order > upto:
                break
            self.base[span.source] = max(self.base[span.source], span.last)
        self.spans = [s for s in self.spans if s.order > upto]
        self.base_order = max(self.base_order, upto)

    def seqs(self, watermark: int, queued: Mapping[str, int], readable_from: int = 0) -> ViewSeqs | None:
        """The view's states as ``consistent_cut`` takes them; None before the initial load."""
        if self.base_order is None:
            return None
        return ViewSeqs(self.base_order, dict(self.base), watermark, tuple(self.spans), dict(queued), readable_from)
