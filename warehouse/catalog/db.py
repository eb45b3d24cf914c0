"""Catalog access: plain synchronous SQLAlchemy, one short transaction per call.

The manager calls these methods from a single worker thread (see ``Manager``), so writes to
an embedded SQLite catalog never contend. Any SQLAlchemy URL works; the schema comes from
the Alembic migrations, applied on open.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

from sqlalchemy import Integer, create_engine, delete, event, func, insert, literal, select, update
from sqlalchemy.engine import CursorResult, Engine, Result, make_url
from sqlalchemy.exc import StatementError
from sqlalchemy.orm import Session

import migrations
from contract.file_modes import PRIVATE
from contract.schemas import dumps_wire_json, loads_wire_json
from warehouse.catalog.models import (
    LogPartRow,
    LogRow,
    RelationRow,
    SourceRow,
    StagedPartRow,
    StoreTableRow,
    TokenRow,
    UnitRow,
    ViewRow,
)
from warehouse.catalog.secrets import SealError, TokenSealer, key_file_for
from warehouse.catalog.statement_size import BoundedJson, StatementTooLarge

P = ParamSpec("P")
T = TypeVar("T")


class CatalogError(Exception):
    """A request that conflicts with the catalog (a duplicate name)."""


class UnknownName(CatalogError):
    """A name the catalog does not hold (a source, view or token removed meanwhile)."""


class SeqConflict(CatalogError):
    """An update whose seq is logged already, with other content."""


@dataclass(frozen=True)
class RelationInfo:
    source: str
    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    primary_key: tuple[str, ...]


@dataclass(frozen=True)
class SourceInfo:
    name: str
    wrapper_url: str
    capture: str
    relations: dict[str, RelationInfo]
    manager_token: str | None = field(default=None, repr=False)  # what the manager sends the wrapper


@dataclass
class ViewInfo:
    name: str
    sql: str
    parallelism: int
    batch_size: int
    commit_mode: str
    state: str
    bases: dict[str, int]
    watermark: int
    error: str | None
    created_at: float
    folded_order: int = 0  # unit records through this order were pruned ...
    folded_seqs: dict[str, int] = field(default_factory=dict)  # ... and the view as of it reflects these seqs

    def start(self) -> tuple[int, dict[str, int]]:
        """Where the view's record of units starts: the order whose state reflects each
        source through the seq given (the folded units', else the initial load's bases;
        order 0 then: the initial load's own order is in its unit record).

        >>> ViewInfo("v", "", 1, 1, "", "active", {"s": 4, "t": 0}, 9, None, 0.0, 7, {"s": 6}).start()
        (7, {'s': 6, 't': 0})
        """
        return self.folded_order, {s: max(seq, self.folded_seqs.get(s, 0)) for s, seq in self.bases.items()}


@dataclass(frozen=True)
class LogEntry:
    id: int
    source: str
    seq: int
    changes: Iterable[dict[str, Any]]  # a list; where read through a function, parts one at a time
    captured_at: float | None
    received_at: float
    parts: int = 0  # logged from this many parts (0: whole); a read of the log ends with such an entry


@dataclass(frozen=True)
class ReadEntry(Generic[T]):
    """A logged update as a function made it, on the catalog's thread (``log_range_read``,
    ``log_ids_read``): its id, seq and number of parts, and what ``read`` returned."""

    id: int
    seq: int
    parts: int
    value: T


@dataclass(frozen=True)
class LogRef:
    """A logged update named, its changes left in the log: one logged from its parts, of any
    size, which the receiver hands to the views by name (they read it from the log when
    they get to it, ``warehouse.spill``)."""

    id: int
    source: str
    seq: int
    received_at: float


@dataclass(frozen=True)
class StagedPart:
    """One checked part of an update to stage (``Catalog.stage_part``): part ``index`` of
    update ``seq``, its changes as plain data."""

    seq: int
    index: int
    changes: list[dict[str, Any]]
    txid: str | None
    captured_at: float | None


@dataclass(frozen=True)
class StagedUpdate:
    """What a source has staged of an update whose last part has not arrived: parts 0 to
    ``parts - 1``, holding ``changes`` changes together."""

    seq: int
    txid: str | None
    captured_at: float | None
    parts: int
    changes: int


@dataclass(frozen=True)
class NewUpdate:
    """A source update to log: its changes as plain data, and their ``content_digest``."""

    seq: int
    changes: list[dict[str, Any]]
    txid: str | None
    captured_at: float | None
    digest: str


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)


class ContentDigest:
    """SHA-256 of a list of changes as canonical JSON (keys sorted, no spaces, ASCII), fed a
    run of changes at a time: ``add`` the parts of an update in order and ``hexdigest``
    is ``content_digest`` of them all, without ever holding them together.

    >>> whole = [{"sign": 1, "relation": "R", "row": {"k": k}} for k in range(5)]
    >>> running = ContentDigest()
    >>> for start in (0, 2, 3):
    ...     running.add(whole[start : {0: 2, 2: 3, 3: 5}[start]], slice_size=2)
    >>> running.hexdigest() == content_digest(whole)
    True
    """

    def __init__(self) -> None:
        self._sha = hashlib.sha256(b"[")
        self._empty = True

    def add(self, changes: Sequence[dict[str, Any]], slice_size: int = 1000) -> None:
        """Digest ``changes`` after those added before. Encoded a slice at a time, so a large
        run never holds the GIL for long; the slices joined are exactly the encoding of the
        whole list."""
        for start in range(0, len(changes), slice_size):
            if not self._empty:
                self._sha.update(b",")
            self._sha.update(_CANONICAL.encode(list(changes[start : start + slice_size]))[1:-1].encode("ascii"))
            self._empty = False

    def copy(self) -> ContentDigest:
        copied = ContentDigest()
        copied._sha, copied._empty = self._sha.copy(), self._empty
        return copied

    def hexdigest(self) -> str:
        closed = self._sha.copy()
        closed.update(b"]")
        return closed.hexdigest()


@contextmanager
def _sized() -> Iterator[None]:
    """StatementTooLarge as itself, not wrapped in SQLAlchemy's StatementError."""
    try:
        yield
    except StatementError as exc:
        if isinstance(exc.orig, StatementTooLarge):
            raise exc.orig from None
        raise


