"""An in-process view store: a list of effects per view. For tests and quick runs."""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence

from contract.zset import ZSet
from warehouse.store.base import Effect, Engine, StoreError, Summed, ViewRecord


class MemoryStore:
    """Effects kept in this process's memory, never compacted: every ``as_of`` stays
    readable, and only this process reads the views (engine ``"python"``)."""

    def __init__(self) -> None:
        self._effects: dict[str, dict[int, ZSet]] = {}
        self._parts: dict[str, dict[int, dict[str, ZSet]]] = {}  # by view, then order: a unit's parts
        self._columns: dict[str, tuple[str, ...]] = {}
        self._published: dict[str, int] = {}
        self._lock = threading.Lock()
        self.commit_log: list[tuple[int, ...]] = []  # the orders of each write, in write order

    @property
    def engine(self) -> Engine:
        return "python"

    def check_new_view(self, view: str, columns: Sequence[str], types: Sequence[str | None] | None = None) -> None:
        """Any name and columns do, but other columns for a view that exists (as ``create``)."""
        with self._lock:
            self._check_columns(view, columns)

    def _check_columns(self, view: str, columns: Sequence[str]) -> None:
        if view in self._columns and self._columns[view] != tuple(columns):
            raise StoreError(f"view {view!r} exists with other columns")

    def create(
        self,
        view: str,
        columns: Sequence[str],
        types: Sequence[str | None] | None = None,
        summed: Summed | None = None,
    ) -> None:
        """``types`` (Spark SQL type names) and ``summed`` are accepted for the interface's
        sake and ignored: rows are kept as the Python values they were committed with, and
        ``read`` returns the stored rows (the manager reads an aggregate view through
        ``aggregate.visible``)."""
        with self._lock:
            self._check_columns(view, columns)
            self._columns[view] = tuple(columns)
            self._effects.setdefault(view, {})

    def drop(self, view: str) -> None:
        with self._lock:
            self._columns.pop(view, None)
            self._effects.pop(view, None)
            self._parts.pop(view, None)
            self._published.pop(view, None)

    def _view(self, view: str) -> dict[int, ZSet]:
        try:
            return self._effects[view]
        except KeyError:
            raise StoreError(f"unknown view {view!r}") from None

    def commit(self, view: str, effects: Sequence[Effect]) -> None:
        with self._lock:
            stored = self._view(view)
            for e in effects:
                stored.setdefault(e.order, e.delta.copy())
            self.commit_log.append(tuple(e.order for e in effects))

    def commit_part(self, view: str, order: int, part: str, delta: ZSet) -> None:
        with self._lock:
            self._view(view)
            self._parts.setdefault(view, {}).setdefault(order, {})[part] = delta.copy()

    def keep_parts(self, view: str, order: int, parts: Collection[str]) -> set[str]:
        with self._lock:
            self._view(view)
            stored = self._parts.get(view, {}).get(order, {})
            for name in set(stored) - set(parts):
                del stored[name]
            return set(stored)

    def publish(self, view: str, watermark: int) -> None:
        with self._lock:
            self._view(view)
            self._published[view] = watermark

    def published(self, view: str) -> int:
        return self._published.get(view, 0)

    def read(self, view: str, as_of: int | None = None) -> ZSet:
        with self._lock:
            out = ZSet()
            for order, delta in self._view(view).items():
                if as_of is None or order <= as_of:
                    out.add_all(delta)
            for order, parts in self._parts.get(view, {}).items():
                if as_of is None or order <= as_of:
                    for delta in parts.values():
                        out.add_all(delta)
            return out

    def committed_orders(self, view: str) -> set[int]:
        with self._lock:
            return set(self._view(view))

    def check_as_of(self, view: str, as_of: int | None) -> None:
        """Nothing is compacted: every ``as_of`` of a view that exists can be read."""
        with self._lock:
            self._view(view)

    def record(self, view: str) -> ViewRecord:
        raise StoreError(f"view {view!r} lives in this process's memory: it has no files another process could read")

    def health(self) -> str | None:
        """Always alive: it lives in this process."""
        return None

    def close(self) -> None:
        pass
