"""Nominal sizes of records, which the algorithms' memory budgets are counted in.

A record's size is its size in a dump (strings by length, numbers as 8 bytes, a separator
per value); the average is estimated from a sample ``peek`` takes off the front of a scan.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain, islice
from typing import Any

from wrappers.differential.record_schema import Key, Record

__all__ = ["estimate_record_bytes", "key_bytes", "peek", "record_bytes"]


def _value_bytes(v: Any) -> int:
    t = type(v)
    if t is str or t is bytes:
        return len(v)
    if t is int or t is float:
        return 8
    if v is None or t is bool:
        return 1
    return len(str(v))


def key_bytes(key: Key) -> int:
    """Nominal size of a key in a dump: its values plus one separator each.

    >>> key_bytes(("00001234",))
    9
    """
    return sum(_value_bytes(v) for v in key) + len(key)


def record_bytes(record: Record) -> int:
    """Nominal size of a record in a dump (strings by length, numbers as 8 bytes).

    >>> record_bytes((("k1",), ("abc", 5)))
    16
    """
    key, rest = record
    return key_bytes(key) + key_bytes(rest)


def estimate_record_bytes(sample: Iterable[Record], default: float = 100.0) -> float:
    """Average nominal record size of a sample (``default`` if it is empty).

    >>> estimate_record_bytes([(("a",), ("bc",)), (("d",), ("efgh",))])
    6.0
    """
    sizes = [record_bytes(r) for r in sample]
    return sum(sizes) / len(sizes) if sizes else default


def peek(iterable: Iterable[Any], n: int) -> tuple[list[Any], Iterator[Any]]:
    """The first ``n`` items and an iterator over all items (the peeked ones included).

    >>> head, it = peek(iter(range(5)), 2)
    >>> head, list(it)
    ([0, 1], [0, 1, 2, 3, 4])
    """
    it = iter(iterable)
    head = list(islice(it, n))
    return head, chain(head, it)
