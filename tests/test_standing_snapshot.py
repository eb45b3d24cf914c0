"""The standing snapshot's bookkeeping (wrappers/standing_snapshot.py): which snapshot
answers, and that every snapshot is closed once, when nothing reads in it any more."""

from __future__ import annotations

import asyncio

from wrappers.standing_snapshot import StandingSnapshots


class Tracked:
    def __init__(self, name: str, closed: list[str]) -> None:
        self.name = name
        self._closed = closed

    def close(self) -> None:
        self._closed.append(self.name)


def test_the_newest_stands_and_each_closes_once_when_unused() -> None:
    async def run() -> list[str]:
        closed: list[str] = []
        standing = StandingSnapshots[Tracked](max_age=60)
        standing.offer(Tracked("a", closed), 5).close()
        first, second = standing.lease(5), standing.lease(0)
        assert first is not None and second is not None and first.watermark == 5
        assert standing.lease(6) is None  # its watermark does not reach: a handshake of its own
        late = standing.offer(Tracked("old", closed), 3)  # an older handshake finishing late
        assert standing.watermark == 5 and late.watermark == 3
        late.close()
        assert closed == ["old"]  # never stood: closed with its last lease
        standing.offer(Tracked("b", closed), 8).close()
        assert closed == ["old"]  # "a" is replaced but still read in
        first.close()
        first.close()  # a lease closes once
        assert closed == ["old"]
        second.close()
        assert closed == ["old", "a"]
        assert standing.reused == 2 and standing.offered == 2
        standing.close()
        return closed

    assert asyncio.run(run()) == ["old", "a", "b"]


def test_a_snapshot_stands_for_max_age_at_most() -> None:
    async def run() -> None:
        closed: list[str] = []
        standing = StandingSnapshots[Tracked](max_age=0.05)
        standing.offer(Tracked("a", closed), 5).close()
        assert standing.watermark == 5
        await asyncio.sleep(0.1)  # its timer retires and closes it
        assert closed == ["a"] and standing.watermark is None and standing.lease(1) is None

    asyncio.run(run())


def test_a_polls_snapshot_stands_only_once_acknowledged_and_in_time() -> None:
    async def run() -> None:
        closed: list[str] = []
        standing = StandingSnapshots[Tracked](max_age=0.05)
        standing.shipping(Tracked("acked", closed), 5).stand(acked_through=5)
        assert standing.watermark == 5 and closed == []
        standing.shipping(Tracked("not acked", closed), 7).stand(acked_through=6)
        assert standing.watermark == 5 and closed == ["not acked"]
        slow = standing.shipping(Tracked("slow", closed), 9)
        await asyncio.sleep(0.1)  # shipping took longer than a snapshot may stand
        assert "slow" in closed  # closed while shipping: the source's old rows are not held
        slow.stand(acked_through=9)
        assert standing.watermark is None  # "acked" expired meanwhile, "slow" never stood
        assert sorted(closed) == ["acked", "not acked", "slow"]

    asyncio.run(run())


def test_none_stands_with_max_age_zero() -> None:
    async def run() -> None:
        closed: list[str] = []
        standing = StandingSnapshots[Tracked](max_age=0)
        lease = standing.offer(Tracked("a", closed), 5)
        assert standing.lease(0) is None and standing.watermark is None
        lease.close()
        assert closed == ["a"]

    asyncio.run(run())
