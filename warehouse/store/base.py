"""The view store interface: append signed effects, read sums of weights.

A view's contents are the sum of its committed effects (Z-sets). Each effect carries the
order number of the maintenance unit that produced it; effects may be committed in any
order (they commute) and a read ``as_of=W`` sums the effects with order <= W. Committing an
order that is already stored is a no-op, so a commit repeated after a crash is harmless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from contract.zset import ZSet

# Names of the Spark store's own tables (``warehouse/store/spark_names.py``). They live
# here, free of pyspark, so that the analysts' API can refuse them without importing Spark.
ZLOG_PREFIX = "pvm_zlog_"
BASE_PREFIX = "pvm_base_"
VERSIONS_DB = "pvm_store"  # one table per kind and version of each view's files


class StoreError(Exception):
    """A request the store cannot serve (unknown view, an as_of already compacted, …)."""


@dataclass(frozen=True)
class Effect:
    order: int
    delta: ZSet


class ViewStore(Protocol):
    def create(self, view: str, columns: Sequence[str], types: Sequence[str | None] | None = None) -> None:
        """Create an empty view (idempotent for the same columns). ``types``: a Spark SQL type
        name per column where known (None: untyped); stores without typed columns ignore it."""

    def drop(self, view: str) -> None: ...

    def commit(self, view: str, effects: Sequence[Effect]) -> None:
        """Append a group of effects in one write; orders already stored are skipped."""

    def publish(self, view: str, watermark: int) -> None:
        """Readers' default state is now ``as_of=watermark``."""

    def published(self, view: str) -> int:
        """The watermark last published (0 before the first)."""

    def read(self, view: str, as_of: int | None = None) -> ZSet:
        """Summed signed weights of effects with order <= as_of (None: every effect)."""

    def committed_orders(self, view: str) -> set[int]:
        """Orders present in the store (for recovery after a crash)."""

    def health(self) -> str | None:
        """None when the store answers; else what is wrong, for a person. Cheap (no job),
        but it may block on a store that hangs: call it off the event loop, with a timeout
        (``warehouse.health.StoreProbe``)."""

    def close(self) -> None: ...
