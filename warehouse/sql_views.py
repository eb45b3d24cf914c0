"""View definitions in SQL, parsed into the select-project-join plan the manager maintains.

An administrator writes a view as one ``SELECT`` (optionally ``CREATE VIEW name AS SELECT``)
over relations qualified by their source, ``source.table``. The parser accepts exactly the
SPJ fragment that PVM/SWEEP can maintain, optionally under GROUP BY with COUNT, SUM, AVG,
MIN and MAX and HAVING (``sql_aggregates``) or under DISTINCT, and rejects everything else
with a message naming the construct: the plan must never silently mean something other
than the SQL.

The WHERE clause and every ``JOIN … ON`` condition are split into top-level conjuncts. A
conjunct that reads one relation becomes that relation's local predicate (evaluated at the
source, and on its deltas); one that reads several relations is a join conjunct. Because
inner joins commute, ``JOIN … ON p`` means exactly ``, … WHERE p``. A LEFT JOIN's ON clause
is not a filter: it is read apart, within what docs/protocol.md proves (``_outer_join``).

>>> tables = {
...     ("shop", "orders"): ["id", "customer", "amount"],
...     ("crm", "customers"): ["id", "name", "country"],
... }
>>> plan = parse_view(
...     "CREATE VIEW big_orders AS SELECT o.id, c.name FROM shop.orders o"
...     " JOIN crm.customers c ON o.customer = c.id WHERE o.amount > 100",
...     lambda source, table: tables.get((source, table)),
... )
>>> plan.name, [r.alias for r in plan.relations]
('big_orders', ['o', 'c'])
>>> [r.columns for r in plan.relations]
[('id', 'customer', 'amount'), ('id', 'name')]
>>> plan.relations[0].where
Cmp(op='>', left=Col(relation='o', name='amount'), right=Lit(value=100))
>>> plan.join
(Cmp(op='=', left=Col(relation='o', name='customer'), right=Col(relation='c', name='id')),)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.errors import SqlglotError

from contract.expr import (
    And,
    Arith,
    Between,
    Cmp,
    Col,
    Expr,
    InList,
    IsNull,
    Like,
    Lit,
    Not,
    Or,
    Scalar,
    columns,
    conjoin,
    relations,
)
from warehouse import sql_bounds
from warehouse.aggregate import Summary, distinct
from warehouse.plan import OutputColumn, RelationRef, ViewPlan
from warehouse.sql_aggregates import SUPPORTED, AggregateError, is_aggregate, summarize

Schema = Callable[[str, str], Sequence[str] | None]
"""``schema(source, table)``: the column names of a registered relation, None if unknown."""

# View names become table names in the catalog and in Spark: keep them plain identifiers.
_VIEW_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

_SELECT_PARTS = frozenset({"expressions", "from_", "joins", "where", "distinct", "group", "having"})
_CLAUSE_LABELS = {
    "with_": "WITH (common table expressions)",
    "distinct": "DISTINCT",
    "group": "GROUP BY",
    "having": "HAVING",
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "windows": "WINDOW",
    "qualify": "QUALIFY",
    "into": "SELECT INTO",
}
_CMP_OPS: dict[type[exp.Binary], str] = {
    exp.EQ: "=",
    exp.NEQ: "<>",  # != parses to NEQ too
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
}
_ARITH_OPS: dict[type[exp.Binary], str] = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*"}


class ViewDefinitionError(ValueError):
    """A view definition outside the supported SPJ fragment; the message names the construct."""


@dataclass(frozen=True)
class _Relation:
    """A relation of the FROM clause with its full registered schema."""

    alias: str
    source: str
    table: str
    schema: tuple[str, ...]


def parse_view(sql: str, schema: Schema, name: str | None = None) -> ViewPlan:
    """Parse ``sql`` into a ViewPlan; ``name`` overrides the name given by CREATE VIEW.
    The statement is bounded in size and nesting before it is parsed (``sql_bounds``)."""
    try:
        return _plan(sql, schema, name)
    except RecursionError:
        raise ViewDefinitionError(str(sql_bounds.too_deep())) from None


def _plan(sql: str, schema: Schema, name: str | None) -> ViewPlan:
    written_name, select = _statement(sql)
    view_name = _view_name(name if name is not None else written_name)
    _check_clauses(select)
    rels = _relations(select, schema)
    outputs, summary = _select_list(select, rels)
    local, join = _split_conjuncts(_predicate_nodes(select), rels)
    outer = _outer_join(select)
    if outer is not None:
        local, join = _with_outer_on(outer, rels, local, join)
    used = {o.column for o in outputs} | {c for e in join + list(local.values()) for c in columns(e)}
    return ViewPlan(
        name=view_name,
        relations=tuple(_relation_ref(r, used, local.get(r.alias)) for r in rels),
        join=tuple(join),
        outputs=tuple(outputs),
        sql=sql,
        summary=summary,
        outer=None if outer is None else len(rels) - 1,
    )


# -- statement -------------------------------------------------------------------------------
def _statement(sql: str) -> tuple[str | None, exp.Select]:
    """The SELECT of the single statement, with the name a CREATE VIEW gives it."""
    try:
        # parse() yields None for empty statements, e.g. after a trailing semicolon.
        statements = [s for s in sql_bounds.parse(sql) if s is not None]
    except sql_bounds.SqlTooComplex as error:
        raise ViewDefinitionError(f"the view definition is refused: {error}") from None
    except SqlglotError as error:
        # sqlglot appends a highlighted excerpt on further lines; the first line says it all.
        raise ViewDefinitionError(f"could not parse the view definition: {str(error).splitlines()[0]}") from error
    except Exception as error:  # sqlglot failing on odd input is still the definition's problem
        raise ViewDefinitionError(
            f"could not parse the view definition ({type(error).__name__}: {error})"[:500]
        ) from None
    if not statements:
        raise ViewDefinitionError("the view definition is empty")
    if len(statements) > 1:
        raise ViewDefinitionError(f"multiple statements are not supported (found {len(statements)})")
    statement = statements[0]
    if isinstance(statement, exp.Create) and statement.kind == "VIEW":
        return _created_view_name(statement), _select(statement.expression)
    return None, _select(statement)


def _created_view_name(create: exp.Create) -> str:
    target = create.this
    if not isinstance(target, exp.Table):
        raise ViewDefinitionError("a column list after the view name is not supported; name columns with AS")
    options = _extra_args(create, {"this", "kind", "expression"})
    if options:
        raise ViewDefinitionError(f"CREATE VIEW options are not supported ({', '.join(options)})")
    if target.db:
        raise ViewDefinitionError(f"invalid view name {target.sql()}: views are not qualified")
    return target.name


def _select(statement: exp.Expr | None) -> exp.Select:
    if isinstance(statement, exp.SetOperation):
        raise ViewDefinitionError(f"{statement.key.upper()} is not supported: {SUPPORTED}")
    if not isinstance(statement, exp.Select):
        raise ViewDefinitionError("only SELECT (optionally as CREATE VIEW … AS SELECT) is accepted")
    return statement


def _view_name(name: str | None) -> str:
    if name is None:
        raise ViewDefinitionError("the view needs a name: write CREATE VIEW name AS SELECT … or pass one")
    if not _VIEW_NAME.fullmatch(name):
        raise ViewDefinitionError(
            f"invalid view name {name!r}: use letters, digits and _, not starting with a digit, at most 63"
        )
    return name


def _check_clauses(select: exp.Select) -> None:
    extra = _extra_args(select, _SELECT_PARTS)
    if extra:
        label = _CLAUSE_LABELS.get(extra[0], extra[0].rstrip("_").upper())
        raise ViewDefinitionError(f"{label} is not supported: {SUPPORTED}")
    distinct = select.args.get("distinct")
    if distinct is not None and distinct.args.get("on"):
        raise ViewDefinitionError(f"DISTINCT ON is not supported: {SUPPORTED}")


def _extra_args(node: exp.Expr, allowed: set[str] | frozenset[str]) -> list[str]:
    """The arguments set on ``node`` beyond ``allowed`` (sqlglot stores absent ones as falsy)."""
    return [arg for arg, value in node.args.items() if value and arg not in allowed]


# -- FROM ------------------------------------------------------------------------------------
def _relations(select: exp.Select, schema: Schema) -> tuple[_Relation, ...]:
    from_ = select.args.get("from_")
    if from_ is None:
        raise ViewDefinitionError("the view reads no relation: FROM source.table is missing")
    items = [from_.this] + [_joined_item(j) for j in select.args.get("joins") or []]
    rels = tuple(_relation(item, schema) for item in items)
    _check_distinct(rels)
    return rels


def _joined_item(join: exp.Join) -> exp.Expr:
    """The relation of an inner, cross or left join; an inner join's ON condition is read with
    the WHERE clause, a left join's on its own (``_outer_join``)."""
    if join.side and join.side != "LEFT":
        raise ViewDefinitionError(f"{join.side} outer joins are not supported; write a LEFT JOIN")
    if join.method:
        raise ViewDefinitionError(f"{join.method} joins are not supported; write JOIN … ON")
    if join.args.get("using"):
        raise ViewDefinitionError("JOIN … USING is not supported; write JOIN … ON")
    if join.side and join.kind not in ("", "OUTER"):
        raise ViewDefinitionError(f"LEFT {join.kind} JOIN is not supported; only LEFT [OUTER] JOIN is")
    if not join.side and join.kind not in ("", "INNER", "CROSS"):
        raise ViewDefinitionError(f"{join.kind} JOIN is not supported; only inner joins are")
    if join.side and not isinstance(join.this, exp.Table):
        raise ViewDefinitionError("an outer join whose right side is not a single relation is not supported")
    extra = _extra_args(join, {"this", "on", "kind", "side"})
    if extra:
        raise ViewDefinitionError(f"JOIN {', '.join(extra)} is not supported")
    return join.this