def content_digest(changes: Sequence[dict[str, Any]], slice_size: int = 1000) -> str:
    """SHA-256 of ``changes`` as canonical JSON (keys sorted, no spaces, ASCII): the same
    content gives the same digest however its keys were ordered on the wire, and however
    it was cut into parts (``ContentDigest``).

    >>> content_digest([{"sign": 1, "relation": "R", "row": {"v": "x", "k": 1}}]) == content_digest(
    ...     [{"relation": "R", "row": {"k": 1, "v": "x"}, "sign": 1}])
    True
    >>> content_digest([{"a": 1}, {"b": 2.5}], slice_size=1) == hashlib.sha256(b'[{"a":1},{"b":2.5}]').hexdigest()
    True
    >>> content_digest([]) == hashlib.sha256(b"[]").hexdigest()
    True
    """
    digest = ContentDigest()
    digest.add(changes, slice_size)
    return digest.hexdigest()


@dataclass(frozen=True)
class TokenInfo:
    """An API token as stored: never the secret, only its salted hash (``api.auth``)."""

    id: int
    role: str
    source: str | None
    name: str
    created_at: float
    revoked_at: float | None
    hash: str = field(default="", repr=False)


@dataclass(frozen=True)
class UnitInfo:
    order: int
    log_ids: tuple[int, ...]
    committed: bool
    started_at: float | None = None
    committed_at: float | None = None
    source: str | None = None  # the one source whose updates the unit holds (None: the initial load)
    first_seq: int | None = None
    last_seq: int | None = None


@dataclass(frozen=True)
class Pruned:
    """What one pruning transaction removed: log entries, and unit records."""

    entries: int = 0
    units: int = 0

    def __add__(self, other: Pruned) -> Pruned:
        return Pruned(self.entries + other.entries, self.units + other.units)


@dataclass(frozen=True)
class PruneReach:
    """What the manager's memory allows pruning: ``released``, per source, the seq through
    which the receiver released its updates (a source left out is not pruned); ``passed``,
    per view and source, a seq through which every update the view holds in no unit at or
    below its recorded W is one it does not read (never queued, so nothing of the view
    needs it)."""

    released: Mapping[str, int]
    passed: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def reflected_through(start: Mapping[str, int], units: Sequence[UnitInfo], order: int) -> dict[str, int]:
    """Per source, the last seq a view as of ``order`` reflects: ``start`` (its base, or
    where its record of units starts), raised by the last seq of every unit at or below
    ``order``. A source's updates enter units in seq order, so these cover a prefix of it.

    >>> units = [UnitInfo(2, (7,), True, source="s", first_seq=5, last_seq=6), UnitInfo(3, (8,), False, source="s",
    ...     first_seq=7, last_seq=7)]
    >>> reflected_through({"s": 4, "t": 1}, units, 2)
    {'s': 6, 't': 1}
    """
    upto = dict(start)
    for unit in units:
        if unit.order <= order and unit.source is not None and unit.last_seq is not None:
            upto[unit.source] = max(upto.get(unit.source, 0), unit.last_seq)
    return upto


