"""The receiver: accepts source updates, durably and exactly once, in each source's order.

* Idempotent on ``(source, seq)``: a resent update is acknowledged again and ignored.
* Durable before acknowledged: the update is in the catalog's update log first.
* Gap-holding: an update that arrives before a smaller seq of its source is stored but not
  released; it is released (in seq order) when the gap is filled, never skipped.

Released updates go to ``release``, which hands them to every view that reads the source
(the paper's AssignTimeStamp appending to the UMQ). The acknowledgment names the highest
seq through which everything is released; the wrapper keeps resending from there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from api.schemas import Ack, Update
from warehouse.catalog.db import LogEntry


class ReceiveError(ValueError):
    """An update the manager cannot accept: unknown source, relation or column."""


@dataclass
class SourceCursor:
    released_through: int = 0
    held: dict[int, LogEntry] = field(default_factory=dict)


class Receiver:
    def __init__(
        self,
        db: Callable[..., Awaitable],
        release: Callable[[LogEntry], None],
        relations: Callable[[str, int], Mapping[str, tuple[Sequence[str], set[str]]] | None],
    ) -> None:
        self._db = db
        self._release = release
        # (source, seq) -> {relation: (its columns, the columns a view needs from that seq on)};
        # None: unknown source
        self._relations = relations
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
                cursor.held[entry.seq] = entry
        return released

    def released_through(self, source: str) -> int:
        return self._cursors.get(source, SourceCursor()).released_through

    def forget(self, source: str) -> None:
        self._cursors.pop(source, None)

    def validate(self, source: str, updates: Sequence[Update]) -> None:
        if self._relations(source, 0) is None:
            raise ReceiveError(f"unknown source {source!r}")
        for update in updates:
            relations = self._relations(source, update.seq)
            for change in update.changes:
                known = relations.get(change.relation)
                if known is None:
                    raise ReceiveError(
                        f"update seq {update.seq} of source {source!r}: unknown relation {change.relation!r}"
                    )
                columns, needed = known
                unknown = set(change.row) - set(columns)
                if unknown:
                    raise ReceiveError(
                        f"update seq {update.seq} of source {source!r}: relation {change.relation!r} "
                        f"has no column(s) {', '.join(sorted(unknown))}"
                    )
                missing = needed - set(change.row)
                if missing:
                    raise ReceiveError(
                        f"update seq {update.seq} of source {source!r}: a row of {change.relation!r} "
                        f"lacks column(s) {', '.join(sorted(missing))} that a view needs"
                    )

    async def receive(self, source: str, updates: Sequence[Update]) -> Ack:
        self.validate(source, updates)
        cursor = self._cursors.setdefault(source, SourceCursor())
        fresh = [
            (u.seq, [c.model_dump() for c in u.changes], u.txid, u.captured_at)
            for u in updates
            if u.seq > cursor.released_through and u.seq not in cursor.held
        ]
        if fresh:
            for entry in await self._db("append_updates", source, fresh):
                cursor.held.setdefault(entry.seq, entry)
        while cursor.released_through + 1 in cursor.held:
            entry = cursor.held.pop(cursor.released_through + 1)
            cursor.released_through = entry.seq
            self._release(entry)
        return Ack(through=cursor.released_through, held=sorted(cursor.held))
