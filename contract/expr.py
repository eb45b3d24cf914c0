"""The predicate language of view definitions: one small tree, three readings.

A view's WHERE clause becomes a tree of the nodes below. The same tree is

* evaluated in Python over rows (local compensation, filtering deltas, the test oracle),
* rendered as parameterized SQL by the wrappers (``to_sqlalchemy``), literals always bound,
* shipped between manager and wrappers as JSON (``to_wire`` / ``from_wire``).

The Python reading follows SQL's three-valued logic: a comparison with NULL is unknown
(``None``), ``AND``/``OR``/``NOT`` propagate unknown as SQL does, and a row passes a filter only
when the predicate is ``True``. ``LIKE`` is case-sensitive everywhere (the wrappers configure
their sources to match), so the manager and the sources agree on every row. NaN compares as
in PostgreSQL and Spark, the engines that hold it: equal to itself, above every other number.

>>> pred = And((Cmp(">", Col("r", "a"), Lit(1)), IsNull(Col("r", "b"), negated=True)))
>>> fn = compile_predicate(pred, {Col("r", "a"): 0, Col("r", "b"): 1})
>>> fn((2, "x")), fn((2, None)), fn((None, "x"))
(True, False, None)
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

Scalar = int | float | str | bool | None


@dataclass(frozen=True)
class Col:
    """A column of one relation of the view, named by the relation's alias."""

    relation: str
    name: str


@dataclass(frozen=True)
class Lit:
    value: Scalar


@dataclass(frozen=True)
class Arith:
    op: str  # + - *
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Cmp:
    op: str  # = <> < <= > >=
    left: Expr
    right: Expr


@dataclass(frozen=True)
class And:
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Or:
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Not:
    arg: Expr


@dataclass(frozen=True)
class InList:
    arg: Expr
    values: tuple[Scalar, ...]
    negated: bool = False


@dataclass(frozen=True)
class Between:
    arg: Expr
    low: Expr
    high: Expr
    negated: bool = False


@dataclass(frozen=True)
class IsNull:
    arg: Expr
    negated: bool = False


@dataclass(frozen=True)
class Like:
    arg: Expr
    pattern: str
    negated: bool = False


Expr = Col | Lit | Arith | Cmp | And | Or | Not | InList | Between | IsNull | Like

TRUE = Lit(True)

_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_ARITH: dict[str, Callable[[Any, Any], Any]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}


# -- structure ---------------------------------------------------------------------------
def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, (Arith, Cmp)):
        return (e.left, e.right)
    if isinstance(e, (And, Or)):
        return e.args
    if isinstance(e, (Not, InList, IsNull, Like)):
        return (e.arg,)
    if isinstance(e, Between):
        return (e.arg, e.low, e.high)
    return ()


def columns(e: Expr) -> set[Col]:
    """Every column the expression reads."""
    if isinstance(e, Col):
        return {e}
    out: set[Col] = set()
    for child in children(e):
        out |= columns(child)
    return out


def relations(e: Expr) -> set[str]:
    return {c.relation for c in columns(e)}


def substitute(e: Expr, mapping: Mapping[Col, Expr]) -> Expr:
    """Replace columns by other expressions (e.g. partial-result columns by shipped keys)."""
    if isinstance(e, Col):
        return mapping.get(e, e)
    if isinstance(e, Lit):
        return e
    if isinstance(e, (Arith, Cmp)):
        return type(e)(e.op, substitute(e.left, mapping), substitute(e.right, mapping))
    if isinstance(e, (And, Or)):
        return type(e)(tuple(substitute(a, mapping) for a in e.args))
    if isinstance(e, Not):
        return Not(substitute(e.arg, mapping))
    if isinstance(e, Between):
        return Between(
            substitute(e.arg, mapping), substitute(e.low, mapping), substitute(e.high, mapping), negated=e.negated
        )
    if isinstance(e, (InList, IsNull, Like)):
        return replace(e, arg=substitute(e.arg, mapping))
    raise TypeError(f"not an expression: {e!r}")


def conjuncts(e: Expr | None) -> list[Expr]:
    """Split a predicate at its top-level ANDs."""
    if e is None:
        return []
    if isinstance(e, And):
        return [c for arg in e.args for c in conjuncts(arg)]
    return [e]


def conjoin(parts: list[Expr]) -> Expr | None:
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else And(tuple(parts))


# -- Python reading ----------------------------------------------------------------------
def _and3(values: list[Any]) -> bool | None:
    if any(v is False for v in values):
        return False
    return None if any(v is None for v in values) else True


def _or3(values: list[Any]) -> bool | None:
    if any(v is True for v in values):
        return True
    return None if any(v is None for v in values) else False


