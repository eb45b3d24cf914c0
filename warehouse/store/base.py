"""The view store interface: append signed effects, read sums of weights.

A view's contents are the sum of its committed effects (Z-sets). Each effect carries the
order number of the maintenance unit that produced it; effects may be committed in any
order (they commute) and a read ``as_of=W`` sums the effects with order <= W. Committing an
order that is already stored is a no-op, so a commit repeated after a crash is harmless.

A store may also take a unit's effect in parts before the unit is committed
(``PartStore``, ``warehouse.unit_parts``): they are summed under the unit's order like an
effect, so a read as of a W below the order does not see them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from contract.zset import ZSet

# Names of the Spark store's own tables (``warehouse/store/spark_names.py``). They live
# here, free of pyspark, so that the analysts' API can refuse them without importing Spark.
ZLOG_PREFIX = "pvm_zlog_"
BASE_PREFIX = "pvm_base_"
VERSIONS_DB = "pvm_store"  # one table per kind and version of each view's files
CONSISTENT_DB = "pvm_consistent"  # every view at one consistent cut (``warehouse/store/published.py``)
CONSISTENT_PREFIX = "__pvm"  # the consistent database's own objects: no view is named so
SUMS = "pvm_sums"  # the relation a ``Summed.select`` reads: an aggregate view's sums per key


class StoreError(Exception):
    """A request the store cannot serve (unknown view, an as_of already compacted, …)."""


@dataclass(frozen=True)
class Effect:
    order: int
    delta: ZSet


@dataclass(frozen=True)
class Summed:
    """How readers see a view whose stored rows are not a bag of its rows: an aggregate or
    DISTINCT view (``warehouse/aggregate.py``). The first ``keys`` stored columns are a key
    and the others numbers: a stored row of weight w adds w times its numbers to its key's
    sums. ``select``, Spark SQL over the relation ``pvm_sums`` (the stored columns summed
    per key as of W), gives the view's ``columns`` of ``types``. Only the stores that read
    views with Spark use it; the others return the stored rows, which the manager reads
    through ``aggregate.visible``."""

    keys: int
    select: str
    columns: tuple[str, ...]
    types: tuple[str | None, ...] | None

    def to_record(self) -> dict[str, Any]:
        return {
            "keys": self.keys,
            "select": self.select,
            "columns": list(self.columns),
            "types": None if self.types is None else list(self.types),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> Summed | None:
        if record is None:
            return None
        types = record["types"]
        return cls(
            int(record["keys"]), record["select"], tuple(record["columns"]), None if types is None else tuple(types)
        )


Engine = Literal["spark", "python"]
"""Where the views of a store are read: ``"spark"``, from files another process (the
analysts' query process) reads with Spark, named by the store's ``record``; ``"python"``,
in this process only, with ``read``."""


class ViewRecord(Protocol):
    """What a store of engine ``"spark"`` records of one view: enough for another process to
    read the view's files as of any order above ``compacted_through``."""

    @property
    def compacted_through(self) -> int:
        """Orders at or below it are folded into the base: readable only as one state."""

    def to_record(self) -> dict[str, Any]:
        """The record as JSON-able data (what the analysts' query process is sent)."""


class ViewStore(Protocol):
    @property
    def engine(self) -> Engine:
        """Where the views are read (``Engine``): the manager sends readers of a ``"spark"``
        store's views to the analysts' query process, and reads a ``"python"`` store's
        itself."""

    def check_new_view(self, view: str, columns: Sequence[str], types: Sequence[str | None] | None = None) -> None:
        """Raise StoreError naming the problem if ``create`` would refuse these arguments;
        changes nothing. The manager asks before it records a new view anywhere."""

    def create(
        self,
        view: str,
        columns: Sequence[str],
        types: Sequence[str | None] | None = None,
        summed: Summed | None = None,
    ) -> None:
        """Create an empty view (idempotent for the same columns). ``types``: a Spark SQL type
        name per column where known (None: untyped); stores without typed columns ignore it.
        ``summed``: how the stored rows of an aggregate view are read (None: a bag)."""

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

    def check_as_of(self, view: str, as_of: int | None) -> None:
        """StoreError unless the view's state as of ``as_of`` (None: every effect) can
        still be read."""

    def record(self, view: str) -> ViewRecord:
        """The view's current record, naming the files its state is read from; StoreError
        for an unknown view, or from a store of engine ``"python"`` (it has no files)."""

    def health(self) -> str | None:
        """None when the store answers; else what is wrong, for a person. Cheap (no job),
        but it may block on a store that hangs: call it off the event loop, with a timeout
        (``warehouse.health.StoreProbe``)."""

    def close(self) -> None: ...


@runtime_checkable
class PartStore(Protocol):
    """A store that takes a unit's effect in parts (``warehouse.unit_parts``). A part is
    stored under the unit's order number, and read as of W like any effect of that order;
    the order is not committed by it (``committed_orders`` leaves it out). A unit run whole
    after parts of it were stored drops them first (``keep_parts`` with none named), so
    nothing is counted twice."""

    def commit_part(self, view: str, order: int, part: str, delta: ZSet) -> None:
        """Store ``delta`` as part ``part`` of ``order``, in one write that readers see whole
        or not at all; a part stored already is replaced (a part is the same every time)."""

    def keep_parts(self, view: str, order: int, parts: Collection[str]) -> set[str]:
        """Drop the stored parts of ``order`` not named in ``parts``; return those named
        that are stored."""
