"""How many queued updates of one source the next maintenance unit takes: adaptive
set-oriented maintenance (Park, "Parallel token processing in an asynchronous trigger
system", ch. 4).

A unit of ``k`` updates of one source sends the same subqueries as a unit of one, with
the keys of all ``k``: Park's *set query* over a token set, against ``k`` *tuple queries*.
Park measures the cost ``C1`` of a tuple query and ``C2``, ``Ck`` of set queries over 2 and
``k`` tokens, and takes the set query for a set larger than the crossover point

    CO = (k*C2 - 2*Ck) / ((k-2)*C1 + C2 - Ck)        (eq. 4.3)

where the line through ``(2, C2)`` and ``(k, Ck)`` meets ``y = C1 * x``. Here the costs are
what the manager measures: the wall time of maintaining each unit, per source, kept as
running aggregates (``SourceCosts``: an exponentially weighted mean of the units of one
update, and exponentially weighted least-squares sums of cost over size for the larger
ones; a few numbers per source, whatever the history).

With ``f`` free PPU slots and ``n`` updates queued, maintaining them one per unit clears
``f`` updates per ``C1``; spreading them over the free slots as sets of ``n/f`` clears
``n`` per ``a + b*n/f`` (the set line's intercept ``a`` and slope ``b``). The sets win
exactly when ``n/f > a / (C1 - b)``, which is eq. 4.3: so the rule (``unit_size``) is
Park's, applied to a free slot's share of the backlog.

* Low load (the queue no longer than the free slots): one update per unit, maintained in
  parallel as the paper runs PVM: the freshest answer.
* A backlog whose share per free slot exceeds the crossover: the share, one set per slot.
  The share grows with the backlog, so the work per update falls as the load rises, and
  the lag stays bounded wherever the sources can answer a set at all.
* Until both kinds of unit have been measured (and the sets at two sizes at least) the
  crossover is 1: a fixed round-trip cost per unit makes any set cheaper than its updates
  one by one. A measured ``C1 <= b`` (a set costs more per update than single updates)
  puts it at infinity: no sets for a moderate backlog. The crossover acted on is at most
  ``MAX_CROSSOVER``, so a deep backlog is still taken in sets, which measures them again.

``batch_size``, a view option, caps the set (1: the paper's PVM, one update per unit).

>>> costs = SourceCosts()
>>> for size, seconds in [(1, 0.020)] * 3 + [(4, 0.046), (16, 0.094), (64, 0.286)]:
...     costs.observe(size, seconds)
>>> round(costs.crossover(), 3)  # C1 = 20 ms; a set: 30 ms + 4 ms per update
1.875
>>> unit_size(queued=6, free_slots=4, crossover=costs.crossover(), cap=1000)  # 1.5 per slot: one each
1
>>> unit_size(queued=400, free_slots=4, crossover=costs.crossover(), cap=1000)  # a backlog: sets
100
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DECAY = 0.05
"""Weight of the newest unit in the running aggregates: about the last 1/DECAY units count."""

PRIOR_CROSSOVER = 1.0
"""The crossover until it is measured: any set beats its updates one unit each."""

MAX_CROSSOVER = 32.0
"""The highest crossover acted on. Only sets measure sets: a crossover taken at its word
when it is very high (or infinite: sets measured dearer per update than single units, as a
busy moment can make them look) would stop sets for good, the measurement would never be
revised, and a backlog would again be maintained one update per unit, which is what falls
behind. Above this share per free slot, sets are made whatever was measured, and measured
again."""

MIN_SPREAD = 0.25
"""Variance of the measured set sizes below which the set line is not fitted (all sets of
about one size tell its height, not its slope)."""


def crossover(c1: float, c2: float, ck: float, k: float) -> float:
    """Park's crossover point (eq. 4.3): the token-set size above which one set query over
    the set costs less than a tuple query per token. ``c1``: a tuple query's cost; ``c2``,
    ``ck``: a set query's over 2 and ``k`` tokens. Infinity where the set query is never
    cheaper (its cost per token is not below ``c1``); at least 1.

    >>> crossover(c1=10.0, c2=24.0, ck=60.0, k=8)  # set: 12 + 6 per token; 10 per token alone
    3.0
    >>> crossover(c1=10.0, c2=30.0, ck=90.0, k=8)  # 15 per token: never
    inf
    >>> crossover(c1=10.0, c2=8.0, ck=8.0, k=8)  # a set costs what one token does
    1.0
    """
    denominator = (k - 2) * c1 + c2 - ck
    if denominator <= 0:
        return math.inf
    return max(1.0, (k * c2 - 2 * ck) / denominator)


@dataclass
class SourceCosts:
    """What one source's units cost, as running aggregates: ``C1``, the exponentially
    weighted mean of the units of one update, and exponentially weighted sums for the least
    squares line ``cost = a + b * size`` through the units of more.

    >>> c = SourceCosts()
    >>> c.observe(1, 0.02); c.observe(1, 0.04); round(c.c1 or 0, 4)  # the first sets it, then it moves
    0.021
    >>> c.line() is None  # no set measured yet
    True
    """

    c1: float | None = None
    weight: float = 0.0  # of the set observations, decayed
    sum_k: float = 0.0
    sum_c: float = 0.0
    sum_kk: float = 0.0
    sum_kc: float = 0.0

    def observe(self, size: int, seconds: float) -> None:
        """A unit of ``size`` updates of this source took ``seconds`` to maintain."""
        if size < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        if size == 1:
            self.c1 = seconds if self.c1 is None else self.c1 + DECAY * (seconds - self.c1)
            return
        keep = 1.0 - DECAY
        self.weight = self.weight * keep + 1.0
        self.sum_k = self.sum_k * keep + size
        self.sum_c = self.sum_c * keep + seconds
        self.sum_kk = self.sum_kk * keep + size * size
        self.sum_kc = self.sum_kc * keep + size * seconds

    def line(self) -> tuple[float, float, float] | None:
        """The set line's intercept ``a`` and slope ``b``, and the sets' mean size; None
        until sets of different sizes have been measured.

        >>> c = SourceCosts()
        >>> for size in (2, 10):
        ...     c.observe(size, 1.0 + 0.5 * size)
        >>> [round(x, 6) for x in c.line() or ()]
        [1.0, 0.5, 6.102564]
        """
        if self.weight <= 0:
            return None
        mean_k = self.sum_k / self.weight
        spread = self.sum_kk / self.weight - mean_k * mean_k
        if spread < MIN_SPREAD:
            return None
        slope = (self.sum_kc / self.weight - mean_k * self.sum_c / self.weight) / spread
        return self.sum_c / self.weight - slope * mean_k, slope, mean_k

    def crossover(self) -> float:
        """Eq. 4.3 over what was measured: ``C2`` and ``Ck`` read off the set line at 2 and
        at ``k``, the sets' mean size (Park: choose ``k`` near the sizes that occur); the
        prior 1 until ``C1`` and the line are both known; at most ``MAX_CROSSOVER``.

        >>> c = SourceCosts()
        >>> for size, seconds in [(1, 0.01), (2, 0.05), (8, 0.20)]:  # sets: 25 ms per update
        ...     c.observe(size, seconds)
        >>> c.crossover() == MAX_CROSSOVER
        True
        """
        line = self.line()
        if self.c1 is None or line is None:
            return PRIOR_CROSSOVER
        a, b, mean_k = line
        k = max(3.0, mean_k)
        return min(MAX_CROSSOVER, crossover(self.c1, a + 2 * b, a + b * k, k))

    def summary(self) -> dict[str, float | None]:
        """For a view's status: ``C1``, the set line and the crossover, in seconds."""
        line = self.line()
        co = self.crossover()
        return {
            "c1_s": None if self.c1 is None else round(self.c1, 6),
            "set_fixed_s": None if line is None else round(line[0], 6),
            "set_per_update_s": None if line is None else round(line[1], 6),
            "crossover": None if math.isinf(co) else round(co, 3),
        }


def unit_size(queued: int, free_slots: int, crossover: float, cap: int) -> int:
    """How many queued updates the next unit takes: one, unless a free slot's share of the
    ``queued`` updates exceeds the ``crossover``; then that share, at most ``cap``.

    >>> unit_size(queued=4, free_slots=4, crossover=1.0, cap=1000)  # one each, in parallel
    1
    >>> unit_size(queued=10, free_slots=4, crossover=1.0, cap=1000)  # 10 over 4 free slots
    3
    >>> unit_size(queued=10, free_slots=4, crossover=5.0, cap=1000)  # 2.5 each: below the crossover
    1
    >>> unit_size(queued=5000, free_slots=1, crossover=1.0, cap=1000), unit_size(50, 1, math.inf, 1000)
    (1000, 1)
    """
    share = queued / max(1, free_slots)
    if share <= crossover:
        return 1
    return max(1, min(cap, math.ceil(share)))
