"""The receiver: accepts source updates, durably and exactly once, in each source's order.

* Idempotent on ``(source, seq)``: a resent update is acknowledged again and ignored; one
  resent with other content than the logged one is refused (SeqConflict, 409), since a seq
  names one update for good.
* Durable before acknowledged: the update is in the catalog's update log first.
* Values that fit: a value that does not fit its column's declared type
  (``contract.value_fit``, the rule a wrapper applies before shipping) refuses the whole
  batch (ReceiveError, 422) before anything of it is logged, since the view's store would
  fail on it and the update, once logged, would fail it again after every ``resume``.
* Gap-holding: an update that arrives before a smaller seq of its source is stored but not
  released; it is released (in seq order) when the gap is filled, never skipped. Only its
  seq and log id stay in memory; its changes are read back from the log when it is released,
  ``RELEASE_CHUNK`` at a time. A seq more than ``window`` beyond the last released one is
  refused (ReceiveError, 422): what is held stays bounded, and a wrapper that numbers wrongly
  hears of it at once. ``status`` tells what a source holds and the seq it waits for.

Released updates go to ``release``, which hands them to every view that reads the source
(the paper's AssignTimeStamp appending to the UMQ). The acknowledgment names the highest
seq through which everything is released; the wrapper keeps resending from there.

Checking a batch against the source's relations, turning it into plain data and digesting
it is CPU work proportional to its size (a batch may be tens of megabytes): it runs on a
thread of its own (``run_off_loop``), as Python code between short C calls, so the event loop
keeps its turns; releasing yields to the loop between updates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from contract.schemas import Ack, Update
from contract.value_fit import Family, unfit_reason
from warehouse.catalog.db import Catalog, CatalogCall, LogEntry, NewUpdate, SeqConflict, content_digest

DEFAULT_SEQ_WINDOW = 100_000
RELEASE_CHUNK = 1_000  # held updates read back from the log at once
_RECEIVING = ThreadPoolExecutor(1, thread_name_prefix="pvm-receive")  # never the pool other work shares


def _on_receiving_thread(function: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    return asyncio.get_running_loop().run_in_executor(_RECEIVING, function, *args)


class ReceiveError(ValueError):
    """An update the manager cannot accept: unknown source, relation or column, a value that
    does not fit its column, a seq too far ahead."""


@dataclass(frozen=True)
class RelationShape:
    """What a relation's rows must match: its columns, those a view needs, and ``(column,
    family, declared type)`` of each column whose view type constrains its values."""

    columns: frozenset[str]
    needed: set[str]
    typed: tuple[tuple[str, Family, str], ...] = ()


@dataclass(frozen=True)
class PlainUpdate:
    """An update as plain data (``Update.model_dump()``'s form): what ``api.ingest`` makes of
    a large body without building a model per change."""

    seq: int
    changes: list[dict[str, Any]]
    txid: str | None = None
    captured_at: float | None = None


@dataclass
class SourceCursor:
    released_through: int = 0
    held: dict[int, int] = field(default_factory=dict)  # seq -> log id, above a gap
    releasing: asyncio.Lock = field(default_factory=asyncio.Lock)  # one release in seq order at a time


@dataclass(frozen=True)
class SourceStatus:
    """What the receiver holds of a source: everything through ``released_through`` is
    released; ``held`` updates are stored but wait for ``waiting_for`` (the first missing seq)."""

    released_through: int
    held: int
    waiting_for: int | None
    held_through: int | None


class Receiver:
    def __init__(
        self,
        db: CatalogCall,
        release: Callable[[LogEntry], None],
        relations: Callable[[str, int], Mapping[str, RelationShape] | None],
        window: int = DEFAULT_SEQ_WINDOW,
        run_off_loop: Callable[..., Awaitable[Any]] | None = None,
    ) -> None:
        self._db = db
        self._release = release
        # (source, seq) -> {relation: its shape, with the columns a view needs from that seq on};
        # None: unknown source
        self._relations = relations
        self.window = window
        self._off_loop = run_off_loop or _on_receiving_thread
        self._cursors: dict[str, SourceCursor] = {}

    def recover(self, source: str, stored: list[LogEntry]) -> list[LogEntry]:
        """Rebuild a source's cursor from the log; returns the entries already released."""
        cursor = self._cursors.setdefault(source, SourceCursor())
        released = []
        for entry in sorted(stored, key=lambda e: e.seq):
            if entry.seq == cursor.released_through + 1:
                cursor.released_through = entry.seq
                released.append(entry)
            else:
                cursor.held[entry.seq] = entry.id
        return released

    def released_through(self, source: str) -> int:
        return self._cursors.get(source, SourceCursor()).released_through

    def status(self, source: str) -> SourceStatus:
        cursor = self._cursors.get(source, SourceCursor())
        held = cursor.held
        return SourceStatus(
            cursor.released_through, len(held), cursor.released_through + 1 if held else None, max(held, default=None)
        )

    def forget(self, source: str) -> None:
        self._cursors.pop(source, None)

    def _schemas(self, source: str, updates: Sequence[Update | PlainUpdate]) -> dict[int, Mapping[str, RelationShape]]:
        """What each update's rows must match, per relation. Read on the event loop, where
        views come and go."""
        if self._relations(source, 0) is None:
            raise ReceiveError(f"unknown source {source!r}")
        schemas: dict[int, Mapping[str, RelationShape]] = {}
        for u in updates:
            relations = self._relations(source, u.seq)
            assert relations is not None  # None only for an unknown source, excluded above
            schemas[u.seq] = relations
        return schemas

    @staticmethod
    def _validate(source: str, update: PlainUpdate, relations: Mapping[str, RelationShape]) -> None:
        for change in update.changes:
            shape = relations.get(change["relation"])
            if shape is None:
                raise ReceiveError(
                    f"update seq {update.seq} of source {source!r}: unknown relation {change['relation']!r}"
                )
            row = change["row"]
            unknown = row.keys() - shape.columns
            if unknown:
                raise ReceiveError(
                    f"update seq {update.seq} of source {source!r}: relation {change['relation']!r} "
                    f"has no column(s) {', '.join(sorted(unknown))}"
                )
            missing = shape.needed - row.keys()
            if missing:
                raise ReceiveError(
                    f"update seq {update.seq} of source {source!r}: a row of {change['relation']!r} "
                    f"lacks column(s) {', '.join(sorted(missing))} that a view needs"
                )
            for column, family, declared in shape.typed:
                if (why := unfit_reason(family, declared, row.get(column))) is not None:
                    raise ReceiveError(
                        f"update seq {update.seq} of source {source!r}: relation {change['relation']!r}, "
                        f"column {column!r}: {why}, which a view cannot store (a wrapper leaves such rows out "
                        "of its updates: docs/capture.md)"
                    )

    def _check_window(self, source: str, cursor: SourceCursor, updates: Sequence[Update | PlainUpdate]) -> None:
        limit = cursor.released_through + self.window
        beyond = [u.seq for u in updates if u.seq > limit]
        if beyond:
            raise ReceiveError(
                f"update seq {min(beyond)} of source {source!r} is too far ahead: everything through seq "
                f"{cursor.released_through} is received, and seqs up to {limit} are accepted ahead of a gap "
                f"(window {self.window}); the source is waiting for seq {cursor.released_through + 1}"
            )

    def _prepare(
        self, source: str, updates: Sequence[Update | PlainUpdate], schemas: Mapping[int, Mapping]
    ) -> list[NewUpdate]:
        """The updates checked against ``schemas`` and as plain data with their digests, one
        per seq. Blocking: CPU in proportion to the batch."""
        prepared: dict[int, NewUpdate] = {}
        for u in updates:
            plain = (
                u
                if isinstance(u, PlainUpdate)
                else PlainUpdate(u.seq, [c.model_dump() for c in u.changes], u.txid, u.captured_at)
            )
            self._validate(source, plain, schemas[u.seq])
            new = NewUpdate(u.seq, plain.changes, u.txid, u.captured_at, content_digest(plain.changes))
            if prepared.setdefault(u.seq, new).digest != new.digest:
                raise SeqConflict(f"source {source!r}: seq {u.seq} appears twice in the batch with different content")
        return list(prepared.values())

    async def receive(self, source: str, updates: Sequence[Update | PlainUpdate]) -> Ack:
        """Store and release ``updates`` of ``source`` (wire models, or the plain data of a
        large body); the acknowledgment."""
        schemas = self._schemas(source, updates)
        cursor = self._cursors.setdefault(source, SourceCursor())
        self._check_window(source, cursor, updates)
        prepared = await self._off_loop(self._prepare, source, updates, schemas)
        stored = {e.seq: e for e in await self._db(Catalog.append_updates, source, prepared)} if prepared else {}
        async with cursor.releasing:
            await self._release_ready(cursor, stored)
            cursor.held.update((seq, e.id) for seq, e in stored.items() if seq > cursor.released_through)
        return Ack(through=cursor.released_through, held=sorted(cursor.held))

    async def _release_ready(self, cursor: SourceCursor, stored: dict[int, LogEntry]) -> None:
        """Release, in seq order, the updates that follow the released ones without a gap: those
        just ``stored`` as they are, held ones read back from the log; the event loop gets its
        turn after each."""
        while True:
            following = cursor.released_through + 1
            if following in stored:
                entries = [stored.pop(following)]
            elif following in cursor.held:
                entries = await self._read_held(cursor, following)
            else:
                return
            for entry in entries:
                cursor.held.pop(entry.seq, None)
                cursor.released_through = entry.seq
                self._release(entry)
                await asyncio.sleep(0)

    async def _read_held(self, cursor: SourceCursor, first: int) -> list[LogEntry]:
        """The held updates from seq ``first`` on without a gap, at most ``RELEASE_CHUNK``."""
        ids: list[int] = []  # log ids
        while first + len(ids) in cursor.held and len(ids) < RELEASE_CHUNK:
            ids.append(cursor.held[first + len(ids)])
        entries = await self._db(Catalog.log_entries, None, 0, ids)
        return [e for i, e in enumerate(entries) if e.seq == first + i]  # in seq order, never past a gap
