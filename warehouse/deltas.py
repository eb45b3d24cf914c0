"""From a logged source update to what one view sees of it (Garg's delta rules).

A change of relation R_i is kept for a view if it passes R_i's local predicate, and is
projected to the columns the view needs from R_i. Changes of relations the view does not
read vanish; an update that leaves nothing is not the view's concern at all.

A table the view reads more than once (a self-join: employee and manager) has one position
per alias, each with its own columns and local predicate: a change of the table is a change
of every one of them, filtered and projected for each, and the chain rule maintains the
positions as separate relations (docs/protocol.md, "Self-joins").

>>> from contract.expr import Cmp, Col, Lit
>>> from warehouse.catalog.db import LogEntry
>>> from warehouse.plan import OutputColumn, RelationRef, ViewPlan
>>> e = RelationRef("e", "hr", "emp", ("id", "boss"))
>>> m = RelationRef("m", "hr", "emp", ("id", "name"), Cmp("<>", Col("m", "name"), Lit("x")))
>>> plan = ViewPlan("v", (e, m), (Cmp("=", Col("e", "boss"), Col("m", "id")),), (OutputColumn("name", Col("m", "name")),))
>>> extract = DeltaExtractor(plan)
>>> row = {"id": 1, "boss": 1, "name": "ann"}
>>> update = extract(LogEntry(7, "hr", 3, [{"relation": "emp", "sign": 1, "row": row}], None, 0.0))
>>> update.deltas
{0: ZSet({(1, 1): 1}), 1: ZSet({(1, 'ann'): 1})}
>>> extract.needed_columns("hr", "emp")
('id', 'boss', 'name')
"""

from __future__ import annotations

from contract.expr import compile_filter
from contract.zset import ZSet
from warehouse.catalog.db import LogEntry
from warehouse.plan import ViewPlan
from warehouse.protocol import ViewUpdate


class DeltaExtractor:
    """``hold_rows``: an update logged from parts whose deltas have more rows than this is
    not held: its ``ViewUpdate`` counts their rows and leaves them in the log
    (``ViewUpdate.logged``), read back a part at a time with ``deltas``. None: every
    update is held whole (a view that cannot sweep a unit in parts).

    >>> from warehouse.plan import RelationRef
    >>> r = RelationRef("r", "s", "t", ("k",))
    >>> extract = DeltaExtractor(ViewPlan("v", (r,), (), ()), hold_rows=2)
    >>> changes = [{"relation": "t", "sign": 1, "row": {"k": k}} for k in range(3)]
    >>> extract(LogEntry(7, "s", 3, changes, None, 0.0, parts=2)).logged
    {0: 3}
    >>> extract(LogEntry(7, "s", 3, changes[:2], None, 0.0, parts=2)).deltas
    {0: ZSet({(0,): 1, (1,): 1})}
    """

    def __init__(self, plan: ViewPlan, hold_rows: int | None = None) -> None:
        self.plan = plan
        self.hold_rows = hold_rows
        self._reads = {(t.source, t.table): t for t in plan.table_reads}
        self._positions = {key: t.positions for key, t in self._reads.items()}
        self._filters = [compile_filter(r.where, {c: i for i, c in enumerate(r.cols())}) for r in plan.relations]

    def __call__(self, entry: LogEntry) -> ViewUpdate | None:
        hold = self.hold_rows if entry.parts else None  # a whole entry is one post's size
        deltas, counts = self._extract(entry, hold)
        if hold is not None and sum(counts.values()) > hold:
            logged = dict(sorted(counts.items()))
            return ViewUpdate(entry.id, entry.source, entry.seq, {}, entry.captured_at, entry.received_at, logged)
        if not deltas:
            return None
        return ViewUpdate(entry.id, entry.source, entry.seq, deltas, entry.captured_at, entry.received_at)

    def deltas(self, entry: LogEntry) -> dict[int, ZSet]:
        """What the view reads of ``entry``'s changes, by position, whatever their size (a
        part of a logged update is one post's size)."""
        return self._extract(entry, None)[0]

    def _extract(self, entry: LogEntry, hold: int | None) -> tuple[dict[int, ZSet], dict[int, int]]:
        """The non-empty deltas, and the rows kept per position (not merged); past ``hold``
        rows the deltas are dropped and only counted."""
        deltas: dict[int, ZSet] = {}
        counts: dict[int, int] = {}
        held = 0
        for change in entry.changes:
            for position in self._positions.get((entry.source, change["relation"]), ()):
                relation = self.plan.relations[position]
                row = tuple(change["row"][c] for c in relation.columns)
                if self._filters[position](row):
                    counts[position] = counts.get(position, 0) + 1
                    if hold is None or held < hold:
                        deltas.setdefault(position, ZSet()).add(row, change["sign"])
                        held += 1
                    elif deltas:
                        deltas = {}  # past the bound: counted only, never held
        return {p: d for p, d in sorted(deltas.items()) if d}, counts

    def complete(self, entry: LogEntry) -> bool:
        """Whether every change carries the columns the view needs of its relation."""
        return all(
            set(self.needed_columns(entry.source, change["relation"])) <= change["row"].keys()
            for change in entry.changes
        )

    def needed_columns(self, source: str, table: str) -> tuple[str, ...]:
        """The columns the view reads of ``table``, over all its positions (``TableRead``)."""
        read = self._reads.get((source, table))
        return () if read is None else read.columns

    def table_changes(self, entry: LogEntry, table: str) -> ZSet:
        """The changes of ``table`` in ``entry`` as ``TableRead`` reads the table: rows that
        pass a local predicate of any of its positions, projected to all their columns."""
        read = self._reads.get((entry.source, table))
        out = ZSet()
        if read is None:
            return out
        for change in entry.changes:
            row = change["row"]
            if change["relation"] == table and any(
                self._filters[p](tuple(row[c] for c in self.plan.relations[p].columns)) for p in read.positions
            ):
                out.add(tuple(row[c] for c in read.columns), change["sign"])
        return out
