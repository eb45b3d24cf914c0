"""Aggregate and DISTINCT views: the operator from the SPJ body's Z-set to per-group deltas.

A view ``SELECT g…, COUNT(*), SUM(x)… FROM <body> GROUP BY g… [HAVING …]`` is maintained
by PVM exactly as its select-project-join body is: every maintenance unit yields the
body's signed effect ΔV, a Z-set of body rows ``(g…, arguments…)``. This module turns ΔV
into what the store keeps for the view (``encode``), and the store's sums back into the
view's rows (``visible``); ``evaluate`` is the same view computed from first principles,
for the recomputation that verifies it. ``SELECT DISTINCT`` is the aggregate that groups
by every selected column and shows no aggregate.

What is stored is linear in ΔV, so effects still commute and may be committed in any
order, read ``as_of`` any W and compacted by summing. Each stored row is a key and some
numbers, and a row of weight w stands for w times its numbers:

* per group, one *summary* row ``(g…, NULL…, c, n…, s…)``: the change of the group's
  COUNT(*), of each argument's non-NULL count, and of each summed argument's sum;
* per group and value v of a MIN/MAX argument, a *multiset* row ``(g…, …v…, 1, 0…, 0…)``
  whose weight is the change of v's multiplicity in the group (NULLs are left out: MIN and
  MAX ignore them).

A group's state as of W is the sum over the stored rows with ``_order <= W``: its count
(gone when 0), counts, sums, and the multiset of each MIN/MAX argument. MIN and MAX are
read from the multiset, so deleting a group's extreme needs no query of the sources: the
next extreme is the multiset's. ``docs/aggregates.md`` says why this is correct.

>>> s = Summary(groups=1, calls=(Call("count", None), Call("sum", 1), Call("max", 1)),
...             outputs=(("g", 0), ("n", 1), ("total", 2), ("top", 3)), names=("g", "x"))
>>> body = ZSet({("a", 5): 1, ("a", 7): 1, ("b", None): 1})
>>> sorted(visible(s, encode(s, body)).items())
[(('a', 2, 12, 7), 1), (('b', 1, None, None), 1)]
>>> later = encode(s, ZSet({("a", 7): -1, ("b", None): -1}))
>>> sorted(visible(s, encode(s, body) + later).items())
[(('a', 1, 5, 5), 1)]
>>> visible(s, encode(s, body) + later) == evaluate(s, body + ZSet({("a", 7): -1, ("b", None): -1}))
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from typing import Any, Literal

from contract.column_types import spark_type
from contract.expr import Col, Expr, compile_filter
from contract.zset import Row, ZSet
from warehouse.store.base import SUMS, Summed

Func = Literal["count", "sum", "avg", "min", "max"]
FUNCS: tuple[Func, ...] = ("count", "sum", "avg", "min", "max")


@dataclass(frozen=True)
class Call:
    """One aggregate: ``func`` of body column ``arg`` (None: COUNT(*))."""

    func: Func
    arg: int | None


@dataclass(frozen=True)
class Summary:
    """The aggregate a view applies to its body.

    Body rows are ``(g_0 … g_{groups-1}, arguments…)``: the group columns first. The *full
    row* of a group is its group values followed by the value of each call; ``outputs``
    picks the view's columns from it by position, ``having`` filters it (an expression
    whose columns are ``position(i)``). ``grouped`` is False for an aggregate without GROUP
    BY: one row always, even over an empty body, as SQL has it. ``names`` are the body's
    column names (for messages and SQL).
    """

    groups: int
    calls: tuple[Call, ...]
    outputs: tuple[tuple[str, int], ...]
    names: tuple[str, ...]
    having: Expr | None = None
    having_sql: str | None = field(default=None, compare=False)  # the same, in Spark SQL over f<i>
    grouped: bool = True

    # -- the stored layout ----------------------------------------------------------------
    @cached_property
    def extremes(self) -> tuple[int, ...]:
        """Body columns whose multiset is kept (arguments of MIN or MAX)."""
        return tuple(dict.fromkeys(c.arg for c in self.calls if c.func in ("min", "max") and c.arg is not None))

    @cached_property
    def counted(self) -> tuple[int, ...]:
        """Body columns whose non-NULL count is kept (arguments of COUNT, SUM, AVG)."""
        return tuple(
            dict.fromkeys(c.arg for c in self.calls if c.func in ("count", "sum", "avg") and c.arg is not None)
        )

    @cached_property
    def summed(self) -> tuple[int, ...]:
        """Body columns whose sum is kept (arguments of SUM and AVG)."""
        return tuple(dict.fromkeys(c.arg for c in self.calls if c.func in ("sum", "avg") and c.arg is not None))

    @property
    def keys(self) -> int:
        """How many leading stored columns are the key (groups, then extremes' values)."""
        return self.groups + len(self.extremes)

    @property
    def stored_names(self) -> tuple[str, ...]:
        """The stored columns: ``g<i>`` groups, ``e<j>`` extremes' values, then the summed
        ``c`` (COUNT(*)), ``n<j>`` (non-NULL counts) and ``s<j>`` (sums). Generated names:
        they never collide with each other or with the store's own columns."""
        return (
            *(f"g{i}" for i in range(self.groups)),
            *(f"e{j}" for j in range(len(self.extremes))),
            "c",
            *(f"n{j}" for j in range(len(self.counted))),
            *(f"s{j}" for j in range(len(self.summed))),
        )

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.outputs)

    def stored_types(self, body: Sequence[str | None]) -> list[str | None]:
        """Spark SQL types of the stored columns from the body columns' types (None: untyped)."""
        return [
            *body[: self.groups],
            *(body[a] for a in self.extremes),
            "BIGINT",
            *("BIGINT" for _ in self.counted),
            *(sum_type(body[a]) for a in self.summed),
        ]

    def output_types(self, body: Sequence[str | None]) -> list[str | None]:
        """Spark SQL types of the view's columns."""
        full = [*body[: self.groups], *(_call_type(c, body) for c in self.calls)]
        return [full[position] for _, position in self.outputs]


