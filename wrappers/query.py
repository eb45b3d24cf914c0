"""ProcessQuery: join the distinct keys of a partial result with one source relation.

The keys are a relation of their own (``_k`` = key index, ``k0..kN`` = key columns), and one
parameterized statement built with SQLAlchemy Core joins it with the relation::

    SELECT t._k, r.<select…>, COUNT(*) FROM <keys> t JOIN <relation> r ON <on>
    WHERE <where> AND <the row fits> GROUP BY t._k, r.<select…>

In PostgreSQL the keys are bound as one array per column and read with ``unnest``: one
statement, and no table created. A TEMP table there would be a row in ``pg_class``,
``pg_attribute``, ``pg_type`` and ``pg_depend`` per subquery, dead as soon as the subquery
ends: at tens of subqueries a second the system catalogs bloat, and every backend slows
with them (autovacuum only catches up). A key column whose values arrays cannot carry
exactly (a numeric column given integers and floats, a boolean column given integers) still
goes through a TEMP table. Elsewhere the keys go into a TEMP table, which SQLite keeps in
memory and MariaDB in its temporary tablespace, neither in a catalog that bloats.

where "the row fits" leaves out the rows the views cannot take, as captured changes leave
them out (``wrappers.quarantine``).

Every identifier is resolved against the reflected schema before anything runs, and every
value is a bound parameter. Preparation (validation) happens before the wrapper takes a
snapshot; evaluation runs inside the snapshot the watermark describes.

The manager evaluates the same predicates in Python (``contract.expr``), and both must
agree on every row. SQLite does (case-sensitive LIKE is switched on, text compares by code
point). PostgreSQL and MariaDB get help: text columns are compared under a binary collation
(PostgreSQL ``"C"``; MariaDB ``utf8mb4_nopad_bin``, which is also case- and
trailing-space-sensitive, also for GROUP BY), and a backslash in a LIKE pattern is escaped,
since both treat it as LIKE's escape character and ``contract.expr`` does not. Their key
columns are typed after the relation column they are compared with (else after the values).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateTable
from sqlalchemy.sql.visitors import InternalTraversal

from contract.expr import And, Cmp, Col, Expr, Like, Not, Or, WireError, columns, from_wire, to_sqlalchemy
from contract.schemas import KEY_RELATION, Subquery
from contract.value_fit import Family, source_family
from wrappers.capture.types import wire_values
from wrappers.errors import InvalidRequest
from wrappers.quarantine import DEFAULT_MAX_VALUE_BYTES, checked_family, fit_clause
from wrappers.schema import SourceSchema, TableSchema

_MARIADB = ("mysql", "mariadb")
_BINARY_COLLATION = {"postgresql": "C", "mysql": "utf8mb4_nopad_bin", "mariadb": "utf8mb4_nopad_bin"}


class _Untyped(sa.types.UserDefinedType):
    """A column declared without a type: SQLite stores each key value exactly as bound."""

    cache_ok = True

    def get_col_spec(self, **_: Any) -> str:
        return ""


@dataclass(frozen=True)
class QueryShape:
    """What a subquery compiles to apart from its key values: the TEMP table for the keys and
    the join statement, and in PostgreSQL the same join over the keys bound as arrays
    (``arrays``, with the key columns' ``families``). Subqueries of one SWEEP step of one
    view share a shape, so it is built and validated once (``_shape`` caches it) and
    SQLAlchemy reuses the compiled SQL.

    The TEMP table is named after the shape. TEMP tables are private to a connection, which
    runs one subquery at a time; SQLite and PostgreSQL drop the table when the snapshot's
    transaction ends, and MariaDB's (which outlive it) are dropped after use, failed or not."""

    key_table: sa.Table
    statement: sa.Select
    arrays: sa.Select | None = None
    families: tuple[Family, ...] = ()


@dataclass(frozen=True)
class PreparedQuery:
    """A validated subquery: its keys and its shape."""

    keys: list[list[Any]]
    shape: QueryShape


def prepare(
    subquery: Subquery,
    schema: SourceSchema,
    dialect: str = "sqlite",
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    affinities: bool = True,
) -> PreparedQuery:
    """Validate ``subquery`` against ``schema`` and build its statement for ``dialect`` (the
    SQLAlchemy dialect name of the database it runs in), leaving out the rows the views
    cannot take (``wrappers.quarantine.fit_clause``, whose ``affinities`` say whether the
    schema's declared types are those of the queried tables: not so in a replica);
    InvalidRequest if it is bad."""
    if subquery.alias == KEY_RELATION:
        raise InvalidRequest(f"alias {KEY_RELATION!r} is reserved for the keys")
    table = schema.table(subquery.relation)
    table.check_columns(subquery.select)
    on_json, where_json = _canonical(subquery.on), _canonical(subquery.where)
    on, _where = _clauses(on_json, where_json, dialect)
    width = len(subquery.keys[0]) if subquery.keys else _key_width(on)  # one width: Subquery checks it
    families = (
        tuple(_key_family(j, subquery, table, on) for j in range(width)) if dialect in _BINARY_COLLATION else None
    )
    shape = _shape(
        table,
        subquery.alias,
        on_json,
        where_json,
        tuple(subquery.select),
        width,
        families,
        dialect,
        max_value_bytes,
        affinities,
    )
    return PreparedQuery(subquery.keys, shape)


def _canonical(wire: dict[str, Any] | None) -> str | None:
    try:
        return json.dumps(wire, sort_keys=True) if wire is not None else None
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"malformed expression: {exc}") from exc


