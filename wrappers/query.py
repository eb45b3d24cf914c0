"""ProcessQuery: join the distinct keys of a partial result with one source relation.

The keys go into a TEMP table (``_k`` = key index, ``k0..kN`` = key columns), and one
parameterized statement built with SQLAlchemy Core joins it with the relation::

    SELECT t._k, r.<select…>, COUNT(*) FROM <keys> t JOIN <relation> r ON <on>
    WHERE <where> GROUP BY t._k, r.<select…>

Every identifier is resolved against the reflected schema before anything runs, and every
value is a bound parameter. Preparation (validation) happens before the wrapper takes a
snapshot; evaluation runs inside the snapshot the watermark describes.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from api.schemas import KEY_RELATION, Subquery
from warehouse.expr import Col, Expr, WireError, columns, from_wire, to_sqlalchemy
from wrappers.errors import InvalidRequest
from wrappers.schema import SourceSchema


class _Untyped(sa.types.UserDefinedType):
    """A column declared without a type: SQLite stores each key value exactly as bound."""

    cache_ok = True

    def get_col_spec(self, **_: Any) -> str:
        return ""


@dataclass(frozen=True)
class PreparedQuery:
    """A validated subquery: its keys, the TEMP table for them and the join statement."""

    keys: list[list[Any]]
    key_table: sa.Table
    statement: sa.Select


def prepare(subquery: Subquery, schema: SourceSchema) -> PreparedQuery:
    """Validate ``subquery`` against ``schema`` and build its statement (InvalidRequest if bad)."""
    if subquery.alias == KEY_RELATION:
        raise InvalidRequest(f"alias {KEY_RELATION!r} is reserved for the keys")
    table = schema.table(subquery.relation)
    table.check_columns(subquery.select)
    on = _parse(subquery.on, "on")
    where = _parse(subquery.where, "where")
    width = len(subquery.keys[0]) if subquery.keys else _key_width(on)
    if any(len(k) != width for k in subquery.keys):
        raise InvalidRequest("all keys must have the same number of columns")
    key_names = [f"k{j}" for j in range(width)]
    key_table = sa.Table(
        f"_pvm_keys_{uuid.uuid4().hex}",
        sa.MetaData(),
        sa.Column("_k", sa.Integer, primary_key=True),
        *(sa.Column(name, _Untyped()) for name in key_names),
        prefixes=["TEMPORARY"],
    )
    relation = table.query_table()

    def resolve(col: Col) -> Any:
        if col.relation == KEY_RELATION:
            if col.name not in key_names:
                raise InvalidRequest(f"unknown key column {col.name!r} (the keys have {width} columns)")
            return key_table.c[col.name]
        if col.relation != subquery.alias:
            raise InvalidRequest(f"unknown relation {col.relation!r} (this subquery reads {subquery.alias!r})")
        table.check_columns([col.name])
        return relation.c[col.name]

    selected = [relation.c[name] for name in subquery.select]
    join = key_table.join(relation, to_sqlalchemy(on, resolve) if on is not None else sa.true())
    statement = sa.select(key_table.c["_k"], *selected, sa.func.count()).select_from(join)
    if where is not None:
        statement = statement.where(to_sqlalchemy(where, resolve))
    statement = statement.group_by(key_table.c["_k"], *selected)
    return PreparedQuery(subquery.keys, key_table, statement)


def evaluate(conn: sa.Connection, query: PreparedQuery) -> list[list[Any]]:
    """Run ``query`` in ``conn``'s transaction; rows are ``[key index, *values, count]``.

    The TEMP table lives in the connection's temp schema, so writing it does not end the
    read snapshot of the main database; it disappears when the transaction rolls back.
    """
    if not query.keys:
        return []
    query.key_table.create(conn)
    names = [c.name for c in query.key_table.columns][1:]
    conn.execute(query.key_table.insert(), [{"_k": i, **dict(zip(names, key))} for i, key in enumerate(query.keys)])
    return [[_json_value(v) for v in row] for row in conn.execute(query.statement)]


def _parse(wire: dict[str, Any] | None, clause: str) -> Expr | None:
    try:
        return from_wire(wire) if wire is not None else None
    except (WireError, TypeError, ValueError) as exc:
        raise InvalidRequest(f"malformed {clause} expression: {exc}") from exc


def _key_width(on: Expr | None) -> int:
    """Without keys there is no row to count columns in: take them from what ``on`` reads."""
    refs = [c.name for c in (columns(on) if on is not None else ()) if c.relation == KEY_RELATION]
    return 1 + max((int(m.group(1)) for n in refs if (m := re.fullmatch(r"k(\d+)", n))), default=-1)


def _json_value(value: Any) -> Any:
    """BLOBs as hex text, as the capture triggers ship them."""
    return value.hex().upper() if isinstance(value, bytes) else value
