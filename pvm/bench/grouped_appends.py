"""Why the commit manager groups effects: rows/s of grouped appends versus one per effect.

An append has a cost whatever its size: on the Spark store a Parquet file, written, flushed
and renamed (a few ms; it was a Spark job of 0.2-1 s), and one more file that every read
lists and compaction folds. Grouping ready effects amortizes it over thousands of rows.
Both ways run side by side on the same store in one call.
"""

from __future__ import annotations

import time

from contract.zset import ZSet
from warehouse.store.base import Effect, ViewStore

_COLUMNS = ("k", "name", "amount")


def _effects(first_order: int, count: int, rows_per_effect: int) -> list[Effect]:
    out = []
    for order in range(first_order, first_order + count):
        keys = range(order * rows_per_effect, (order + 1) * rows_per_effect)
        out.append(Effect(order, ZSet({(k, f"row-{k}", k * 0.5): 1 for k in keys})))
    return out


def _rate(store: ViewStore, view: str, groups: list[list[Effect]]) -> float:
    """Effect rows per second over committing ``groups``, one append each."""
    rows = sum(len(e.delta) for group in groups for e in group)
    start = time.perf_counter()
    for group in groups:
        store.commit(view, group)
    return rows / (time.perf_counter() - start)


def bench_commit(
    store: ViewStore,
    effects_per_group: int = 200,
    rows_per_effect: int = 100,
    groups: int = 5,
    single_effects: int = 20,
    warmup_appends: int = 3,
    view_prefix: str = "bench_commit",
) -> dict[str, float]:
    """Commit ``groups`` groups of ``effects_per_group`` effects, then ``single_effects``
    effects one append each, into two scratch views that are dropped afterwards. Each way
    starts with ``warmup_appends`` untimed appends: a long-running service pays the JVM's
    warm-up (class loading, JIT) once, so it should count against neither way."""
    grouped_view, single_view = f"{view_prefix}_grouped", f"{view_prefix}_single"
    for view in (grouped_view, single_view):
        store.drop(view)
        store.create(view, _COLUMNS)
    try:
        batches = [
            _effects(1 + g * effects_per_group, effects_per_group, rows_per_effect)
            for g in range(warmup_appends + groups)
        ]
        for batch in batches[:warmup_appends]:
            store.commit(grouped_view, batch)
        grouped = _rate(store, grouped_view, batches[warmup_appends:])
        singles = [[e] for e in _effects(1, warmup_appends + single_effects, rows_per_effect)]
        for batch in singles[:warmup_appends]:
            store.commit(single_view, batch)
        single = _rate(store, single_view, singles[warmup_appends:])
    finally:
        for view in (grouped_view, single_view):
            store.drop(view)
    return {
        "grouped_rows_per_s": grouped,
        "single_rows_per_s": single,
        "speedup": grouped / single,
        "rows_per_group": float(effects_per_group * rows_per_effect),
        "rows_per_single_append": float(rows_per_effect),
        "grouped_append_ms": 1000 * effects_per_group * rows_per_effect / grouped,
        "single_append_ms": 1000 * rows_per_effect / single,
    }
