"""Turning captured outbox rows into the changes the manager wants (the Interest).

Per relation, the manager says which columns its views read and which rows can matter (a
row matters if any view's local predicate holds for it). Filtering and projecting at the
source cuts what is shipped (Garg: projections and selections pushed to the sources). Before
the first Interest arrives, every captured table is shipped in full.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from contract.expr import Col, WireError, columns, compile_filter, from_wire
from contract.schemas import Change, Interest
from wrappers.capture.base import OutboxRow
from wrappers.errors import InvalidRequest
from wrappers.quarantine import Fitness
from wrappers.schema import SourceSchema, TableSchema


@dataclass(frozen=True)
class RelationFilter:
    """Which rows of one relation are shipped, and which of their columns."""

    table: TableSchema
    keep: Callable[[tuple[Any, ...]], bool]
    columns: tuple[str, ...]

    def apply(self, row: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The projected row if it is shipped, else None. Absent JSON members are NULL."""
        if row is None or not self.keep(tuple(row.get(c) for c in self.table.columns)):
            return None
        return {c: row.get(c) for c in self.columns}


class ChangeFilter:
    """The compiled form of an Interest (or of no Interest: everything, in full)."""

    def __init__(self, relations: dict[str, RelationFilter]) -> None:
        self._relations = relations

    @classmethod
    def build(cls, interest: Interest | None, schema: SourceSchema) -> ChangeFilter:
        """Compile ``interest``; InvalidRequest naming any relation or column the source lacks."""
        if interest is None:
            return cls({name: RelationFilter(t, lambda row: True, t.columns) for name, t in schema.tables.items()})
        relations: dict[str, RelationFilter] = {}
        for name, wanted in interest.relations.items():
            table = schema.table(name)
            table.check_columns(wanted.columns)
            layout = {Col(name, c): i for i, c in enumerate(table.columns)}
            tests = [_compile_predicate(p, table, layout) for p in wanted.where]
            relations[name] = RelationFilter(table, partial(_any_holds, tests), tuple(wanted.columns))
        return cls(relations)

    def changes(self, rows: Iterable[OutboxRow], fit: Fitness) -> list[Change]:
        """The signed changes of ``rows``: an UPDATE is -old, +new; an UPDATE whose shipped
        projection did not change is dropped (its two changes cancel out). A row the views
        cannot take (``fit``) is left out, and the quarantine counts it."""
        out: list[Change] = []
        for r in rows:
            f = self._relations.get(r.relation)
            if f is None:
                continue
            if r.unreadable is not None:
                fit.unreadable(r.relation, r.unreadable)
                continue
            old, new = f.apply(fit(r.relation, r.old)), f.apply(fit(r.relation, r.new))
            if old is not None and old == new:
                continue
            if old is not None:
                out.append(Change(relation=r.relation, sign=-1, row=old))
            if new is not None:
                out.append(Change(relation=r.relation, sign=1, row=new))
        return out


def _any_holds(tests: list[Callable[[tuple[Any, ...]], bool]], row: tuple[Any, ...]) -> bool:
    return any(t(row) for t in tests)


def _compile_predicate(
    wire: dict[str, Any] | None, table: TableSchema, layout: dict[Col, int]
) -> Callable[[tuple[Any, ...]], bool]:
    """One predicate of an Interest; its columns must be ``{"col": [<table>, <column>]}``."""
    if wire is None:
        return lambda row: True
    try:
        expr = from_wire(wire)
    except (WireError, TypeError, ValueError) as exc:
        raise InvalidRequest(f"malformed predicate for relation {table.name!r}: {exc}") from exc
    for col in columns(expr):
        if col.relation != table.name:
            raise InvalidRequest(f"predicate for relation {table.name!r} reads column {col.name!r} of {col.relation!r}")
    table.check_columns([c.name for c in columns(expr)])
    return compile_filter(expr, layout)
