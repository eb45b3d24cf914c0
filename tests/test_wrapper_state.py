"""The wrapper's durable state: seqs, pending updates, acknowledgments, interest, locking."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from contract.schemas import Change, Interest, RelationInterest
from wrappers.capture import sqlite as capture
from wrappers.errors import WrapperError
from wrappers.parts import PartCutter, PartLimits, UpdateHead
from wrappers.state import StoredUpdate, WrapperState
from wrappers.wrapper import Wrapper, WrapperConfig


def change(i: int) -> list[Change]:
    return [Change(relation="r", sign=1, row={"id": i})]


def record(state: WrapperState, changes: list[Change], outbox_through: int) -> int | None:
    """Capture ``changes`` as the next update (its parts, then its record), as capture does."""
    if not changes:
        return state.record(None, outbox_through)
    cutter = PartCutter(PartLimits(changes=2))
    parts = cutter.add(changes)
    parts += [p for p in [cutter.cut()] if p is not None]
    seq = state.last_seq + 1
    for index, part in enumerate(parts):
        state.write_part(seq, index, part.text)
    size = sum(len(p.text) for p in parts)
    return state.record(UpdateHead(seq, None, 1.5, len(parts), len(changes), size), outbox_through)


def test_seqs_pending_and_acks_survive_a_restart(tmp_path: Path) -> None:
    state = WrapperState(tmp_path, "shop")
    assert record(state, change(1), outbox_through=3) == 1
    assert record(state, [], outbox_through=5) is None  # filtered away: no seq
    assert record(state, change(2) + change(3) + change(4), outbox_through=7) == 2
    assert state.deletable_through() == 0  # update 1 (outbox 1..3) is not acknowledged
    state.ack(1)
    assert state.deletable_through() == 5  # update 2 covers outbox 6..7
    interest = Interest(relations={"r": RelationInterest(columns=["id"], where=[None])})
    state.set_interest(interest)
    before = state.pending(10)
    state.close()

    again = WrapperState(tmp_path, "shop")
    assert (again.last_seq, again.acked_through, again.captured_through) == (2, 1, 7)
    assert again.pending(10) == before and [u.seq for u in before] == [2]
    assert [again.part(2, i) for i in range(before[0].parts)] == [change(2) + change(3), change(4)]
    assert again.has_pending
    assert again.interest == interest
    again.ack(2)
    assert again.pending(10) == [] and again.pending_count() == 0
    assert not again.has_pending
    assert again.deletable_through() == 7
    again.close()


def test_has_pending_agrees_with_pending(tmp_path: Path) -> None:
    """The ship loop asks ``has_pending`` (no query) before it reads ``pending``."""
    state = WrapperState(tmp_path, "shop")
    assert not state.has_pending
    for i in range(1, 5):
        record(state, change(i), outbox_through=i)
        record(state, [], outbox_through=i)  # filtered away: nothing more to ship
        assert state.has_pending == bool(state.pending(10))
    for through in (1, 3, 4):
        state.ack(through)
        assert state.has_pending == bool(state.pending(10)) == (through < 4)
    state.close()


def test_parts_of_a_capture_never_recorded_are_dropped(tmp_path: Path) -> None:
    """A wrapper that stops (or a read that fails) while it writes an update's parts leaves
    them under a seq it never assigned: the next capture, and the next start, drop them."""
    state = WrapperState(tmp_path, "shop")
    record(state, change(1), outbox_through=1)
    state.write_part(2, 0, b'[{"relation":"r","sign":1,"row":{"id":99}}]')  # then the capture failed
    state.drop_unrecorded()
    assert record(state, change(2), outbox_through=2) == 2
    assert [state.part(2, 0)] == [change(2)]
    state.write_part(3, 0, b'[{"relation":"r","sign":1,"row":{"id":99}}]')  # then the wrapper stopped
    state.close()
    again = WrapperState(tmp_path, "shop")
    assert [h.seq for h in again.pending(10)] == [1, 2]
    with pytest.raises(WrapperError, match="part 0 of pending update seq 3 is missing"):
        again.part(3, 0)
    again.close()


def test_whole_updates_an_earlier_version_kept_are_cut_into_parts(tmp_path: Path) -> None:
    """Pending updates of an earlier version's state (each whole in its row) ship in parts."""
    state = WrapperState(tmp_path, "shop")
    state.close()
    whole = StoredUpdate(seq=1, changes=[c for i in range(5) for c in change(i)], txid="7", captured_at=2.0)
    with sqlite3.connect(tmp_path / "shop.state.sqlite3") as db:
        db.execute("INSERT INTO pending VALUES (1, ?, 0, 9)", (whole.model_dump_json(),))
        db.execute("INSERT INTO meta VALUES ('last_seq', '1')")
    again = WrapperState(tmp_path, "shop", PartLimits(changes=2))
    [head] = again.pending(10)
    assert (head.seq, head.txid, head.captured_at, head.parts, head.changes) == (1, "7", 2.0, 3, 5)
    assert [c for i in range(3) for c in again.part(1, i)] == whole.changes
    again.close()
    third = WrapperState(tmp_path, "shop")
    assert third.pending(10) == [head] and third.part(1, 2) == whole.changes[4:]  # cut once
    third.close()