@functools.lru_cache(maxsize=256)
def _clauses(on_json: str | None, where_json: str | None, dialect: str) -> tuple[Expr | None, Expr | None]:
    on = _parse(json.loads(on_json) if on_json is not None else None, "on")
    where = _parse(json.loads(where_json) if where_json is not None else None, "where")
    if dialect in _BINARY_COLLATION:
        on, where = _escape_backslashes(on), _escape_backslashes(where)
    return on, where


@functools.lru_cache(maxsize=256)
def _shape(
    table: TableSchema,
    alias: str,
    on_json: str | None,
    where_json: str | None,
    select: tuple[str, ...],
    width: int,
    families: tuple[Family, ...] | None,
    dialect: str,
    max_value_bytes: int,
    affinities: bool,
) -> QueryShape:
    on, where = _clauses(on_json, where_json, dialect)
    key_names = [f"k{j}" for j in range(width)]
    key_types = [_KEY_TYPES[dialect][f] for f in families] if families is not None else [_Untyped()] * width
    digest = hashlib.sha1(repr((table, alias, on_json, where_json, select, width, families)).encode()).hexdigest()
    key_table = sa.Table(
        f"_pvm_keys_{digest[:20]}",
        sa.MetaData(),
        sa.Column("_k", sa.Integer, primary_key=True, autoincrement=False),  # MariaDB: 0 is a key, not "next"
        *(sa.Column(name, key_type) for name, key_type in zip(key_names, key_types)),
        prefixes=["TEMPORARY"],
    )
    relation = table.query_table()
    column = functools.partial(_column, table, relation, dialect)
    fit = fit_clause(table, dialect, max_value_bytes, column, affinities)
    selected_columns = [_selected(table, relation, dialect, name) for name in select]

    def joined(keys: sa.FromClause, key_column: Any) -> sa.Select:
        """The join of ``keys`` (whose columns ``key_column`` reads) with the relation."""

        def resolve(col: Col) -> Any:
            if col.relation == KEY_RELATION:
                if col.name not in key_names:
                    raise InvalidRequest(f"unknown key column {col.name!r} (the keys have {width} columns)")
                return key_column(col.name)
            if col.relation != alias:
                raise InvalidRequest(f"unknown relation {col.relation!r} (this subquery reads {alias!r})")
            table.check_columns([col.name])
            return column(col.name)

        join = keys.join(relation, to_sqlalchemy(on, resolve) if on is not None else sa.true())
        statement = sa.select(keys.c["_k"], *selected_columns, sa.func.count()).select_from(join)
        if where is not None:
            statement = statement.where(to_sqlalchemy(where, resolve))
        if fit is not None:
            statement = statement.where(fit)
        return statement.group_by(keys.c["_k"], *selected_columns)

    statement = joined(key_table, lambda name: key_table.c[name])
    if dialect != "postgresql" or families is None:
        return QueryShape(key_table, statement)
    key_families = dict(zip(key_names, families))
    array_types = {"_k": sa.Integer(), **{n: _ARRAY_TYPES[f] for n, f in key_families.items()}}
    unnested = (
        sa.func.unnest(*(sa.bindparam(_array_param(n), type_=postgresql.ARRAY(t)) for n, t in array_types.items()))
        .table_valued(*(sa.column(n, t) for n, t in array_types.items()))
        .render_derived(name=key_table.name)
    )

    def array_column(name: str) -> Any:  # text keys under the binary collation, as the TEMP table's
        return _Binary(unnested.c[name], "C") if key_families[name] == "text" else unnested.c[name]

    return QueryShape(key_table, statement, joined(unnested, array_column), families)