class _LikeSegment:
    """A piece of a LIKE pattern between two ``%``: literal characters and ``_`` (any one).

    Without ``_`` it is plain text, found with ``str.find``; with ``_`` a regex of literals
    and ``.`` only, which tries each start position once and never backtracks further than
    the segment's own length."""

    def __init__(self, text: str) -> None:
        self.length = len(text)
        self._text = text
        self._regex = (
            re.compile("".join("." if ch == "_" else re.escape(ch) for ch in text), re.DOTALL) if "_" in text else None
        )

    def matches_at(self, value: str, start: int) -> bool:
        """Whether ``value[start:start + length]`` is this segment."""
        if self._regex is None:
            return value.startswith(self._text, start)
        return self._regex.fullmatch(value, start, start + self.length) is not None

    def find(self, value: str, start: int, end: int) -> int:
        """The first position at or after ``start`` where the segment lies within ``value[:end]``; -1 if none."""
        if self._regex is None:
            return value.find(self._text, start, end)
        found = self._regex.search(value, start, end)
        return -1 if found is None else found.start()


class LikeMatcher:
    """SQL LIKE (``%`` any run, ``_`` one character, case-sensitive, no escape), in time
    O(len(value) * len(pattern)) whatever the input.

    A regex with one ``.*`` per ``%`` backtracks exponentially on a text that almost
    matches (``%a%b%c%d%e%f%`` against 2 KB without an ``f``); this splits the pattern at
    ``%`` instead: the first segment must start the value, the last must end it, and the
    ones between are found left to right, each at its first fit after the previous one
    (taking the first fit never loses a match: a later one leaves less room for the rest).

    >>> like = LikeMatcher("ab_%c%")
    >>> like("abxc"), like("abxyzc!"), like("abc"), like("Abxc")
    (True, True, False, False)
    >>> LikeMatcher("%a%b%c%d%e%f%")("ab" * 1000)
    False
    """

    def __init__(self, pattern: str) -> None:
        self._segments = [_LikeSegment(part) for part in pattern.split("%")]

    def __call__(self, value: str) -> bool:
        first, *rest = self._segments
        if not rest:  # no %: the whole value is the one segment
            return len(value) == first.length and first.matches_at(value, 0)
        *middle, last = rest
        end = len(value) - last.length
        if end < first.length or not first.matches_at(value, 0) or not last.matches_at(value, end):
            return False
        position = first.length
        for segment in middle:
            found = segment.find(value, position, end)
            if found < 0:
                return False
            position = found + segment.length
        return True


def _compare_nan(op: Callable[[Any, Any], bool], a: Any, b: Any) -> bool | None:
    """``op(a, b)`` where ``a`` or ``b`` is NaN, ordered as PostgreSQL and Spark order it: NaN
    equals NaN and is above every other number (Python's NaN compares false with everything).

    >>> nan = float("nan")
    >>> [_compare_nan(_CMP[op], nan, x) for op, x in (("=", nan), (">", 1e308), ("<>", 5), ("<", float("inf")))]
    [True, True, True, False]
    """
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
        return op(int(a != a), int(b != b))
    try:  # against a non-number: as any comparison of mixed types
        return op(a, b)
    except TypeError:
        return None


def compile_value(e: Expr, layout: Mapping[Col, int]) -> Callable[[tuple], Any]:
    """A function from a row to the value of ``e``; ``layout`` maps each column to its index."""
    if isinstance(e, Col):
        index = layout[e]
        return lambda row: row[index]
    if isinstance(e, Lit):
        value = e.value
        return lambda row: value
    if isinstance(e, Arith):
        op, left, right = _ARITH[e.op], compile_value(e.left, layout), compile_value(e.right, layout)

        def arith(row: tuple) -> Any:
            a, b = left(row), right(row)
            if a is None or b is None:
                return None
            try:
                return op(a, b)
            except TypeError:
                return None

        return arith
    return compile_predicate(e, layout)


