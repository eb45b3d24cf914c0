"""Z-sets: bags with signed counts, the one data type of view maintenance.

The algebra, stated once:

* A Z-set maps rows (tuples of scalars) to integer weights. Weight 0 is never stored:
  a row whose weight reaches 0 disappears.
* Z-sets form an abelian group under ``+`` (add weights row by row); ``-z`` negates every
  weight. A table is a Z-set with positive weights (a bag); a change (insert +1, delete -1)
  is a Z-set; a view's contents and its deltas are Z-sets. Deltas and data are the same type.
* Applying a change is addition, and addition commutes: effects committed in any order give
  the same sum (the paper's negative counters, Theorem 9). A row with weight <= 0 is an
  "owed" delete and is never shown to readers.
* Join multiplies weights, so it distributes over ``+``: (a + b) ⋈ c = a ⋈ c + b ⋈ c.
  That is what makes local compensation possible: subtracting ``partial ⋈ ΔR`` from an answer
  that saw ``R + ΔR`` leaves the answer for ``R``.

>>> a = ZSet({(1, "x"): 2})
>>> b = ZSet({(1, "x"): -2, (2, "y"): 1})
>>> sorted((a + b).items())
[((2, 'y'), 1)]
>>> (a - a).is_empty()
True
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

Row = tuple[Any, ...]


def row_order(row: Row) -> tuple[tuple[bool, str, Any], ...]:
    """A sort key for rows of mixed values: column by column, NULLs last, values of one type
    in their natural order (the order readers get pages in).

    >>> sorted([(2, None), (None, 1), (1, "b"), (1, "a")], key=row_order)
    [(1, 'a'), (1, 'b'), (2, None), (None, 1)]
    """
    return tuple((v is None, str(type(v)), v if v is not None else 0) for v in row)


class ZSet:
    """A finite map from rows to non-zero integer weights."""

    __slots__ = ("_weights",)

    def __init__(self, weights: Mapping[Row, int] | Iterable[tuple[Row, int]] = ()) -> None:
        self._weights: dict[Row, int] = {}
        items = weights.items() if isinstance(weights, Mapping) else weights
        for row, weight in items:
            self.add(row, weight)

    # -- construction -------------------------------------------------------------------
    @classmethod
    def unit(cls) -> ZSet:
        """The join identity: one empty row with weight 1 (``{() : 1}``)."""
        return cls({(): 1})

    @classmethod
    def from_rows(cls, rows: Iterable[Row], weight: int = 1) -> ZSet:
        """A bag: every occurrence of a row adds ``weight``."""
        z = cls()
        for row in rows:
            z.add(tuple(row), weight)
        return z

    def add(self, row: Row, weight: int) -> None:
        """Add ``weight`` to ``row`` in place; drop the row if it reaches zero."""
        if weight == 0:
            return
        total = self._weights.get(row, 0) + weight
        if total:
            self._weights[row] = total
        else:
            del self._weights[row]

    def add_all(self, other: ZSet, scale: int = 1) -> None:
        """``self += scale * other`` in place."""
        for row, weight in other._weights.items():
            self.add(row, weight * scale)

    # -- group operations -----------------------------------------------------------------
    def __add__(self, other: ZSet) -> ZSet:
        out = self.copy()
        out.add_all(other)
        return out

    def __sub__(self, other: ZSet) -> ZSet:
        out = self.copy()
        out.add_all(other, -1)
        return out

    def __neg__(self) -> ZSet:
        return ZSet({row: -w for row, w in self._weights.items()})

    def scaled(self, factor: int) -> ZSet:
        return ZSet({row: w * factor for row, w in self._weights.items()}) if factor else ZSet()

    # -- linear maps ----------------------------------------------------------------------
    def map_rows(self, fn) -> ZSet:
        """Apply ``fn`` to every row, adding weights of rows that collide (projection)."""
        out = ZSet()
        for row, weight in self._weights.items():
            out.add(fn(row), weight)
        return out

    def filter(self, keep) -> ZSet:
        return ZSet({row: w for row, w in self._weights.items() if keep(row)})

    # -- reading --------------------------------------------------------------------------
    def items(self) -> Iterator[tuple[Row, int]]:
        return iter(self._weights.items())

    def rows(self) -> Iterator[Row]:
        return iter(self._weights)

    def weight(self, row: Row) -> int:
        return self._weights.get(row, 0)

    def positive(self) -> ZSet:
        """The rows a reader may see: weight > 0."""
        return ZSet({row: w for row, w in self._weights.items() if w > 0})

    def expand(self) -> list[Row]:
        """Bag semantics for readers: each positive row repeated by its weight."""
        return [row for row, w in self._weights.items() for _ in range(max(w, 0))]

    def is_empty(self) -> bool:
        return not self._weights

    def has_negative(self) -> bool:
        return any(w < 0 for w in self._weights.values())

    def copy(self) -> ZSet:
        out = ZSet()
        out._weights = dict(self._weights)
        return out

    def __len__(self) -> int:
        return len(self._weights)

    def __bool__(self) -> bool:
        return bool(self._weights)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ZSet) and self._weights == other._weights

    def __repr__(self) -> str:
        inner = ", ".join(f"{row!r}: {w}" for row, w in list(self._weights.items())[:8])
        more = "" if len(self._weights) <= 8 else f", … ({len(self._weights)} rows)"
        return f"ZSet({{{inner}{more}}})"

    # -- wire form ------------------------------------------------------------------------
    def to_wire(self) -> list[list[Any]]:
        """JSON form: ``[[col0, col1, …, weight], …]``."""
        return [[*row, w] for row, w in self._weights.items()]

    @classmethod
    def from_wire(cls, rows: Iterable[list[Any]]) -> ZSet:
        z = cls()
        for entry in rows:
            *values, weight = entry
            z.add(tuple(values), int(weight))
        return z


def total(zsets: Iterable[ZSet]) -> ZSet:
    """The sum of many Z-sets."""
    out = ZSet()
    for z in zsets:
        out.add_all(z)
    return out
