"""What a dialect must provide to capture committed changes of a source (the capture interface).

A capture dialect is a module implementing ``CaptureDialect``. It keeps an *outbox* table in
the source, filled by triggers in the same transaction as the change, so a change becomes
visible to the wrapper exactly when its transaction commits (rolled-back work never does).

Where outbox ids grow in commit order (SQLite serializes writers, so its AUTOINCREMENT ids
do; ``OUTBOX_IDS_IN_COMMIT_ORDER = True``), the wrapper remembers the highest id it captured
and reads only newer rows, then deletes acknowledged rows by id range (``delete_outbox``).
With concurrent writers (PostgreSQL, MariaDB) a sequence value is taken when a row is
written, not when its transaction commits, so a smaller id can become visible later: the
wrapper reads every visible row, skips the ids its state records as captured (most of them
on the server, ``skip_clause``; the others before decoding them: ``read_outbox``'s
``skip``), and deletes
acknowledged rows by id (``delete_outbox_ids``), forgetting them only afterwards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Container, Generator, Sequence, Set
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import sqlalchemy as sa

OUTBOX = "_pvm_outbox"
"""The name of the outbox table every dialect creates in the source."""

FETCH_ROWS = 1_000
"""Outbox rows the driver fetches from the source at a time while an outbox is read (a
server-side cursor where the driver has one): a read of millions of rows is never held
whole by the driver, nor turned into rows before the wrapper takes them."""

SKIP_RUNS = 64
"""The most runs of skipped ids a read of the outbox leaves out on the server (``skip_clause``)."""

Op = Literal["I", "U", "D"]


@dataclass(frozen=True)
class OutboxRow:
    """One captured row change: ``old`` is None for an insert, ``new`` is None for a delete.
    ``txid`` is the source transaction's id where the database exposes one. ``unreadable``
    says why its JSON could not be read (then it has no values: the change is quarantined)."""

    id: int
    relation: str
    op: Op
    old: dict[str, Any] | None
    new: dict[str, Any] | None
    txid: str | None = None
    unreadable: str | None = None


def skip_clause(skip: Container[int], most: int = SKIP_RUNS) -> tuple[str, dict[str, int]]:
    """A condition on ``id`` (`` AND NOT (id BETWEEN …)``, and its parameters) that leaves
    out, on the server, the ``most`` longest runs of consecutive ids all in ``skip``: the
    rows captured already, which wait in the outbox for their acknowledgment, then do not
    cross the wire again in every poll and every subquery's snapshot (at a few hundred
    transactions a second they were thousands of rows, read and parsed each time). Every id
    of such a run is in ``skip``, and an outbox id is never given twice, so no row that is
    not in ``skip`` is left out; the rest of ``skip`` is still left out by the reader.

    >>> skip_clause({1, 2, 3, 7, 9, 10}, most=5)
    (' AND NOT (id BETWEEN :skip_lo0 AND :skip_hi0) AND NOT (id BETWEEN :skip_lo1 AND :skip_hi1)', {'skip_lo0': 1, 'skip_hi0': 3, 'skip_lo1': 9, 'skip_hi1': 10})
    >>> skip_clause(())
    ('', {})
    """
    if not isinstance(skip, Set) or len(skip) < 2:
        return "", {}
    runs: list[tuple[int, int]] = []
    ids = sorted(skip)
    start = prev = ids[0]
    for i in ids[1:]:
        if i != prev + 1:
            if prev > start:
                runs.append((start, prev))
            start = i
        prev = i
    if prev > start:
        runs.append((start, prev))
    kept = sorted(sorted(runs, key=lambda run: run[0] - run[1])[:most])  # the longest, in id order
    clause = "".join(f" AND NOT (id BETWEEN :skip_lo{i} AND :skip_hi{i})" for i in range(len(kept)))
    params = {
        name: value for i, (lo, hi) in enumerate(kept) for name, value in ((f"skip_lo{i}", lo), (f"skip_hi{i}", hi))
    }
    return clause, params


def outbox_row(id: int, relation: str, op: Op, old: str | None, new: str | None) -> OutboxRow:
    """An outbox row whose values a trigger wrote as JSON text (SQLite, MariaDB)."""
    try:
        return OutboxRow(id, relation, op, row_json(old), row_json(new))
    except ValueError as exc:
        return OutboxRow(id, relation, op, None, None, unreadable=str(exc))


def read_json_outbox(conn: sa.Connection, after: int, skip: Container[int] = ()) -> Generator[OutboxRow]:
    """``read_outbox`` of an outbox whose triggers write JSON text (SQLite, MariaDB): the rows
    visible in ``conn``'s snapshot with id > ``after`` and not in ``skip`` (left out
    undecoded), in id order, made as they are taken from the driver (``FETCH_ROWS`` at a
    time; PyMySQL's ``SSCursor``, SQLite's stepping)."""
    skipped, params = skip_clause(skip)
    result: sa.CursorResult[int, str, Op, str | None, str | None] = conn.execute(
        sa.text(f"SELECT id, relation, op, old, new FROM {OUTBOX} WHERE id > :after{skipped} ORDER BY id"),
        {"after": after, **params},
        execution_options={"yield_per": FETCH_ROWS},
    )
    with result:
        for id, relation, op, old, new in result:
            if id not in skip:
                yield outbox_row(id, relation, op, old, new)


# A JSON string, or a bare Inf / -Inf outside of strings (what SQLite before 3.42 writes for
# an infinite REAL; later versions write 9.0e+999, which json.loads reads as infinity).
_STRING_OR_INF = re.compile(r'"(?:[^"\\]|\\.)*"|(-?)\bInf\b')


def row_json(text: str | None) -> dict[str, Any] | None:
    """The row a trigger wrote as JSON; ValueError if it cannot be read.

    >>> row_json('{"v":Inf,"w":-Inf,"t":"Inf:Inf"}')
    {'v': inf, 'w': -inf, 't': 'Inf:Inf'}
    """
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    spelled = _STRING_OR_INF.sub(lambda m: m.group(0) if m.group(0)[0] == '"' else m.group(1) + "Infinity", text)
    try:
        return json.loads(spelled)
    except ValueError as exc:
        shown = text if len(text) <= 80 else text[:80] + "…"
        raise ValueError(f"malformed JSON in the outbox ({exc}): {shown}") from None


class CaptureDialect(Protocol):
    """The dialect-specific half of a wrapper; everything else is dialect-neutral."""

    OUTBOX_IDS_IN_COMMIT_ORDER: bool
    SNAPSHOTS_MAY_STAND: bool  # whether snapshots may be kept to answer later subqueries

    def open_engine(self, url: str) -> sa.Engine:
        """An engine whose transactions are real snapshot transactions, raising WrapperError
        if the database does not exist."""
        ...

    def install(self, engine: sa.Engine, tables: Sequence[str]) -> None:
        """Create the outbox and the capture triggers of ``tables`` (idempotent)."""
        ...

    def uninstall(self, engine: sa.Engine, tables: Sequence[str]) -> None:
        """Drop the triggers of ``tables``, and the outbox once no table is captured (idempotent)."""
        ...

    def begin_snapshot(self, engine: sa.Engine) -> sa.Connection:
        """A connection inside a read transaction whose snapshot is already fixed."""
        ...

    def read_outbox(self, conn: sa.Connection, after: int, skip: Container[int] = ()) -> Generator[OutboxRow]:
        """The outbox rows visible to ``conn`` with id > ``after``, but for those whose id is
        in ``skip``: in commit order where ids are; otherwise grouped by transaction, each
        transaction's rows in id order, the transactions in the order of their largest ids
        (the order write conflicts imply). Rows are made as the caller takes them, and the
        driver fetches ``FETCH_ROWS`` at a time: close the iterator (or take every row)
        before ``conn`` runs anything else.

        Skipped rows are left out before their values are decoded: where ids are not in
        commit order every read sees every captured row not yet deleted (a few hundred under
        a steady write load), and decoding them again in every poll and every subquery's
        snapshot was the largest part of a busy MariaDB wrapper's CPU time."""
        ...

    def delete_outbox(self, engine: sa.Engine, through: int) -> None:
        """Ids in commit order: delete the outbox rows with id <= ``through`` (acknowledged or filtered)."""
        ...

    def delete_outbox_ids(self, engine: sa.Engine, ids: Sequence[int]) -> None:
        """Ids not in commit order: delete exactly the outbox rows ``ids`` (acknowledged or filtered)."""
        ...

    def outbox_high_water(self, engine: sa.Engine) -> int:
        """The highest outbox id ever assigned (0 for a fresh outbox), to detect a re-created outbox."""
        ...
