"""Subqueries waiting for the handshake together share the next one
(``wrappers/shared_handshake.py``): who joins which handshake, who closes its snapshot."""

from __future__ import annotations

import asyncio

from wrappers.shared_handshake import SharedHandshakes


class Snap:
    def __init__(self, number: int) -> None:
        self.number = number
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class Handshakes:
    """A handshake that takes a numbered snapshot under ``lock`` (the capture lock) and
    waits until released before it returns it (shipping)."""

    def __init__(self) -> None:
        self.taken: list[Snap] = []
        self.gate = asyncio.Event()
        self.fail: BaseException | None = None
        self.lock = asyncio.Lock()

    async def __call__(self, cutoff) -> tuple[Snap, int]:
        async with self.lock:
            cutoff()
            snap = Snap(len(self.taken) + 1)
            self.taken.append(snap)
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return snap, snap.number


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_arrivals_during_a_handshake_share_the_next_one_and_the_last_closes_it() -> None:
    handshake = Handshakes()
    groups = SharedHandshakes(handshake)
    first = asyncio.create_task(groups.join())
    await settle()  # the first handshake has taken its snapshot: later arrivals wait for the next
    later = [asyncio.create_task(groups.join()) for _ in range(3)]
    await settle()
    assert len(handshake.taken) == 2  # the next one took its snapshot while the first ships
    handshake.gate.set()
    (held, watermark), *rest = await asyncio.gather(first, *later)
    assert watermark == 1 and {w for _, w in rest} == {2}  # the three shared snapshot 2
    assert len(handshake.taken) == 2
    held.close()
    assert handshake.taken[0].closed == 1
    shared = [h for h, _ in rest]
    shared[0].close()
    shared[1].close()
    shared[1].close()  # a second close of one hold changes nothing
    assert handshake.taken[1].closed == 0
    shared[2].close()
    assert handshake.taken[1].closed == 1


async def test_a_failed_handshake_fails_every_member_and_the_next_group_starts_afresh() -> None:
    handshake = Handshakes()
    groups = SharedHandshakes(handshake)
    handshake.fail = ConnectionError("the manager is gone")
    members = [asyncio.create_task(groups.join()) for _ in range(3)]
    await settle()
    handshake.gate.set()
    results = await asyncio.gather(*members, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    handshake.fail = None
    held, watermark = await groups.join()
    assert watermark == 2
    held.close()
    assert handshake.taken[1].closed == 1


async def test_members_that_give_up_before_the_snapshot_leave_it_closed() -> None:
    handshake = Handshakes()
    groups = SharedHandshakes(handshake)
    members = [asyncio.create_task(groups.join()) for _ in range(2)]
    await settle()
    for member in members:
        member.cancel()
    await asyncio.gather(*members, return_exceptions=True)
    handshake.gate.set()
    await settle()
    assert handshake.taken[0].closed == 1  # nobody holds it: closed once it is taken


async def test_a_group_closes_when_its_handshake_holds_the_capture_lock() -> None:
    """Arrivals while a handshake waits for the capture lock (a poll holds it) join that
    handshake; the snapshot comes after all of them."""
    handshake = Handshakes()
    handshake.gate.set()
    groups = SharedHandshakes(handshake)
    async with handshake.lock:  # a poll captures
        members = [asyncio.create_task(groups.join())]
        await settle()
        members.append(asyncio.create_task(groups.join()))
        await settle()
        assert handshake.taken == []
    joined = await asyncio.gather(*members)
    assert [w for _, w in joined] == [1, 1] and len(handshake.taken) == 1
    for held, _ in joined:
        held.close()
    assert handshake.taken[0].closed == 1
