"""A subquery's updates past the post in flight go beside it (``Wrapper._overtake``)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.fake_manager import FakeManager
from wrappers.wrapper import Wrapper, WrapperConfig

SLOW = 0.8
"""Seconds the fake manager takes over each slow post."""


def insert(path: Path, key: int) -> None:
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO r VALUES (?, 'x')", (key,))


@asynccontextmanager
async def wrapper_of(tmp_path: Path, manager: FakeManager) -> AsyncIterator[tuple[Wrapper, Path]]:
    """A wrapper of an SQLite source whose ship loop, after its first step, waits an hour:
    the test ships by hand."""
    path = tmp_path / "src.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE r (id INTEGER PRIMARY KEY, v TEXT)")
    config = WrapperConfig(
        "src", f"sqlite:///{path}", ("r",), manager.url, state_dir=tmp_path / "state", poll_interval=3600.0
    )
    wrapper = Wrapper(config)
    await wrapper.start()
    try:
        yield wrapper, path
    finally:
        await wrapper.stop()


async def post_in_flight(wrapper: Wrapper, path: Path) -> asyncio.Task[None]:
    """Seq 1 captured, and its post under way (under the ship lock, as the ship loop's)."""
    insert(path, 1)
    await wrapper._capture_locked()
    shipping = asyncio.create_task(wrapper._ship_pending())
    deadline = time.monotonic() + 10
    while wrapper._in_flight_through != 1:
        assert time.monotonic() < deadline and not shipping.done(), "the post of seq 1 never got under way"
        await asyncio.sleep(0.005)
    return shipping


async def test_a_subquery_posts_its_updates_beside_the_post_in_flight(tmp_path: Path) -> None:
    with FakeManager() as manager:
        manager.delays = [SLOW, SLOW]  # the post in flight, and the subquery's
        async with wrapper_of(tmp_path, manager) as (wrapper, path):
            shipping = await post_in_flight(wrapper, path)
            insert(path, 2)
            began = time.monotonic()
            snapshot, watermark = await wrapper._snapshot_shipped_through()
            took = time.monotonic() - began
            snapshot.close()
            await shipping
            assert watermark == 2 and wrapper.state.acked_through == 2
    # side by side: about one slow post, where one after the other takes two
    assert took < 1.5 * SLOW, took
    assert [[u.seq for u in b.updates] for b in manager.posts] == [[1], [2]]
    assert [u.changes[0].row["id"] for u in manager.updates("src")] == [1, 2]


async def test_a_failed_post_beside_the_one_in_flight_goes_again_in_turn(tmp_path: Path) -> None:
    with FakeManager() as manager:
        manager.delays = [SLOW]
        async with wrapper_of(tmp_path, manager) as (wrapper, path):
            shipping = await post_in_flight(wrapper, path)
            manager.fail_posts = 1  # the next post handled: the subquery's, while the first waits
            insert(path, 2)
            snapshot, watermark = await wrapper._snapshot_shipped_through()
            snapshot.close()
            await shipping
            assert watermark == 2 and wrapper.state.acked_through == 2
            assert wrapper.health()["shipping_error"] is None  # tried once, not a failing streak
    # seq 2 refused beside seq 1, then sent again once seq 1 was acknowledged
    assert [[u.seq for u in b.updates] for b in manager.posts] == [[2], [1], [2]]
    assert [u.changes[0].row["id"] for u in manager.updates("src")] == [1, 2]


async def test_a_retried_post_takes_an_answer_that_covers_seqs_assigned_meanwhile(tmp_path: Path) -> None:
    """The post in flight fails after the subquery's post beside it was taken: its retry is
    answered through the subquery's seqs, assigned after the post began, which are this
    wrapper's all the same."""
    with FakeManager() as manager:
        manager.delays = [SLOW]
        async with wrapper_of(tmp_path, manager) as (wrapper, path):
            shipping = await post_in_flight(wrapper, path)
            insert(path, 2)
            subquery = asyncio.create_task(wrapper._snapshot_shipped_through())
            deadline = time.monotonic() + 10
            while not manager.posts:  # the subquery's post of seq 2, taken while seq 1's waits
                assert time.monotonic() < deadline and not subquery.done(), "seq 2 was not posted beside seq 1"
                await asyncio.sleep(0.005)
            manager.fail_posts = 1  # seq 1's post fails once: its retry is answered through seq 2
            snapshot, watermark = await asyncio.wait_for(subquery, 30)
            snapshot.close()
            await asyncio.wait_for(shipping, 30)
            assert watermark == 2 and wrapper.state.acked_through == 2
            assert wrapper.health()["shipping_error"] is None
    assert [u.changes[0].row["id"] for u in manager.updates("src")] == [1, 2]


async def test_updates_acknowledged_while_a_post_beside_reads_them_are_left_alone(tmp_path: Path) -> None:
    """A post beside the one in flight read updates that an earlier post beside it had
    delivered; the post in flight is acknowledged through them, which forgets them, before
    their changes are read: the second post beside gives way, and nothing fails."""
    with FakeManager() as manager:
        manager.delays = [SLOW]  # the post in flight
        async with wrapper_of(tmp_path, manager) as (wrapper, path):
            shipping = await post_in_flight(wrapper, path)
            insert(path, 2)
            await wrapper._capture_locked()
            await wrapper._overtake(1)  # seq 2, held above the gap by the manager
            insert(path, 3)
            await wrapper._capture_locked()
            whole = wrapper._whole

            def after_the_acknowledgment(heads):  # on a thread, as the post beside reads them
                deadline = time.monotonic() + 10
                while wrapper.state.acked_through < 2:  # seq 1's post fills the gap: through 2
                    assert time.monotonic() < deadline, "the post in flight was never acknowledged"
                    time.sleep(0.005)
                return whole(heads)

            wrapper._whole = after_the_acknowledgment  # type: ignore[method-assign]
            await wrapper._overtake(1)  # reads seqs 2 and 3; seq 2 is forgotten before its changes
            await shipping
            wrapper._whole = whole  # type: ignore[method-assign]
            await wrapper._ship_pending()
            assert manager.through("src") == 3


async def test_the_ship_lock_s_turn_reads_what_a_post_beside_left_unacknowledged(tmp_path: Path) -> None:
    """The post in flight is answered first (through seq 1), the post beside it later (through
    seq 2, which it carried). The ship lock's next turn waits for the post beside, and then
    must not read seq 2: the post beside's acknowledgment forgets it. It used to be applied
    after the turn was let go, so the turn could read seq 2's head while its changes were
    being forgotten ("part 0 of pending update seq 2 is missing", a subquery's 503, seen
    under load). Here the acknowledgment's thread is slow, and the turn's read of the
    changes waits for it."""
    with FakeManager() as manager:
        manager.delays = [0.3, SLOW]  # seq 1's post is handled first, the post beside after it
        async with wrapper_of(tmp_path, manager) as (wrapper, path):
            shipping = await post_in_flight(wrapper, path)  # then ships whatever is pending
            insert(path, 2)
            await wrapper._capture_locked()
            whole, calls = wrapper._whole, []

            def late_for_the_turn(heads):  # on a thread: the post beside's read, then the turn's
                calls.append([h.seq for h in heads])
                deadline = time.monotonic() + 10
                while len(calls) > 1 and wrapper.state.acked_through < 2:
                    assert time.monotonic() < deadline, "the post beside was never acknowledged"
                    time.sleep(0.005)
                return whole(heads)

            ack = wrapper.state.ack

            def late_ack(through: int) -> None:  # its thread scheduled after the turn's read
                time.sleep(0.2)
                ack(through)

            wrapper._whole = late_for_the_turn  # type: ignore[method-assign]
            wrapper.state.ack = late_ack  # type: ignore[method-assign]
            await asyncio.gather(wrapper._overtake(1), shipping)
            assert wrapper.state.acked_through == 2 and calls == [[2]]
    assert [u.changes[0].row["id"] for u in manager.updates("src")] == [1, 2]