def _relation(item: exp.Expr, schema: Schema) -> _Relation:
    if isinstance(item, exp.Subquery):
        raise ViewDefinitionError("subqueries are not supported (in FROM)")
    if not isinstance(item, exp.Table) or not isinstance(item.this, exp.Identifier):
        raise ViewDefinitionError(f"{item.sql()} is not supported in FROM; write source.table")
    if not item.db:
        raise ViewDefinitionError(f"relation {item.name} must be written source.table")
    if item.catalog or _extra_args(item, {"this", "db", "alias"}):
        raise ViewDefinitionError(f"{item.sql()} is not supported in FROM; write source.table [AS alias]")
    alias = item.args.get("alias")
    if alias is not None and alias.columns:
        raise ViewDefinitionError(f"column aliases on relation {item.db}.{item.name} are not supported")
    known = schema(item.db, item.name)
    if known is None:
        raise ViewDefinitionError(f"unknown relation {item.db}.{item.name}")
    return _Relation(item.alias or item.name, item.db, item.name, tuple(known))


def _check_distinct(rels: Sequence[_Relation]) -> None:
    """Every relation has an alias of its own. One table may appear more than once (a
    self-join), each occurrence a relation of the view under its own alias."""
    aliases: dict[str, _Relation] = {}
    for r in rels:
        # Aliases resolve case-insensitively as a fallback, so they must differ beyond case.
        first = aliases.setdefault(r.alias.lower(), r)
        if first is r:
            continue
        if (first.source, first.table) == (r.source, r.table):
            raise ViewDefinitionError(
                f"relation {r.source}.{r.table} appears twice as {r.alias}; give each occurrence an alias of its own"
            )
        raise ViewDefinitionError(f"duplicate alias {r.alias}")


