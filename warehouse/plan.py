"""The select-project-join plan of a view and its SWEEP subquery sequences.

A view is ``π_outputs σ_join (R_1 × … × R_n)`` with local predicates pushed to each R_i.
Relations have positions 0..n-1 in FROM order. Every relation carries the columns the view needs from it
(outputs, join and local predicate columns): those are the only columns shipped for it, in
updates and in subquery answers (Garg: projections pushed to the sources).

For a change of relation k, SWEEP joins the delta with the relations left of k from right to
left, then with those right of k from left to right; relation k itself is never queried::

    sweep_order(k=2, n=5) == [1, 0, 3, 4]

Initial materialization starts from the unit Z-set ``{(): 1}`` and queries every relation,
in FROM order. Each step joins the partial result with one relation under the join
conjuncts whose relations are all present once that relation joins.

Compensation does not depend on the order of the subqueries (it compares relation
positions, not query times), so where SWEEP's next relation shares no join predicate with
the partial result yet, the first one in SWEEP's order that does is taken instead. For a
chain or path written in its order that is SWEEP's order; for any other FROM order of a
connected view it avoids the cross product SWEEP's order would ship.

A view with a LEFT JOIN (``outer``: its right relation, the last) queries that relation last
in every term but its own, so that the step asking it holds whole left rows: their partner
counts decide which of them are extended with NULLs (``warehouse.outer_join``).

>>> from contract.expr import Col, Cmp
>>> r = RelationRef("r", "s1", "r", ("a", "b"), None)
>>> s = RelationRef("s", "s2", "s", ("b",), None)
>>> plan = ViewPlan("v", (r, s), (Cmp("=", Col("r", "b"), Col("s", "b")),), (OutputColumn("a", Col("r", "a")),))
>>> [step.relation for step in plan.sweep(1)]
[0]
>>> plan.sweep(1)[0].keys
(Col(relation='s', name='b'),)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from contract.expr import Col, Expr, Or, columns, conjoin, relations, substitute
from warehouse.aggregate import Summary


@dataclass(frozen=True)
class RelationRef:
    """One relation of the view: where it lives and what the view needs from it."""

    alias: str
    source: str
    table: str
    columns: tuple[str, ...]
    where: Expr | None = None

    def cols(self) -> tuple[Col, ...]:
        return tuple(Col(self.alias, c) for c in self.columns)


@dataclass(frozen=True)
class TableRead:
    """One source table as all the view's relations over it read it together: a self-join
    reads one table under several aliases (``positions``). Its columns are theirs, first seen
    first; a row matters if any of their local predicates holds (``where``, written over
    ``alias``, the first of them; None: every row). What a wrapper ships of the table and
    what a verification reads of it."""

    source: str
    table: str
    alias: str
    columns: tuple[str, ...]
    where: Expr | None
    positions: tuple[int, ...]


@dataclass(frozen=True)
class OutputColumn:
    name: str
    column: Col


@dataclass(frozen=True)
class SweepStep:
    """Join the partial result (``layout``) with relation ``relation`` under ``on``.

    ``keys`` are the partial result's columns that ``on`` reads: only their distinct values
    are shipped to the source. The step's result has layout ``layout + relation columns``.
    """

    relation: int
    layout: tuple[Col, ...]
    keys: tuple[Col, ...]
    on: Expr | None


@dataclass(frozen=True)
class ViewPlan:
    name: str
    relations: tuple[RelationRef, ...]
    join: tuple[Expr, ...]
    outputs: tuple[OutputColumn, ...]
    sql: str = field(default="", compare=False)
    # GROUP BY, aggregates or DISTINCT over the SPJ body whose columns ``outputs`` are
    # (``warehouse/aggregate.py``); None: the view is the body itself.
    summary: Summary | None = None
    outer: int | None = None
    """The position of a LEFT JOIN's right relation (always the last), or None: the view is
    the inner join plus every left row without a partner, extended with NULLs. Its ON
    conjuncts that read the left side are the join conjuncts reading it (``outer_on``); those
    that read it alone are its local predicate. See docs/protocol.md, "Outer joins"."""

    # -- lookups -----------------------------------------------------------------------
    @cached_property
    def sources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.source for r in self.relations))

    @cached_property
    def table_reads(self) -> tuple[TableRead, ...]:
        """Every distinct table the view reads, in FROM order of its first relation.

        >>> e = RelationRef("e", "hr", "emp", ("id", "boss"))
        >>> m = RelationRef("m", "hr", "emp", ("id", "name"))
        >>> [(t.table, t.alias, t.columns, t.positions) for t in ViewPlan("v", (e, m), (), ()).table_reads]
        [('emp', 'e', ('id', 'boss', 'name'), (0, 1))]
        """
        groups: dict[tuple[str, str], list[int]] = {}
        for i, r in enumerate(self.relations):
            groups.setdefault((r.source, r.table), []).append(i)
        return tuple(self._table_read(source, table, tuple(ps)) for (source, table), ps in groups.items())

    def _table_read(self, source: str, table: str, positions: tuple[int, ...]) -> TableRead:
        refs = [self.relations[p] for p in positions]
        alias = refs[0].alias
        cols = tuple(dict.fromkeys(c for r in refs for c in r.columns))
        wheres = [
            None if r.where is None else substitute(r.where, {Col(r.alias, c): Col(alias, c) for c in r.columns})
            for r in refs
        ]
        where = None if None in wheres else wheres[0] if len(wheres) == 1 else Or(tuple(w for w in wheres if w))
        return TableRead(source, table, alias, cols, where, positions)

    # -- LEFT JOIN ---------------------------------------------------------------------------
    @cached_property
    def outer_on(self) -> tuple[Expr, ...]:
        """The outer join's ON conjuncts between its two sides (empty for an inner view)."""
        if self.outer is None:
            return ()
        alias = self.relations[self.outer].alias
        return tuple(c for c in self.join if alias in relations(c))

    @cached_property
    def partner_step(self) -> SweepStep:
        """A step asking the outer join's right relation for the partners of left keys: the
        layout is the key, the left side's columns the ON clause reads. A left row's partner
        count depends on those columns only (the ON clause reads nothing else of the left)."""
        assert self.outer is not None, "only an outer join has partners to count"
        on = conjoin(list(self.outer_on))
        left = [r for i, r in enumerate(self.relations) if i != self.outer]
        keys = tuple(c for r in left for c in r.cols() if on is not None and c in columns(on))
        return SweepStep(self.outer, keys, keys, on)

    @property
    def output_names(self) -> tuple[str, ...]:
        """The SPJ body's columns: what maintenance yields rows of."""
        return tuple(o.name for o in self.outputs)

    @property
    def view_names(self) -> tuple[str, ...]:
        """The view's columns, as readers see them."""
        return self.output_names if self.summary is None else self.summary.output_names

    @property
    def stored_names(self) -> tuple[str, ...]:
        """The columns of the rows the store keeps for the view."""
        return self.output_names if self.summary is None else self.summary.stored_names

    # -- SWEEP ---------------------------------------------------------------------------
    def sweep(self, changed: int | None) -> tuple[SweepStep, ...]:
        """The subquery steps for a delta of relation ``changed`` (None: initial load)."""
        if changed not in self._sweeps:
            joined: tuple[int, ...] = () if changed is None else (changed,)
            steps = []
            while (j := self._next_relation(changed, joined)) is not None:
                steps.append(self._step(joined, j))
                joined += (j,)
            self._sweeps[changed] = tuple(steps)
        return self._sweeps[changed]

    @cached_property
    def _sweeps(self) -> dict[int | None, tuple[SweepStep, ...]]:
        return {}

    def _next_relation(self, changed: int | None, joined: tuple[int, ...]) -> int | None:
        """SWEEP's next relation, or, when it shares no join conjunct with the partial result,
        the first in SWEEP's order that does (FROM order for the initial load, whose first
        relation starts the partial result)."""
        order = list(range(len(self.relations))) if changed is None else sweep_order(changed, len(self.relations))
        remaining = [j for j in order if j not in joined]
        if not remaining:
            return None
        if len(remaining) > 1 and self.outer in remaining:  # a LEFT JOIN's right side comes last
            remaining.remove(self.outer)
        present = {self.relations[i].alias for i in joined}
        connected = [j for j in remaining if self._joins(self.relations[j].alias, present)]
        return connected[0] if connected else remaining[0]

    def _joins(self, alias: str, present: set[str]) -> bool:
        return any(alias in relations(c) and (relations(c) - {alias}) & present for c in self.join)

    def _step(self, joined: tuple[int, ...], j: int) -> SweepStep:
        """The step joining relation ``j`` to a partial result of ``joined`` (in that order)."""
        present = {self.relations[i].alias for i in joined}
        alias = self.relations[j].alias
        on = [c for c in self.join if alias in relations(c) and relations(c) <= present | {alias}]
        layout = tuple(c for i in joined for c in self.relations[i].cols())
        keys = tuple(c for c in layout if any(c in columns(p) for p in on))
        return SweepStep(j, layout, keys, conjoin(on))

    def final_layout(self, changed: int | None) -> tuple[Col, ...]:
        steps = self.sweep(changed)
        if not steps:  # a one-relation view
            return self.relations[changed or 0].cols()
        last = steps[-1]
        return last.layout + self.relations[last.relation].cols()

    def projection(self, changed: int | None):
        """A function from a final partial row to the view's output row."""
        layout = {c: i for i, c in enumerate(self.final_layout(changed))}
        idx = [layout[o.column] for o in self.outputs]
        return lambda row: tuple(row[i] for i in idx)


def sweep_order(k: int, n: int) -> list[int]:
    """SWEEP's subquery order for a change of relation k among n relations."""
    return list(range(k - 1, -1, -1)) + list(range(k + 1, n))