def position(i: int) -> Col:
    """The column of a HAVING expression that reads position ``i`` of the full row."""
    return Col("", f"f{i}")


def sum_type(argument: str | None) -> str:
    """The type of a sum: BIGINT over integers, DOUBLE otherwise (unknown types included)."""
    return "BIGINT" if argument == "BIGINT" else "DOUBLE"


_NUMERIC_PREFIXES = ("NUMERIC", "DECIMAL", "DEC", "NUMBER", "MONEY", "SMALLMONEY")


def non_numeric(declared: str | None) -> str | None:
    """``declared`` (a source's SQL type) if it is known and not numeric, else None: SUM and
    AVG refuse such a column at definition time. An unknown type is let through.

    >>> [non_numeric(t) for t in ["INTEGER", "NUMERIC(10, 2)", "DOUBLE PRECISION", "VARCHAR(20)", None]]
    [None, None, None, 'VARCHAR(20)', None]
    """
    if not declared:
        return None
    if spark_type(declared) in ("BIGINT", "DOUBLE") or declared.upper().startswith(_NUMERIC_PREFIXES):
        return None
    return declared


def _call_type(call: Call, body: Sequence[str | None]) -> str | None:
    if call.func == "count":
        return "BIGINT"
    assert call.arg is not None
    if call.func == "sum":
        return sum_type(body[call.arg])
    if call.func == "avg":
        return "DOUBLE"
    return body[call.arg]


def distinct(names: Sequence[str]) -> Summary:
    """``SELECT DISTINCT`` over a body of ``names``: every column a group, no aggregate; a row
    is shown once while its weight is positive."""
    return Summary(len(names), (), tuple((n, i) for i, n in enumerate(names)), tuple(names))