def _relation_ref(rel: _Relation, used: set[Col], where: Expr | None) -> RelationRef:
    """The plan's view of a relation: only the columns the view reads, in schema order."""
    needed = tuple(c for c in rel.schema if Col(rel.alias, c) in used)
    return RelationRef(rel.alias, rel.source, rel.table, needed, where)


# -- names -----------------------------------------------------------------------------------
def _match(name: str, candidates: Sequence[str]) -> str | None:
    """``name`` as spelled among ``candidates``: exact first, else the only case-insensitive match."""
    if name in candidates:
        return name
    folded = [c for c in candidates if c.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


def _by_alias(alias: str, rels: Sequence[_Relation]) -> _Relation:
    found = _match(alias, [r.alias for r in rels])
    if found is None:
        raise ViewDefinitionError(f"unknown relation alias {alias}; the view reads {_aliases(rels)}")
    return next(r for r in rels if r.alias == found)


def _aliases(rels: Sequence[_Relation]) -> str:
    return ", ".join(r.alias for r in rels)


def _qualifier(column: exp.Column) -> str:
    """The relation alias of a column reference ('' if unqualified)."""
    if column.args.get("db") or column.args.get("catalog"):
        raise ViewDefinitionError(f"column {column.sql()}: refer to columns as alias.column")
    return column.table


def _resolve(column: exp.Column, rels: Sequence[_Relation]) -> Col:
    qualifier = _qualifier(column)
    if isinstance(column.this, exp.Star):
        raise ViewDefinitionError(f"{column.sql()} is only allowed in the SELECT list")
    name = column.name
    if qualifier:
        rel = _by_alias(qualifier, rels)
        found = _match(name, rel.schema)
        if found is None:
            raise ViewDefinitionError(f"unknown column {name} in relation {rel.alias} ({rel.source}.{rel.table})")
        return Col(rel.alias, found)
    hits = [Col(r.alias, found) for r in rels if (found := _match(name, r.schema)) is not None]
    if not hits:
        raise ViewDefinitionError(f"unknown column {name}: none of the relations {_aliases(rels)} has it")
    if len(hits) > 1:
        candidates = ", ".join(f"{c.relation}.{c.name}" for c in hits)
        raise ViewDefinitionError(f"column {name} is ambiguous ({candidates}); qualify it with its alias")
    return hits[0]


# -- SELECT list -----------------------------------------------------------------------------
def _select_list(select: exp.Select, rels: Sequence[_Relation]) -> tuple[list[OutputColumn], Summary | None]:
    """The body's output columns, and the aggregate or DISTINCT over them (None: neither).
    An aggregate view's SELECT list, GROUP BY and HAVING are ``sql_aggregates``'."""
    if is_aggregate(select):
        try:
            body, summary = summarize(
                select,
                lambda column: _resolve(column, rels),
                lambda node, names: _condition(node, [_Relation("", "", "", tuple(names))]),
                _why_unsupported,
            )
        except AggregateError as error:
            raise ViewDefinitionError(str(error)) from None
        return [OutputColumn(f"{c.relation}.{c.name}", c) for c in body], summary
    outputs = [out for item in select.expressions for out in _outputs(item, rels)]
    _check_output_names(outputs)
    if select.args.get("distinct"):
        return outputs, distinct([o.name for o in outputs])
    return outputs, None


def _outputs(item: exp.Expr, rels: Sequence[_Relation]) -> list[OutputColumn]:
    if isinstance(item, exp.Star) and not _extra_args(item, set()):  # not * EXCEPT/REPLACE
        return [out for r in rels for out in _all_columns(r)]
    if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
        return _all_columns(_by_alias(_qualifier(item), rels))
    if isinstance(item, exp.Alias) and isinstance(item.this, exp.Column):
        return [OutputColumn(item.alias, _resolve(item.this, rels))]
    if isinstance(item, exp.Column):
        column = _resolve(item, rels)
        return [OutputColumn(column.name, column)]
    raise ViewDefinitionError(f"only columns may be selected; {_why_unsupported(item.unalias())}")


def _all_columns(rel: _Relation) -> list[OutputColumn]:
    return [OutputColumn(c, Col(rel.alias, c)) for c in rel.schema]


def _check_output_names(outputs: Sequence[OutputColumn]) -> None:
    seen: set[str] = set()
    for out in outputs:
        # Spark resolves column names case-insensitively, so x and X would collide there.
        if out.name.lower() in seen:
            raise ViewDefinitionError(f"duplicate output column name {out.name}; give it an alias")
        seen.add(out.name.lower())


# -- WHERE / ON ------------------------------------------------------------------------------
def _predicate_nodes(select: exp.Select) -> list[exp.Expr]:
    """The top-level conjuncts of every inner join's ON condition, then of WHERE, in textual
    order (a LEFT JOIN's ON condition is not a filter: ``_outer_join`` reads it)."""
    clauses = [j.args.get("on") for j in select.args.get("joins") or [] if not j.side]
    where = select.args.get("where")
    clauses.append(where.this if where is not None else None)
    return [c for clause in clauses if clause is not None for c in _conjunct_nodes(clause)]


def _conjunct_nodes(node: exp.Expr) -> list[exp.Expr]:
    # Split on the SQL tree (not the translated one) to quote a rejected conjunct as written.
    node = node.unnest()
    if isinstance(node, exp.And):
        return _conjunct_nodes(node.left) + _conjunct_nodes(node.right)
    return [node]


def _split_conjuncts(nodes: Sequence[exp.Expr], rels: Sequence[_Relation]) -> tuple[dict[str, Expr], list[Expr]]:
    """Local predicates by alias (conjoined) and join conjuncts, both in textual order."""
    local: dict[str, list[Expr]] = {}
    join: list[Expr] = []
    for node in nodes:
        conjunct = _condition(node, rels)
        readers = relations(conjunct)
        if not readers:
            raise ViewDefinitionError(f"constant predicate {node.sql()} is not supported")
        if len(readers) == 1:
            local.setdefault(next(iter(readers)), []).append(conjunct)
        else:
            join.append(conjunct)
    predicates: dict[str, Expr] = {}
    for alias, parts in local.items():
        predicate = conjoin(parts)
        assert predicate is not None  # every alias here has at least one conjunct
        predicates[alias] = predicate
    return predicates, join


def _condition(node: exp.Expr, rels: Sequence[_Relation]) -> Expr:
    """Translate a SQL condition (a node in boolean position)."""
    node = node.unnest()
    if isinstance(node, (exp.And, exp.Or)):
        kind = And if isinstance(node, exp.And) else Or
        args: list[Expr] = []
        for side in (node.left, node.right):
            part = _condition(side, rels)
            args.extend(part.args if isinstance(part, kind) else (part,))
        return kind(tuple(args))
    if isinstance(node, exp.Not):
        return _negate(_condition(node.this, rels))
    if isinstance(node, exp.Binary) and type(node) in _CMP_OPS:
        return Cmp(_CMP_OPS[type(node)], _value(node.left, rels), _value(node.right, rels))
    if isinstance(node, exp.In) and not _extra_args(node, {"this", "expressions"}):
        return InList(_value(node.this, rels), tuple(_in_value(v, rels) for v in node.expressions))
    if isinstance(node, exp.Between) and not _extra_args(node, {"this", "low", "high"}):
        return Between(_value(node.this, rels), _value(node.args["low"], rels), _value(node.args["high"], rels))
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        return IsNull(_value(node.this, rels))
    if type(node) is exp.Like:
        like = Like(_value(node.this, rels), _like_pattern(node.expression))
        return _negate(like) if node.args.get("negate") else like
    if isinstance(node, (exp.Column, exp.Boolean, exp.Null, exp.Literal)):
        return _value(node, rels)  # a boolean column, or a constant (rejected by the caller)
    raise ViewDefinitionError(_why_unsupported(node))


def _negate(e: Expr) -> Expr:
    """NOT e; folded into the node's own flag where SQL has a negated form (same 3VL meaning)."""
    if isinstance(e, (InList, Between, IsNull, Like)):
        return dataclasses.replace(e, negated=not e.negated)
    return Not(e)


def _value(node: exp.Expr, rels: Sequence[_Relation]) -> Expr:
    """Translate a SQL scalar (an operand of a comparison or of arithmetic)."""
    node = node.unnest()
    if isinstance(node, exp.Column):
        return _resolve(node, rels)
    if isinstance(node, (exp.Literal, exp.Boolean, exp.Null)):
        return _literal(node)
    if isinstance(node, exp.Neg):
        inner = _value(node.this, rels)
        if isinstance(inner, Lit) and isinstance(inner.value, (int, float)) and not isinstance(inner.value, bool):
            return Lit(-inner.value)
        return Arith("-", Lit(0), inner)
    if isinstance(node, exp.Binary) and type(node) in _ARITH_OPS:
        return Arith(_ARITH_OPS[type(node)], _value(node.left, rels), _value(node.right, rels))
    raise ViewDefinitionError(_why_unsupported(node))


def _literal(node: exp.Literal | exp.Boolean | exp.Null) -> Lit:
    if isinstance(node, exp.Null):
        return Lit(None)
    if isinstance(node, exp.Boolean):
        return Lit(node.this)
    if node.is_string:
        return Lit(node.this)
    text = node.this
    return Lit(int(text) if text.isdigit() else float(text))


def _in_value(node: exp.Expr, rels: Sequence[_Relation]) -> Scalar:
    value = _value(node, rels)
    if not isinstance(value, Lit):
        raise ViewDefinitionError(f"IN accepts only a list of literals; {node.sql()} is not one")
    return value.value


def _like_pattern(node: exp.Expr) -> str:
    if not (isinstance(node, exp.Literal) and node.is_string):
        raise ViewDefinitionError(f"LIKE needs a string literal pattern, not {node.sql()}")
    return node.this


# -- LEFT JOIN -------------------------------------------------------------------------------
def _outer_join(select: exp.Select) -> list[exp.Expr] | None:
    """The ON conjuncts of the view's LEFT JOIN, None if it has none. What is accepted is what
    docs/protocol.md proves: one LEFT JOIN, written last, whose right side is one relation."""
    joins = select.args.get("joins") or []
    outer = [j for j in joins if j.side]
    if not outer:
        return None
    if len(outer) > 1:
        raise ViewDefinitionError("more than one outer join is not supported")
    if outer[0] is not joins[-1]:
        raise ViewDefinitionError("a join after an outer join is not supported; write the LEFT JOIN last")
    on = outer[0].args.get("on")
    if on is None:
        raise ViewDefinitionError("an outer join needs an ON condition")
    return _conjunct_nodes(on)


def _with_outer_on(
    on: list[exp.Expr], rels: Sequence[_Relation], local: dict[str, Expr], join: list[Expr]
) -> tuple[dict[str, Expr], list[Expr]]:
    """Add the LEFT JOIN's ON conjuncts to the inner part's: those reading its right relation
    alone are its local predicate (they choose its rows before the join), those reading it and
    one left relation are the join conjuncts the outer join is over. Every ON conjunct must
    read the right relation, and all of them the same one left relation; nothing else may
    read the right relation (a WHERE condition on it would filter the NULL-extended rows)."""
    right = rels[-1].alias
    if right in local or any(right in relations(c) for c in join):
        raise ViewDefinitionError(
            f"a condition outside the outer join's ON clause on its right relation {right} is not supported"
        )
    on_local, on_join = _split_conjuncts(on, rels)
    for node in on:
        readers = relations(_condition(node, rels))
        if right not in readers:
            raise ViewDefinitionError(
                f"an outer join whose ON clause has a condition on its left side alone ({node.sql()}) is not supported"
            )
        if len(readers) > 2:
            raise ViewDefinitionError(f"an outer join whose ON clause references a third relation ({node.sql()})")
    lefts = {a for c in on_join for a in relations(c)} - {right}
    if len(lefts) > 1:
        raise ViewDefinitionError(
            f"an outer join whose ON clause references a third relation ({', '.join(sorted(lefts))} with {right})"
        )
    if not lefts:
        raise ViewDefinitionError(f"an outer join whose ON clause does not compare {right} with the left side")
    return {**local, **on_local}, [*join, *on_join]


# -- rejection messages ----------------------------------------------------------------------
def _why_unsupported(node: exp.Expr) -> str:
    """Name the first unsupported construct inside ``node``, else quote ``node`` itself."""
    for part in node.walk():
        reason = _construct(part)
        if reason is not None:
            return reason
    return f"{node.sql()} is not supported"


def _construct(node: exp.Expr) -> str | None:
    if isinstance(node, (exp.Subquery, exp.Exists, exp.Query)):
        return f"subqueries are not supported: {SUPPORTED}"
    if isinstance(node, exp.Window):
        return f"window functions are not supported: {SUPPORTED}"
    if isinstance(node, exp.AggFunc):
        return f"aggregate {_function_name(node)} is not allowed here: aggregates go in the SELECT list or HAVING"
    if isinstance(node, exp.Case):
        return "CASE is not supported"
    if isinstance(node, exp.Cast):
        return "CAST is not supported"
    # AND/OR are Func subclasses in sqlglot, but they are operators here.
    if isinstance(node, exp.Func) and not isinstance(node, exp.Connector):
        return f"function {_function_name(node)} is not supported"
    return None


def _function_name(node: exp.Func) -> str:
    return node.name.upper() if isinstance(node, exp.Anonymous) else node.sql_name()