def _pruned_through(s: Session, source: str) -> int:
    """The last seq of the source's log pruning removed (0: none): every seq up to it was
    logged once."""
    return s.scalar(select(SourceRow.pruned_through).where(SourceRow.name == source)) or 0


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        cur = dbapi_connection.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
        cur.execute("PRAGMA busy_timeout=10000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()


def _private_sqlite_file(url: str) -> None:
    """An SQLite catalog holds the update log and the sealed tokens: its file is made 0600
    before SQLite opens it (which gives its ``-wal`` and ``-shm`` files that mode too), and an
    existing one readable by others is made so."""
    database = make_url(url).database
    if database is None or database in ("", ":memory:"):
        return
    path = Path(database)
    if not path.exists():
        PRIVATE.create_file(path)
    PRIVATE.secure(path, path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm"))


class Catalog:
    """What the manager keeps durably: sources, views, the update log, units, tokens. Used
    from one thread (the manager's ``db``: ``await manager.db(Catalog.units, view)``).

    ``key_file`` holds the key of the sealed manager tokens (``secrets``); by default the
    one next to an SQLite catalog file. A catalog on a database server without one can keep
    no manager token."""

    def __init__(self, url: str, key_file: Path | None = None) -> None:
        self.url = url
        key_file = key_file or key_file_for(url, None)
        self.sealer = TokenSealer(key_file) if key_file is not None else None
        # Update rows may hold non-finite floats: stored tagged (a PostgreSQL JSON column
        # refuses NaN), read back with every NaN the one object Z-sets can cancel. A value
        # MariaDB would refuse in one statement is refused before it is sent.
        self._json = BoundedJson(dumps_wire_json)
        self.engine = create_engine(url, json_serializer=self._json, json_deserializer=loads_wire_json)
        if self.engine.dialect.name == "sqlite":
            _private_sqlite_file(url)
            _sqlite_pragmas(self.engine)
        migrations.upgrade(url, token_sealer=self.sealer)
        self._json.measure(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    # -- sources -------------------------------------------------------------------------
    def add_source(
        self,
        name: str,
        wrapper_url: str,
        capture: str,
        relations: Sequence[RelationInfo],
        manager_token: str | None = None,
    ) -> None:
        with Session(self.engine) as s, s.begin():
            if s.get(SourceRow, name) is not None:
                raise CatalogError(f"source {name!r} is already registered")
            sealed = None if manager_token is None else self._sealer().seal(manager_token)
            s.add(
                SourceRow(
                    name=name,
                    wrapper_url=wrapper_url,
                    capture=capture,
                    created_at=time.time(),
                    sealed_manager_token=sealed,
                )
            )
            s.flush()  # the relations reference it
            for r in relations:
                s.add(
                    RelationRow(
                        source=name,
                        name=r.name,
                        columns=list(r.columns),
                        types=list(r.types),
                        primary_key=list(r.primary_key),
                    )
                )

    def sources(self) -> dict[str, SourceInfo]:
        with Session(self.engine) as s:
            rels: dict[str, dict[str, RelationInfo]] = {}
            for r in s.scalars(select(RelationRow)):
                info = RelationInfo(r.source, r.name, tuple(r.columns), tuple(r.types), tuple(r.primary_key))
                rels.setdefault(r.source, {})[r.name] = info
            return {
                row.name: SourceInfo(row.name, row.wrapper_url, row.capture, rels.get(row.name, {}), self._unseal(row))
                for row in s.scalars(select(SourceRow))
            }

    def _unseal(self, row: SourceRow) -> str | None:
        return None if row.sealed_manager_token is None else self._sealer().unseal(row.sealed_manager_token)

    def _sealer(self) -> TokenSealer:
        if self.sealer is None:
            raise SealError(
                f"the catalog on {self.engine.dialect.name} keeps manager tokens sealed with a key file, "
                "and none was given (the manager's data directory holds it: pvm serve --data-dir)"
            )
        return self.sealer

    # -- views ---------------------------------------------------------------------------
    def add_view(self, view: ViewInfo) -> None:
        with Session(self.engine) as s, s.begin():
            if s.get(ViewRow, view.name) is not None:
                raise CatalogError(f"view {view.name!r} already exists")
            s.add(ViewRow(**view.__dict__))
            s.flush()

    def update_view(self, name: str, **fields: Any) -> None:
        with Session(self.engine) as s, s.begin():
            s.execute(update(ViewRow).where(ViewRow.name == name).values(**fields))

    def views(self) -> dict[str, ViewInfo]:
        with Session(self.engine) as s:
            return {v.name: _view_info(v) for v in s.scalars(select(ViewRow))}

    def drop_view(self, name: str) -> None:
        with Session(self.engine) as s, s.begin():
            for u in s.scalars(select(UnitRow).where(UnitRow.view == name)):
                s.delete(u)
            row = s.get(ViewRow, name)
            if row is None:
                raise UnknownName(f"unknown view {name!r}")
            s.delete(row)

    # -- the update log ------------------------------------------------------------------
    def append_updates(self, source: str, updates: Sequence[NewUpdate]) -> list[LogEntry]:
        """Store the updates not stored yet (idempotent on (source, seq) and content); returns
        the new entries. SeqConflict, storing none of them, if one's seq is stored with other
        content (rows logged without a digest are digested from their stored changes). What
        the source staged of a seq logged now is dropped: it can never complete."""
        now = time.time()
        with _sized(), Session(self.engine) as s, s.begin():
            wanted = {u.seq: u for u in updates}
            new = self._unlogged(s, source, {seq: u.digest for seq, u in wanted.items()})
            rows = [
                LogRow(
                    source=source,
                    seq=u.seq,
                    changes=u.changes,
                    txid=u.txid,
                    captured_at=u.captured_at,
                    received_at=now,
                    digest=u.digest,
                    parts=0,
                )
                for seq, u in sorted(wanted.items())
                if seq in new
            ]
            s.add_all(rows)
            s.flush()
            if new:
                s.execute(
                    delete(StagedPartRow).where(StagedPartRow.source == source, StagedPartRow.seq.in_(sorted(new)))
                )
            return [_entry(r) for r in rows]

    @staticmethod
    def _unlogged(s: Session, source: str, digests: Mapping[int, str]) -> set[int]:
        """Of the seqs of ``digests`` (seq -> content digest), those not logged yet;
        SeqConflict if one is logged with other content."""
        # a seq pruned already was logged, reflected by every view and removed: a resend
        # of it is a duplicate (its content can no longer be compared)
        pruned = _pruned_through(s, source)
        wanted = {seq: digest for seq, digest in digests.items() if seq > pruned}
        q = select(LogRow.seq, LogRow.digest).where(LogRow.source == source, LogRow.seq.in_(list(wanted)))
        stored: dict[int, str | None] = dict(s.execute(q).all())  # (seq, digest) rows
        Catalog._check_same_content(s, source, wanted, stored)
        return wanted.keys() - stored.keys()

    @staticmethod
    def _check_same_content(s: Session, source: str, wanted: Mapping[int, str], stored: dict[int, str | None]) -> None:
        undigested = [seq for seq, digest in stored.items() if digest is None]
        if undigested:
            q = select(LogRow.seq, LogRow.changes).where(LogRow.source == source, LogRow.seq.in_(undigested))
            logged: Result[int, list[Any]] = s.execute(q)
            stored.update((seq, content_digest(changes)) for seq, changes in logged)
        differing = sorted(seq for seq, digest in stored.items() if digest != wanted[seq])
        if differing:
            shown = ", ".join(map(str, differing[:10])) + (
                f" and {len(differing) - 10} more" if len(differing) > 10 else ""
            )
            raise SeqConflict(
                f"source {source!r}: seq {shown} {'was' if len(differing) == 1 else 'were'} received before with other "
                "content; a seq names one update for good (the stored one stays)"
            )

    # -- updates in parts: staged, then logged whole --------------------------------------
    def stage_part(self, source: str, part: StagedPart) -> bool:
        """Stage ``part`` of the source's update ``part.seq`` (its part 0 drops whatever the
        source staged before); the receiver has checked that it continues the staged parts.
        False, staging nothing and dropping what the source staged, if the seq is logged
        already (a resend of it, whole, was logged meanwhile). StatementTooLarge, staging
        nothing, if the catalog's database cannot take the part in one statement."""
        with _sized(), Session(self.engine) as s, s.begin():
            if self._logged(s, source, part.seq):
                s.execute(delete(StagedPartRow).where(StagedPartRow.source == source))
                return False
            self._stage(s, source, part)
            return True

    @staticmethod
    def _logged(s: Session, source: str, seq: int) -> bool:
        pruned = _pruned_through(s, source)
        return (
            seq <= pruned or s.scalar(select(LogRow.id).where(LogRow.source == source, LogRow.seq == seq)) is not None
        )

    def log_staged(self, source: str, last: StagedPart, digest: str) -> LogRef | None:
        """Log the update whose parts the source staged, completed by its ``last`` part, as
        one seq, in one transaction: its log row, and its changes copied a part per row from
        the staged parts in the database (``INSERT … SELECT``: never through this process);
        the staged parts are dropped. ``digest``: ``content_digest`` of all its changes.
        None if the seq is logged already with the same content (or pruned); SeqConflict,
        with the staged parts dropped, if with other content; StatementTooLarge, as
        ``stage_part``."""
        try:
            with _sized(), Session(self.engine) as s, s.begin():
                self._stage(s, source, last)
                if not self._unlogged(s, source, {last.seq: digest}):
                    s.execute(delete(StagedPartRow).where(StagedPartRow.source == source))
                    return None
                row = LogRow(
                    source=source,
                    seq=last.seq,
                    changes=[],
                    txid=last.txid,
                    captured_at=last.captured_at,
                    received_at=time.time(),
                    digest=digest,
                    parts=last.index + 1,
                )
                s.add(row)
                s.flush()
                staged = select(literal(row.id, Integer), StagedPartRow.part, StagedPartRow.changes).where(
                    StagedPartRow.source == source, StagedPartRow.seq == last.seq
                )
                s.execute(insert(LogPartRow).from_select(["log_id", "part", "changes"], staged))
                s.execute(delete(StagedPartRow).where(StagedPartRow.source == source))
                return LogRef(row.id, source, row.seq, row.received_at)
        except SeqConflict:
            self.drop_staged(source)
            raise

    @staticmethod
    def _stage(s: Session, source: str, part: StagedPart) -> None:
        if part.index == 0:  # an update starts afresh: nothing staged before it can complete
            s.execute(delete(StagedPartRow).where(StagedPartRow.source == source))
        s.add(
            StagedPartRow(
                source=source,
                seq=part.seq,
                part=part.index,
                txid=part.txid,
                captured_at=part.captured_at,
                changes=part.changes,
                count=len(part.changes),
            )
        )
        s.flush()

    def staged(self, source: str) -> StagedUpdate | None:
        """What the source has staged (None: nothing), for the receiver after a restart.
        Reads no changes."""
        with Session(self.engine) as s:
            q = (
                select(StagedPartRow.seq, StagedPartRow.txid, StagedPartRow.captured_at, StagedPartRow.count)
                .where(StagedPartRow.source == source)
                .order_by(StagedPartRow.part)
            )
            rows = s.execute(q).all()
            if not rows:
                return None
            seq, txid, captured_at, _ = rows[0]
            return StagedUpdate(seq, txid, captured_at, len(rows), sum(count for *_, count in rows))

    def staged_part(self, source: str, seq: int, index: int) -> list[dict[str, Any]]:
        """The changes of staged part ``index`` of update ``seq`` of ``source``."""
        with Session(self.engine) as s:
            q = select(StagedPartRow.changes).where(
                StagedPartRow.source == source, StagedPartRow.seq == seq, StagedPartRow.part == index
            )
            return list(s.scalar(q) or [])

    def drop_staged(self, source: str) -> None:
        """Drop what the source staged: an update that can no longer complete."""
        with Session(self.engine) as s, s.begin():
            s.execute(delete(StagedPartRow).where(StagedPartRow.source == source))

    # -- reading the log -------------------------------------------------------------------
    def log_entries(
        self, source: str | None = None, after_seq: int = 0, ids: Sequence[int] | None = None
    ) -> list[LogEntry]:
        with Session(self.engine) as s:
            q = select(LogRow)
            if source is not None:
                q = q.where(LogRow.source == source, LogRow.seq > after_seq)
            if ids is not None:
                q = q.where(LogRow.id.in_(list(ids)))
            q = q.order_by(LogRow.source, LogRow.seq)
            return [_entry(r, self._parts(s, r)) for r in s.scalars(q)]

    def log_range_read(
        self, source: str, after_seq: int, through_seq: int, limit: int, read: Callable[[LogEntry], T]
    ) -> list[ReadEntry[T]]:
        """The first ``limit`` logged updates of ``source`` with ``after_seq < seq <=
        through_seq``, in seq order (a chunk of a spilled queue, ``warehouse.spill``), each
        made into ``read(entry)`` here. The chunk ends early with an update logged from
        parts: it may be of any size, so a chunk holds one at most, and it is read a part at
        a time as ``read`` goes through its changes (each time it does): its changes are
        never joined, and only what ``read`` keeps stays."""
        with Session(self.engine) as s:
            return [_read(s, r, read) for r in self._range(s, source, after_seq, through_seq, limit)]

    def log_ids_read(self, ids: Sequence[int], read: Callable[[LogEntry], T]) -> dict[int, ReadEntry[T]]:
        """The log entries ``ids``, each made into ``read(entry)`` as ``log_range_read`` does."""
        with Session(self.engine) as s:
            return {r.id: _read(s, r, read) for r in s.scalars(select(LogRow).where(LogRow.id.in_(list(ids))))}

    @staticmethod
    def _range(s: Session, source: str, after_seq: int, through_seq: int, limit: int) -> list[LogRow]:
        q = (
            select(LogRow)
            .where(LogRow.source == source, LogRow.seq > after_seq, LogRow.seq <= through_seq)
            .order_by(LogRow.seq)
            .limit(limit)
        )
        rows = list(s.scalars(q))
        parted = next((i for i, r in enumerate(rows) if r.parts), len(rows))
        return rows[: parted + 1]

    def log_part_read(self, log_id: int, index: int, read: Callable[[LogEntry], T]) -> tuple[int, T] | None:
        """How many parts the update logged from parts as entry ``log_id`` has, and ``read``
        of part ``index`` of it, as an entry of that part's changes only; None past its last
        part (or for an entry that is gone or was logged whole)."""
        with Session(self.engine) as s:
            row = s.get(LogRow, log_id)
            if row is None or index >= row.parts:
                return None
            changes: list[dict[str, Any]] = s.scalars(
                select(LogPartRow.changes).where(LogPartRow.log_id == log_id, LogPartRow.part == index)
            ).one()
            entry = LogEntry(row.id, row.source, row.seq, changes, row.captured_at, row.received_at, row.parts)
            return row.parts, read(entry)

    def log_releases(self, ids: Sequence[int]) -> list[LogEntry | LogRef]:
        """The log entries ``ids`` as the receiver releases them: whole, or named only
        (``LogRef``) where logged from parts. Reads no part of those."""
        with Session(self.engine) as s:
            q = select(LogRow).where(LogRow.id.in_(list(ids))).order_by(LogRow.source, LogRow.seq)
            return [LogRef(r.id, r.source, r.seq, r.received_at) if r.parts else _entry(r) for r in s.scalars(q)]

    @staticmethod
    def _parts(s: Session, row: LogRow) -> list[dict[str, Any]] | None:
        """The changes of an entry logged from parts, its parts joined (None: a whole one)."""
        if not row.parts:
            return None
        changes: list[dict[str, Any]] = []
        part: list[dict[str, Any]]
        for part in s.scalars(select(LogPartRow.changes).where(LogPartRow.log_id == row.id).order_by(LogPartRow.part)):
            changes.extend(part)
        return changes

    def log_positions(self, source: str) -> tuple[int, dict[int, int]]:
        """Where a source's log stands, for the receiver's cursor after a restart: the last
        seq of its gapless prefix (seqs start at 1; the pruned ones count as logged), and the
        seq -> log id of every stored update after a gap. Reads two integers per update only
        when there is a gap."""
        with Session(self.engine) as s:
            pruned = _pruned_through(s, source)
            after = (LogRow.source == source, LogRow.seq > pruned)
            count, last = s.execute(
                select(func.count(LogRow.id), func.coalesce(func.max(LogRow.seq), 0)).where(*after)
            ).one()
            if count == 0 or count == last - pruned:
                return max(int(last), pruned), {}
            q = select(LogRow.seq, LogRow.id).where(*after).order_by(LogRow.seq)
            through, held = pruned, dict[int, int]()
            for seq, log_id in s.execute(q):
                if not held and seq == through + 1:
                    through = seq
                else:
                    held[seq] = log_id
            return through, held

    # -- maintenance units ---------------------------------------------------------------
    def start_unit(self, view: str, order: int, log_ids: Sequence[int]) -> None:
        """Record unit ``order`` of ``view`` and the log entries it maintains (none: the
        initial load), with the seqs it holds (its first and last entry's), which outlive
        the entries once the log is pruned."""
        with Session(self.engine) as s, s.begin():
            row = UnitRow(view=view, order_no=order, log_ids=list(log_ids), committed=False, started_at=time.time())
            if log_ids:
                q = select(LogRow.id, LogRow.source, LogRow.seq).where(LogRow.id.in_({log_ids[0], log_ids[-1]}))
                ends = {log_id: (source, seq) for log_id, source, seq in s.execute(q)}
                if log_ids[0] in ends and log_ids[-1] in ends:
                    row.source, row.first_seq = ends[log_ids[0]]
                    row.last_seq = ends[log_ids[-1]][1]
            s.add(row)

    def commit_units(self, view: str, orders: Sequence[int], watermark: int) -> None:
        with Session(self.engine) as s, s.begin():
            s.execute(
                update(UnitRow)
                .where(UnitRow.view == view, UnitRow.order_no.in_(list(orders)))
                .values(committed=True, committed_at=time.time())
            )
            s.execute(update(ViewRow).where(ViewRow.name == view).values(watermark=watermark))

    def units(self, view: str) -> list[UnitInfo]:
        with Session(self.engine) as s:
            return self._units(s, view)

    def view_units(self, view: str) -> tuple[ViewInfo, list[UnitInfo]]:
        """The view's row and its unit records, read together: where its record of units
        starts (``ViewInfo.start``) and the records after it. Read apart, a pruning round in
        between may fold records that the row read first does not count yet, and the
        records read then would start after a gap (docs/protocol.md, "Pruning the update
        log"). One session, on the catalog's one thread: nothing is written in between."""
        with Session(self.engine) as s:
            row = s.get(ViewRow, view)
            if row is None:
                raise UnknownName(f"unknown view {view!r}")
            return _view_info(row), self._units(s, view)

    @staticmethod
    def _units(s: Session, view: str) -> list[UnitInfo]:
        q = select(UnitRow).where(UnitRow.view == view).order_by(UnitRow.order_no)
        return [
            UnitInfo(
                u.order_no,
                tuple(u.log_ids),
                u.committed,
                u.started_at,
                u.committed_at,
                u.source,
                u.first_seq,
                u.last_seq,
            )
            for u in s.scalars(q)
        ]

    # -- pruning: what no reader can need any more (docs/protocol.md, "Pruning the update log") --
    def prune(self, reach: PruneReach, before: float, most: int, keep_units: int) -> Pruned:
        """Remove, in one transaction, at most ``most`` log entries and ``most`` unit records
        that no reader can need any more:

        * of each source in ``reach.released``, the entries through the least seq every view
          reading it reflects at its recorded W (its base, or the last seq of its units at or
          below W; or, further, ``reach.passed``: up to there it holds nothing it reads
          outside those units), received before ``before``, in seq order: what is removed is
          always a prefix, and ``sources.pruned_through`` says where it ends;
        * of each view, the committed unit records at or below its recorded W but the newest
          ``keep_units`` of them, committed before ``before``, folded into ``folded_order``
          and ``folded_seqs`` (the state as of that order reflects those seqs).

        Only the catalog's durable state decides what a view reflects: a W the manager holds
        in memory and has not recorded yet counts for nothing here."""
        with Session(self.engine) as s, s.begin():
            views = list(s.scalars(select(ViewRow)))
            bound = dict(reach.released)
            for view in views:
                passed = reach.passed.get(view.name, {})
                for source, seq in self._reflected(s, view, view.watermark).items():
                    if source in bound:
                        bound[source] = min(bound[source], max(seq, passed.get(source, 0)))
            entries = 0
            for source, through in sorted(bound.items()):
                if entries < most:
                    entries += self._prune_entries(s, source, through, before, most - entries)
            units = 0
            for view in views:
                if units < most:
                    units += self._fold_units(s, view, before, most - units, keep_units)
            return Pruned(entries, units)

    def reflected(self, view: str, order: int) -> dict[str, int]:
        """Per source of ``view``, the last seq its state as of ``order`` reflects (its
        base, or the last seq of its units at or below ``order``; a source's updates enter
        units in seq order, so everything of it up to there is reflected). Read in one
        transaction with what pruning folded into the view's row."""
        with Session(self.engine) as s:
            row = s.get(ViewRow, view)
            if row is None:
                raise UnknownName(f"unknown view {view!r}")
            return self._reflected(s, row, order)

    @staticmethod
    def _reflected(s: Session, view: ViewRow, order: int) -> dict[str, int]:
        upto = _view_info(view).start()[1]
        q = (
            select(UnitRow.source, func.max(UnitRow.last_seq))
            .where(UnitRow.view == view.name, UnitRow.order_no <= order, UnitRow.source.is_not(None))
            .group_by(UnitRow.source)
        )
        for source, last in s.execute(q):
            if source in upto and last is not None:
                upto[source] = max(upto[source], int(last))
        return upto

    @staticmethod
    def _prune_entries(s: Session, source: str, through: int, before: float, most: int) -> int:
        """Remove the entries of ``source`` after its pruned prefix up to seq ``through``,
        received before ``before``, at most ``most``; how many."""
        row = s.get(SourceRow, source)
        if row is None or through <= row.pruned_through:
            return 0
        q = (
            select(LogRow.seq, LogRow.received_at)
            .where(LogRow.source == source, LogRow.seq > row.pruned_through, LogRow.seq <= through)
            .order_by(LogRow.seq)
            .limit(most)
        )
        upto = row.pruned_through
        for seq, received_at in s.execute(q):
            if received_at >= before:
                break
            upto = seq
        if upto == row.pruned_through:
            return 0
        done = s.execute(
            delete(LogRow).where(LogRow.source == source, LogRow.seq > row.pruned_through, LogRow.seq <= upto)
        )
        assert isinstance(done, CursorResult)  # what a DELETE statement returns
        row.pruned_through = upto
        return done.rowcount

    @staticmethod
    def _fold_units(s: Session, view: ViewRow, before: float, most: int, keep: int) -> int:
        """Remove the oldest committed unit records of ``view`` at or below its W, keeping
        the newest ``keep`` of them (a restart rebuilds the view's record of units from
        these); fold what they reflected into the view's row. How many were removed."""
        kept_from = s.scalar(
            select(UnitRow.order_no)
            .where(UnitRow.view == view.name, UnitRow.order_no <= view.watermark)
            .order_by(UnitRow.order_no.desc())
            .offset(keep)
            .limit(1)
        )
        if kept_from is None:
            return 0
        q = (
            select(UnitRow.order_no, UnitRow.source, UnitRow.last_seq, UnitRow.committed_at)
            .where(UnitRow.view == view.name, UnitRow.order_no <= kept_from)
            .order_by(UnitRow.order_no)
            .limit(most)
        )
        upto = _view_info(view).start()[1]
        through = None
        for order, source, last, committed_at in s.execute(q):
            if committed_at is None or committed_at >= before:
                break
            through = order
            if source is not None and last is not None:
                upto[source] = max(upto.get(source, 0), int(last))
        if through is None:
            return 0
        done = s.execute(delete(UnitRow).where(UnitRow.view == view.name, UnitRow.order_no <= through))
        assert isinstance(done, CursorResult)
        view.folded_order, view.folded_seqs = max(view.folded_order, through), upto
        return done.rowcount

    def log_size(self) -> int:
        """How many updates the log holds now."""
        with Session(self.engine) as s:
            return int(s.scalar(select(func.count(LogRow.id))) or 0)

    # -- API tokens (hashes only; see api.auth) --------------------------------------------
    def add_token(self, role: str, source: str | None, name: str, hash: str) -> TokenInfo:
        with Session(self.engine) as s, s.begin():
            row = TokenRow(role=role, source=source, name=name, hash=hash, created_at=time.time())
            s.add(row)
            s.flush()
            return _token_info(row)

    def token(self, token_id: int) -> TokenInfo | None:
        with Session(self.engine) as s:
            row = s.get(TokenRow, token_id)
            return None if row is None else _token_info(row)

    def tokens(self, after_id: int = 0) -> list[TokenInfo]:
        """Every token with an id above ``after_id`` (all of them by default), by id."""
        with Session(self.engine) as s:
            q = select(TokenRow).where(TokenRow.id > after_id).order_by(TokenRow.id)
            return [_token_info(r) for r in s.scalars(q)]

    def replace_token_hash(self, token_id: int, old: str, new: str) -> bool:
        """Store ``new`` as the token's hash if it still is ``old`` (an upgrade of the hash
        scheme, see api.auth); whether it was replaced."""
        with Session(self.engine) as s, s.begin():
            done = s.execute(update(TokenRow).where(TokenRow.id == token_id, TokenRow.hash == old).values(hash=new))
            assert isinstance(done, CursorResult)  # what an UPDATE statement returns
            return done.rowcount == 1

    def revoke_token(self, token_id: int) -> TokenInfo:
        """Revoke a token (idempotent: an already revoked token keeps its revocation time)."""
        with Session(self.engine) as s, s.begin():
            row = s.get(TokenRow, token_id)
            if row is None:
                raise UnknownName(f"unknown token {token_id}")
            if row.revoked_at is None:
                row.revoked_at = time.time()
            s.flush()
            return _token_info(row)

    def ping(self) -> bool:
        """True when the catalog database answers (readiness)."""
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        return True


class _PartChanges:
    """The changes of an update logged from parts, read from the log a part at a time
    whenever they are gone through: never joined. Valid while its session is open."""

    def __init__(self, s: Session, log_id: int) -> None:
        self._s = s
        self._log_id = log_id

    def __iter__(self) -> Iterator[dict[str, Any]]:
        of_this = LogPartRow.log_id == self._log_id
        for index in list(self._s.scalars(select(LogPartRow.part).where(of_this).order_by(LogPartRow.part))):
            changes: list[dict[str, Any]] = self._s.scalars(
                select(LogPartRow.changes).where(of_this, LogPartRow.part == index)
            ).one()
            yield from changes


def _read(s: Session, row: LogRow, read: Callable[[LogEntry], T]) -> ReadEntry[T]:
    """``read`` of the entry of ``row``; the changes of one logged from parts, a part at a time."""
    changes = _PartChanges(s, row.id) if row.parts else row.changes
    entry = LogEntry(row.id, row.source, row.seq, changes, row.captured_at, row.received_at, row.parts)
    return ReadEntry(row.id, row.seq, row.parts, read(entry))


def _entry(row: LogRow, parts: list[dict[str, Any]] | None = None) -> LogEntry:
    """A log row as an entry: its changes, or ``parts``, those of its parts joined."""
    changes = row.changes if parts is None else parts
    return LogEntry(row.id, row.source, row.seq, changes, row.captured_at, row.received_at, row.parts)


def _view_info(v: ViewRow) -> ViewInfo:
    return ViewInfo(
        v.name,
        v.sql,
        v.parallelism,
        v.batch_size,
        v.commit_mode,
        v.state,
        dict(v.bases),
        v.watermark,
        v.error,
        v.created_at,
        v.folded_order,
        dict(v.folded_seqs or {}),
    )


def _token_info(row: TokenRow) -> TokenInfo:
    return TokenInfo(row.id, row.role, row.source, row.name, row.created_at, row.revoked_at, row.hash)


class StoreRecords:
    """The view store's per-view records (table locations, compaction state) kept in the
    catalog database, so a restart re-registers every table from one place."""

    def __init__(self, catalog: Catalog) -> None:
        self._engine = catalog.engine

    def views(self) -> list[str]:
        with Session(self._engine) as s:
            return list(s.scalars(select(StoreTableRow.view)))

    def load(self, view: str) -> dict[str, Any] | None:
        with Session(self._engine) as s:
            row = s.get(StoreTableRow, view)
            return dict(row.record) if row else None

    def save(self, view: str, record: dict[str, Any]) -> None:
        with Session(self._engine) as s, s.begin():
            row = s.get(StoreTableRow, view)
            if row is None:
                s.add(StoreTableRow(view=view, record=record))
            else:
                row.record = record

    def delete(self, view: str) -> None:
        with Session(self._engine) as s, s.begin():
            row = s.get(StoreTableRow, view)
            if row is not None:
                s.delete(row)


class CatalogCall(Protocol):
    """Runs a method of the catalog on the catalog's one thread and awaits its result:
    ``await db(Catalog.start_unit, view, order, log_ids)``. The method is named as an
    attribute of ``Catalog``, so its arguments and result are checked like a direct call's
    (``Manager.db`` is one)."""

    def __call__(
        self, method: Callable[Concatenate[Catalog, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> Awaitable[T]: ...


__all__ = [
    "Catalog",
    "CatalogCall",
    "CatalogError",
    "ContentDigest",
    "LogEntry",
    "LogRef",
    "NewUpdate",
    "PruneReach",
    "Pruned",
    "RelationInfo",
    "SeqConflict",
    "SourceInfo",
    "StagedPart",
    "StagedUpdate",
    "StoreRecords",
    "TokenInfo",
    "UnitInfo",
    "ViewInfo",
    "content_digest",
    "reflected_through",
]