# -- the operator ---------------------------------------------------------------------------
@dataclass
class _Group:
    """A group's summed state: COUNT(*), non-NULL counts, sums, and MIN/MAX multisets."""

    count: int = 0
    counts: list[int] = field(default_factory=list)
    sums: list[Any] = field(default_factory=list)
    values: list[dict[Any, int]] = field(default_factory=list)

    @classmethod
    def empty(cls, s: Summary) -> _Group:
        return cls(0, [0] * len(s.counted), [0] * len(s.summed), [{} for _ in s.extremes])


def encode(s: Summary, body: ZSet) -> ZSet:
    """The stored rows for a change ``body`` of the view's body: per changed group, one
    summary row and one multiset row per changed MIN/MAX value. Work and size are
    O(changed rows), whatever the view holds."""
    groups: dict[Row, _Group] = {}
    for row, weight in body.items():
        key = row[: s.groups]
        g = groups.get(key) or groups.setdefault(key, _Group.empty(s))
        g.count += weight
        for j, a in enumerate(s.counted):
            if row[a] is not None:
                g.counts[j] += weight
        for j, a in enumerate(s.summed):
            if row[a] is not None:
                g.sums[j] += weight * row[a]
        for j, a in enumerate(s.extremes):
            if row[a] is not None:
                g.values[j][row[a]] = g.values[j].get(row[a], 0) + weight
    out = ZSet()
    blanks = (None,) * len(s.extremes)
    zeros = (0,) * (len(s.counted) + len(s.summed))
    for key, g in groups.items():
        if g.count or any(g.counts) or any(g.sums):
            out.add((*key, *blanks, g.count, *g.counts, *g.sums), 1)
        for j, multiset in enumerate(g.values):
            for value, weight in multiset.items():
                out.add((*key, *blanks[:j], value, *blanks[j + 1 :], 1, *zeros), weight)
    return out


def totals(s: Summary, stored: ZSet) -> dict[Row, _Group]:
    """Each group's state: the stored rows summed per group, a row counting its weight times."""
    groups: dict[Row, _Group] = {}
    k, e = s.groups, len(s.extremes)
    n = len(s.counted)
    for row, weight in stored.items():
        key = row[:k]
        g = groups.get(key) or groups.setdefault(key, _Group.empty(s))
        values = row[k : k + e]
        found = next((j for j, v in enumerate(values) if v is not None), None)
        if found is not None:  # a multiset row
            multiset = g.values[found]
            total = multiset.get(values[found], 0) + weight * row[k + e]
            if total:
                multiset[values[found]] = total
            else:
                del multiset[values[found]]
            continue
        if row[k + e] is None:  # the Spark store's placeholder of an empty effect
            continue
        g.count += weight * row[k + e]
        for j in range(n):
            g.counts[j] += weight * row[k + e + 1 + j]
        for j in range(len(s.summed)):
            g.sums[j] += weight * row[k + e + 1 + n + j]
    return groups


def visible(s: Summary, stored: ZSet) -> ZSet:
    """The view's rows (each of weight 1) from its stored rows summed as of some W."""
    groups = totals(s, stored)
    return _rows(s, ((key, g) for key, g in groups.items() if g.count > 0), lambda key, g: _values(s, g))


def _values(s: Summary, g: _Group) -> list[Any]:
    out: list[Any] = []
    for call in s.calls:
        if call.arg is None:
            out.append(g.count)
            continue
        if call.func in ("min", "max"):
            present = [v for v, m in g.values[s.extremes.index(call.arg)].items() if m > 0]
            out.append((min if call.func == "min" else max)(present) if present else None)
            continue
        n = g.counts[s.counted.index(call.arg)]
        if call.func == "count":
            out.append(n)
        else:
            total = g.sums[s.summed.index(call.arg)]
            out.append(None if n <= 0 else total if call.func == "sum" else _mean(total, n))
    return out


def _mean(total: Any, n: int) -> Any:
    return total / n if not isinstance(total, Decimal) else total / Decimal(n)