def _column(table: TableSchema, relation: sa.TableClause, dialect: str, name: str) -> Any:
    """A relation column; text under a binary collation where the dialect needs one."""
    if dialect in _BINARY_COLLATION and source_family(table.types[table.columns.index(name)]) == "text":
        return _Binary(relation.c[name], _BINARY_COLLATION[dialect])
    return relation.c[name]


def _selected(table: TableSchema, relation: sa.TableClause, dialect: str, name: str) -> Any:
    """A selected column in its wire form: SQLite keeps an integer as it was written in a
    float column of the replica (untyped), where the wire carries a float."""
    if dialect == "sqlite" and checked_family(table.types[table.columns.index(name)]) == "float":
        return sa.cast(relation.c[name], sa.Float)
    return _column(table, relation, dialect, name)


def scan(
    table: TableSchema,
    alias: str,
    where: dict[str, Any] | None,
    select: list[str],
    dialect: str = "sqlite",
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    affinities: bool = True,
) -> sa.Select:
    """The statement of a relation snapshot: every fit row of ``table`` that satisfies
    ``where``, projected to ``select``, one result row per source row (weight one), in the
    same wire forms and under the same collations as a subquery's answer. InvalidRequest
    if the request names what the table does not have."""
    if alias == KEY_RELATION:
        raise InvalidRequest(f"alias {KEY_RELATION!r} is reserved for the keys")
    table.check_columns(select)
    _, condition = _clauses(None, _canonical(where), dialect)
    relation = table.query_table()

    def resolve(col: Col) -> Any:
        if col.relation != alias:
            raise InvalidRequest(f"unknown relation {col.relation!r} (this snapshot reads {alias!r})")
        table.check_columns([col.name])
        return _column(table, relation, dialect, col.name)

    statement = sa.select(*(_selected(table, relation, dialect, name) for name in select)).select_from(relation)
    if condition is not None:
        statement = statement.where(to_sqlalchemy(condition, resolve))
    fit = fit_clause(table, dialect, max_value_bytes, functools.partial(_column, table, relation, dialect), affinities)
    return statement.where(fit) if fit is not None else statement


@functools.lru_cache(maxsize=256)
def _create_sql(shape: QueryShape, dialect: sa.Dialect) -> str:
    return str(CreateTable(shape.key_table).compile(dialect=dialect))