def compile_predicate(e: Expr, layout: Mapping[Col, int]) -> Callable[[tuple], bool | None]:
    """A function from a row to True, False or None (unknown), with SQL's NULL semantics."""
    if isinstance(e, Cmp):
        op, left, right = _CMP[e.op], compile_value(e.left, layout), compile_value(e.right, layout)

        def cmp(row: tuple) -> bool | None:
            a, b = left(row), right(row)
            if a is None or b is None:
                return None
            if a != a or b != b:  # NaN (only NaN differs from itself)
                return _compare_nan(op, a, b)
            try:
                return op(a, b)
            except TypeError:  # e.g. text against a number: unknown, never a crash
                return None

        return cmp
    if isinstance(e, And):
        fns = [compile_predicate(a, layout) for a in e.args]
        return lambda row: _and3([f(row) for f in fns])
    if isinstance(e, Or):
        fns = [compile_predicate(a, layout) for a in e.args]
        return lambda row: _or3([f(row) for f in fns])
    if isinstance(e, Not):
        inner = compile_predicate(e.arg, layout)

        def negate(row: tuple) -> bool | None:
            v = inner(row)
            return None if v is None else not v

        return negate
    if isinstance(e, InList):
        arg, values, negated = compile_value(e.arg, layout), e.values, e.negated
        has_null = any(v is None for v in values)

        def in_list(row: tuple) -> bool | None:
            a = arg(row)
            if a is None:
                return None
            if any(v is not None and a == v for v in values):
                return not negated
            return None if has_null else negated

        return in_list
    if isinstance(e, Between):
        lo_hi = And((Cmp(">=", e.arg, e.low), Cmp("<=", e.arg, e.high)))
        return compile_predicate(Not(lo_hi) if e.negated else lo_hi, layout)
    if isinstance(e, IsNull):
        arg, negated = compile_value(e.arg, layout), e.negated
        return lambda row: (arg(row) is None) != negated
    if isinstance(e, Like):
        arg, matches, negated = compile_value(e.arg, layout), LikeMatcher(e.pattern), e.negated

        def like(row: tuple) -> bool | None:
            a = arg(row)
            if a is None:
                return None
            return (isinstance(a, str) and matches(a)) != negated

        return like
    if isinstance(e, Lit):
        value = e.value
        return lambda row: None if value is None else bool(value)
    if isinstance(e, Col):
        fn = compile_value(e, layout)
        return lambda row: None if fn(row) is None else bool(fn(row))
    raise TypeError(f"not a predicate: {e!r}")


def compile_filter(e: Expr | None, layout: Mapping[Col, int]) -> Callable[[tuple], bool]:
    """A row filter: keeps rows where ``e`` is True (None means no predicate)."""
    if e is None:
        return lambda row: True
    fn = compile_predicate(e, layout)
    return lambda row: fn(row) is True


# -- wire form ---------------------------------------------------------------------------
def to_wire(e: Expr) -> dict[str, Any]:
    if isinstance(e, Col):
        return {"col": [e.relation, e.name]}
    if isinstance(e, Lit):
        return {"lit": e.value}
    if isinstance(e, (Arith, Cmp)):
        return {"op": e.op, "args": [to_wire(e.left), to_wire(e.right)]}
    if isinstance(e, And):
        return {"op": "and", "args": [to_wire(a) for a in e.args]}
    if isinstance(e, Or):
        return {"op": "or", "args": [to_wire(a) for a in e.args]}
    if isinstance(e, Not):
        return {"op": "not", "args": [to_wire(e.arg)]}
    if isinstance(e, InList):
        return {"op": "in", "args": [to_wire(e.arg)], "values": list(e.values), "negated": e.negated}
    if isinstance(e, Between):
        return {"op": "between", "args": [to_wire(e.arg), to_wire(e.low), to_wire(e.high)], "negated": e.negated}
    if isinstance(e, IsNull):
        return {"op": "is_null", "args": [to_wire(e.arg)], "negated": e.negated}
    if isinstance(e, Like):
        return {"op": "like", "args": [to_wire(e.arg)], "pattern": e.pattern, "negated": e.negated}
    raise TypeError(f"not an expression: {e!r}")


class WireError(ValueError):
    """A shipped expression that is not well formed."""


MAX_WIRE_NODES = 500
MAX_WIRE_DEPTH = 64
MAX_WIRE_VALUES = 100_000
MAX_LIKE_PATTERN = 10_000
"""Bounds of a shipped expression: nodes (columns, literals, operators), nesting, literal
values (IN lists included) and LIKE pattern characters. The sources' SQL parsers have
limits of their own (SQLite: expression depth 1000, LIKE patterns of 50,000 bytes, 250,000
bound values); a view that needs more is refused with the bound it passes, not a crash."""


@dataclass
class _WireBudget:
    nodes: int = MAX_WIRE_NODES
    values: int = MAX_WIRE_VALUES

    def spend(self, nodes: int, values: int = 0) -> None:
        self.nodes -= nodes
        self.values -= values
        if self.nodes < 0:
            raise WireError(f"expression has more than {MAX_WIRE_NODES} nodes")
        if self.values < 0:
            raise WireError(f"expression has more than {MAX_WIRE_VALUES} literal values")


