"""Snapshot-differential capture: changes inferred by differencing snapshots into a replica.

For sources that offer neither triggers nor timestamps, only their contents: a live
``SELECT`` or dump files (``snapshots``). On every interval the wrapper takes a snapshot,
differences it against the previous one it kept (Labio & Garcia-Molina; the
``differential`` package), and applies the inserts, deletes and updates to the replica
(``wrappers.replica``) in one transaction, which the replica's own capture ships as one
update. Subqueries are answered from the replica, which holds exactly the differenced
snapshots, so invariant 3 holds as for timestamp capture; the views show the source as of
its last differenced snapshot, and changes that come and go between two snapshots are
never seen.

Per pull (all tables, or none)::

    take the due tables' snapshots into new files (tag = next generation)
    for each: changes = differential(kept snapshot, new snapshot)
    replica.apply(all changes, meta = {kept files: the new ones, ...})   # one transaction
    delete the previous files

The replica's metadata names the kept files, so a crash at any point leaves either the old
files (and no change applied) or the new ones (and the changes applied); files it does not
name are leftovers and are removed at start. A snapshot that cannot be differenced (a
truncated or unreadable dump, a changed schema or key, a duplicate key) is reported in
``status()`` and the log, nothing is applied, and the kept snapshot stays for the next
try; an unchanged bad dump is not read again. Duplicate keys are found whatever the
algorithm and however far apart they are: the differential's changes are checked among
themselves (``_check_keys``), and an insert of a key the replica has is refused by
``Replica.apply`` (``DuplicateKey``), the whole pull with it.

The algorithm is chosen per table (``SnapshotOptions.algorithm``). ``auto`` runs the window
algorithm (both snapshots read once) while the records of the last two snapshots moved
less than its aging buffer holds, and the compressed partitioned hash otherwise; how far
they moved is estimated from one key in 64, as a by-product of every differential. The
window's useless delete-insert pairs are removed by its second pass, so every algorithm
ships the exact changes, up to the compressed hash's missed-update probability
(``2**-checksum_bits`` per changed record).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wrappers.capture.snapshots import SnapshotOptions, SnapshotSource
from wrappers.capture.types import wire_value
from wrappers.differential import (
    ChangeList,
    Compression,
    MemoryBudget,
    Snapshot,
    SnapshotError,
    partitioned_hash_diff,
    sort_merge_diff,
    window_diff,
)
from wrappers.differential.record_schema import Key, Record, Rest
from wrappers.differential.spill import IOStats
from wrappers.differential.window import DEFAULT_INPUT_RECORDS
from wrappers.errors import InvalidRequest
from wrappers.replica import DuplicateKey, Replica, RowChange
from wrappers.schema import TableSchema

log = logging.getLogger(__name__)

_SAMPLE_MASK = 63  # keys whose hash is 0 modulo 64 are sampled for the displacement estimate


class SnapshotCapture:
    """Feeds a replica from a snapshot source by differencing successive snapshots."""

    def __init__(self, source: SnapshotSource, replica: Replica, options: SnapshotOptions, directory: Path) -> None:
        self._source = source
        self._replica = replica
        self._options = options
        self._directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._kept: dict[str, str] = json.loads(replica.meta("snapshot_files") or "{}")
        self._signatures: dict[str, Any] = json.loads(replica.meta("snapshot_signatures") or "{}")
        self._displacement: dict[str, int | None] = json.loads(replica.meta("snapshot_displacement") or "{}")
        self._generation = int(replica.meta("snapshot_generation") or 0)
        self._failed: dict[str, Any] = {}
        self._next_at = 0.0
        self._status: dict[str, Any] = {
            "snapshots": 0, "last_snapshot_at": None, "last_changes": {}, "algorithms": {}, "last_error": None,
        }  # fmt: skip
        self._remove_leftovers()

    @staticmethod
    def kept_files(replica_meta: dict[str, str], directory: Path) -> dict[str, Path]:
        """The kept snapshot of each table, from the replica's metadata (before the replica
        is opened: a dump source reads its schema from them)."""
        return {t: directory / name for t, name in json.loads(replica_meta.get("snapshot_files", "{}")).items()}

    def status(self) -> dict[str, Any]:
        return dict(self._status)

    # -- the first snapshot ---------------------------------------------------------------------
    def load(self) -> None:
        """Load an empty replica with a first snapshot of every table."""
        tables = list(self._source.schema.tables)
        signatures = {t: self._source.signature(t) for t in tables}
        files = self._source.take(tables, self._directory, "1")
        rows = {t: self._rows(t, self._source.open(t, files[t])) for t in tables}
        try:
            self._replica.load(rows, self._meta(files, signatures, self._displacement, 1))
        except InvalidRequest as exc:
            raise SnapshotError(f"the first snapshot cannot be loaded: {exc}") from exc
        self._kept, self._signatures, self._generation = {t: p.name for t, p in files.items()}, signatures, 1
        self._status.update(snapshots=1, last_snapshot_at=time.time())

    def _rows(self, table: str, snapshot: Snapshot) -> Iterator[dict[str, Any]]:
        assert snapshot.schema is not None
        join = snapshot.schema.join
        columns = snapshot.schema.columns
        for key, rest in snapshot.scan():
            yield dict(zip(columns, map(wire_value, join(key, rest))))

    # -- every interval -------------------------------------------------------------------------
    def pull(self) -> bool:
        """Take, difference and apply a snapshot of the due tables, once the interval passed;
        whether any row of the replica changed."""
        now = time.monotonic()
        if now < self._next_at:
            return False
        self._next_at = now + self._options.interval
        signatures = {t: self._source.signature(t) for t in self._source.schema.tables}
        due = [
            t for t, sig in signatures.items()
            if sig is None or (sig != self._signatures.get(t) and sig != self._failed.get(t))
        ]  # fmt: skip
        if not due:
            return False
        generation = self._generation + 1
        files: dict[str, Path] = {}
        try:
            files = self._source.take(due, self._directory, str(generation))
            changes: list[RowChange] = []
            counts: dict[str, dict[str, int]] = {}
            algorithms: dict[str, str] = {}
            displacement = dict(self._displacement)
            for table in due:
                algorithms[table] = self._algorithm(table)
                found, displacement[table] = self._difference(table, algorithms[table], files[table])
                self._check_keys(table, found, files[table])
                counts[table] = found.counts()
                changes.extend(row_changes(self._source.schema.tables[table], found))
            kept = {**self._kept, **{t: p.name for t, p in files.items()}}
            applied = {**self._signatures, **{t: signatures[t] for t in due}}
            self._apply(changes, self._meta(kept, applied, displacement, generation), files)
        except (SnapshotError, InvalidRequest, OSError) as exc:
            for path in files.values():
                path.unlink(missing_ok=True)
            self._failed.update({t: signatures[t] for t in due if signatures[t] is not None})
            message = f"snapshot of {', '.join(due)} not applied: {exc}"
            if message != self._status["last_error"]:
                log.error("%s; the previous snapshot is kept", message)
            self._status["last_error"] = message
            return False
        previous = [self._directory / self._kept[t] for t in due if t in self._kept]
        self._kept, self._signatures, self._displacement, self._generation = kept, applied, displacement, generation
        for table in due:
            self._failed.pop(table, None)
        for path in previous:
            path.unlink(missing_ok=True)
        self._status.update(
            snapshots=self._status["snapshots"] + 1, last_snapshot_at=time.time(), last_error=None,
            last_changes=counts, algorithms={**self._status["algorithms"], **algorithms},
        )  # fmt: skip
        if changes:
            log.info("snapshot %d: %s", generation, ", ".join(f"{t} {_describe(c)}" for t, c in counts.items()))
        return bool(changes)

    def _algorithm(self, table: str) -> str:
        """The configured algorithm, or for ``auto`` the window while the last measured
        displacement fits its aging buffer (with room for two input buffers and a margin)."""
        if self._options.algorithm != "auto":
            return self._options.algorithm
        moved = self._displacement.get(table)
        room = self._options.aging_records - 2 * DEFAULT_INPUT_RECORDS
        return "window" if moved is None or moved * 1.25 < room else "partitioned-hash"

    def _difference(self, table: str, algorithm: str, new_file: Path) -> tuple[ChangeList, int | None]:
        """The changes from the kept snapshot of ``table`` to ``new_file``, and how far the
        sampled records moved between the two."""
        old = _Positions(self._source.open(table, self._directory / self._kept[table]))
        new = _Positions(self._source.open(table, new_file))
        budget = MemoryBudget(bytes=self._options.memory_mb * 2**20)
        stats = IOStats()
        if algorithm == "window":
            result = window_diff(
                old, new, aging_records=self._options.aging_records, second_pass=True, budget=budget, stats=stats
            )
        elif algorithm == "partitioned-hash":
            compression = Compression(bits=self._options.checksum_bits)
            result = partitioned_hash_diff(old, new, compression=compression, budget=budget, stats=stats)
        else:
            result = sort_merge_diff(old, new, budget=budget, stats=stats)
        return result.changes, _max_displacement(old.positions, new.positions)

    def _check_keys(self, table: str, changes: ChangeList, new_file: Path) -> None:
        """SnapshotError if ``changes`` insert or update a key of ``table`` twice.

        The outer-join algorithms find every duplicate key, the window algorithm only those
        that meet in its buffers: a duplicate further away comes out as a second insert or
        update of the key (found here), or as an insert of a key the replica (the kept
        snapshot) still has, unmatched and undeleted (found by ``_apply``).
        """
        written: set[Key] = set()
        for change in changes.others:
            if change.key in written:
                raise _duplicate(change.key, table, new_file)
            written.add(change.key)

    def _apply(self, changes: list[RowChange], meta: dict[str, str], files: dict[str, Path]) -> None:
        """Apply ``changes`` and ``meta`` to the replica. An insert of a key it has is a key
        repeated in the new snapshot: the replica refuses it on the way (its primary key), so
        inserted keys need no lookup of their own beforehand."""
        try:
            self._replica.apply(changes, meta)
        except DuplicateKey as exc:
            raise _duplicate(exc.key, exc.relation, files[exc.relation]) from None

    def _meta(
        self, files: dict[str, Any], signatures: dict[str, Any], displacement: dict[str, Any], generation: int
    ) -> dict[str, str]:
        return {
            "snapshot_files": json.dumps({t: getattr(p, "name", p) for t, p in files.items()}),
            "snapshot_signatures": json.dumps(signatures),
            "snapshot_displacement": json.dumps(displacement),
            "snapshot_generation": str(generation),
        }

    def _remove_leftovers(self) -> None:
        """Files of a pull that did not reach the replica (a crash), or of an aborted load."""
        kept = set(self._kept.values())
        for path in self._directory.iterdir():
            if path.is_file() and path.name not in kept:
                path.unlink()


class _Positions(Snapshot):
    """``inner`` read as it is, remembering the position of the sampled keys it passes."""

    def __init__(self, inner: Snapshot) -> None:
        self.inner = inner
        self.schema = inner.schema
        self.name = inner.name
        self.nbytes = inner.nbytes
        self.supports_pointers = inner.supports_pointers
        self.positions: dict[Key, int] = {}

    def scan(self, stats: IOStats | None = None) -> Iterator[Record]:
        positions = self.positions
        for i, record in enumerate(self.inner.scan(stats)):
            if hash(record[0]) & _SAMPLE_MASK == 0:
                positions[record[0]] = i
            yield record

    def scan_with_pointers(self, stats: IOStats | None = None) -> Iterator[tuple[Key, Rest, int]]:
        positions = self.positions
        for i, (key, rest, pointer) in enumerate(self.inner.scan_with_pointers(stats)):
            if hash(key) & _SAMPLE_MASK == 0:
                positions[key] = i
            yield key, rest, pointer

    def fetch(self, pointers: Any, stats: IOStats | None = None) -> Iterator[tuple[int, Record]]:
        return self.inner.fetch(pointers, stats)


def _duplicate(key: Key, table: str, new_file: Path) -> SnapshotError:
    return SnapshotError(f"duplicate key {key!r} in the new snapshot of {table!r} ({new_file.name})")


def _max_displacement(old: dict[Key, int], new: dict[Key, int]) -> int | None:
    """The largest move, in records, of a sampled key present in both snapshots."""
    moves = [abs(p - new[k]) for k, p in old.items() if k in new]
    return max(moves) if moves else None


def row_changes(table: TableSchema, changes: ChangeList) -> Iterator[RowChange]:
    """Differential messages as replica changes (deletes first, as the algorithms send them)."""
    key_columns = table.primary_key
    rest_columns = [c for c in table.columns if c not in key_columns]
    for change in changes:
        key = dict(zip(key_columns, map(wire_value, change.key)))
        if change.kind == "delete":
            yield RowChange(table.name, "delete", key=key)
            continue
        assert change.new is not None
        row = {**key, **dict(zip(rest_columns, map(wire_value, change.new)))}
        if change.kind == "insert":
            yield RowChange(table.name, "insert", row=row)
        else:
            yield RowChange(table.name, "update", key=key, row=row)


def _describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}s" for kind, n in counts.items() if n) or "unchanged"
