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
  ``RELEASE_CHUNK`` at a time (one logged from parts is named only, below). A seq more than
  ``window`` beyond the last released one is refused (ReceiveError, 422): what is held stays
  bounded, and a wrapper that numbers wrongly hears of it at once. ``status`` tells what a
  source holds and the seq it waits for.

* Parts: an update larger than one message (``MAX_CHANGES_PER_UPDATE`` changes) arrives as
  parts of one seq (``Update.part``), each alone in its batch, in order from part 0. Each is
  checked as it arrives and staged in the catalog (``Catalog.stage_part``), not held: in
  memory the receiver keeps, per source, the staged update's seq, txid, parts and changes
  counted, and the running digest of its content (``ContentDigest``). With its last part the
  update is logged as one seq, in one catalog transaction, its changes copied from the
  staged parts inside the database (``Catalog.log_staged``), and then acknowledged and
  released: no view ever sees a state between two of its rows, and no size is refused (the
  catalog's disk is the bound, as for the whole log). The log keeps the digest of the whole
  content, computed over the parts in order: the seq resent whole is compared as for any
  update. Staged parts outlive a restart: the
  receiver takes the update up where its parts stand (``recover``; the digest is read again
  from the staged parts when the next one arrives), and a wrapper that resends from part 0
  is served too. The wrapper's shipping position moves only on acknowledgment, and that only
  comes once the whole update is logged: nothing is lost, and a seq is logged once. Part 0
  always starts the update afresh, dropping what the source staged (a wrapper that restarted
  resends from it), and part 0 of a seq already received is acknowledged and ignored like a
  resent update. A part that does not continue what the source staged (out of order, of
  another seq, of a seq already complete, other than part 0) is refused (PartRefused, 409),
  its answer saying what the manager holds (``PartRefusal``: ``through``, and ``parts``, the
  parts of that update staged), so that a wrapper whose post failed without an answer goes
  on from there (the post may have been staged); a txid other than part 0's is refused
  (ReceiveError, 422). A
  part (or a whole update) larger than the catalog's database takes in one statement (a
  MariaDB catalog's ``max_allowed_packet``) is refused before it is sent (TooLarge, 413).
* Large updates by name: an update logged from parts is never read back whole here. It is
  released as a ``LogRef`` (its seq and log id): each view queues it in the update log only,
  as a queue past its budget is kept (``warehouse.spill``), and reads it from the log when
  maintenance gets to it.

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
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from contract.schemas import Ack, Update, UpdatePart
from contract.value_fit import Family, unfit_reason
from warehouse.catalog.db import (
    Catalog,
    CatalogCall,
    ContentDigest,
    LogEntry,
    LogRef,
    NewUpdate,
    SeqConflict,
    StagedPart,
    StagedUpdate,
    content_digest,
)
from warehouse.catalog.statement_size import StatementTooLarge

DEFAULT_SEQ_WINDOW = 100_000
RELEASE_CHUNK = 1_000  # held updates read back from the log at once
_RECEIVING = ThreadPoolExecutor(1, thread_name_prefix="pvm-receive")  # never the pool other work shares


@contextmanager
def _too_large(what: str) -> Iterator[None]:
    """StatementTooLarge from the catalog as TooLarge, naming ``what`` and the remedy."""
    try:
        yield
    except StatementTooLarge as exc:
        raise TooLarge(
            f"{what}: {exc}; nothing of it is stored. Ship smaller parts (pvm wrapper run --part-bytes; "
            "docs/capture.md) or raise the catalog's max_allowed_packet"
        ) from exc


def _on_receiving_thread(function: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    return asyncio.get_running_loop().run_in_executor(_RECEIVING, function, *args)


class ReceiveError(ValueError):
    """An update the manager cannot accept: unknown source, relation or column, a value that
    does not fit its column, a seq too far ahead, parts that do not make one update."""

    status = 422


class TooLarge(ReceiveError):
    """An update (or a part) larger than the catalog's database takes in one statement
    (MariaDB's ``max_allowed_packet``, ``warehouse.catalog.statement_size``): nothing of it is
    stored. The wrapper must send smaller parts (``--part-bytes``)."""

    status = 413


class PartRefused(ReceiveError):
    """A part that does not continue what the manager holds of its source: out of order, of
    another seq, or of a seq already complete. ``holding`` is what the manager holds, its
    ``parts`` counting the refused part's update's staged parts (0: none of them): the
    answer's body (``contract.schemas.PartRefusal``) tells the wrapper where to go on."""

    status = 409

    def __init__(self, message: str, holding: Ack) -> None:
        super().__init__(message)
        self.holding = holding


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
    part: UpdatePart | None = None


@dataclass
class Staging:
    """What the receiver keeps of the update whose parts are arriving; the parts themselves
    are staged in the catalog."""

    seq: int
    txid: str | None
    captured_at: float | None
    parts: int = 0
    changes: int = 0
    digest: ContentDigest | None = None  # of the parts so far; None: to read from the staged parts (a restart)


@dataclass
class SourceCursor:
    released_through: int = 0
    held: dict[int, int] = field(default_factory=dict)  # seq -> log id, above a gap
    releasing: asyncio.Lock = field(default_factory=asyncio.Lock)  # one release in seq order at a time
    staging: Staging | None = None  # the update whose parts are arriving
    assembling: asyncio.Lock = field(default_factory=asyncio.Lock)  # one part at a time

    def ack(self, parts: int | None = None) -> Ack:
        """The acknowledgment of what the source has released and holds (and ``parts``: of
        the update being staged, how many parts the manager has)."""
        return Ack(through=self.released_through, held=sorted(self.held), parts=parts)


@dataclass(frozen=True)
class SourceStatus:
    """What the receiver holds of a source: everything through ``released_through`` is
    released; ``held`` updates are stored but wait for ``waiting_for`` (the first missing seq)."""

    released_through: int
    held: int
    waiting_for: int | None
    held_through: int | None
    unfinished: tuple[int, int, int] | None = None  # (seq, parts, changes) of an update whose parts arrive


class Receiver:
    def __init__(
        self,
        db: CatalogCall,
        release: Callable[[LogEntry | LogRef], None],
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

    def recover(
        self,
        source: str,
        released_through: int = 0,
        held: Mapping[int, int] | None = None,
        staged: StagedUpdate | None = None,
    ) -> None:
        """Rebuild a source's cursor from the log (``Catalog.log_positions``): released
        through the end of its gapless prefix, the rest (seq -> log id) held; and the
        update whose parts it had staged (``Catalog.staged``), to go on from its next part."""
        cursor = self._cursors.setdefault(source, SourceCursor())
        cursor.released_through = released_through
        cursor.held = dict(held or {})
        cursor.staging = (
            None
            if staged is None
            else Staging(staged.seq, staged.txid, staged.captured_at, staged.parts, staged.changes)
        )

    def released_through(self, source: str) -> int:
        return self._cursors.get(source, SourceCursor()).released_through

    def status(self, source: str) -> SourceStatus:
        cursor = self._cursors.get(source, SourceCursor())
        held, parts = cursor.held, cursor.staging
        return SourceStatus(
            cursor.released_through,
            len(held),
            cursor.released_through + 1 if held else None,
            max(held, default=None),
            None if parts is None else (parts.seq, parts.parts, parts.changes),
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
        large body); the acknowledgment. A part of an update travels alone in its batch."""
        if any(u.part is not None for u in updates):
            if len(updates) != 1:
                raise ReceiveError(
                    f"source {source!r}: a batch carrying a part of an update carries nothing else "
                    f"(got {len(updates)} updates)"
                )
            return await self._receive_part(source, updates[0])
        schemas = self._schemas(source, updates)
        cursor = self._cursors.setdefault(source, SourceCursor())
        self._check_window(source, cursor, updates)
        prepared = await self._off_loop(self._prepare, source, updates, schemas)
        return await self._store(source, cursor, prepared)

    async def _store(self, source: str, cursor: SourceCursor, prepared: list[NewUpdate]) -> Ack:
        """Log ``prepared`` and release what follows the released updates without a gap."""
        stored: dict[int, LogEntry | LogRef] = {}
        if prepared:
            seqs = f"seq {prepared[0].seq}" + (f"-{prepared[-1].seq}" if len(prepared) > 1 else "")
            with _too_large(f"update {seqs} of source {source!r}"):
                stored = {e.seq: e for e in await self._db(Catalog.append_updates, source, prepared)}
        if cursor.staging is not None and cursor.staging.seq in stored:
            cursor.staging = None  # logged whole meanwhile: the catalog dropped its staged parts
        return await self._settle(cursor, stored)

    async def _settle(self, cursor: SourceCursor, stored: dict[int, LogEntry | LogRef]) -> Ack:
        """Release what follows the released updates without a gap, ``stored`` (just logged)
        included, hold the rest of ``stored``; the acknowledgment."""
        async with cursor.releasing:
            await self._release_ready(cursor, stored)
            cursor.held.update((seq, e.id) for seq, e in stored.items() if seq > cursor.released_through)
        return cursor.ack()

    async def _receive_part(self, source: str, update: Update | PlainUpdate) -> Ack:
        """Stage one part of the update it belongs to; with its last part, log the whole
        update as one seq and release it (see the module's docstring)."""
        part = update.part
        assert part is not None
        schemas = self._schemas(source, [update])
        cursor = self._cursors.setdefault(source, SourceCursor())
        async with cursor.assembling:
            seq, named = update.seq, f"part {part.index} of update seq {update.seq} of source {source!r}"
            if seq <= cursor.released_through or seq in cursor.held:
                if part.index == 0:  # a resend from the start: acknowledged again and ignored
                    if cursor.staging is not None and cursor.staging.seq == seq:
                        await self._db(Catalog.drop_staged, source)
                        cursor.staging = None
                    return cursor.ack()
                raise PartRefused(
                    f"{named}: seq {seq} is complete already; resend an update from its part 0", cursor.ack(parts=0)
                )
            self._check_window(source, cursor, [update])
            if part.index == 0:  # part 0 starts the update afresh
                staging = Staging(seq, update.txid, update.captured_at, digest=ContentDigest())
            else:
                staging = self._continued(named, update, part.index, cursor)
            digest = staging.digest if staging.digest is not None else await self._staged_digest(source, staging)
            digest = digest.copy()  # the staging's own moves on only once the part is staged
            changes = await self._off_loop(self._prepare_part, source, update, schemas[seq], digest)
            staged = StagedPart(seq, part.index, changes, staging.txid, staging.captured_at)
            if part.last:
                try:
                    with _too_large(named):
                        ref = await self._db(Catalog.log_staged, source, staged, digest.hexdigest())
                except SeqConflict:
                    cursor.staging = None  # the catalog dropped its staged parts
                    raise
                cursor.staging = None
                return await self._settle(cursor, {} if ref is None else {seq: ref})
            with _too_large(named):
                taken = await self._db(Catalog.stage_part, source, staged)
            if not taken:
                cursor.staging = None  # logged whole meanwhile; the catalog dropped its staged parts
                raise PartRefused(
                    f"{named}: seq {seq} is complete already; resend an update from its part 0", cursor.ack(parts=0)
                )
            staging.parts, staging.changes, staging.digest = part.index + 1, staging.changes + len(changes), digest
            cursor.staging = staging
            return cursor.ack(parts=staging.parts)

    @staticmethod
    def _continued(named: str, update: Update | PlainUpdate, index: int, cursor: SourceCursor) -> Staging:
        """The staging that part ``index`` (not 0) of ``update`` continues; refused, saying
        what the source staged, if it does not continue that."""
        staging = cursor.staging
        if staging is None or staging.seq != update.seq:
            holding = "no part of it" if staging is None else f"parts of seq {staging.seq} instead"
            raise PartRefused(
                f"{named} is out of order: the manager holds {holding}; send part 0 first", cursor.ack(parts=0)
            )
        if staging.parts != index:
            raise PartRefused(
                f"{named} is out of order: the manager holds parts 0-{staging.parts - 1}, the next is part {staging.parts}",
                cursor.ack(parts=staging.parts),
            )
        if staging.txid != update.txid:
            raise ReceiveError(
                f"{named} carries txid {update.txid!r}, its part 0 carried {staging.txid!r}: "
                "the parts of one update carry one txid"
            )
        return staging

    async def _staged_digest(self, source: str, staging: Staging) -> ContentDigest:
        """The digest of the parts ``staging`` names, read from the catalog a part at a time:
        the receiver's after a restart."""
        digest = ContentDigest()
        for index in range(staging.parts):
            await self._off_loop(digest.add, await self._db(Catalog.staged_part, source, staging.seq, index))
        return digest

    def _prepare_part(
        self,
        source: str,
        update: Update | PlainUpdate,
        relations: Mapping[str, RelationShape],
        digest: ContentDigest,
    ) -> list[dict[str, Any]]:
        """One part's changes checked against ``relations``, as plain data, added to
        ``digest``. Blocking."""
        plain = (
            update
            if isinstance(update, PlainUpdate)
            else PlainUpdate(update.seq, [c.model_dump() for c in update.changes], update.txid, update.captured_at)
        )
        self._validate(source, plain, relations)
        digest.add(plain.changes)
        return plain.changes

    async def _release_ready(self, cursor: SourceCursor, stored: dict[int, LogEntry | LogRef]) -> None:
        """Release, in seq order, the updates that follow the released ones without a gap: those
        just ``stored`` as they are, held ones read back from the log (by name, if logged from
        parts); the event loop gets its turn after each."""
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

    async def _read_held(self, cursor: SourceCursor, first: int) -> list[LogEntry | LogRef]:
        """The held updates from seq ``first`` on without a gap, at most ``RELEASE_CHUNK``."""
        ids: list[int] = []  # log ids
        while first + len(ids) in cursor.held and len(ids) < RELEASE_CHUNK:
            ids.append(cursor.held[first + len(ids)])
        entries = await self._db(Catalog.log_releases, ids)
        return [e for i, e in enumerate(entries) if e.seq == first + i]  # in seq order, never past a gap
