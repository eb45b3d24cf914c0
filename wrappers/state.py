"""The wrapper's durable state, in its own SQLite file (never inside the source).

It holds what must survive a restart for invariants 1 and 2 (docs/design.md):

* ``last_seq``: the last seq assigned; seqs are assigned here, once, gap-free;
* ``pending``: assigned updates not yet acknowledged, with their exact payload, resent with
  the same seq after a restart;
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
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from pathlib import Path

from pydantic import Field

from contract.file_modes import PRIVATE
from contract.schemas import Change, Interest, Update
from wrappers.errors import WrapperError


class StoredUpdate(Update):
    """A pending update as the state keeps it: one source transaction (or several) of any
    size, one seq; the shipper sends one larger than a message in parts (``wrappers.shipper``)."""

    changes: list[Change] = Field()


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
"""


class WrapperState:
    """Durable wrapper state; methods are thread-safe and each one is one transaction."""

    def __init__(self, directory: Path, source: str) -> None:
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

    # -- writes -------------------------------------------------------------------------
    def record(
        self, changes: list[Change], outbox_through: int, outbox_ids: Sequence[int] = (), txid: str | None = None
    ) -> int | None:
        """Mark outbox rows up to ``outbox_through`` captured (and remember ``outbox_ids``,
        given where ids are not in commit order); if ``changes`` is not empty, make them the
        next update, of source transaction ``txid`` if it is one. Returns its seq (None when
        everything was filtered away)."""
        with self._mutex, self._transaction():
            seq = None
            if changes:
                seq = self.last_seq + 1
                update = StoredUpdate(seq=seq, changes=changes, txid=txid, captured_at=time.time())
                self._db.execute(
                    "INSERT INTO pending VALUES (?, ?, ?, ?)",
                    (seq, update.model_dump_json(), self.captured_through, outbox_through),
                )
                self._set("last_seq", seq)
            self._db.executemany("INSERT INTO captured VALUES (?, ?)", [(i, seq or 0) for i in outbox_ids])
            outbox_through = max(self.captured_through, outbox_through)
            self._set("captured_through", outbox_through)
            if seq is not None:
                self.last_seq = seq
            self.captured_through = outbox_through
            self._captured.update(outbox_ids)
        return seq

    def record_log(self, updates: Sequence[tuple[list[Change], int, str | None]], through: int) -> list[int]:
        """Log capture: make each ``(changes, position, txid)`` with changes the next update
        (``position``: where the log is handled through once it is captured), and mark the
        log handled through ``through``; all in one transaction, so that the updates and the
        position move together. Returns the seqs assigned."""
        seqs: list[int] = []
        with self._mutex, self._transaction():
            last_seq, captured = self.last_seq, self.captured_through
            for changes, position, txid in updates:
                if changes:
                    last_seq += 1
                    update = StoredUpdate(seq=last_seq, changes=changes, txid=txid, captured_at=time.time())
                    self._db.execute(
                        "INSERT INTO pending VALUES (?, ?, ?, ?)",
                        (last_seq, update.model_dump_json(), captured, position),
                    )
                    seqs.append(last_seq)
                captured = max(captured, position)
            captured = max(captured, through)
            self._set("last_seq", last_seq)
            self._set("captured_through", captured)
            self.last_seq, self.captured_through = last_seq, captured
        return seqs

    def forget(self, outbox_ids: Sequence[int]) -> None:
        """The outbox rows ``outbox_ids`` are deleted from the source: stop remembering them."""
        with self._mutex, self._transaction():
            self._db.executemany("DELETE FROM captured WHERE outbox_id = ?", [(i,) for i in outbox_ids])
            self._captured.difference_update(outbox_ids)

    def ack(self, through: int) -> None:
        """The manager holds every update with seq <= ``through``: forget them."""
        with self._mutex, self._transaction():
            self._db.execute("DELETE FROM pending WHERE seq <= ?", (through,))
            self._set("acked_through", through)
            self.acked_through = through

    def set_interest(self, interest: Interest) -> None:
        with self._mutex, self._transaction():
            self._set("interest", interest.model_dump_json())
            self.interest = interest

    # -- reads --------------------------------------------------------------------------
    def pending(self, limit: int) -> list[Update]:
        """The oldest ``limit`` unacknowledged updates, in seq order."""
        with self._mutex:
            rows = self._db.execute("SELECT payload FROM pending ORDER BY seq LIMIT ?", (limit,)).fetchall()
        return [StoredUpdate.model_validate_json(payload) for (payload,) in rows]

    @property
    def has_pending(self) -> bool:
        """Whether some update is not acknowledged yet (``pending`` would return one),
        known without a query: seqs are consecutive and acknowledged in order."""
        return self.last_seq > self.acked_through

    def pending_count(self) -> int:
        with self._mutex:
            return int(self._db.execute("SELECT count(*) FROM pending").fetchone()[0])

    @property
    def captured_ids(self) -> AbstractSet[int]:
        """The remembered outbox rows, already part of an update (or filtered away), as a
        live read-only set: read it where nothing records or forgets meanwhile (the
        wrapper's capture lock)."""
        return self._captured

    def deletable_ids(self) -> list[int]:
        """Remembered outbox rows that are acknowledged or filtered away: safe to delete."""
        with self._mutex:
            rows = self._db.execute(
                "SELECT outbox_id FROM captured WHERE seq <= ? ORDER BY outbox_id", (self.acked_through,)
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


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/pvm/wrappers`` (``~/.local/state/pvm/wrappers`` by default)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "pvm" / "wrappers"