def evaluate(conn: sa.Connection, query: PreparedQuery) -> list[list[Any]]:
    """Run ``query`` in ``conn``'s transaction; rows are ``[key index, *values, count]``.

    The TEMP table lives in the connection's temp schema, so writing it does not end the
    read snapshot of the main database. A key or literal the database cannot hold (an
    integer beyond 64 bits in SQLite, text that is no date) is an InvalidRequest.

    One snapshot may answer several subqueries, one after the other
    (``wrappers/shared_handshake.py``), so each leaves the transaction as it found it: in
    PostgreSQL inside a savepoint rolled back afterwards (which also undoes an error, that
    would abort the whole transaction), elsewhere by dropping its key table (a failed
    statement aborts nothing there).
    """
    if not query.keys:
        return []
    shape = query.shape
    arrays = _key_arrays(query.keys, shape.families) if shape.arrays is not None else None
    savepoint = conn.begin_nested() if conn.dialect.name == "postgresql" else None
    try:
        if arrays is not None and shape.arrays is not None:
            rows = conn.execute(shape.arrays, arrays)
        else:
            conn.exec_driver_sql(_create_sql(shape, conn.dialect))
            names = [c.name for c in shape.key_table.columns][1:]
            keys = [{"_k": i, **dict(zip(names, key))} for i, key in enumerate(query.keys)]
            conn.execute(shape.key_table.insert(), keys)
            rows = conn.execute(shape.statement)
        return [wire_values(row) for row in rows]
    except (sa.exc.DataError, OverflowError) as exc:
        reason = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
        raise InvalidRequest(f"the source cannot take a key or literal value of this subquery: {reason}") from None
    finally:
        if savepoint is not None:
            savepoint.rollback()
        elif conn.dialect.name in _MARIADB:  # its TEMPORARY tables outlive the transaction
            conn.exec_driver_sql(f"DROP TEMPORARY TABLE IF EXISTS {shape.key_table.name}")
        else:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS temp.{shape.key_table.name}")


def _key_arrays(keys: list[list[Any]], families: tuple[Family, ...]) -> dict[str, list[Any]] | None:
    """The keys as PostgreSQL's ``unnest`` takes them, one array per key column (and ``_k``,
    the key's index), or None where an array cannot carry a column's values exactly as the
    TEMP table's column would take them.

    An array holds one type. psycopg types it after its Python values, and the statement
    casts it to the column's family (``_ARRAY_TYPES``): integers to a float or numeric
    array, floats to a numeric one, as the TEMP table's column converts them on insert.
    A float column takes integers as floats (the same rounding). Integers and floats
    mixed for a numeric column, and integers for a boolean one, keep the TEMP table."""
    arrays: dict[str, list[Any]] = {_array_param("_k"): list(range(len(keys)))}
    for j, family in enumerate(families):
        values = [key[j] for key in keys]
        kinds = {type(v) for v in values if v is not None}
        if not kinds <= _ARRAY_KINDS[family] or (len(kinds) > 1 and family != "float"):
            return None
        if family == "float":
            values = [float(v) if v is not None else None for v in values]
        arrays[_array_param(f"k{j}")] = values
    return arrays


def _array_param(column: str) -> str:
    """The bound parameter that carries key column ``column`` as an array."""
    return f"_pvm_{column}"


def _parse(wire: dict[str, Any] | None, clause: str) -> Expr | None:
    try:
        return from_wire(wire) if wire is not None else None
    except (WireError, TypeError, ValueError) as exc:
        raise InvalidRequest(f"malformed {clause} expression: {exc}") from exc


def _key_width(on: Expr | None) -> int:
    """Without keys there is no row to count columns in: take them from what ``on`` reads."""
    refs = [c.name for c in (columns(on) if on is not None else ()) if c.relation == KEY_RELATION]
    return 1 + max((int(m.group(1)) for n in refs if (m := re.fullmatch(r"k(\d+)", n))), default=-1)


# -- PostgreSQL and MariaDB: the same answers as contract.expr ---------------------------------
class _Binary(sa.sql.expression.ColumnElement[Any]):
    """A text column compared, grouped and selected under a binary collation.

    Its cache key is the column's and the collation, so a statement holding it has one too,
    and SQLAlchemy compiles each ``QueryShape``'s statement once per engine, not per call."""

    _traverse_internals = [  # noqa: RUF012 (SQLAlchemy reads it)
        ("column", InternalTraversal.dp_clauseelement),
        ("collation", InternalTraversal.dp_string),
    ]

    def __init__(self, column: Any, collation: str) -> None:
        self.column = column
        self.collation = collation
        self.type = sa.String()


@compiles(_Binary, "postgresql")
def _binary_postgresql(element: _Binary, compiler: Any, **kw: Any) -> str:
    return f'({compiler.process(element.column, **kw)} COLLATE "{element.collation}")'


