"""The synthetic snapshot pairs ``pvm bench diff`` differences.

``make_pair``: two snapshots of dump-like records of a given size, the second with inserts,
updates and deletes and reordered the way the paper's generator does (section 5.2).
``make_sweep_pair``: the Fig. 14/16 pair, short records in key order and a reordered copy
with some updated.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["make_pair", "make_sweep_pair"]

_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ      "


def _swap_nearby(items: list[Any], disp_avg: int, rng: random.Random) -> None:
    """The paper's reordering: each record is swapped with one ``d`` positions away, ``d``
    uniform in ``[0, 2 * disp_avg]``; a record moves at most once, so no record moves more
    than ``2 * disp_avg``."""
    if disp_avg <= 0:
        return
    n = len(items)
    moved = bytearray(n)
    hi = 2 * disp_avg
    randint = rng.randint
    for j in range(n):
        if moved[j]:
            continue
        t = j + randint(0, hi)
        if t >= n or moved[t] or t == j:
            continue
        items[j], items[t] = items[t], items[j]
        moved[j] = moved[t] = 1


def make_pair(
    records: int, record_bytes: int, change_rate: float, displacement: int, seed: int
) -> tuple[list[tuple[tuple[str], tuple[str, ...]]], list[tuple[tuple[str], tuple[str, ...]]], dict[str, int]]:
    """Two snapshots of ``(key, rest)`` records whose dump lines are ``record_bytes`` long,
    and the counts of the changes made (``insert``, ``delete``, ``update``).

    >>> f1, f2, expected = make_pair(1000, 80, 0.02, 5, seed=1)
    >>> len(f1), len(f2), expected
    (1000, 1000, {'insert': 10, 'delete': 10, 'update': 10})
    >>> len(",".join(f1[0][0] + f1[0][1])) + 1
    80
    """
    rng = random.Random(seed)
    width = len(str(2 * records))
    # key, name, address, balance, note: 4 separators and a newline
    body = record_bytes - width - 5
    bal = 10 if body >= 40 else 2
    name = max(1, min(20, (body - bal) // 4))
    addr = max(1, (body - bal - name) // 2)
    note = body - bal - name - addr
    if note < 1:
        raise ValueError(f"record_bytes={record_bytes} is too small")
    pool = "".join(rng.choice(_ALPHABET) for _ in range(1 << 16))
    span = len(pool) - (name + addr + note) - 1

    def rest(i: int) -> tuple[str, ...]:
        o = rng.randrange(span)
        return (
            pool[o : o + name],
            pool[o + name : o + name + addr],
            f"{i % 10**bal:0{bal}d}",
            pool[o + 7 : o + 7 + note],
        )

    ids = list(range(records))
    rng.shuffle(ids)  # physical order is not key order
    f1 = [((f"{i:0{width}d}",), rest(i)) for i in ids]

    n_ins = round(records * change_rate / 2)
    n_upd = round(records * change_rate / 2)
    n_del = n_ins
    picks = rng.sample(range(records), n_upd + n_del)
    updated = set(picks[:n_upd])
    deleted = set(picks[n_upd:])
    insert_at = {}
    for j, pos in enumerate(rng.sample(range(records), n_ins)):
        k = records + j
        insert_at[pos] = ((f"{k:0{width}d}",), rest(k))
    f2 = []
    for pos, (key, r) in enumerate(f1):
        if pos in insert_at:
            f2.append(insert_at[pos])
        if pos in deleted:
            continue
        if pos in updated:
            new = list(r)
            new[2] = f"{(int(r[2]) + 1) % 10**bal:0{bal}d}"
            new[3] = r[3][::-1] if r[3][::-1] != r[3] else "x" * len(r[3])
            if tuple(new) == r:
                new[2] = "y" * bal
            f2.append((key, tuple(new)))
        else:
            f2.append((key, r))
    _swap_nearby(f2, displacement, rng)
    return f1, f2, {"insert": n_ins, "delete": n_del, "update": n_upd}


def make_sweep_pair(records: int, disp_avg: int, update_rate: float, seed: int) -> tuple[list[Any], list[Any], int]:
    """The Fig. 14/16 generator: the first snapshot in key order, the second a copy with
    records swapped ``disp_avg`` away on average and ``update_rate`` of them updated; no
    inserts or deletes. Returns both and the number of updates.

    >>> f1, f2, u = make_sweep_pair(100, 5, 0.2, seed=3)
    >>> sorted(k for k, _ in f1) == sorted(k for k, _ in f2), u
    (True, 20)
    """
    rng = random.Random(seed)
    f1 = [((i,), (i,)) for i in range(records)]
    f2 = list(f1)
    _swap_nearby(f2, disp_avg, rng)
    n_upd = round(records * update_rate)
    for pos in rng.sample(range(records), n_upd):
        k, r = f2[pos]
        f2[pos] = (k, (r[0] + records,))
    return f1, f2, n_upd
