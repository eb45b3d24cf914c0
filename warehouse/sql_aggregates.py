"""The SELECT list, GROUP BY and HAVING of an aggregate view, parsed into its Summary.

``SELECT g…, COUNT(*), COUNT(x), SUM(x), AVG(x), MIN(x), MAX(x) FROM <SPJ body> [GROUP BY
g…] [HAVING …]``: the groups are columns, every selected column is grouped, each aggregate
reads one column (COUNT also ``*``), and HAVING reads groups, aggregates and output aliases.
The SPJ body (FROM, JOIN, WHERE) is ``sql_views``' and is maintained as for any view; its
columns are the groups, then the aggregates' other arguments (``aggregate.Summary``).
Anything else is refused with a message naming the construct.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlglot import exp

from contract.expr import Col, Expr
from warehouse.aggregate import Call, Func, Summary

SUPPORTED = (
    "views are select-project-join, optionally with GROUP BY, COUNT/SUM/AVG/MIN/MAX of columns, HAVING, or DISTINCT"
)

_FUNCS: dict[type[exp.AggFunc], Func] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Avg: "avg",
    exp.Min: "min",
    exp.Max: "max",
}

Resolve = Callable[[exp.Column], Col]
"""A column reference of the body resolved to its relation's column (raises on unknown)."""
Condition = Callable[[exp.Expr, Sequence[str]], Expr]
"""A SQL condition translated over a relation of the given unqualified column names."""
Unsupported = Callable[[exp.Expr], str]
"""A message naming the unsupported construct in a node."""


class AggregateError(ValueError):
    """An aggregate view outside what is supported; the message names the construct."""


def is_aggregate(select: exp.Select) -> bool:
    """Whether the SELECT groups or aggregates (DISTINCT is handled as a plain body)."""
    if select.args.get("group") or select.args.get("having"):
        return True
    return any(
        isinstance(node, exp.AggFunc) and node.find_ancestor(exp.Window) is None  # a window's is refused later
        for item in select.expressions
        for node in item.walk()
    )


def summarize(
    select: exp.Select, resolve: Resolve, condition: Condition, unsupported: Unsupported
) -> tuple[list[Col], Summary]:
    """The body's columns and the aggregate over them of an aggregate SELECT."""
    if select.args.get("distinct"):
        raise AggregateError("DISTINCT together with GROUP BY or aggregates is not supported")
    groups = _groups(select.args.get("group"), resolve)
    body = list(groups)
    calls: list[Call] = []

    def call_position(node: exp.AggFunc) -> int:
        call = _call(node, resolve, body)
        if call not in calls:
            calls.append(call)
        return len(groups) + calls.index(call)

    outputs: list[tuple[str, int]] = []
    for item in select.expressions:
        alias = item.alias if isinstance(item, exp.Alias) else None
        node = item.unalias()
        if isinstance(node, exp.Star) or (isinstance(node, exp.Column) and isinstance(node.this, exp.Star)):
            raise AggregateError(f"{node.sql()} cannot be selected with GROUP BY or aggregates; name the columns")
        if isinstance(node, exp.AggFunc) and type(node) in _FUNCS:
            outputs.append((alias or _default_name(node), call_position(node)))
        elif isinstance(node, exp.Column):
            column = resolve(node)
            if column not in groups:
                raise AggregateError(
                    f"column {node.sql()} is selected but neither in GROUP BY nor in an aggregate; "
                    "group by it or aggregate it"
                )
            outputs.append((alias or column.name, groups.index(column)))
        elif isinstance(node, exp.AggFunc):
            raise AggregateError(_unsupported_function(node))
        else:
            raise AggregateError(f"only columns and aggregates of columns may be selected; {unsupported(node)}")
    _check_names(outputs)
    translated = _having(select.args.get("having"), groups, outputs, resolve, call_position)
    full = [f"f{i}" for i in range(len(groups) + len(calls))]
    having = None if translated is None else condition(translated, full)
    summary = Summary(
        groups=len(groups),
        calls=tuple(calls),
        outputs=tuple(outputs),
        names=tuple(f"{c.relation}.{c.name}" for c in body),
        having=having,
        having_sql=None if translated is None else translated.sql(dialect="spark"),
        grouped=bool(select.args.get("group")),
    )
    return body, summary


