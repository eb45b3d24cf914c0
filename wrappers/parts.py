"""How much of an update the wrapper holds in memory: a part at a time.

One seq is one update however large (a source transaction of millions of rows, a backlog
read at once). The wrapper never holds such an update whole: capture turns the rows it
reads into changes a few at a time and writes them to its state in *parts* of at most
``PartLimits.changes`` changes and about ``PartLimits.bytes`` bytes of JSON
(``wrappers.update_assembly``), and shipping reads back and posts one part at a time
(``wrappers.shipper``). ``HeldChanges`` counts the changes held meanwhile, which health
shows, so that the bound can be checked from outside.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from contract.schemas import MAX_CHANGES_PER_UPDATE, Change

DEFAULT_PART_CHANGES = MAX_CHANGES_PER_UPDATE
"""Changes per part, and per post of whole updates (``pvm wrapper run --part-changes``)."""

DEFAULT_PART_BYTES = 8 << 20
"""Bytes of JSON per part, and per post of whole updates (``--part-bytes``, 8 MiB): within a
MariaDB catalog's ``max_allowed_packet`` (16 MiB by default) once the manager has stored the
part's changes as JSON and the driver has escaped its quotes, for ASCII text."""

MAX_PART_BYTES = 32 << 20
"""The most ``--part-bytes`` may be: a post of that much JSON, with its envelope, stays under
the manager's 64 MiB limit on an update body."""


@dataclass(frozen=True)
class PartLimits:
    """The most one part (and one post of whole updates) carries: ``changes`` changes, and
    ``bytes`` bytes of the changes as JSON. A single change larger than ``bytes`` is a part
    of its own."""

    changes: int = DEFAULT_PART_CHANGES
    bytes: int = DEFAULT_PART_BYTES

    def __post_init__(self) -> None:
        if not 2 <= self.changes <= MAX_CHANGES_PER_UPDATE:
            raise ValueError(f"part changes: between 2 and {MAX_CHANGES_PER_UPDATE:,}, not {self.changes}")
        if not 1 <= self.bytes <= MAX_PART_BYTES:
            raise ValueError(f"part bytes: between 1 and {MAX_PART_BYTES:,}, not {self.bytes}")

    @property
    def rows_per_update(self) -> int:
        """Captured rows (each at most two changes: an UPDATE's old and new row) up to which
        consecutive transactions are merged into one update: merged, they stay one part."""
        return self.changes // 2


@dataclass(frozen=True)
class UpdateHead:
    """A pending update without its changes: what it is, and how it is stored (``parts``
    parts holding ``changes`` changes, ``bytes`` bytes of JSON in all)."""

    seq: int
    txid: str | None
    captured_at: float | None
    parts: int
    changes: int
    bytes: int


class HeldChanges:
    """How many changes of updates the wrapper holds in memory (being captured into parts,
    being shipped), and the most it held at once. Thread-safe: capture runs on threads.

    >>> held = HeldChanges()
    >>> held.hold(30); held.hold(10); held.release(30); held.hold(5)
    >>> held.now, held.peak
    (15, 40)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def hold(self, n: int) -> None:
        with self._lock:
            self.now += n
            self.peak = max(self.peak, self.now)

    def release(self, n: int) -> None:
        with self._lock:
            self.now -= n


_to_json = Change.__pydantic_serializer__.to_json


@dataclass(frozen=True)
class Part:
    """A part as stored and shipped: the JSON text of a list of ``changes`` changes."""

    text: bytes
    changes: int


class PartCutter:
    """Cuts a run of changes into parts within ``limits`` (a single change beyond
    ``limits.bytes`` makes a part alone): ``add`` returns the parts it filled, ``cut`` the
    changes buffered since. What it buffers (``buffered`` changes) is at most one part, as
    JSON text.

    >>> cutter = PartCutter(PartLimits(changes=2))
    >>> [p.changes for p in cutter.add([Change(relation="r", sign=1, row={"k": k}) for k in range(3)])]
    [2]
    >>> cutter.buffered, cutter.cut()
    (1, Part(text=b'[{"relation":"r","sign":1,"row":{"k":2}}]', changes=1))
    """

    def __init__(self, limits: PartLimits) -> None:
        self.limits = limits
        self._texts: list[bytes] = []
        self._bytes = 0

    @property
    def buffered(self) -> int:
        return len(self._texts)

    def add(self, changes: list[Change]) -> list[Part]:
        full: list[Part] = []
        for change in changes:
            text = _to_json(change)
            if self._texts and (
                len(self._texts) == self.limits.changes or self._bytes + len(text) + 2 > self.limits.bytes
            ):  # the part's text: "[", each change and a "," or "]"
                full.append(self._cut())
            self._texts.append(text)
            self._bytes += len(text) + 1
        return full

    def cut(self) -> Part | None:
        """The buffered changes as a part of their own (None: none buffered)."""
        return self._cut() if self._texts else None

    def _cut(self) -> Part:
        part = Part(b"[" + b",".join(self._texts) + b"]", len(self._texts))
        self._texts, self._bytes = [], 0
        return part
