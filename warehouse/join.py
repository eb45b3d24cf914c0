"""Joining a partial result with one relation: from a source's answer, or locally.

Both functions compute ``partial ⋈_on R`` for one SWEEP step; weights multiply. A source
answers a step with rows ``(key index, relation values, count)`` (see ``SubqueryAnswer``);
``extend`` turns that into the joined Z-set. ``local_join`` computes the same thing in Python
against a Z-set of relation rows: the local compensation term ``partial ⋈ ΔR`` and the
oracle's recomputation use it.

>>> from contract.expr import Col, Cmp
>>> from warehouse.plan import SweepStep
>>> step = SweepStep(1, (Col("r", "b"),), (Col("r", "b"),), Cmp("=", Col("r", "b"), Col("s", "b")))
>>> sorted(local_join(ZSet({(1,): 2, (2,): 1}), step, ZSet({(1,): 3}), (Col("s", "b"),)).items())
[((1, 1), 6)]
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

from contract.expr import Cmp, Col, compile_filter, conjuncts
from contract.zset import Row, ZSet
from warehouse.plan import SweepStep


def key_function(step: SweepStep):
    index = {c: i for i, c in enumerate(step.layout)}
    positions = [index[c] for c in step.keys]
    return lambda row: tuple(row[i] for i in positions)


def distinct_keys(partial: ZSet, step: SweepStep) -> list[Row]:
    """The distinct key tuples of the partial result: what a subquery ships to the source."""
    key = key_function(step)
    return list(dict.fromkeys(key(row) for row in partial.rows()))


def key_chunks(partial: ZSet, step: SweepStep, most: int) -> list[tuple[ZSet, list[Row]]]:
    """``partial`` cut by its keys into parts of at most ``most`` distinct keys each, with
    their keys: the subquery of each part ships those keys only. The parts add up to
    ``partial`` and no key is in two of them, so ``Σ (part ⋈ R) = partial ⋈ R``.

    >>> from contract.expr import Col
    >>> step = SweepStep(1, (Col("r", "a"), Col("r", "b")), (Col("r", "b"),), None)
    >>> parts = key_chunks(ZSet({(1, 10): 1, (2, 10): 1, (3, 20): 2, (4, 30): -1}), step, 2)
    >>> [(sorted(part.items()), keys) for part, keys in parts]
    [([((1, 10), 1), ((2, 10), 1), ((3, 20), 2)], [(10,), (20,)]), ([((4, 30), -1)], [(30,)])]
    """
    key = key_function(step)
    parts: dict[Row, int] = {}  # key -> index of its part
    chunks: list[tuple[ZSet, list[Row]]] = []
    for row, weight in partial.items():
        k = key(row)
        index = parts.get(k)
        if index is None:
            if not chunks or len(chunks[-1][1]) >= most:
                chunks.append((ZSet(), []))
            index = parts[k] = len(chunks) - 1
            chunks[index][1].append(k)
        chunks[index][0].add(row, weight)
    return chunks


def extend(partial: ZSet, step: SweepStep, keys: Sequence[Row], answer: Iterable[tuple[int, Row, int]]) -> ZSet:
    """Join ``partial`` with a source's answer ``(key index, relation row, count)``."""
    matches: dict[Row, list[tuple[Row, int]]] = defaultdict(list)
    for key_index, rel_row, count in answer:
        matches[keys[key_index]].append((tuple(rel_row), count))
    key = key_function(step)
    out = ZSet()
    for row, weight in partial.items():
        for rel_row, count in matches.get(key(row), ()):
            out.add(row + rel_row, weight * count)
    return out


def local_join(partial: ZSet, step: SweepStep, relation: ZSet, rel_cols: tuple[Col, ...]) -> ZSet:
    """``partial ⋈_on relation`` in Python; hashes on the equality conjuncts of ``on``."""
    if not partial or not relation:
        return ZSet()
    p_hash, r_hash, keep = _join_plan(step, rel_cols)
    buckets: dict[Row, list[tuple[Row, int]]] = defaultdict(list)
    for rel_row, w in relation.items():
        buckets[tuple(rel_row[i] for i in r_hash)].append((rel_row, w))
    out = ZSet()
    for row, weight in partial.items():
        probe = tuple(row[i] for i in p_hash)
        if any(v is None for v in probe):  # NULL never equals anything
            continue
        for rel_row, w in buckets.get(probe, ()):
            joined = row + rel_row
            if keep(joined):
                out.add(joined, weight * w)
    return out


def matching(partial: ZSet, step: SweepStep, relation: ZSet, rel_cols: tuple[Col, ...]) -> ZSet:
    """The rows of ``relation`` whose equality columns meet some row of ``partial``: all
    that ``local_join(partial, step, relation, rel_cols)`` can use.

    >>> from contract.expr import Col, Cmp
    >>> step = SweepStep(1, (Col("a", "k"),), (Col("a", "k"),), Cmp("=", Col("a", "k"), Col("b", "k")))
    >>> matching(ZSet({(1,): 1}), step, ZSet({(1, "x"): 1, (2, "y"): -1}), (Col("b", "k"), Col("b", "v")))
    ZSet({(1, 'x'): 1})
    """
    if not partial or not relation:
        return ZSet()
    p_hash, r_hash, _ = _join_plan(step, rel_cols)
    probes = {tuple(row[i] for i in p_hash) for row in partial.rows()}
    return ZSet({row: w for row, w in relation.items() if tuple(row[i] for i in r_hash) in probes})


@functools.lru_cache(maxsize=1024)
def _join_plan(
    step: SweepStep, rel_cols: tuple[Col, ...]
) -> tuple[tuple[int, ...], tuple[int, ...], Callable[[Row], bool]]:
    """The positions ``local_join`` hashes on in each side, and the compiled ``on``, once per
    step: compiling the predicate costs more than the join of a few delta rows."""
    p_index = {c: i for i, c in enumerate(step.layout)}
    r_index = {c: i for i, c in enumerate(rel_cols)}
    p_hash: list[int] = []
    r_hash: list[int] = []
    for c in conjuncts(step.on):
        if isinstance(c, Cmp) and c.op == "=" and isinstance(c.left, Col) and isinstance(c.right, Col):
            if c.left in p_index and c.right in r_index:
                p_hash.append(p_index[c.left])
                r_hash.append(r_index[c.right])
            elif c.right in p_index and c.left in r_index:
                p_hash.append(p_index[c.right])
                r_hash.append(r_index[c.left])
    layout = {c: i for i, c in enumerate(step.layout + rel_cols)}
    return tuple(p_hash), tuple(r_hash), compile_filter(step.on, layout)
