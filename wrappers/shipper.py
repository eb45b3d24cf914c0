"""SendUpdates: post pending updates to the manager until it acknowledges them.

Posting is idempotent per ``(source, seq)``, so every failure (network, 5xx, a malformed or
short acknowledgment, a refusal) is simply retried with capped exponential backoff for as
long as the wrapper runs: a manager may be fixed or upgraded meanwhile. A failure streak is
logged once when it starts and once when it ends, and ``failing`` keeps its last error, since
when and how many posts failed (one record; the wrapper's health shows it) until a post is
acknowledged.

An update stored in more than one part (``wrappers.parts``: one source transaction of any
size is one update, one seq) is sent in parts, each alone in its post, in order, read from
the wrapper's state one at a time as it is posted (``send_parts``): the shipper never holds
more than one part of it. The manager stages the parts (in its catalog: they outlive its
restarts) until the last one and logs the update whole then; the shipping position moves
only with the acknowledgment of the last part. A failure does not start the update again:
the next try goes on from the first part the manager does not hold, as the manager said
last, never as the shipper supposes:

* each part's acknowledgment counts the parts staged (``Ack.parts``): after a failed post
  (a network error, a timeout, a 5xx, a 413) the same part goes again;
* the manager checks that a part continues what it staged, and refuses one that does not
  with 409 saying what it holds (``PartRefusal``): the parts staged of the update, from which
  the shipper goes on (a post whose answer was lost was staged: the next part follows), or
  ``through`` covering the seq (its last part was logged: done);
* a manager that holds none of the update (it forgot its staged parts: an older one that
  restarted), or that refuses without saying what it holds (one older than ``PartRefusal``),
  or whose answer does not add up, gets the update again from part 0, which starts it
  afresh. The update still arrives whole and once: part 0 drops whatever was staged, and a
  seq is logged once.

Where the shipper goes on is known only within one ``send_parts``, which starts at part 0: a
wrapper that restarted sends its pending update from part 0. So every staged part the
shipper goes on from was posted by this ``send_parts``, after part 0, of the same stored
parts. ``held`` counts the changes being sent: the part in flight, or the whole updates of
a ``send``.

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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pydantic
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never, wait_exponential

from contract.schemas import Ack, Change, PartRefusal, Update, UpdateBatch, UpdatePart
from contract.update_stream import ARROW_FROM_CHANGES, UPDATE_STREAM_CONTENT_TYPE, encode_update_batch
from wrappers.parts import HeldChanges, UpdateHead

log = logging.getLogger(__name__)

ReadPart = Callable[[int], Awaitable[list[Change]]]
"""Reads part ``index`` of the update being sent in parts (from the wrapper's state)."""

LastSeq = Callable[[], int]
"""The last seq the wrapper assigned, asked when an answer comes: it grows while a post is
retried, and a post beside it may have the manager acknowledge the newer seqs."""

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
    """One failed attempt to deliver a batch; always retried. ``status`` and ``content``: the
    manager's answer, if it answered with an error."""

    def __init__(self, message: str, status: int | None = None, content: bytes = b"") -> None:
        super().__init__(message)
        self.status = status
        self.content = content


@dataclass
class ShipFailure:
    """The posts failing since ``since`` (unix time): ``attempts`` of them, the last with
    ``error`` (``status``: the manager's HTTP status; None: no answer, a network error or a
    timeout)."""

    error: str
    status: int | None
    since: float
    attempts: int = 1


@dataclass
class _Staged:
    """How many parts of the update being sent the manager holds, as it last said: where the
    next try goes on."""

    parts: int = 0


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
        self.failing: ShipFailure | None = None
        """The current streak of failed posts; None once a post is acknowledged."""

    async def send(self, updates: list[Update], last_seq: LastSeq) -> int:
        """Post ``updates`` (consecutive seqs) until the manager holds at least the first one.

        Returns the seq through which the manager acknowledged, never above ``last_seq()``
        (the last seq this wrapper assigned).
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

    async def send_ahead(self, updates: list[Update], last_seq: LastSeq) -> int:
        """One post of ``updates`` (consecutive seqs) while an earlier post may still be under
        way: the manager holds them above the gap it leaves (``Ack.held``) until it is filled.
        The seq acknowledged through, which may be below them; ShipError (not retried, and not
        counted in ``failing``: the caller ships them again in turn) unless the manager holds
        every one of them."""
        changes = sum(len(u.changes) for u in updates)
        self.held.hold(changes)
        try:
            ack = await self._acknowledgment(await self.body(updates), last_seq)
        finally:
            self.held.release(changes)
        held = set(ack.held)
        missing = [u.seq for u in updates if u.seq > ack.through and u.seq not in held]
        if missing:
            raise ShipError(
                f"the manager holds neither seq {missing[0]} nor the ones before it (through {ack.through})"
            )
        return ack.through

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

    async def send_parts(self, update: UpdateHead, read_part: ReadPart, last_seq: LastSeq) -> int:
        """Post ``update``'s parts, each read with ``read_part`` as it goes, from part 0, until
        the manager holds it whole; after a failure, from the first part the manager does not
        hold (see the module's docstring). The seq acknowledged through, as ``send``."""
        staged = _Staged()
        return await self._retrying(lambda: self._post_parts(update, read_part, last_seq, staged))

    async def _retrying(self, attempt_once: Callable[[], Awaitable[int]]) -> int:
        retrying = AsyncRetrying(
            wait=self._wait,
            stop=stop_never,
            retry=retry_if_exception_type((httpx.HTTPError, ShipError)),
            before_sleep=self._failed,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                through = await attempt_once()
                self.failing = None  # delivered (a refused last part may say so too)
                if attempt.retry_state.attempt_number > 1:
                    log.info(
                        "shipping to %s recovered after %d attempts", self._url, attempt.retry_state.attempt_number
                    )
        return through

    async def _post_parts(self, update: UpdateHead, read_part: ReadPart, last_seq: LastSeq, staged: _Staged) -> int:
        """One try at ``update``, from part ``staged.parts``; ``staged`` follows what the
        manager says it holds as the parts go (0: start over)."""
        if staged.parts:
            log.info("update seq %d: the manager holds parts 0-%d; going on from there", update.seq, staged.parts - 1)
        for index in range(staged.parts, update.parts):
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
            except ShipError as error:
                if error.status != 409:
                    raise  # the manager took nothing of it, or did without answering: the part goes again
                through = self._refused(error, update, index, last_seq, staged)
                if through is not None:
                    return through
                raise
            finally:
                self.held.release(len(changes))
            if ack.through >= update.seq:
                return ack.through  # whole (part 0 of a seq the manager has: it says so at once)
            staged.parts = 0  # unless the answer adds up, below
            if index == update.parts - 1:
                raise ShipError(f"the manager acknowledged only through seq {ack.through} after the last part")
            if ack.parts != index + 1:
                raise ShipError(
                    f"the manager holds {ack.parts} part(s) of seq {update.seq} after part {index}; resending from part 0"
                )
            staged.parts = index + 1
        raise AssertionError("unreachable: the last part returns or raises")

    @staticmethod
    def _refused(error: ShipError, update: UpdateHead, index: int, last_seq: LastSeq, staged: _Staged) -> int | None:
        """Part ``index`` was refused (409): where to go on, from what the manager says it
        holds (``PartRefusal``) into ``staged``; the seq acknowledged through if the manager
        has the update whole. Part 0 again if it does not say, or its answer does not add up."""
        staged.parts = 0
        try:
            refusal = PartRefusal.model_validate_json(error.content)
        except pydantic.ValidationError:
            return None  # a manager older than PartRefusal, or another conflict: from part 0
        if refusal.through is None or refusal.parts is None:
            return None
        if refusal.through > last_seq():
            raise ShipError(_not_this_history(refusal.through, last_seq())) from error
        if refusal.through >= update.seq:
            return refusal.through  # its last part was logged, and the answer lost
        if refusal.parts != index and refusal.parts <= min(index + 1, update.parts - 1):
            staged.parts = refusal.parts  # else it refused what it asks for, or holds what was not posted
        return None

    async def _post(self, body: Body, first: int, last_seq: LastSeq) -> int:
        ack = await self._acknowledgment(body, last_seq)
        if ack.through < first:
            raise ShipError(f"the manager acknowledged only through seq {ack.through} (held: {ack.held[:10]})")
        return ack.through

    async def _acknowledgment(self, body: Body, last_seq: LastSeq) -> Ack:
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
            raise ShipError(
                f"HTTP {response.status_code}: {response.text[:300]}", response.status_code, response.content
            )
        try:
            ack = Ack.model_validate_json(response.content)
        except pydantic.ValidationError as exc:
            raise ShipError(f"malformed acknowledgment: {exc}") from exc
        if ack.through > last_seq():
            # Accepting this would drop our updates as duplicates of ones the manager got
            # from an earlier wrapper state: refuse loudly rather than lose them.
            raise ShipError(_not_this_history(ack.through, last_seq()))
        return ack

    def _failed(self, state: RetryCallState) -> None:
        """Note a failed try in ``failing`` (the first of a streak is logged too)."""
        error = state.outcome.exception() if state.outcome is not None else None
        if error is None:
            return
        if state.attempt_number == 1:
            log.warning("cannot ship updates to %s (retrying until it works): %s", self._url, error)
        status = error.status if isinstance(error, ShipError) else None
        text = (str(error) if isinstance(error, ShipError) else f"{type(error).__name__}: {error}")[:500]
        if self.failing is None:
            self.failing = ShipFailure(text, status, time.time())
        else:
            self.failing.error, self.failing.status = text, status
            self.failing.attempts += 1


def _not_this_history(through: int, last_seq: int) -> str:
    return (
        f"the manager acknowledged seq {through} but this wrapper assigned only {last_seq}: "
        "the wrapper state does not belong to this manager's history of the source"
    )