@compiles(_Binary, "mysql")
@compiles(_Binary, "mariadb")
def _binary_mariadb(element: _Binary, compiler: Any, **kw: Any) -> str:
    # CONVERT first: COLLATE must name a collation of the column's own character set.
    return f"(CONVERT({compiler.process(element.column, **kw)} USING utf8mb4) COLLATE {element.collation})"


def _escape_backslashes(e: Expr | None) -> Expr | None:
    """LIKE patterns with each backslash escaped, so it matches itself as in contract.expr."""
    if isinstance(e, Like):
        return dataclasses.replace(e, pattern=e.pattern.replace("\\", "\\\\"))
    if isinstance(e, (And, Or)):
        return type(e)(tuple(_escape_backslashes(a) for a in e.args))  # type: ignore[misc]
    if isinstance(e, Not):
        return Not(_escape_backslashes(e.arg))  # type: ignore[arg-type]
    return e


_KEY_TYPES: dict[str, dict[Family, Any]] = {
    "postgresql": {
        "integer": sa.BigInteger(),
        "float": sa.Double(),
        "numeric": sa.Numeric(),
        "boolean": sa.Boolean(),
        "text": sa.Text(collation="C"),
        "date": sa.Date(),
    },
    "mysql": {
        "integer": sa.BigInteger(),
        "float": sa.Double(),
        "numeric": sa.Numeric(65, 30),
        "boolean": sa.Boolean(),
        "text": sa.Text(collation="utf8mb4_nopad_bin"),
        "date": sa.Date(),
    },
}
_KEY_TYPES["mariadb"] = _KEY_TYPES["mysql"]
_ARRAY_TYPES: dict[Family, Any] = {  # PostgreSQL's key arrays: its TEMP table's types, less the collation
    family: sa.Text() if family == "text" else key_type for family, key_type in _KEY_TYPES["postgresql"].items()
}
_ARRAY_KINDS: dict[Family, set[type]] = {  # the Python values an array of each family carries exactly
    "integer": {int},
    "float": {int, float},
    "numeric": {int, float},
    "boolean": {bool},
    "text": {str},
    "date": {str},
}
_ACCEPTS: dict[Family, tuple[type, ...]] = {
    "integer": (int,),
    "float": (int, float),
    "numeric": (int, float),
    "boolean": (bool, int),
    "text": (str,),
    "date": (str,),
}


def _key_family(j: int, subquery: Subquery, table: TableSchema, on: Expr | None) -> Family:
    """The type family of key column ``k<j>``: that of the relation column ``on`` compares
    it with, else of its values. InvalidRequest if a value does not fit that family."""
    family = _compared_family(on, f"k{j}", subquery.alias, table)
    values = [k[j] for k in subquery.keys if k[j] is not None]
    if family is None:
        kinds = {_value_family(v) for v in values}
        if kinds == {"integer", "float"}:
            family = "float"
        elif len(kinds) > 1:
            raise InvalidRequest(f"key column k{j} mixes values of types {sorted(kinds)}")
        else:
            family = kinds.pop() if kinds else "text"
    bad = [v for v in values if not isinstance(v, _ACCEPTS[family]) or (family == "integer" and isinstance(v, bool))]
    if bad:
        raise InvalidRequest(f"key column k{j} holds {bad[0]!r}, which cannot be compared with a {family} column")
    return family


def _value_family(value: Any) -> Family:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return "float" if isinstance(value, float) else "text"


def _compared_family(on: Expr | None, key: str, alias: str, table: TableSchema) -> Family | None:
    """The family of the first relation column compared with key column ``key`` in ``on``."""
    if on is None:
        return None
    if isinstance(on, Cmp):
        for mine, other in ((on.left, on.right), (on.right, on.left)):
            if mine == Col(KEY_RELATION, key) and isinstance(other, Col) and other.relation == alias:
                if other.name in table.columns:
                    return source_family(table.types[table.columns.index(other.name)])
        return None
    for child in on.args if isinstance(on, (And, Or)) else (on.arg,) if isinstance(on, Not) else ():
        found = _compared_family(child, key, alias, table)
        if found is not None:
            return found
    return None
