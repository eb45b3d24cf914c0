"""SendUpdates: post pending updates to the manager until it acknowledges them.

Posting is idempotent per ``(source, seq)``, so every failure (network, 5xx, a malformed or
short acknowledgment) is simply retried with capped exponential backoff for as long as the
wrapper runs. A failure streak is logged once when it starts and once when it ends.

An update stored in more than one part (``wrappers.parts``: one source transaction of any
size is one update, one seq) is sent in parts, each alone in its post, in order, read from
the wrapper's state one at a time as it is posted (``send_parts``): the shipper never holds
more than one part of it. The manager stages the parts until the last one and logs the
update whole then; every failure, a refused part included (a manager older than staged parts
forgets them when it restarts), starts the update again from part 0, and the shipping
position moves only with the acknowledgment of the last part. ``held`` counts the changes
being sent: the part in flight, or the whole updates of a ``send``.

Each post's body is chosen by its size: a batch (or a part) of at least ``arrow_from``
changes goes as an update stream (``contract.update_stream``: Arrow IPC, a quarter to a
third of JSON's time for both sides from 1,000 changes on, half the bytes), a smaller one as JSON, which
is cheaper there. A manager that answers an update stream with 400 or 415 (one older than
the stream, which reads every body as JSON) gets JSON from then on; ``encoding="json"``
sends JSON from the start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pydantic
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never, wait_exponential

from contract.schemas import Ack, Change, Update, UpdateBatch, UpdatePart
from contract.update_stream import ARROW_FROM_CHANGES, UPDATE_STREAM_CONTENT_TYPE, encode_update_batch
from wrappers.parts import HeldChanges, UpdateHead

log = logging.getLogger(__name__)

ReadPart = Callable[[int], Awaitable[list[Change]]]
"""Reads part ``index`` of the update being sent in parts (from the wrapper's state)."""

_WHOLE: Any = {"updates": {"__all__": {"part"}}}
"""A whole update's body leaves ``part`` out: it is what managers before parts take."""

UPDATE_ENCODINGS = ("auto", "json")
"""How a wrapper encodes its posts: ``auto`` by size (an update stream from ``arrow_from``
changes on), ``json`` always (for a manager older than the update stream)."""

_REFUSED_STREAM = (400, 415)
"""The answers of a manager that does not read an update stream (an older one reads it as
malformed JSON: 400)."""


def uses_stream(updates: list[Update], arrow_from: int) -> bool:
    """Whether a post of ``updates`` goes as an update stream: from ``arrow_from`` changes on.

    >>> from contract.schemas import Change
    >>> small = Update(seq=1, changes=[Change(relation="r", sign=1, row={"k": 1})] * 99)
    >>> uses_stream([small], 100), uses_stream([small, small], 100)
    (False, True)
    """
    return sum(len(u.changes) for u in updates) >= arrow_from


@dataclass(frozen=True)
class Body:
    """One post's body, ready to send: its bytes and headers, and whether it is a stream."""

    content: bytes
    headers: dict[str, str]
    stream: bool


class ShipError(Exception):
    """One failed attempt to deliver a batch; always retried."""


class Shipper:
    """Delivers batches of one source's updates to ``POST {manager_url}/v1/updates``."""

    def __init__(
        self,
        source: str,
        manager_url: str,
        client: httpx.AsyncClient,
        token: str | None = None,
        *,
        first_wait: float = 0.05,
        max_wait: float = 5.0,
        encoding: str = "auto",
        arrow_from: int | None = None,
        held: HeldChanges | None = None,
    ) -> None:
        if encoding not in UPDATE_ENCODINGS:
            raise ValueError(f"update encoding {encoding!r}: one of {', '.join(UPDATE_ENCODINGS)}")
        self.source = source
        self._url = manager_url.rstrip("/") + "/v1/updates"
        self._client = client
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._stream_headers = {**self._headers, "Content-Type": UPDATE_STREAM_CONTENT_TYPE}
        self._wait = wait_exponential(multiplier=first_wait, max=max_wait)
        self.streams = encoding == "auto"
        """Whether posts of ``arrow_from`` changes or more go as update streams (until a
        manager refuses one)."""
        self.arrow_from = ARROW_FROM_CHANGES if arrow_from is None else arrow_from  # read now: tests lower it
        self.held = held or HeldChanges()

    async def send(self, updates: list[Update], last_seq: int) -> int:
        """Post ``updates`` (consecutive seqs) until the manager holds at least the first one.

        Returns the seq through which the manager acknowledged, never above ``last_seq`` (the
        last seq this wrapper assigned).
        """
        bodies: dict[bool, Body] = {}  # encoded once per kind, not on every retry

        async def attempt() -> int:
            if self.streams not in bodies:
                bodies[self.streams] = await self.body(updates)
            return await self._post(bodies[self.streams], updates[0].seq, last_seq)

        changes = sum(len(u.changes) for u in updates)
        self.held.hold(changes)
        try:
            return await self._retrying(attempt)
        finally:
            self.held.release(changes)

    async def body(self, updates: list[Update]) -> Body:
        """The body of a post of ``updates``: an update stream or JSON, by size (see the
        module's docstring). The stream is encoded off the event loop: it is Python work in
        proportion to the changes, and the loop answers subqueries meanwhile."""
        if self.streams and uses_stream(updates, self.arrow_from):
            stream = await asyncio.to_thread(encode_update_batch, self.source, updates)
            if stream is not None:  # else more row shapes than a stream holds
                return Body(stream, self._stream_headers, stream=True)
        whole = all(u.part is None for u in updates)
        text = UpdateBatch(source=self.source, updates=updates).model_dump_json(exclude=_WHOLE if whole else None)
        return Body(text.encode(), self._headers, stream=False)

    async def send_parts(self, update: UpdateHead, read_part: ReadPart, last_seq: int) -> int:
        """Post ``update``'s parts, each read with ``read_part`` as it goes, from part 0, until
        the manager holds it whole (every failure starts again from part 0); the seq
        acknowledged through, as ``send``."""
        return await self._retrying(lambda: self._post_parts(update, read_part, last_seq))

    async def _retrying(self, attempt_once: Callable[[], Awaitable[int]]) -> int:
        retrying = AsyncRetrying(
            wait=self._wait,
            stop=stop_never,
            retry=retry_if_exception_type((httpx.HTTPError, ShipError)),
            before_sleep=self._log_failure,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                through = await attempt_once()
                if attempt.retry_state.attempt_number > 1:
                    log.info(
                        "shipping to %s recovered after %d attempts", self._url, attempt.retry_state.attempt_number
                    )
        return through

    async def _post_parts(self, update: UpdateHead, read_part: ReadPart, last_seq: int) -> int:
        for index in range(update.parts):
            changes = await read_part(index)
            self.held.hold(len(changes))
            try:
                part = Update.model_construct(
                    seq=update.seq,
                    changes=changes,
                    txid=update.txid,
                    captured_at=update.captured_at,
                    part=UpdatePart(index=index, last=index == update.parts - 1),
                )
                ack = await self._acknowledgment(await self.body([part]), last_seq)
            finally:
                self.held.release(len(changes))
            if ack.through >= update.seq:
                return ack.through  # whole (part 0 of a seq the manager has: it says so at once)
            if index == update.parts - 1:
                raise ShipError(f"the manager acknowledged only through seq {ack.through} after the last part")
            if ack.parts != index + 1:
                raise ShipError(
                    f"the manager holds {ack.parts} part(s) of seq {update.seq} after part {index}; resending from part 0"
                )
        raise AssertionError("unreachable: the last part returns or raises")

    async def _post(self, body: Body, first: int, last_seq: int) -> int:
        ack = await self._acknowledgment(body, last_seq)
        if ack.through < first:
            raise ShipError(f"the manager acknowledged only through seq {ack.through} (held: {ack.held[:10]})")
        return ack.through

    async def _acknowledgment(self, body: Body, last_seq: int) -> Ack:
        response = await self._client.post(self._url, content=body.content, headers=body.headers)
        if body.stream and response.status_code in _REFUSED_STREAM:
            self.streams = False
            log.warning(
                "the manager at %s refused an update stream (HTTP %d: %s); shipping JSON from now on",
                self._url,
                response.status_code,
                response.text[:300],
            )
        if response.status_code >= 300:
            raise ShipError(f"HTTP {response.status_code}: {response.text[:300]}")
        try:
            ack = Ack.model_validate_json(response.content)
        except pydantic.ValidationError as exc:
            raise ShipError(f"malformed acknowledgment: {exc}") from exc
        if ack.through > last_seq:
            # Accepting this would drop our updates as duplicates of ones the manager got
            # from an earlier wrapper state: refuse loudly rather than lose them.
            raise ShipError(
                f"the manager acknowledged seq {ack.through} but this wrapper assigned only {last_seq}: "
                "the wrapper state does not belong to this manager's history of the source"
            )
        return ack

    def _log_failure(self, state: RetryCallState) -> None:
        if state.attempt_number == 1 and state.outcome is not None:
            log.warning("cannot ship updates to %s (retrying until it works): %s", self._url, state.outcome.exception())