def _groups(group: exp.Group | None, resolve: Resolve) -> list[Col]:
    if group is None:
        return []
    extra = [arg for arg, value in group.args.items() if value and arg != "expressions"]
    if extra:
        raise AggregateError(f"GROUP BY {extra[0].upper()} is not supported; group by columns")
    out: list[Col] = []
    for node in group.expressions:
        node = node.unnest()
        if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
            raise AggregateError(f"GROUP BY {node.sql()} is not a column; group by columns only")
        column = resolve(node)
        if column not in out:
            out.append(column)
    return out


def _call(node: exp.AggFunc, resolve: Resolve, body: list[Col]) -> Call:
    """The aggregate ``node`` as a Call; its argument column joins ``body`` if new."""
    if type(node) not in _FUNCS:
        raise AggregateError(_unsupported_function(node))
    func = _FUNCS[type(node)]
    name = func.upper()
    argument = node.this
    if isinstance(argument, exp.Distinct):
        raise AggregateError(f"{name}(DISTINCT …) is not supported")
    if node.expressions:
        raise AggregateError(f"{node.sql()}: {name} takes one argument")
    if isinstance(argument, exp.Star):
        if func != "count":
            raise AggregateError(f"{name}(*) is not supported; only COUNT(*) is")
        return Call(func, None)
    argument = argument.unnest()
    if any(isinstance(inner, exp.AggFunc) for inner in argument.walk()):
        raise AggregateError(f"nested aggregates are not supported ({node.sql()})")
    if not isinstance(argument, exp.Column) or isinstance(argument.this, exp.Star):
        raise AggregateError(f"the argument of {name} must be a column, not {argument.sql()}")
    column = resolve(argument)
    if column not in body:
        body.append(column)
    return Call(func, body.index(column))


def _unsupported_function(node: exp.AggFunc) -> str:
    name = node.name.upper() if isinstance(node, exp.Anonymous) else node.sql_name()
    return f"aggregate {name} is not supported; COUNT, SUM, AVG, MIN and MAX are"


def _default_name(node: exp.AggFunc) -> str:
    """``count`` for COUNT(*), else ``<func>_<column>``: a plain identifier, unlike SQL's."""
    func = _FUNCS[type(node)]
    argument = node.this
    return func if isinstance(argument, exp.Star) else f"{func}_{argument.unnest().name}"


def _check_names(outputs: Sequence[tuple[str, int]]) -> None:
    seen: set[str] = set()
    for name, _ in outputs:
        if name.lower() in seen:  # Spark resolves column names case-insensitively
            raise AggregateError(f"duplicate output column name {name}; give it an alias")
        seen.add(name.lower())


def _having(
    having: exp.Having | None,
    groups: Sequence[Col],
    outputs: Sequence[tuple[str, int]],
    resolve: Resolve,
    call_position: Callable[[exp.AggFunc], int],
) -> exp.Expr | None:
    """HAVING over the full row's positions (``f<i>``). Its aggregates not selected become
    hidden calls; a column must be a group, or an output alias."""
    if having is None:
        return None
    aliases = {name.lower(): p for name, p in outputs}

    def replace(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.AggFunc):
            return exp.column(f"f{call_position(node)}")
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
            return exp.column(f"f{_having_column(node, groups, aliases, resolve)}")
        return node

    return having.this.transform(replace)


def _having_column(node: exp.Column, groups: Sequence[Col], aliases: dict[str, int], resolve: Resolve) -> int:
    try:
        column = resolve(node)
    except ValueError:
        column = None
    if column is not None and column in groups:
        return groups.index(column)
    if not node.table and node.name.lower() in aliases:
        return aliases[node.name.lower()]
    raise AggregateError(
        f"HAVING reads {node.sql()}, which is neither a GROUP BY column nor an output column; "
        "HAVING may read groups, aggregates and output aliases"
    )
