"""From a logged source update to what one view sees of it (Garg's delta rules).

A change of relation R_i is kept for a view if it passes R_i's local predicate, and is
projected to the columns the view needs from R_i. Changes of relations the view does not
read vanish; an update that leaves nothing is not the view's concern at all.
"""

from __future__ import annotations

from contract.expr import compile_filter
from contract.zset import ZSet
from warehouse.catalog.db import LogEntry
from warehouse.plan import ViewPlan
from warehouse.protocol import ViewUpdate


class DeltaExtractor:
    def __init__(self, plan: ViewPlan) -> None:
        self.plan = plan
        self._positions = {(r.source, r.table): i for i, r in enumerate(plan.relations)}
        self._filters = [compile_filter(r.where, {c: i for i, c in enumerate(r.cols())}) for r in plan.relations]

    def __call__(self, entry: LogEntry) -> ViewUpdate | None:
        deltas: dict[int, ZSet] = {}
        for change in entry.changes:
            position = self._positions.get((entry.source, change["relation"]))
            if position is None:
                continue
            relation = self.plan.relations[position]
            row = tuple(change["row"][c] for c in relation.columns)
            if self._filters[position](row):
                deltas.setdefault(position, ZSet()).add(row, change["sign"])
        deltas = {p: d for p, d in deltas.items() if d}
        if not deltas:
            return None
        return ViewUpdate(entry.id, entry.source, entry.seq, deltas, entry.captured_at, entry.received_at)

    def complete(self, entry: LogEntry) -> bool:
        """Whether every change carries the columns the view needs of its relation."""
        for change in entry.changes:
            position = self._positions.get((entry.source, change["relation"]))
            if position is not None and not set(self.plan.relations[position].columns) <= change["row"].keys():
                return False
        return True

    def needed_columns(self, source: str, table: str) -> tuple[str, ...]:
        position = self._positions.get((source, table))
        return () if position is None else self.plan.relations[position].columns
