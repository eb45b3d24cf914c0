"""A unit too large to hold whole: each term's delta cut into parts, swept part by part.

A unit's effect is linear in its deltas. The chain-rule term of relation ``k`` is
``ΔR_k ⋈ (the other relations)``, and for ``ΔR_k = Σ_i P_i`` it is ``Σ_i (P_i ⋈ …)``. The
compensation of an answer depends on the unit's order number and the term, never on which
rows asked (``ViewProtocol.concurrent_deltas``), so each part, swept on its own and
compensated as the whole delta would be, gives its share of the term's effect exactly, and
the parts' effects sum to the unit's (docs/protocol.md, "Units in parts").

``ViewChange`` sweeps a unit whose deltas hold more than ``PART_ROWS`` rows (or the bound
``pvm serve --unit-part-rows`` gives) in parts and hands each part's effect to the store at once, under the unit's order number
(``PartStore.commit_part``). Readers read the store as of W, and W passes the order only
once the CommitManager has committed the unit, after its last part: the parts are there
before, invisible. A unit so maintained holds one part's partial results at a time, never
its whole effect.

The parts are named by term, index and count (``part_name``), and a row's part is a hash of
its values that every process computes alike (``row_part``). So a unit run again, after a
fault or a restart, cuts its deltas into the same parts and skips those the store holds.

>>> from contract.zset import ZSet
>>> delta = ZSet({(i, "x"): 1 for i in range(10)})
>>> parts = cut(delta, part_count(len(delta), most=4))
>>> [len(p) for p in parts], sum(map(len, parts)) == len(delta)
([2, 3, 5], True)
>>> cut(delta, 3) == parts  # the same parts in every run
True
>>> [part_name(2, i, len(parts)) for i in range(len(parts))]
['t2.0of3', 't2.1of3', 't2.2of3']
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from contract.zset import Row, ZSet

PART_ROWS = 50_000
"""The most delta rows a unit sweeps at once: a unit with more is swept in parts of about
this many rows each, and stores each part's effect as soon as it is computed."""

_NAN = 0x7FF8  # every NaN in one part: NaN's own hash is its object's address (Python 3.10+)
_MASK = (1 << 64) - 1


def part_count(rows: int, most: int = PART_ROWS) -> int:
    """How many parts a delta of ``rows`` rows is cut into: at most ``most`` rows each on
    average, at least one.

    >>> part_count(0), part_count(50_000), part_count(50_001)
    (1, 1, 2)
    """
    return max(1, -(-rows // most))


def part_name(term: int, index: int, count: int) -> str:
    """The name of part ``index`` of ``count`` of ``term``'s delta: the count is in it, so a
    delta cut into another number of parts shares no name with this one."""
    return f"t{term}.{index}of{count}"


def row_part(row: Row, count: int) -> int:
    """The part (``0 <= part < count``) of ``row``: a hash of its values that is the same in
    every process (Python's own hash of a string is salted per process), and equal for
    values that are equal (``1``, ``1.0`` and ``Decimal(1)`` go to one part, as they are
    one row of a Z-set).

    >>> row_part(("a", 1, None), 7) == row_part(("a", 1.0, None), 7)
    True
    """
    h = 0
    for value in row:
        h = ((h * 1_000_003) ^ _value_hash(value)) & _MASK
    h = ((h ^ (h >> 33)) * 0xFF51AFD7ED558CCD) & _MASK  # mixed, so near values spread over the parts
    return (h ^ (h >> 33)) % count


def _value_hash(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return zlib.crc32(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes):
        return zlib.crc32(value)
    if isinstance(value, (int, float)) or type(value).__name__ == "Decimal":
        # numbers hash by value, unsalted, and alike where equal
        return _NAN if value != value else hash(value) & _MASK
    return zlib.crc32(repr(value).encode("utf-8", "surrogatepass"))  # dates, times: repr is their value


def cut(delta: ZSet, count: int) -> list[ZSet]:
    """``delta`` cut into ``count`` parts by ``row_part``: every row in exactly one."""
    if count == 1:
        return [delta]
    parts = [ZSet() for _ in range(count)]
    for row, weight in delta.items():
        parts[row_part(row, count)].add(row, weight)
    return parts


def names(counts: Sequence[tuple[int, int]]) -> list[str]:
    """Every part's name, for ``(term, count)`` pairs.

    >>> names([(0, 2), (1, 1)])
    ['t0.0of2', 't0.1of2', 't1.0of1']
    """
    return [part_name(term, i, count) for term, count in counts for i in range(count)]
