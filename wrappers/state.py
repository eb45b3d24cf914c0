"""The wrapper's durable state, in its own SQLite file (never inside the source).

It holds what must survive a restart for invariants 1 and 2 (docs/design.md):

* ``last_seq``: the last seq assigned; seqs are assigned here, once, gap-free;
* ``pending``: assigned updates not yet acknowledged, resent with the same seq and the same
  changes after a restart. Their changes are in ``parts`` (the JSON text of a list of
  changes per row, ``wrappers.parts``): capture writes an update's parts as it reads them,
  before the update is recorded, and shipping reads them back one at a time, so that no
  update is ever held whole in memory. Parts written under a seq above ``last_seq`` belong
  to a capture that did not finish (it failed, or the wrapper stopped): they are dropped;
* ``captured_through``: the highest outbox id turned into an update (or filtered away), so
  nothing is captured twice; each pending update remembers the outbox ids it covers,
  ``(outbox_after, outbox_through]``, which stay in the source until it is acknowledged.
  Log capture keeps log positions there instead: the log is handled through
  ``captured_through``, and the server releases it only up to an acknowledged position;
* ``captured``: where outbox ids are not in commit order (PostgreSQL, MariaDB), the id of
  every captured outbox row still in the source, with the seq of its update (0: filtered
  away); a row is forgotten only once it is deleted from the outbox;
* ``acked_through`` and the current Interest.

Every change is one SQLite transaction with ``synchronous = FULL``: a seq is durable before
the update is sent. An exclusive file lock keeps a second wrapper off the same state.

The state directory is 0700 and the source's files in it 0600 (``contract.file_modes``):
pending updates are rows of the source. Files of an earlier run open to others are tightened.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from pathlib import Path

from pydantic import Field, TypeAdapter

from contract.file_modes import PRIVATE
from contract.schemas import Change, Interest, Update
from wrappers.errors import WrapperError
from wrappers.parts import PartCutter, PartLimits, UpdateHead


class StoredUpdate(Update):
    """A pending update as earlier versions kept it, whole in its ``pending`` row (of any size:
    no bound on its changes); converted into parts when the state is opened."""

    changes: list[Change] = Field()


_CHANGES = TypeAdapter(list[Change])


SOURCE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
"""Source names become file names and appear in every UpdateBatch."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pending (
    seq INTEGER PRIMARY KEY,
    payload TEXT NOT NULL,
    outbox_after INTEGER NOT NULL,
    outbox_through INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS captured (outbox_id INTEGER PRIMARY KEY, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS parts (
    seq INTEGER NOT NULL,
    part INTEGER NOT NULL,
    changes TEXT NOT NULL,
    PRIMARY KEY (seq, part)
);
"""
# ``pending.payload``: the update's head as JSON ({"txid", "captured_at", "parts", "changes",
# "bytes"}); earlier versions kept the whole update there, its changes an array.


class WrapperState:
    """Durable wrapper state; methods are thread-safe and each one is one transaction."""

    def __init__(self, directory: Path, source: str, limits: PartLimits | None = None) -> None:
        if not SOURCE_NAME.fullmatch(source):
            raise WrapperError(f"invalid source name {source!r}: use letters, digits, '_', '-' and '.'")
        PRIVATE.make_dir(directory)
        PRIVATE.secure(*directory.glob(f"{glob.escape(source)}.*"))  # left by an earlier version
        self.path = PRIVATE.create_file(directory / f"{source}.state.sqlite3")
        self._lock_file = open(PRIVATE.create_file(directory / f"{source}.lock"), "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise WrapperError(f"another wrapper of source {source!r} is using {directory}") from None
        self._mutex = threading.Lock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.executescript(_SCHEMA)
            meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
            if meta.get("source", source) != source:
                raise WrapperError(f"{self.path} holds the state of source {meta['source']!r}, not {source!r}")
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('source', ?)", (source,))
        except BaseException:
            self.close()
            raise
        self.last_seq = int(meta.get("last_seq", 0))
        self.acked_through = int(meta.get("acked_through", 0))
        self.captured_through = int(meta.get("captured_through", 0))
        self.interest = Interest.model_validate_json(meta["interest"]) if "interest" in meta else None
        self._captured = {i for (i,) in self._db.execute("SELECT outbox_id FROM captured")}
        try:
            self.drop_unrecorded()
            self._cut_whole_updates(limits or PartLimits())
        except BaseException:
            self.close()
            raise

    # -- writes -------------------------------------------------------------------------
    def write_part(self, seq: int, index: int, changes: bytes) -> None:
        """Part ``index`` of the update that will be ``seq`` once recorded (``record``):
        ``changes``, the JSON text of a list of changes. Parts are written before their
        update is recorded, each in a transaction of its own, while the caller holds the
        wrapper's capture lock (nothing else assigns a seq meanwhile)."""
        assert seq == self.last_seq + 1, f"part of seq {seq}, the next is {self.last_seq + 1}"
        with self._mutex:
            # Not synced: until its update is recorded a part may be lost (it would be dropped),
            # and the record's commit syncs the log that holds the parts written before it.
            self._db.execute("PRAGMA synchronous = NORMAL")
            try:
                with self._transaction():
                    self._db.execute("INSERT INTO parts VALUES (?, ?, ?)", (seq, index, changes.decode()))
            finally:
                self._db.execute("PRAGMA synchronous = FULL")

    def drop_unrecorded(self) -> None:
        """Drop parts of a capture that was not recorded: written under a seq above ``last_seq``."""
        with self._mutex, self._transaction():
            self._db.execute("DELETE FROM parts WHERE seq > ?", (self.last_seq,))

    def record(self, update: UpdateHead | None, outbox_through: int, outbox_ids: Sequence[int] = ()) -> int | None:
        """Mark outbox rows up to ``outbox_through`` captured (and remember ``outbox_ids``,
        given where ids are not in commit order); if ``update`` is given (its parts written
        under seq ``last_seq + 1``), make it the next update. Returns its seq (None when
        everything was filtered away). Log capture records log positions the same way: an
        update with the position after its last transaction, a position alone without one."""
        with self._mutex, self._transaction():
            seq = None
            if update is not None:
                seq = self.last_seq + 1
                assert update.seq == seq, f"update of seq {update.seq}, the next is {seq}"
                self._db.execute(
                    "INSERT INTO pending VALUES (?, ?, ?, ?)",
                    (seq, _head_json(update), self.captured_through, outbox_through),
                )
                self._set("last_seq", seq)
            self._db.executemany("INSERT INTO captured VALUES (?, ?)", ((i, seq or 0) for i in outbox_ids))
            outbox_through = max(self.captured_through, outbox_through)
            self._set("captured_through", outbox_through)
            if seq is not None:
                self.last_seq = seq
            self.captured_through = outbox_through
            self._captured.update(outbox_ids)
        return seq

    def forget(self, outbox_ids: Sequence[int]) -> None:
        """The outbox rows ``outbox_ids`` are deleted from the source: stop remembering them."""
        with self._mutex, self._transaction():
            self._db.executemany("DELETE FROM captured WHERE outbox_id = ?", [(i,) for i in outbox_ids])
            self._captured.difference_update(outbox_ids)

    def ack(self, through: int) -> None:
        """The manager holds every update with seq <= ``through``: forget them. Never
        backwards: the answers to two posts in flight side by side may arrive in any order."""
        with self._mutex:
            if through <= self.acked_through:
                return
            with self._transaction():
                self._db.execute("DELETE FROM pending WHERE seq <= ?", (through,))
                self._db.execute("DELETE FROM parts WHERE seq <= ?", (through,))
                self._set("acked_through", through)
                self.acked_through = through

    def set_interest(self, interest: Interest) -> None:
        with self._mutex, self._transaction():
            self._set("interest", interest.model_dump_json())
            self.interest = interest

    # -- reads --------------------------------------------------------------------------
    def pending(self, limit: int, after: int = 0) -> list[UpdateHead]:
        """The oldest ``limit`` unacknowledged updates with seq above ``after``, in seq order,
        without their changes."""
        with self._mutex:
            rows = self._db.execute(
                "SELECT seq, payload FROM pending WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)
            ).fetchall()
        return [_head(seq, payload) for seq, payload in rows]

    def part(self, seq: int, index: int) -> list[Change]:
        """The changes of part ``index`` of pending update ``seq``."""
        with self._mutex:
            row = self._db.execute("SELECT changes FROM parts WHERE seq = ? AND part = ?", (seq, index)).fetchone()
        if row is None:
            raise WrapperError(f"{self.path}: part {index} of pending update seq {seq} is missing")
        return _CHANGES.validate_json(row[0])

    @property
    def has_pending(self) -> bool:
        """Whether some update is not acknowledged yet (``pending`` would return one),
        known without a query: seqs are consecutive and acknowledged in order."""
        return self.last_seq > self.acked_through

    def pending_count(self) -> int:
        """How many updates are not acknowledged (seqs are consecutive, acknowledged in order)."""
        return self.last_seq - self.acked_through

    @property
    def captured_ids(self) -> AbstractSet[int]:
        """The remembered outbox rows, already part of an update (or filtered away), as a
        live read-only set: read it where nothing records or forgets meanwhile (the
        wrapper's capture lock)."""
        return self._captured

    def deletable_ids(self, limit: int) -> list[int]:
        """Up to ``limit`` remembered outbox rows that are acknowledged or filtered away: safe
        to delete."""
        with self._mutex:
            rows = self._db.execute(
                "SELECT outbox_id FROM captured WHERE seq <= ? ORDER BY outbox_id LIMIT ?", (self.acked_through, limit)
            )
            return [i for (i,) in rows]

    def deletable_through(self) -> int:
        """Outbox rows with id <= this are acknowledged or filtered away: safe to delete."""
        with self._mutex:  # one consistent view of pending and captured_through
            oldest = self._db.execute("SELECT min(outbox_after) FROM pending").fetchone()[0]
            return self.captured_through if oldest is None else int(oldest)

    def close(self) -> None:
        """Close the state once no write is under way: a task cancelled while its write runs on
        a thread (``Wrapper.stop``) leaves the write running, and closing SQLite under it crashes."""
        with self._mutex:
            self._db.close()
        self._lock_file.close()

    # -- helpers --------------------------------------------------------------------------
    def _cut_whole_updates(self, limits: PartLimits) -> None:
        """Pending updates an earlier version kept whole, as parts within ``limits``: one
        update at a time (each held whole once, as that version held it), each in a
        transaction of its own."""
        with self._mutex:
            seqs = [
                seq
                for (seq,) in self._db.execute(
                    "SELECT seq FROM pending WHERE json_type(payload, '$.changes') = 'array' ORDER BY seq"
                )
            ]
        for seq in seqs:
            with self._mutex, self._transaction():
                (payload,) = self._db.execute("SELECT payload FROM pending WHERE seq = ?", (seq,)).fetchone()
                update = StoredUpdate.model_validate_json(payload)
                cutter = PartCutter(limits)
                parts = cutter.add(update.changes)
                if (last := cutter.cut()) is not None:
                    parts.append(last)
                self._db.execute("DELETE FROM parts WHERE seq = ?", (seq,))
                self._db.executemany(
                    "INSERT INTO parts VALUES (?, ?, ?)", [(seq, i, p.text.decode()) for i, p in enumerate(parts)]
                )
                size = sum(len(p.text) for p in parts)
                head = UpdateHead(seq, update.txid, update.captured_at, len(parts), len(update.changes), size)
                self._db.execute("UPDATE pending SET payload = ? WHERE seq = ?", (_head_json(head), seq))

    def _set(self, key: str, value: object) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, str(value)))

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")


def _head_json(update: UpdateHead) -> str:
    return json.dumps(
        {
            "txid": update.txid,
            "captured_at": update.captured_at,
            "parts": update.parts,
            "changes": update.changes,
            "bytes": update.bytes,
        }
    )


def _head(seq: int, payload: str) -> UpdateHead:
    head = json.loads(payload)
    return UpdateHead(seq, head["txid"], head["captured_at"], head["parts"], head["changes"], head["bytes"])


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/pvm/wrappers`` (``~/.local/state/pvm/wrappers`` by default)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "pvm" / "wrappers"
