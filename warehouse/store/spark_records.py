"""The Spark store's record of each view, and where the records are kept (``StoreCatalog``).

A view's record (``ViewMeta``) names its current base and z-log versions, its published
watermark and the orders compacted into its base: what a restart needs to find and serve
the view again.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from warehouse.store.base import Summed
from warehouse.store.file_access import store_files

__all__ = ["JsonStoreCatalog", "Ranges", "StoreCatalog", "ViewMeta", "in_ranges", "merge_ranges"]


# -- order sets --------------------------------------------------------------------------------
# Orders folded into a base are kept as closed intervals: the watermark makes them contiguous
# in practice, so the record stays a handful of numbers however long the view lives.

Ranges = list[tuple[int, int]]


def merge_ranges(ranges: Ranges, orders: set[int]) -> Ranges:
    merged: Ranges = []
    for lo, hi in sorted([*ranges, *((o, o) for o in orders)]):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def in_ranges(ranges: Sequence[tuple[int, int]], order: int) -> bool:
    i = bisect.bisect_right(ranges, (order, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= order <= ranges[i][1]


class StoreCatalog(Protocol):
    """Durable home of the per-view records (JSON-compatible dicts)."""

    def views(self) -> list[str]: ...

    def load(self, view: str) -> dict[str, Any] | None: ...

    def save(self, view: str, record: dict[str, Any]) -> None: ...

    def delete(self, view: str) -> None: ...


class JsonStoreCatalog:
    """All records in one JSON file, replaced atomically on every save."""

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        self._records: dict[str, dict[str, Any]] = json.loads(self._path.read_text()) if self._path.exists() else {}

    def views(self) -> list[str]:
        with self._lock:
            return list(self._records)

    def load(self, view: str) -> dict[str, Any] | None:
        with self._lock:
            record = self._records.get(view)
            return None if record is None else json.loads(json.dumps(record))

    def save(self, view: str, record: dict[str, Any]) -> None:
        with self._lock:
            self._records[view] = json.loads(json.dumps(record))
            self._write()

    def delete(self, view: str) -> None:
        with self._lock:
            if self._records.pop(view, None) is not None:
                self._write()

    def _write(self) -> None:
        store_files().make_dir(self._path.parent)
        tmp = store_files().create_file(self._path.with_suffix(".tmp"))
        with open(tmp, "w") as f:
            json.dump(self._records, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path)


@dataclass(frozen=True)
class ViewMeta:
    """One view's record: what a restart needs to find and serve the view again."""

    columns: tuple[str, ...]
    # Spark SQL type names; None (for the view or one column): JSON text in a STRING column
    types: tuple[str | None, ...] | None
    base_location: str
    base_version: int
    zlog_location: str
    zlog_version: int
    watermark: int = 0
    compacted_through: int = 0
    compacted_orders: tuple[tuple[int, int], ...] = ()
    summed: Summed | None = None  # an aggregate view's stored rows and how they are read

    def to_record(self) -> dict[str, Any]:
        return {
            "columns": list(self.columns),
            "types": None if self.types is None else list(self.types),
            "base_location": self.base_location,
            "base_version": self.base_version,
            "zlog_location": self.zlog_location,
            "zlog_version": self.zlog_version,
            "watermark": self.watermark,
            "compacted_through": self.compacted_through,
            "compacted_orders": [list(r) for r in self.compacted_orders],
            "summed": None if self.summed is None else self.summed.to_record(),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ViewMeta:
        types = record["types"]
        return cls(
            columns=tuple(record["columns"]),
            types=None if types is None else tuple(types),
            base_location=record["base_location"],
            base_version=int(record["base_version"]),
            zlog_location=record["zlog_location"],
            zlog_version=int(record["zlog_version"]),
            watermark=int(record["watermark"]),
            compacted_through=int(record["compacted_through"]),
            compacted_orders=tuple((int(lo), int(hi)) for lo, hi in record["compacted_orders"]),
            summed=Summed.from_record(record.get("summed")),
        )