def _rows(s: Summary, groups: Iterable[tuple[Row, _Group]], values: Callable[[Row, _Group], list[Any]]) -> ZSet:
    keep = compile_filter(s.having, {position(i): i for i in range(s.groups + len(s.calls))})
    out = ZSet()
    seen = False
    for key, g in groups:
        seen = True
        full = (*key, *values(key, g))
        if keep(full):
            out.add(tuple(full[p] for _, p in s.outputs), 1)
    if not s.grouped and not seen:  # SQL: an aggregate without GROUP BY has one row always
        full = tuple(_values(s, _Group.empty(s)))
        if keep(full):
            out.add(tuple(full[p] for _, p in s.outputs), 1)
    return out


def evaluate(s: Summary, body: ZSet) -> ZSet:
    """The view over a body bag computed directly, as SQL defines it (for verification):
    nothing shared with ``encode``/``totals`` but the HAVING filter and the output picking.
    Rows of non-positive weight are not in a bag and count for nothing."""
    bags: dict[Row, list[tuple[Row, int]]] = {}
    for row, weight in body.items():
        if weight > 0:
            bags.setdefault(row[: s.groups], []).append((row, weight))

    def direct(key: Row, _: _Group) -> list[Any]:
        rows = bags.get(key, [])
        out: list[Any] = []
        for call in s.calls:
            if call.arg is None:
                out.append(sum(w for _, w in rows))
                continue
            a = call.arg
            values = [v for row, w in rows for v in [row[a]] * w if row[a] is not None]
            if call.func == "count":
                out.append(len(values))
            elif not values:
                out.append(None)
            elif call.func == "sum":
                out.append(sum(values))
            elif call.func == "avg":
                out.append(_mean(sum(values), len(values)))
            else:
                out.append((min if call.func == "min" else max)(values))
        return out

    return _rows(s, ((key, _Group()) for key in bags), direct)


# -- Spark SQL of the view -------------------------------------------------------------------
def summed(s: Summary, body_types: Sequence[str | None]) -> Summed:
    """What a store needs to read the view and compact it (``store.base.Summed``), from the
    Spark SQL types of the body's columns."""
    return Summed(s.keys, select_sql(s, SUMS), s.output_names, tuple(s.output_types(body_types)))


def encode_sql(s: Summary, body: str, types: Sequence[str | None]) -> str:
    """``encode`` in Spark SQL, for a whole body at once (an initial load in the engine):
    the stored rows, then ``_w``, of ``body``, a relation of the body's columns ``b<i>``
    and a weight ``_w`` (a row standing for ``_w`` copies of itself). ``body`` may hold a
    row more than once, and rows whose weights cancel: every number is summed per group
    (or per group and MIN/MAX value), so only the sums count, as in ``encode``. ``types``:
    the stored columns' Spark SQL types (``Summary.stored_types``), which the blank key
    slots take.

    >>> s = Summary(groups=1, calls=(Call("count", None), Call("sum", 1), Call("max", 1)),
    ...             outputs=(("g", 0), ("n", 1), ("total", 2), ("top", 3)), names=("g", "x"))
    >>> print(encode_sql(s, "b", ["STRING", "BIGINT", "BIGINT", "BIGINT", "BIGINT"]))  # doctest: +NORMALIZE_WHITESPACE
    SELECT b0, CAST(NULL AS BIGINT), SUM(_w), SUM(CASE WHEN b1 IS NOT NULL THEN _w ELSE 0 END),
    COALESCE(SUM(b1 * _w), 0), 1L FROM b GROUP BY b0 HAVING SUM(_w) <> 0
    OR SUM(CASE WHEN b1 IS NOT NULL THEN _w ELSE 0 END) <> 0 OR COALESCE(SUM(b1 * _w), 0) <> 0
    UNION ALL SELECT b0, b1, 1L, 0L, 0L, SUM(_w) FROM b WHERE b1 IS NOT NULL GROUP BY b0, b1 HAVING SUM(_w) <> 0
    """
    groups = [f"b{i}" for i in range(s.groups)]
    blanks = [f"CAST(NULL AS {types[s.groups + j] or 'STRING'})" for j in range(len(s.extremes))]
    counts = [f"SUM(CASE WHEN b{a} IS NOT NULL THEN _w ELSE 0 END)" for a in s.counted]
    sums = [f"COALESCE(SUM(b{a} * _w), 0)" for a in s.summed]
    by = f" GROUP BY {', '.join(groups)}" if groups else ""
    # a group's summary row where ``encode`` writes one: some number of it is not 0 (rows
    # that cancel leave none, and an aggregate without GROUP BY over no rows has none: its
    # sums are NULL)
    summary = f"SELECT {', '.join([*groups, *blanks, 'SUM(_w)', *counts, *sums, '1L'])} FROM {body}{by}"
    parts = [summary + " HAVING " + " OR ".join(f"{n} <> 0" for n in ["SUM(_w)", *counts, *sums])]
    zeros = ["0L"] * (len(s.counted) + len(s.summed))
    for j, a in enumerate(s.extremes):
        value = f"b{a}"
        extremes = [*blanks[:j], value, *blanks[j + 1 :]]
        parts.append(
            f"SELECT {', '.join([*groups, *extremes, '1L', *zeros, 'SUM(_w)'])} FROM {body} "
            f"WHERE {value} IS NOT NULL GROUP BY {', '.join([*groups, value])} HAVING SUM(_w) <> 0"
        )
    return " UNION ALL ".join(parts)


