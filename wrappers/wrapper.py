"""The wrapper of one source: capture, ship, answer subqueries, keep the Interest.

One asyncio lock serializes everything that assigns seqs or fixes a watermark: the polling
loop, a subquery's handshake and an Interest change. That is what makes invariant 3 hold
(DESIGN.md): when a subquery takes its snapshot under the lock, every change captured
earlier is visible in it, and every change visible in it is captured and acknowledged
before the lock is released, so the answer covers exactly seqs 1..watermark.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import sqlalchemy as sa

from api.schemas import MAX_CHANGES_PER_UPDATE, MAX_UPDATES_PER_POST, Interest, InterestAck, Subquery, SubqueryAnswer
from wrappers import query
from wrappers.capture import dialect_for
from wrappers.capture.base import OutboxRow
from wrappers.errors import WrapperError
from wrappers.interest import ChangeFilter
from wrappers.schema import SourceSchema
from wrappers.shipper import Shipper
from wrappers.snapshot import Snapshot
from wrappers.state import WrapperState, default_state_dir

log = logging.getLogger(__name__)

# An outbox row yields at most two changes (an UPDATE), so this many rows fit one Update.
_ROWS_PER_UPDATE = MAX_CHANGES_PER_UPDATE // 2


@dataclass(frozen=True)
class WrapperConfig:
    """Everything a wrapper needs to run; see ``pvm wrapper run --help``."""

    source: str
    url: str
    tables: tuple[str, ...]
    manager_url: str
    token: str | None = None
    state_dir: Path = field(default_factory=default_state_dir)
    poll_interval: float = 0.05
    query_delay_ms: float = 0.0
    max_concurrent_queries: int = 1
    updates_per_post: int = MAX_UPDATES_PER_POST


class Wrapper:
    """A running wrapper. Construct it (installs capture, opens state), then ``start()``."""

    def __init__(self, config: WrapperConfig) -> None:
        if config.max_concurrent_queries < 1:
            raise WrapperError("max_concurrent_queries must be at least 1")
        if config.poll_interval <= 0:
            raise WrapperError("poll_interval must be positive")
        self.config = config
        self._dialect = dialect_for(config.url)
        self.engine = self._dialect.open_engine(config.url)
        self.state = WrapperState(config.state_dir, config.source)  # first: it locks out a twin
        try:
            self._dialect.install(self.engine, config.tables)
            self.schema = SourceSchema.reflect(self.engine, config.tables)
            high_water = self._dialect.outbox_high_water(self.engine)
            if high_water < self.state.captured_through:
                raise WrapperError(
                    f"the outbox of {config.url} was re-created (ids restart below {self.state.captured_through}); "
                    f"the state in {self.state.path} belongs to its previous life"
                )
            self._filter = ChangeFilter.build(self.state.interest, self.schema)
        except BaseException:
            self.state.close()
            self.engine.dispose()
            raise
        self._lock = asyncio.Lock()
        self._queries = asyncio.Semaphore(config.max_concurrent_queries)
        self._shipped_through = self.state.acked_through
        self._deleted_through = 0
        self._client: httpx.AsyncClient | None = None
        self._shipper: Shipper | None = None
        self._poller: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Start shipping: pending updates from an earlier run go first, with their seqs."""
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0))
        self._shipper = Shipper(self.config.source, self.config.manager_url, self._client, self.config.token)
        self._poller = asyncio.create_task(self._poll_forever(), name=f"pvm-wrapper-{self.config.source}")

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            try:
                await self._poller
            except asyncio.CancelledError:
                pass
        if self._client is not None:
            await self._client.aclose()
        self.state.close()
        self.engine.dispose()

    # -- SendUpdates -------------------------------------------------------------------------
    async def poll_once(self) -> None:
        """Capture what committed since the last poll, ship everything pending, then delete
        acknowledged changes from the outbox."""
        async with self._lock:
            await asyncio.to_thread(self._capture_now)
            await self._ship_pending()
        await asyncio.to_thread(self._delete_acknowledged)

    async def _poll_forever(self) -> None:
        failing = False
        while True:
            try:
                await self.poll_once()
                if failing:
                    log.info("polling %s works again", self.config.source)
                    failing = False
            except Exception:
                # Keep running (the source may be locked or briefly unavailable); log a streak once.
                if not failing:
                    log.exception("polling %s failed; retrying every %.2f s", self.config.source, self.config.poll_interval)
                    failing = True
            await asyncio.sleep(self.config.poll_interval)

    def _capture_now(self) -> None:
        conn = self._dialect.begin_snapshot(self.engine)
        try:
            self._capture(conn)
        finally:
            conn.close()

    def _capture(self, conn: sa.Connection) -> None:
        """Turn the uncaptured outbox rows visible to ``conn`` into the next update (caller
        holds the lock). One read sees whole transactions only, merged into one update."""
        rows = self._dialect.read_outbox(conn, self.state.captured_through)
        for chunk in _chunks(rows, self.config.source):
            seq = self.state.record(self._filter.changes(chunk), chunk[-1].id)
            if seq is not None:
                log.debug("captured update %d of %s (%d outbox rows)", seq, self.config.source, len(chunk))

    async def _ship_pending(self) -> None:
        """Send every pending update and wait until all are acknowledged (caller holds the lock)."""
        assert self._shipper is not None, "start() the wrapper first"
        while batch := await asyncio.to_thread(self.state.pending, self.config.updates_per_post):
            through = await self._shipper.send(batch, self.state.last_seq)
            self._shipped_through = max(self._shipped_through, batch[-1].seq)
            await asyncio.to_thread(self.state.ack, through)

    def _delete_acknowledged(self) -> None:
        """Invariant 1: outbox rows go only once their update is acknowledged (or was empty)."""
        through = self.state.deletable_through()
        if through > self._deleted_through:
            self._dialect.delete_outbox(self.engine, through)
            self._deleted_through = through

    # -- ProcessQuery --------------------------------------------------------------------------
    async def answer(self, subquery: Subquery) -> SubqueryAnswer:
        """Join ``subquery.keys`` with a source relation in a snapshot whose watermark is exact."""
        started = time.perf_counter()
        prepared = query.prepare(subquery, self.schema)
        async with self._lock:
            snapshot = await Snapshot.open(self._dialect, self.engine)
            try:
                await snapshot.run(self._capture)
                await self._ship_pending()
            except BaseException:
                snapshot.close()
                raise
            watermark = self.state.last_seq
        try:
            async with self._queries:
                if self.config.query_delay_ms:
                    await asyncio.sleep(self.config.query_delay_ms / 1000)
                rows = await snapshot.run(lambda conn: query.evaluate(conn, prepared))
        finally:
            snapshot.close()
        return SubqueryAnswer(watermark=watermark, rows=rows, elapsed_ms=(time.perf_counter() - started) * 1000)

    # -- Interest -------------------------------------------------------------------------------
    async def set_interest(self, interest: Interest) -> InterestAck:
        """Switch to ``interest``: updates with seq <= boundary used the old one, later ones the new."""
        new_filter = ChangeFilter.build(interest, self.schema)
        async with self._lock:
            await asyncio.to_thread(self._capture_now)
            await self._ship_pending()
            await asyncio.to_thread(self.state.set_interest, interest)
            self._filter = new_filter
            return InterestAck(boundary=self.state.last_seq)

    # -- reports ----------------------------------------------------------------------------------
    def health(self) -> dict[str, object]:
        return {
            "ok": self._poller is not None and not self._poller.done(),
            "source": self.config.source,
            "last_seq": self.state.last_seq,
            "shipped_through": self._shipped_through,
            "acked_through": self.state.acked_through,
            "pending": self.state.pending_count(),
        }


def _chunks(rows: list[OutboxRow], source: str) -> Iterator[list[OutboxRow]]:
    """``rows`` as one chunk, unless they exceed what one Update may carry.

    That only happens after a long outage; splitting then may cut a source transaction in
    two, so the manager can briefly see a state between two of its rows. It is logged.
    """
    if len(rows) <= _ROWS_PER_UPDATE:
        if rows:
            yield rows
        return
    log.warning("%s: %d captured rows exceed one update; shipping them as several", source, len(rows))
    for i in range(0, len(rows), _ROWS_PER_UPDATE):
        yield rows[i : i + _ROWS_PER_UPDATE]