def from_wire(d: Any) -> Expr:
    """The expression ``d`` is the JSON form of; WireError if it is malformed or beyond the
    bounds above."""
    return _from_wire(d, 1, _WireBudget())


def _from_wire(d: Any, depth: int, budget: _WireBudget) -> Expr:
    if not isinstance(d, dict):
        raise WireError(f"expression must be an object, got {type(d).__name__}")
    if depth > MAX_WIRE_DEPTH:
        raise WireError(f"expression is nested deeper than {MAX_WIRE_DEPTH} levels")
    budget.spend(1)
    if "col" in d:
        ref = d["col"]
        if not (isinstance(ref, list) and len(ref) == 2 and all(isinstance(part, str) for part in ref)):
            raise WireError(f"a column is [relation, name], got {ref!r:.100}")
        return Col(*ref)
    if "lit" in d:
        budget.spend(0, 1)
        return Lit(_scalar(d["lit"], "literal"))
    wire_args = d.get("args", [])
    if not isinstance(wire_args, list):
        raise WireError(f"args must be a list, got {type(wire_args).__name__}")
    op, args = d.get("op"), [_from_wire(a, depth + 1, budget) for a in wire_args]
    negated = bool(d.get("negated", False))
    if op in _ARITH and len(args) == 2:
        return Arith(op, *args)
    if op in _CMP and len(args) == 2:
        return Cmp(op, *args)
    if op == "and" and args:
        return And(tuple(args))
    if op == "or" and args:
        return Or(tuple(args))
    if op == "not" and len(args) == 1:
        return Not(args[0])
    if op == "in" and len(args) == 1 and isinstance(values := d.get("values", []), list):
        budget.spend(0, len(values))
        return InList(args[0], tuple(_scalar(v, "an IN list value") for v in values), negated)
    if op == "between" and len(args) == 3:
        return Between(args[0], args[1], args[2], negated=negated)
    if op == "is_null" and len(args) == 1:
        return IsNull(args[0], negated)
    if op == "like" and len(args) == 1 and isinstance(pattern := d.get("pattern"), str):
        if len(pattern) > MAX_LIKE_PATTERN:
            raise WireError(f"LIKE pattern has {len(pattern)} characters, more than {MAX_LIKE_PATTERN}")
        return Like(args[0], pattern, negated)
    raise WireError(f"unknown or malformed expression operator {op!r}")


def _scalar(value: Any, what: str) -> Scalar:
    if not isinstance(value, (int, float, str, bool, type(None))):
        raise WireError(f"{what} must be a scalar, got {type(value).__name__}")
    return value


# -- SQL reading (parameterized; used by the wrappers) -----------------------------------
def to_sqlalchemy(e: Expr, resolve: Callable[[Col], Any]):
    """Render ``e`` as a SQLAlchemy Core expression; every literal becomes a bound parameter.

    ``resolve`` maps a column reference to a SQLAlchemy column of a table the wrapper has
    reflected (it raises for names that are not in the source's schema).
    """
    import sqlalchemy as sa

    def value(x: Expr):
        if isinstance(x, Col):
            return resolve(x)
        if isinstance(x, Lit):
            return sa.literal(x.value) if x.value is not None else sa.null()
        if isinstance(x, Arith):
            return _ARITH[x.op](value(x.left), value(x.right))
        return pred(x)

    def pred(x: Expr):
        if isinstance(x, Cmp):
            return _CMP[x.op](value(x.left), value(x.right))
        if isinstance(x, And):
            return sa.and_(*[pred(a) for a in x.args])
        if isinstance(x, Or):
            return sa.or_(*[pred(a) for a in x.args])
        if isinstance(x, Not):
            return sa.not_(pred(x.arg))
        if isinstance(x, InList):
            clause = value(x.arg).in_([sa.literal(v) for v in x.values if v is not None])
            if any(v is None for v in x.values):  # SQL: x IN (…, NULL) is never false
                clause = sa.or_(clause, sa.null())
            return sa.not_(clause) if x.negated else clause
        if isinstance(x, Between):
            clause = value(x.arg).between(value(x.low), value(x.high))
            return sa.not_(clause) if x.negated else clause
        if isinstance(x, IsNull):
            v = value(x.arg)
            return v.is_not(None) if x.negated else v.is_(None)
        if isinstance(x, Like):
            v = value(x.arg)
            return v.not_like(sa.literal(x.pattern)) if x.negated else v.like(sa.literal(x.pattern))
        if isinstance(x, Lit):
            return sa.true() if x.value else sa.false()
        if isinstance(x, Col):
            return resolve(x)
        raise TypeError(f"not an expression: {x!r}")

    return pred(e)