def select_sql(s: Summary, sums: str) -> str:
    """The view's rows in Spark SQL from ``sums``, a relation of the stored columns already
    summed per key (each value times its weight): the same as ``visible``.

    >>> print(select_sql(distinct(["a"]), "t"))
    SELECT f0 AS `a` FROM (SELECT g0 AS f0 FROM (SELECT g0, SUM(c) AS cc FROM t GROUP BY g0) WHERE cc > 0)
    """
    k, e = s.groups, len(s.extremes)
    keys = [f"g{i}" for i in range(k)]
    summary_row = " AND ".join(f"e{j} IS NULL" for j in range(e))
    count = f"SUM(CASE WHEN {summary_row} THEN c END)" if e else "SUM(c)"
    inner = [*keys, f"{count} AS cc"]
    inner += [f"SUM(n{j}) AS n{j}" for j in range(len(s.counted))]
    inner += [f"SUM(s{j}) AS s{j}" for j in range(len(s.summed))]
    for j, a in enumerate(s.extremes):
        funcs = {c.func for c in s.calls if c.arg == a and c.func in ("min", "max")}
        inner += [f"{f.upper()}(CASE WHEN c > 0 THEN e{j} END) AS {f}{j}" for f in sorted(funcs)]
    group_by = f" GROUP BY {', '.join(keys)}" if keys else ""
    grouped = f"SELECT {', '.join(inner)} FROM {sums}{group_by}"
    full = [f"g{i} AS f{i}" for i in range(k)]
    for i, call in enumerate(s.calls, start=k):
        full.append(f"{_call_sql(s, call)} AS f{i}")
    where = " WHERE cc > 0" if s.grouped else ""
    having = f" WHERE {s.having_sql}" if s.having_sql else ""
    picked = ", ".join(f"f{p} AS `{name}`" for name, p in s.outputs)
    return f"SELECT {picked} FROM (SELECT {', '.join(full)} FROM ({grouped}){where}){having}"


def _call_sql(s: Summary, call: Call) -> str:
    if call.arg is None:
        return "COALESCE(cc, 0)"
    if call.func in ("min", "max"):
        return f"{call.func}{s.extremes.index(call.arg)}"
    n = f"n{s.counted.index(call.arg)}"
    if call.func == "count":
        return f"COALESCE({n}, 0)"
    total = f"s{s.summed.index(call.arg)}"
    if call.func == "sum":
        return f"CASE WHEN {n} > 0 THEN {total} END"
    return f"CASE WHEN {n} > 0 THEN CAST({total} AS DOUBLE) / {n} END"
