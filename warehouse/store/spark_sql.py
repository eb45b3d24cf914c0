"""What readers of a Spark store's view see, as Spark SQL over one version's base and z-log
tables: the store's own reads and the analysts' query process (``warehouse/analysts``)
build it the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from warehouse.store.base import SUMS, Summed
from warehouse.store.spark_names import ORDER, WEIGHT

__all__ = ["SUMS", "shown_sql", "summed_sql", "sums_sql", "visible_sql"]


def sums_sql(base: str, zlog: str, columns: Sequence[str], as_of: int | None, keep: str) -> str:
    """Summed weights per row over ``base`` plus ``zlog`` up to ``as_of`` (None: every
    committed effect), keeping the sums for which ``SUM(_w) <keep>`` holds.

    >>> sums_sql("b", "z", ["k"], 7, "> 0")
    'SELECT `k`, SUM(_w) AS _w FROM (SELECT `k`, _w FROM b UNION ALL SELECT `k`, _w FROM z WHERE _order <= 7) GROUP BY `k` HAVING SUM(_w) > 0'
    """
    cols = ", ".join(f"`{c}`" for c in columns)
    bound = "" if as_of is None else f" WHERE {ORDER} <= {int(as_of)}"
    return (
        f"SELECT {cols}, SUM({WEIGHT}) AS {WEIGHT} FROM ("
        f"SELECT {cols}, {WEIGHT} FROM {base} UNION ALL "
        f"SELECT {cols}, {WEIGHT} FROM {zlog}{bound}"
        f") GROUP BY {cols} HAVING SUM({WEIGHT}) {keep}"
    )


def visible_sql(base: str, zlog: str, columns: Sequence[str], as_of: int | None) -> str:
    """Bag semantics, as a SQL reader sees the view: rows with a positive sum, each repeated
    as many times as its sum."""
    cols = ", ".join(f"t.`{c}`" for c in columns)
    return (
        f"SELECT {cols} FROM ({sums_sql(base, zlog, columns, as_of, '> 0')}) t "
        f"LATERAL VIEW explode(sequence(CAST(1 AS BIGINT), t.{WEIGHT})) copies AS _copy"
    )


def summed_sql(base: str, zlog: str, columns: Sequence[str], keys: int, as_of: int | None) -> str:
    """Per key (the first ``keys`` columns), every other column times its row's weight,
    summed over ``base`` plus ``zlog`` up to ``as_of``: an aggregate view's state.

    >>> summed_sql("b", "z", ["g0", "c"], 1, 7)
    'SELECT `g0`, SUM(`c` * _w) AS `c` FROM (SELECT `g0`, `c`, _w FROM b UNION ALL SELECT `g0`, `c`, _w FROM z WHERE _order <= 7) GROUP BY `g0`'
    """
    cols = ", ".join(f"`{c}`" for c in columns)
    key = [f"`{c}`" for c in columns[:keys]]
    sums = [f"SUM(`{c}` * {WEIGHT}) AS `{c}`" for c in columns[keys:]]
    bound = "" if as_of is None else f" WHERE {ORDER} <= {int(as_of)}"
    group = f" GROUP BY {', '.join(key)}" if key else ""
    return (
        f"SELECT {', '.join([*key, *sums])} FROM ("
        f"SELECT {cols}, {WEIGHT} FROM {base} UNION ALL "
        f"SELECT {cols}, {WEIGHT} FROM {zlog}{bound}"
        f"){group}"
    )


def shown_sql(base: str, zlog: str, columns: Sequence[str], summed: Summed | None, as_of: int | None) -> str:
    """The rows a reader sees: the bag (``visible_sql``), or an aggregate view's rows, its
    ``select`` over its per-key sums."""
    if summed is None:
        return visible_sql(base, zlog, columns, as_of)
    return f"WITH {SUMS} AS ({summed_sql(base, zlog, columns, summed.keys, as_of)}) {summed.select}"
