"""The captured tables of a source as the wrapper sees them: names, columns, types, keys.

Every identifier in a request is checked against this schema before any SQL is built, so a
name that reaches SQL is always one the source itself reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from wrappers.errors import InvalidRequest


@dataclass(frozen=True)
class TableSchema:
    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    primary_key: tuple[str, ...]

    def check_columns(self, names: Sequence[str]) -> None:
        """InvalidRequest naming every column of ``names`` the table does not have."""
        unknown = [n for n in names if n not in self.columns]
        if unknown:
            raise InvalidRequest(f"relation {self.name!r} has no column {', '.join(map(repr, unknown))}")

    def query_table(self) -> sa.TableClause:
        """An untyped table construct for queries: values come back exactly as stored, the
        same as the captured JSON (no date or decimal conversion by column type)."""
        return sa.table(self.name, *(sa.column(c) for c in self.columns))


@dataclass(frozen=True)
class SourceSchema:
    tables: dict[str, TableSchema]

    @classmethod
    def reflect(cls, engine: sa.Engine, tables: Sequence[str]) -> SourceSchema:
        inspector = sa.inspect(engine)
        out: dict[str, TableSchema] = {}
        for name in tables:
            cols = inspector.get_columns(name)
            pk = inspector.get_pk_constraint(name).get("constrained_columns") or []
            out[name] = TableSchema(
                name,
                tuple(c["name"] for c in cols),
                tuple(_type_name(c["type"]) for c in cols),
                tuple(pk),
            )
        return cls(out)

    def table(self, name: str) -> TableSchema:
        """The captured table ``name``; InvalidRequest if the wrapper does not capture it."""
        try:
            return self.tables[name]
        except KeyError:
            raise InvalidRequest(f"unknown relation {name!r} (captured: {', '.join(sorted(self.tables))})") from None


def _type_name(sql_type: sa.types.TypeEngine) -> str:
    """The declared SQL type; SQLite columns may have none (reported as an empty string)."""
    return "" if isinstance(sql_type, sa.types.NullType) else str(sql_type)
