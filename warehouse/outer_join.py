"""The NULL-extended rows of a LEFT JOIN, from partner counts (Griffin and Kumar; Larson
and Zhou: the dangling rows' changes derived from the inner join's).

A view ``Left ⟕_θ S`` is the inner join ``Left ⋈_θ S`` plus every left row without a partner,
extended with NULLs for S's columns. θ reads one left relation and S, so whether a left row
has a partner depends only on the left columns θ reads: its *key*. The partner count of a key
is ``Σ`` of the weights of S's rows θ matches; it is linear in S, so it is computed from a
subquery answer and compensated exactly like the answer (``count_partners``). Then:

* a change of the left side (or the initial load): each row of the term's partial result is
  joined with S as usual and, where its key has no partner in S's state before the term,
  extended with NULLs (``null_extend``);
* a change ΔS of S: the keys θ matches in ΔS are the only ones whose counts change. Their
  counts after the term (a subquery, compensated as any) minus ΔS's own (``local_counts``)
  give those before; a key whose count falls to 0 gains its left rows extended with NULLs, one
  whose count rises from 0 loses them (``flips``, ``left_rows``).

docs/protocol.md, "Outer joins", argues why this is exact under PVM.

>>> from contract.expr import Cmp, Col
>>> from warehouse.plan import SweepStep
>>> k = (Col("l", "b"),)
>>> step = SweepStep(1, (Col("l", "a"), Col("l", "b")), k, Cmp("=", Col("l", "b"), Col("s", "b")))
>>> counts = count_partners([(1,), (2,)], [(0, (1,), 2)], SweepStep(1, k, k, step.on), (Col("s", "b"),), None)
>>> counts
{(1,): 2, (2,): 0}
>>> sorted(null_extend(ZSet({(10, 1): 1, (20, 2): -1}), step, counts, 1).items())
[((20, 2, None), -1)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from contract.expr import Col
from contract.zset import Row, ZSet
from warehouse.join import key_function, local_join
from warehouse.plan import SweepStep


def local_counts(keys: Sequence[Row], step: SweepStep, rel_cols: tuple[Col, ...], relation: ZSet) -> dict[Row, int]:
    """The partner counts of ``keys`` in ``relation`` (rows of S), computed here; ``step`` is
    the plan's ``partner_step`` (its layout is the key)."""
    counts = dict.fromkeys(keys, 0)
    width = len(step.layout)
    for row, weight in local_join(ZSet(dict.fromkeys(keys, 1)), step, relation, rel_cols).items():
        counts[row[:width]] += weight
    return counts


def count_partners(
    keys: Sequence[Row],
    answer: Iterable[tuple[int, Row, int]],
    step: SweepStep,
    rel_cols: tuple[Col, ...],
    subtract: ZSet | None,
) -> dict[Row, int]:
    """Partner counts of ``keys`` from a source's answer ``(key index, row, count)`` to a
    subquery that shipped them, minus those of ``subtract`` (the concurrent deltas the
    answer's compensation subtracts): the counts in the state the compensated answer has."""
    counts = dict.fromkeys(keys, 0)
    for index, _, count in answer:
        counts[keys[index]] += count
    if subtract:
        for key, count in local_counts(keys, step, rel_cols, subtract).items():
            counts[key] -= count
    return counts


def null_extend(partial: ZSet, step: SweepStep, counts: Mapping[Row, int], width: int) -> ZSet:
    """The rows of ``partial`` whose key has no partner, extended with ``width`` NULLs."""
    key = key_function(step)
    nulls = (None,) * width
    return ZSet((row + nulls, weight) for row, weight in partial.items() if counts.get(key(row), 0) == 0)


def flips(after: Mapping[Row, int], own: Mapping[Row, int]) -> dict[Row, int]:
    """+1 for a key whose partners all went (its left rows gain NULL-extended rows), -1 for a
    key that got its first partner (they lose them); ``own``: the counts of the term's delta.

    >>> flips({(1,): 0, (2,): 3, (3,): 2}, {(1,): -2, (2,): 3, (3,): 1})
    {(1,): 1, (2,): -1}
    """
    out = {}
    for key, now in after.items():
        before = now - own.get(key, 0)
        if (before == 0) != (now == 0):
            out[key] = 1 if now == 0 else -1
    return out


def left_rows(joined: ZSet, delta: ZSet, key: Callable[[Row], Row], changed: Mapping[Row, int]) -> ZSet:
    """The left rows of the keys in ``changed``, NULL-extended and weighted by their flip.

    ``joined`` is ``ΔS ⋈_θ Left`` (rows: S's columns, then the left relation's). Every left row
    of a key θ matches in ΔS is in it, once per S row of ΔS matching that key, weighted by the
    product of both weights; one such S row per key gives each left row once, its weight
    divided back out.

    >>> joined = ZSet({(7, 1, 10): 2, (7, 1, 11): 2, (8, 1, 10): -1, (8, 1, 11): -1})
    >>> sorted(left_rows(joined, ZSet({(7, 1): 2, (8, 1): -1}), lambda r: (r[1],), {(1,): -1}).items())
    [((None, None, 10), -1), ((None, None, 11), -1)]
    """
    width = len(next(iter(delta.rows()), ()))
    by_key: dict[Row, Row] = {}  # key -> the S row whose pairs are taken
    out = ZSet()
    for row, weight in joined.items():
        k = key(row)
        flip = changed.get(k)
        if flip is None or by_key.setdefault(k, row[:width]) != row[:width]:
            continue
        out.add((None,) * width + row[width:], flip * weight // delta.weight(row[:width]))
    return out