def test_one_wrapper_per_state_and_source(tmp_path: Path) -> None:
    state = WrapperState(tmp_path, "shop")
    with pytest.raises(WrapperError, match="another wrapper"):
        WrapperState(tmp_path, "shop")
    state.close()
    (tmp_path / "other.state.sqlite3").write_bytes((tmp_path / "shop.state.sqlite3").read_bytes())
    with pytest.raises(WrapperError, match="state of source 'shop', not 'other'"):
        WrapperState(tmp_path, "other")
    with pytest.raises(WrapperError, match="invalid source name"):
        WrapperState(tmp_path, "../escape")


def test_a_recreated_outbox_is_not_mistaken_for_the_old_one(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "src.db") as db:
        db.execute("CREATE TABLE r (id INTEGER PRIMARY KEY)")
    config = WrapperConfig(
        "shop", f"sqlite:///{tmp_path / 'src.db'}", ("r",), "http://unused", state_dir=tmp_path / "state"
    )
    wrapper = Wrapper(config)
    with sqlite3.connect(tmp_path / "src.db") as db:
        db.executemany("INSERT INTO r VALUES (?)", [(1,), (2,)])
    wrapper._capture_now()  # outbox rows 1..2 become seq 1
    assert wrapper.state.last_seq == 1
    asyncio.run(wrapper.stop())

    engine = capture.open_engine(config.url)
    capture.uninstall(engine, ["r"])  # drops the outbox and its id counter
    engine.dispose()
    with pytest.raises(WrapperError, match="re-created"):
        Wrapper(config)


async def returned(engine, seconds: float = 10.0) -> None:
    """Wait until every connection of ``engine`` is back in its pool: a snapshot closes in its
    own thread, which a busy machine may run late."""
    deadline = asyncio.get_running_loop().time() + seconds
    while engine.pool.checkedout():
        assert asyncio.get_running_loop().time() < deadline, "a closed snapshot kept its connection"
        await asyncio.sleep(0.01)


async def test_snapshot_threads_are_reused_once_closed(tmp_path: Path) -> None:
    """A subquery's snapshot runs in a thread of its own; a closed snapshot's thread serves
    the next one, and a snapshot whose first step fails closes its connection."""
    import threading

    from wrappers.snapshot import Snapshot

    db = tmp_path / "src.db"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE r (id INTEGER PRIMARY KEY)")
    engine = capture.open_engine(f"sqlite:///{db}")
    try:
        first = await Snapshot.open(capture, engine)
        second = await Snapshot.open(capture, engine)
        idents = {await s.run(lambda _: threading.current_thread()) for s in (first, second)}
        assert len(idents) == 2  # open snapshots never share a thread
        first.close()
        second.close()
        await returned(engine)  # closing runs in the snapshot's own thread
        third = await Snapshot.open(capture, engine)
        assert await third.run(lambda _: threading.current_thread()) in idents
        third.close()
        await returned(engine)

        def fail(_: object) -> None:
            raise RuntimeError("capture failed")

        with pytest.raises(RuntimeError, match="capture failed"):
            await Snapshot.open(capture, engine, then=fail)
        assert engine.pool.checkedout() == 0  # the connection went back at once
    finally:
        engine.dispose()


@pytest.mark.parametrize("answers", [(3, 1), (1, 3), (3, 3)])
def test_the_acknowledged_position_never_moves_backwards(tmp_path: Path, answers: tuple[int, int]) -> None:
    """The answers of two posts in flight side by side may arrive in any order."""
    state = WrapperState(tmp_path, "shop")
    for i in (1, 2, 3):
        record(state, change(i), outbox_through=i)
    for through in answers:
        state.ack(through)
    assert state.acked_through == 3 and state.pending(10) == []
    state.close()
    again = WrapperState(tmp_path, "shop")
    assert again.acked_through == 3
    again.close()
