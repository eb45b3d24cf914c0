"""First-principles recomputation: a view evaluated from scratch over relation contents.

Each relation filtered by its local predicate, joined one at a time (a relation with a
column equality to those joined so far first, hashing on those equalities, so that no
connected view costs a cross product), then the whole WHERE clause again, then the
projection, then the view's aggregate or DISTINCT if it has one (``aggregate.evaluate``,
straight from the bag): obvious, and sharing nothing with incremental maintenance but the
predicate language. It is the oracle the tests hold maintenance to, and what ``pvm demo``
verifies the maintained view against (Garg's "first principle": recompute and compare).

>>> from contract.expr import Col, Cmp
>>> from warehouse.plan import OutputColumn, RelationRef, ViewPlan
>>> r, s = RelationRef("r", "a", "r", ("k",)), RelationRef("s", "b", "s", ("k",))
>>> plan = ViewPlan("v", (r, s), (Cmp("=", Col("r", "k"), Col("s", "k")),), (OutputColumn("k", Col("r", "k")),))
>>> rows = {("a", "r"): ZSet({(1,): 1, (2,): 1}), ("b", "s"): ZSet({(1,): 2})}
>>> recompute(plan, rows, {("a", "r"): ("k",), ("b", "s"): ("k",)})
ZSet({(1,): 2})
"""

from __future__ import annotations

from collections.abc import Mapping

from contract import expr
from contract.zset import ZSet
from warehouse.aggregate import evaluate
from warehouse.plan import RelationRef, ViewPlan


def recompute(
    plan: ViewPlan,
    contents: Mapping[tuple[str, str], ZSet],
    columns: Mapping[tuple[str, str], tuple[str, ...]],
) -> ZSet:
    """The view over ``contents[(source, table)]``, whose rows follow ``columns[(source, table)]``."""
    body = recompute_body(plan, contents, columns)
    return body if plan.summary is None else evaluate(plan.summary, body)


def recompute_body(
    plan: ViewPlan,
    contents: Mapping[tuple[str, str], ZSet],
    columns: Mapping[tuple[str, str], tuple[str, ...]],
) -> ZSet:
    """The view's select-project-join body over ``contents`` (the view itself without an aggregate).
    A LEFT JOIN's right relation is joined last, to the rows of all the others: each row with
    every partner its ON clause finds, or, finding none, with NULLs."""
    layout: list[expr.Col] = []
    combos = ZSet.unit()
    for r, cols in _join_order(plan, columns):
        combos = _hash_join(plan.join, combos, layout, _filtered(r, contents, cols), cols)
        layout += cols
    inner = [c for c in plan.join if c not in plan.outer_on]
    left = [r for i, r in enumerate(plan.relations) if i != plan.outer]
    where = expr.conjoin([*(r.where for r in left if r.where is not None), *inner])
    combos = combos.filter(expr.compile_filter(where, {c: i for i, c in enumerate(layout)}))
    if plan.outer is not None:
        right = plan.relations[plan.outer]
        cols = [expr.Col(right.alias, c) for c in columns[(right.source, right.table)]]
        on = expr.compile_filter(expr.conjoin(list(plan.outer_on)), {c: i for i, c in enumerate(layout + cols)})
        matched = _hash_join(plan.outer_on, combos, layout, _filtered(right, contents, cols), cols).filter(on)
        has_partner = {row[: len(layout)] for row in matched.rows()}
        nulls = (None,) * len(cols)
        matched.add_all(ZSet((row + nulls, w) for row, w in combos.items() if row not in has_partner))
        combos, layout = matched, layout + cols
    index = {c: i for i, c in enumerate(layout)}
    outputs = [index[o.column] for o in plan.outputs]
    return combos.map_rows(lambda row: tuple(row[i] for i in outputs))


def _filtered(r: RelationRef, contents: Mapping[tuple[str, str], ZSet], cols: list[expr.Col]) -> ZSet:
    """The relation's rows that pass its local predicate."""
    return contents[(r.source, r.table)].filter(expr.compile_filter(r.where, {c: i for i, c in enumerate(cols)}))


def _hash_join(join, combos: ZSet, layout: list[expr.Col], table: ZSet, cols: list[expr.Col]) -> ZSet:
    """``combos × table``, hashed on the column equalities of ``join`` between them (the rest
    of ``join`` is left to the caller's filter)."""
    left_keys, right_keys = _equalities(join, layout, cols)
    buckets: dict[tuple, list] = {}
    for right, wr in table.items():
        buckets.setdefault(tuple(right[i] for i in right_keys), []).append((right, wr))
    return ZSet(
        (left + right, wl * wr)
        for left, wl in combos.items()
        for right, wr in buckets.get(tuple(left[i] for i in left_keys), ())
    )


def _join_order(
    plan: ViewPlan, columns: Mapping[tuple[str, str], tuple[str, ...]]
) -> list[tuple[RelationRef, list[expr.Col]]]:
    """The relations with their columns, each next one the first (in FROM order) with a
    column equality to those before it, else the first left: no connected view is joined
    through a cross product, whatever its FROM order.

    >>> from contract.expr import Col, Cmp
    >>> from warehouse.plan import OutputColumn
    >>> a, c, b = (RelationRef(x, "s", x, ("k",)) for x in "acb")
    >>> chain = (Cmp("=", Col("a", "k"), Col("b", "k")), Cmp("=", Col("b", "k"), Col("c", "k")))
    >>> plan = ViewPlan("v", (a, c, b), chain, (OutputColumn("k", Col("a", "k")),))
    >>> [r.alias for r, _ in _join_order(plan, {("s", x): ("k",) for x in "acb"})]
    ['a', 'b', 'c']
    """
    remaining = {
        r.alias: (r, [expr.Col(r.alias, c) for c in columns[(r.source, r.table)]])
        for i, r in enumerate(plan.relations)
        if i != plan.outer  # a LEFT JOIN's right relation is joined apart, last
    }
    order: list[tuple[RelationRef, list[expr.Col]]] = []
    layout: list[expr.Col] = []
    while remaining:
        joined = (a for a, (_, cols) in remaining.items() if _equalities(plan.join, layout, cols)[0])
        r, cols = remaining.pop(next(joined, next(iter(remaining))))
        order.append((r, cols))
        layout += cols
    return order


def _equalities(join, left: list[expr.Col], right: list[expr.Col]) -> tuple[list[int], list[int]]:
    """Positions of ``left_col = right_col`` conjuncts between the rows so far and a relation."""
    li, ri = {c: i for i, c in enumerate(left)}, {c: i for i, c in enumerate(right)}
    pairs = []
    for c in join:
        if isinstance(c, expr.Cmp) and c.op == "=" and isinstance(c.left, expr.Col) and isinstance(c.right, expr.Col):
            if c.left in li and c.right in ri:
                pairs.append((li[c.left], ri[c.right]))
            elif c.right in li and c.left in ri:
                pairs.append((li[c.right], ri[c.left]))
    return [p for p, _ in pairs], [q for _, q in pairs]
