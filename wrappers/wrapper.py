"""The wrapper of one source: capture, ship, answer subqueries, keep the Interest.

The capture lock serializes everything that assigns seqs: a poll's capture, a pull's
capture, a subquery's snapshot and capture, an Interest change, and the deletion of
acknowledged outbox rows. The ship lock makes the ship loop and the subqueries ship one at
a time; no capture is made under it, and the two are never held together. That is what
makes invariant 3 hold (docs/design.md): a subquery opens its snapshot and captures under
the capture lock, so every change captured earlier is visible in it, every change visible
in it gets a seq <= its watermark, and every seq assigned later is above it; it then ships,
under the ship lock, until all of them are acknowledged, and no further: not at all when
other shipping already had them acknowledged, looked at again once it holds the lock (the
shipping it waited for usually had). So one subquery's read can run while another subquery
or a poll ships, and one post serves every subquery that waited for it. A subquery whose
updates come after the post under way does not wait for that post before sending its own:
it posts them beside it, once (``_overtake``), and the manager holds them above the gap
until the first fills it; only then does the ship lock's turn come. An Interest change
takes only the capture lock: it needs seqs, not acknowledgments, so it never waits for a
manager that is not taking updates (one that is still starting, say).

Where outbox ids are not in commit order (PostgreSQL, MariaDB), deleting acknowledged rows
and forgetting their ids also happens under the capture lock: a snapshot taken before the
delete committed still shows those rows, and must still find their ids remembered.
Log capture (``capture.log``) reads transactions from the database's log instead of an
outbox; its reads run in the same snapshots and also under the capture lock, a subquery's
read checks that its snapshot sees exactly a prefix of the log (``capture.log``), and the
log is confirmed to the server only through acknowledged updates.
Timestamp, application and snapshot capture feed a replica, which the wrapper then reads as
it reads any trigger-captured SQLite source (``wrappers.capture``).

No update is held whole, however large: capture writes it to the state a part at a time as
it reads the outbox (``wrappers.update_assembly``), and shipping reads it back and posts it a
part at a time (``wrappers.shipper``); ``held`` in health counts what each holds.

Two loops run. The ship loop captures (log capture: as soon as a transaction arrives from
the log, ``capture.log_stream``, and otherwise less often while the log holds nothing new
for the captured tables, ``capture.log.PollPacing``), ships everything pending, one batch
at a time under the ship lock (retrying for as long as the manager is down) and deletes
acknowledged changes (after releasing the ship lock, so that subqueries ship meanwhile). The pull
loop polls a timestamp or snapshot source into the replica (``capture.pull``) and, when
the pull applied anything, captures the replica's new changes under the capture lock alone, so pulling and seq
assignment go on while shipping waits for a manager that is down: the pending updates
grow, durably, and ship once it is back. The pull itself assigns no seq: it is one
replica transaction, which the next capture (under the capture lock) turns into an
update like any committed source transaction.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import closing
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import sqlalchemy as sa

from contract.relation_snapshot import RelationSnapshot
from contract.schemas import (
    MAX_UPDATES_PER_POST,
    Change,
    Interest,
    InterestAck,
    Subquery,
    SubqueryAnswer,
    Update,
)
from wrappers import query, relation_stream
from wrappers.capture import Capture, CaptureConfig, open_capture
from wrappers.capture.common import reason
from wrappers.capture.log import PollPacing, SnapshotRace
from wrappers.errors import InvalidRequest, WrapperError, masked_url
from wrappers.interest import ChangeFilter
from wrappers.parts import HeldChanges, PartLimits, UpdateHead
from wrappers.priority import PriorityLimiter
from wrappers.quarantine import DEFAULT_MAX_VALUE_BYTES, Fitness
from wrappers.replica import RowChange
from wrappers.shared_handshake import SharedHandshakes
from wrappers.shipper import ShipError, Shipper
from wrappers.snapshot import Snapshot
from wrappers.standing_snapshot import STANDING_SECONDS, Lease, StandingSnapshots
from wrappers.state import WrapperState, default_state_dir
from wrappers.update_assembly import Assembly, ChangesOf

log = logging.getLogger(__name__)

BLOCKED_AFTER_ATTEMPTS = 3
"""Failed steps in a row after which health reports a loop as blocked (one may be a lock)."""

DELETE_IDS = 10_000
"""Acknowledged outbox rows deleted per source transaction, where ids are not in commit order."""

SNAPSHOT_RACE_SECONDS = 10.0
"""Log capture: how long a subquery takes new snapshots while each races a commit (then 503)."""

POSITION_EVERY_SECONDS = 1.0
"""Log capture: how often a read that captured nothing records how far the log is handled."""


@dataclass(frozen=True)
class WrapperConfig:
    """Everything a wrapper needs to run; see ``pvm wrapper run --help``."""

    source: str
    url: str | None  # None for snapshot capture of dump files
    tables: tuple[str, ...]
    manager_url: str
    token: str | None = None
    state_dir: Path = field(default_factory=default_state_dir)
    poll_interval: float = 0.05
    query_delay_ms: float = 0.0
    max_concurrent_queries: int = 1
    updates_per_post: int = MAX_UPDATES_PER_POST
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    update_encoding: str = "auto"  # wrappers.shipper.UPDATE_ENCODINGS
    part_limits: PartLimits = field(default_factory=PartLimits)
    standing_seconds: float = STANDING_SECONDS  # wrappers.standing_snapshot (0: none stands)


class Wrapper:
    """A running wrapper. Construct it (installs capture, opens state), then ``start()``."""

    def __init__(self, config: WrapperConfig) -> None:
        if config.max_concurrent_queries < 1:
            raise WrapperError("max_concurrent_queries must be at least 1")
        if config.poll_interval <= 0:
            raise WrapperError("poll_interval must be positive")
        if config.max_value_bytes < 1:
            raise WrapperError("max_value_bytes must be at least 1")
        self.config = config
        self.state = WrapperState(config.state_dir, config.source, config.part_limits)  # first: it locks out a twin
        capture: Capture | None = None
        try:
            replica_path = config.state_dir / f"{config.source}.replica.sqlite3"
            capture = open_capture(config.capture, config.url, config.tables, replica_path)
            self.capture = capture
            self._dialect, self.engine, self.schema = capture.dialect, capture.engine, capture.schema
            self._ordered = self._dialect.OUTBOX_IDS_IN_COMMIT_ORDER
            self._log = capture.log
            if self._log is not None:
                self._log.check_position(self.state.captured_through)
            elif self._dialect.outbox_high_water(self.engine) < self.state.captured_through:
                raise WrapperError(
                    f"the outbox of {masked_url(str(config.url))} was re-created (ids restart below {self.state.captured_through}); "
                    f"the state in {self.state.path} belongs to its previous life"
                )
            self._filter = ChangeFilter.build(self.state.interest, self.schema)
            self._fit = Fitness(config.source, self.schema, self.engine.dialect.name, config.max_value_bytes)
        except BaseException:
            self.state.close()
            if capture is not None:
                capture.close()
            raise
        self._lock = asyncio.Lock()  # shipping
        self._capture_lock = asyncio.Lock()  # seq assignment
        self._queries = PriorityLimiter(config.max_concurrent_queries)  # q, oldest unit first
        standing_seconds = config.standing_seconds if self._dialect.SNAPSHOTS_MAY_STAND else 0
        self._standing: StandingSnapshots[Snapshot] = StandingSnapshots(standing_seconds)
        self._handshakes = SharedHandshakes(self._standing_handshake)
        self._shipped_through = self.state.acked_through
        self._in_flight_through: int | None = None  # the last seq of a post of whole updates under way
        self._overtaking: asyncio.Event | None = None  # set once a subquery's post past it is done (``_overtake``)
        self._deleted_through = 0
        self._position_recorded_at = 0.0  # log capture: when a read last recorded a bare log position
        self._log_pacing = PollPacing(config.poll_interval)  # log capture: when the next poll reads the log
        self._log_arrived = asyncio.Event()  # log capture: wakes the ship loop when a transaction arrives
        self._poll_now = False  # log capture: a transaction arrived since the last poll began
        self._client: httpx.AsyncClient | None = None
        self._shipper: Shipper | None = None
        self._poller: asyncio.Task[None] | None = None
        self._puller: asyncio.Task[None] | None = None
        self._failing: dict[str, LoopFailure] = {}  # by loop, while its steps keep failing
        self._capturing = HeldChanges()  # changes of updates held in memory while they are captured
        self._shipping = HeldChanges()  # and while they are shipped

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Start shipping: pending updates from an earlier run go first, with their seqs."""
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0))
        self._shipper = Shipper(
            self.config.source,
            self.config.manager_url,
            self._client,
            self.config.token,
            encoding=self.config.update_encoding,
            held=self._shipping,
        )
        if self._log is not None:  # the stream's thread wakes the ship loop
            loop = asyncio.get_running_loop()

            def wake() -> None:
                loop.call_soon_threadsafe(self._arrived)

            self._log.on_transaction(wake)
        self._poller = asyncio.create_task(
            self._forever(self.ship_once, "capturing and shipping", self._idle),
            name=f"pvm-wrapper-{self.config.source}",
        )
        if self.capture.pull is not None:
            self._puller = asyncio.create_task(
                self._forever(self.pull_once, "pulling the source into the replica"),
                name=f"pvm-wrapper-{self.config.source}-pull",
            )

    async def stop(self) -> None:
        for task in (self._puller, self._poller):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        if self._client is not None:
            await self._client.aclose()
        self._standing.close()
        self.state.close()
        self.capture.close()

    # -- SendUpdates -------------------------------------------------------------------------
    async def ship_once(self) -> None:
        """Capture what committed since the last poll (under the capture lock alone, so that
        subqueries ship meanwhile), ship everything pending, then delete acknowledged changes
        from the outbox (log capture: confirm them to the server, after the ship lock is
        released). While the manager is down this waits (holding the ship lock) until it
        takes the updates. Log capture reads when a transaction arrived from the log since
        the last read began, and otherwise only when ``PollPacing`` says a poll is due."""
        arrived, self._poll_now = self._poll_now, False
        if self._log is None and self._standing.max_age > 0:
            await self._capture_and_ship_standing()
        else:
            if self._log is None or arrived or self._log_pacing.due(time.monotonic()):
                await self._capture_locked()
            await self._ship_pending()
        if self._log is None and not self._ordered:  # the capture lock only: subqueries ship meanwhile
            async with self._capture_lock:
                await asyncio.to_thread(self._delete_acknowledged_ids)
        if self._log is not None:  # no lock: the stream's reader only notes the position to report
            await asyncio.to_thread(self._confirm_acknowledged)
        elif self._ordered:
            await asyncio.to_thread(self._delete_acknowledged)

    async def pull_once(self) -> None:
        """Timestamp and snapshot capture: poll the source into the replica, then capture the
        replica's new changes as the next update (capture lock only: never waits for shipping,
        and a source that is down delays no shipping). Nothing to do for other methods.

        Most pulls apply nothing (a snapshot is due once an interval), and then there is
        nothing to capture. A pull that raises may have committed to the replica before it
        failed, so that is captured as if it applied something."""
        if self.capture.pull is None:
            return
        try:
            applied = await asyncio.to_thread(self.capture.pull)
        except Exception:
            await self._capture_locked()
            raise
        if applied:
            await self._capture_locked()

    async def _capture_locked(self) -> None:
        async with self._capture_lock:
            await asyncio.to_thread(self._capture_now)

    async def _capture_and_ship_standing(self) -> None:
        """A poll whose capture is a subquery's handshake: captured in an exact snapshot
        (trigger capture reads the outbox in one anyway), shipped, and then offered to
        answer subqueries (``wrappers.standing_snapshot``)."""
        async with self._capture_lock:
            snapshot = await Snapshot.open(self._dialect, self.engine, then=self._capture_exact)
            shipping = self._standing.shipping(snapshot, self.state.last_seq)
        try:
            await self._ship_pending()
        except BaseException:
            shipping.close()
            raise
        shipping.stand(self.state.acked_through)

    def _arrived(self) -> None:
        """Log capture: a transaction arrived from the log; the ship loop reads at once, or
        as soon as its step is done (it may be waiting for the manager's acknowledgment)."""
        self._poll_now = True
        self._log_arrived.set()

    async def _idle(self) -> None:
        """Between two steps of the ship loop: the poll interval, or with log capture until a
        transaction arrives from the log or the next poll is due (``PollPacing``), at most
        the poll interval (shipping and confirming go on)."""
        if self._log is None:
            await asyncio.sleep(self.config.poll_interval)
            return
        if self._poll_now:
            return
        self._log_arrived.clear()
        wait = self._log_pacing.wait(time.monotonic(), self.config.poll_interval)
        if wait > 0:
            try:
                await asyncio.wait_for(self._log_arrived.wait(), wait)
            except TimeoutError:
                pass

    async def _forever(
        self, step: Callable[[], Awaitable[None]], what: str, idle: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Run ``step`` again and again: after ``idle()`` when it worked, after the poll
        interval when it failed."""
        while True:
            try:
                await step()
                if self._failing.pop(what, None) is not None:
                    log.info("%s (source %s) works again", what, self.config.source)
            except Exception as exc:
                # Keep running (the source may be locked or briefly unavailable); log a streak
                # once, and let health show it while it lasts.
                failure = self._failing.get(what)
                if failure is None:
                    log.exception(
                        "%s (source %s) failed; retrying every %.2f s",
                        what,
                        self.config.source,
                        self.config.poll_interval,
                    )
                    failure = self._failing[what] = LoopFailure(time.time())
                failure.attempts += 1
                failure.error = f"{type(exc).__name__}: {reason(exc)}"[:1000]  # no SQL, no parameters
                await asyncio.sleep(self.config.poll_interval)
                continue
            await (idle() if idle is not None else asyncio.sleep(self.config.poll_interval))

    def _capture_now(self) -> None:
        conn = self._dialect.begin_snapshot(self.engine)
        try:
            self._capture(conn)
        finally:
            conn.close()

    def _capture(self, conn: sa.Connection) -> None:
        """Turn the uncaptured outbox rows visible to ``conn`` into the next updates (caller
        holds the capture lock). One read sees whole transactions only; they are read, and
        written to the state in parts, a few rows at a time (``wrappers.update_assembly``)."""
        if self._log is not None:
            self._capture_log(conn, exact=False)
            return
        if self._ordered:
            rows = self._dialect.read_outbox(conn, self.state.captured_through)
        else:
            rows = self._dialect.read_outbox(conn, 0, skip=self.state.captured_ids)
        with closing(rows), self._assembly(keep_ids=not self._ordered) as assembly:
            while batch := list(itertools.islice(rows, assembly.room())):
                for txid, run in itertools.groupby(batch, key=lambda row: row.txid):
                    taken = list(run)
                    assembly.add(taken, txid, max(row.id for row in taken))
            assembly.finish()
        if assembly.seqs:
            log.debug("captured updates %d-%d of %s", assembly.seqs[0], assembly.seqs[-1], self.config.source)

    def _assembly(self, *, keep_ids: bool) -> Assembly:
        changes: ChangesOf = partial(self._filter.changes, fit=self._fit)  # the Interest of now
        return Assembly(self.state, changes, self.config.part_limits, self._capturing, keep_ids)

    def _capture_exact(self, conn: sa.Connection) -> None:
        """A subquery's capture: every change ``conn``'s snapshot sees gets a seq, and no other
        (log capture raises SnapshotRace when no prefix of the log matches the snapshot)."""
        if self._log is not None:
            self._capture_log(conn, exact=True)
        else:
            self._capture(conn)

    def _capture_log(self, conn: sa.Connection, *, exact: bool) -> None:
        """Log capture: turn the transactions read from the log into updates (consecutive
        ones merged, a transaction never split), each recorded with the log position after
        it, then the position the read handled the log through."""
        assert self._log is not None
        read = self._log.read(conn, self.state.captured_through, exact=exact)
        self._log_pacing.read(time.monotonic(), found=bool(read.transactions), poll=not exact, more=read.more)
        now = time.monotonic()
        if not read.transactions and (
            read.through <= self.state.captured_through or now - self._position_recorded_at < POSITION_EVERY_SECONDS
        ):
            return  # a bare position is recorded once a second: the log may move without captured changes
        self._position_recorded_at = now
        with self._assembly(keep_ids=False) as assembly:
            for transaction in read.transactions:
                rows = iter(transaction.rows)  # a chunk at a time where they spilled to disk
                while run := list(itertools.islice(rows, assembly.room())):
                    assembly.add(run, transaction.xid, transaction.end)
            assembly.finish()
        if read.through > self.state.captured_through:
            self.state.record(None, read.through)
        if assembly.seqs:
            log.debug(
                "captured updates %d-%d of %s from the log", assembly.seqs[0], assembly.seqs[-1], self.config.source
            )

    def _confirm_acknowledged(self) -> None:
        """Log capture, invariant 1: the server may release the log only up to acknowledged
        updates. Only the ship loop calls it; it takes no lock (the log's stream reports the
        position on its own connection), so a subquery's read never waits for it."""
        assert self._log is not None
        through = self.state.deletable_through()
        if through > self._deleted_through:
            self._log.confirm(through)
            self._deleted_through = through

    async def _ship_pending(self) -> None:
        """Send every pending update and wait until all are acknowledged, taking the ship lock
        for one batch at a time: a subquery waiting for it gets its turn between two batches
        (and often finds its updates acknowledged by then), where it used to wait for every
        batch captured meanwhile."""
        while self.state.has_pending:
            async with self._lock:
                if not await self._ship_batch():
                    return

    async def _ship_through(self, watermark: int) -> None:
        """Have every update through ``watermark`` acknowledged (a subquery's handshake). The
        ship lock is taken only while some of them is not, and once held, the check is made
        again: the shipping it waited for (a poll's, another subquery's) usually had them
        acknowledged meanwhile. Batches go only until they are: updates captured since (by
        polls, by other subqueries' snapshots) are not this subquery's to wait for."""
        if self.state.acked_through >= watermark:
            return
        while self.state.acked_through < watermark:
            in_flight = self._in_flight_through
            if in_flight is not None and watermark > max(in_flight, self._shipped_through) and self._overtaking is None:
                await self._overtake(in_flight)
            async with self._lock:
                if self.state.acked_through >= watermark or not await self._ship_batch():
                    break

    async def _overtake(self, in_flight: int) -> None:
        """A subquery's updates are past the post in flight (through seq ``in_flight``, under
        the ship lock) and what posts beside it delivered already: post them now, beside it,
        instead of after its acknowledgment. The manager holds them above the gap until the
        post in flight fills it (``docs/protocol.md``), and acknowledges through them then:
        waiting for both posts takes about as long as the one in flight, not the two in a
        row. One such post at a time, of whole updates, tried once: a failure leaves them to
        the ship lock's turn, which ships whatever is still unacknowledged (at worst a second
        time: a post is idempotent per seq). Delivered updates are not read again: the post
        in flight may be acknowledged through them meanwhile, and then they are forgotten
        (the caller checks the same bound, so it starts no post with nothing to send)."""
        assert self._shipper is not None, "start() the wrapper first"
        done = self._overtaking = asyncio.Event()
        try:
            after = max(in_flight, self._shipped_through)
            heads = await asyncio.to_thread(self.state.pending, self.config.updates_per_post, after)
            if not heads or heads[0].parts > 1:
                return
            shipped = self._one_post(heads)
            updates = await asyncio.to_thread(self._whole, shipped)
            through = await self._shipper.send_ahead(updates, self._last_seq)
            self._shipped_through = max(self._shipped_through, shipped[-1].seq)
            # before the ship lock's turn, which waits for this post, reads the pending
            # updates: the manager may acknowledge through more than the turn knows of (the
            # post in flight was answered first), and what is acknowledged is forgotten
            await asyncio.to_thread(self.state.ack, through)
        except (httpx.HTTPError, ShipError) as exc:
            log.debug("a post past the one in flight failed (the ship lock's turn sends it): %s", exc)
        finally:
            self._overtaking = None
            done.set()

    async def _ship_batch(self) -> bool:
        """Send the oldest pending updates (one post's worth, or one update in parts) and wait
        until they are acknowledged (caller holds the ship lock); False if none was pending."""
        assert self._shipper is not None, "start() the wrapper first"
        if self._overtaking is not None:  # what it carries is acknowledged once it is done, or goes now
            await self._overtaking.wait()
        heads = await asyncio.to_thread(self.state.pending, self.config.updates_per_post)
        if not heads:
            return False
        if heads[0].parts > 1:  # acknowledged once it is whole
            shipped = heads[:1]
            through = await self._shipper.send_parts(shipped[0], self._read_part(shipped[0].seq), self._last_seq)
        else:
            shipped = self._one_post(heads)
            updates = await asyncio.to_thread(self._whole, shipped)
            self._in_flight_through = shipped[-1].seq  # a subquery's updates past it may overtake it
            try:
                through = await self._shipper.send(updates, self._last_seq)
            finally:
                self._in_flight_through = None
        self._shipped_through = max(self._shipped_through, shipped[-1].seq)
        await asyncio.to_thread(self.state.ack, through)
        return True

    def _last_seq(self) -> int:
        return self.state.last_seq

    def _one_post(self, heads: list[UpdateHead]) -> list[UpdateHead]:
        """The first of ``heads``, and the whole updates after it that one post takes along
        within the part limits (a post carries what one part may)."""
        limits = self.config.part_limits
        post = heads[:1]
        changes, size = heads[0].changes, heads[0].bytes
        for head in heads[1:]:
            changes, size = changes + head.changes, size + head.bytes
            if head.parts != 1 or changes > limits.changes or size > limits.bytes:
                break
            post.append(head)
        return post

    def _whole(self, heads: list[UpdateHead]) -> list[Update]:
        return [
            Update.model_construct(
                seq=h.seq, changes=self.state.part(h.seq, 0), txid=h.txid, captured_at=h.captured_at, part=None
            )
            for h in heads
        ]

    def _read_part(self, seq: int) -> Callable[[int], Awaitable[list[Change]]]:
        async def read(index: int) -> list[Change]:
            return await asyncio.to_thread(self.state.part, seq, index)

        return read

    def _delete_acknowledged(self) -> None:
        """Invariant 1: outbox rows go only once their update is acknowledged (or was empty)."""
        if self.state.captured_through <= self._deleted_through:
            return  # deletable_through() is never above it
        through = self.state.deletable_through()
        if through > self._deleted_through:
            self._dialect.delete_outbox(self.engine, through)
            self._deleted_through = through

    def _delete_acknowledged_ids(self) -> None:
        """Invariant 1 where ids are not in commit order (caller holds the capture lock, see
        above), ``DELETE_IDS`` rows at a time: a large update's ids are never listed at once."""
        while ids := self.state.deletable_ids(DELETE_IDS):
            self._dialect.delete_outbox_ids(self.engine, ids)
            self.state.forget(ids)

    # -- ProcessQuery --------------------------------------------------------------------------
    async def answer(self, subquery: Subquery) -> SubqueryAnswer:
        """Join ``subquery.keys`` with a source relation in a snapshot whose watermark is exact."""
        started = time.perf_counter()
        prepared = query.prepare(
            subquery, self.schema, self.engine.dialect.name, self.config.max_value_bytes, self.capture.replica is None
        )
        # in the standing snapshot if it reaches what the unit needs; else one subquery
        # evaluated at a time (q = 1): those that wait for a handshake together share the
        # next one (wrappers/shared_handshake.py); with more, each takes its own snapshot, on
        # a connection of its own, to be evaluated alongside the others
        standing = self._standing.lease(subquery.at_least) if subquery.at_least is not None else None
        if standing is not None:  # a snapshot whose watermark reaches what the unit needs
            snapshot, watermark, done = standing.snapshot, standing.watermark, standing.close
        elif self.config.max_concurrent_queries == 1:
            shared, watermark = await self._handshakes.join()
            snapshot, done = shared.snapshot.snapshot, shared.close
        else:
            lease, watermark = await self._standing_handshake()
            snapshot, done = lease.snapshot, lease.close
        try:
            async with self._queries.admit(subquery.priority):
                if self.config.query_delay_ms:
                    await asyncio.sleep(self.config.query_delay_ms / 1000)
                rows = await snapshot.run(lambda conn: query.evaluate(conn, prepared))
        finally:
            done()
        elapsed_ms = (time.perf_counter() - started) * 1000
        return SubqueryAnswer.model_construct(
            watermark=watermark, rows=rows, elapsed_ms=elapsed_ms
        )  # rows: wire values

    async def _snapshot_shipped_through(self, on_locked: Callable[[], None] = lambda: None) -> tuple[Snapshot, int]:
        """An exact snapshot and its watermark, with every update through the watermark shipped
        before the answer read in it can reach the manager (the handshake of invariant 3).

        The snapshot is taken under the capture lock alone, then shipped under the ship lock:
        while one subquery ships, the next reads. Shipping is skipped where every update
        through the watermark is acknowledged already (another subquery or a poll shipped it).
        ``on_locked``: called once the capture lock is held, before the snapshot is taken."""
        snapshot, watermark = await self._exact_snapshot(on_locked)
        try:
            await self._ship_through(watermark)
        except BaseException:
            snapshot.close()
            raise
        return snapshot, watermark

    async def _standing_handshake(self, on_locked: Callable[[], None] = lambda: None) -> tuple[Lease[Snapshot], int]:
        """A subquery's handshake (``_snapshot_shipped_through``), its snapshot offered to
        answer later subqueries too."""
        snapshot, watermark = await self._snapshot_shipped_through(on_locked)
        return self._standing.offer(snapshot, watermark), watermark

    async def _exact_snapshot(self, on_locked: Callable[[], None] = lambda: None) -> tuple[Snapshot, int]:
        """A snapshot whose visible changes are exactly the updates through the watermark.
        Log capture takes another snapshot while one races a committing transaction."""
        deadline = time.monotonic() + SNAPSHOT_RACE_SECONDS
        wait = 0.001
        while True:
            async with self._capture_lock:
                on_locked()
                try:
                    snapshot = await Snapshot.open(self._dialect, self.engine, then=self._capture_exact)
                    return snapshot, self.state.last_seq
                except SnapshotRace as exc:
                    if time.monotonic() > deadline:
                        raise WrapperError(
                            f"no snapshot of the source matched its log for {SNAPSHOT_RACE_SECONDS:.0f} s ({exc}); "
                            "a transaction stays committed but invisible (waiting for a synchronous standby?)"
                        ) from exc
            await asyncio.sleep(wait)
            wait = min(wait * 2, 0.1)

    # -- the initial load: a relation whole ---------------------------------------------------
    async def relation_snapshot(self, request: RelationSnapshot) -> AsyncIterator[bytes]:
        """Every row of a relation after its local predicate, as an Arrow stream as of an exact
        watermark: the subquery handshake (snapshot, ship through it, read in it), read with
        a server-side cursor, a batch at a time (``wrappers.relation_stream``). It takes no
        query slot: a view's load must not hold up the subqueries of the others."""
        table = self.schema.table(request.relation)
        statement = query.scan(
            table,
            request.alias,
            request.where,
            request.select,
            self.engine.dialect.name,
            self.config.max_value_bytes,
            self.capture.replica is None,
        )
        types = [table.types[table.columns.index(c)] for c in request.select]
        snapshot, watermark = await self._snapshot_shipped_through()
        return relation_stream.stream(snapshot, statement, table.name, request.select, types, watermark)

    # -- application capture -----------------------------------------------------------------------
    async def post_changes(self, changes: list[RowChange]) -> None:
        """Apply one application transaction to the replica, durably, all or nothing; the
        next poll ships it as one update. InvalidRequest if the change does not fit."""
        if self.config.capture.method != "application":
            raise InvalidRequest(
                f"source {self.config.source!r} uses {self.config.capture.method} capture; only "
                "application capture takes changes from the application"
            )
        assert self.capture.replica is not None
        await asyncio.to_thread(self.capture.replica.apply, changes)

    # -- Interest -------------------------------------------------------------------------------
    async def set_interest(self, interest: Interest) -> InterestAck:
        """Switch to ``interest``: updates with seq <= boundary used the old one, later ones the new.

        The boundary needs captured changes to have their seqs, not to be acknowledged: a
        manager that pushes its interest while starting, before it takes updates, must not
        wait for updates it cannot take yet (they ship with the next poll).
        """
        new_filter = ChangeFilter.build(interest, self.schema)
        async with self._capture_lock:
            await asyncio.to_thread(self._capture_now)
            await asyncio.to_thread(self.state.set_interest, interest)
            self._filter = new_filter
            return InterestAck(boundary=self.state.last_seq)

    # -- reports ----------------------------------------------------------------------------------
    def _loops(self) -> list[asyncio.Task[None] | None]:
        return [self._poller, self._puller] if self.capture.pull is not None else [self._poller]

    def blocked(self) -> dict[str, object] | None:
        """The loop that has failed at least ``BLOCKED_AFTER_ATTEMPTS`` times in a row (the
        longest failing, if several): its error, since when and how many tries; else None."""
        failures = [(f.since, what, f) for what, f in self._failing.items() if f.attempts >= BLOCKED_AFTER_ATTEMPTS]
        if not failures:
            return None
        since, what, failure = min(failures, key=lambda item: item[0])
        return {"loop": what, "error": failure.error, "since": since, "attempts": failure.attempts}

    def _shipping_error(self) -> dict[str, object] | None:
        """While posts to the manager keep failing (the ship loop retries them for as long
        as it runs: a manager down, or one refusing them for good, 413 or 422, until it is
        fixed or upgraded): the last error, its HTTP status, since when and how many."""
        failing = self._shipper.failing if self._shipper is not None else None
        return None if failing is None else dataclasses.asdict(failing)

    def health(self) -> dict[str, object]:
        blocked = self.blocked()
        return {
            "ok": blocked is None and all(t is not None and not t.done() for t in self._loops()),
            "source": self.config.source,
            "last_seq": self.state.last_seq,
            "shipped_through": self._shipped_through,
            "acked_through": self.state.acked_through,
            "pending": self.state.pending_count(),
            "capture": {"method": self.config.capture.method, **(self.capture.status() if self.capture.status else {})},
            "blocked": blocked,
            "shipping_error": self._shipping_error(),
            "quarantine": self._fit.quarantine.status(),
            "standing_snapshot": {
                "watermark": self._standing.watermark,
                "seconds": self._standing.max_age,
                "answers": self._standing.reused,
                "snapshots": self._standing.offered,
            },
            "held": {
                "capturing": self._capturing.now,
                "capturing_peak": self._capturing.peak,
                "shipping": self._shipping.now,
                "shipping_peak": self._shipping.peak,
                "part_changes": self.config.part_limits.changes,
                "part_bytes": self.config.part_limits.bytes,
            },
        }


@dataclass
class LoopFailure:
    """A streak of failed steps of one of the wrapper's loops."""

    since: float
    attempts: int = 0
    error: str = ""
