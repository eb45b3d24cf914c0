"""SendUpdates: post pending updates to the manager until it acknowledges them.

Posting is idempotent per ``(source, seq)``, so every failure (network, 5xx, a malformed or
short acknowledgment) is simply retried with capped exponential backoff for as long as the
wrapper runs. A failure streak is logged once when it starts and once when it ends.

An update with more changes than ``PART_CHANGES`` (one source transaction of any size is one
update, one seq) is sent in parts, each alone in its post, in order. The manager holds parts
in memory until the last one and logs the update whole then; so every failure, a refused
part included (a manager that restarted forgot the parts before it), starts the update again
from part 0, and the shipping position moves only with the acknowledgment of the last part.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pydantic
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never, wait_exponential

from contract.schemas import MAX_CHANGES_PER_UPDATE, Ack, Update, UpdateBatch, UpdatePart

log = logging.getLogger(__name__)

PART_CHANGES = MAX_CHANGES_PER_UPDATE
"""The most changes one message carries: a larger update is sent in parts of this many (tests
lower it to ship a transaction of a few hundred rows in parts)."""


def fits_one_message(update: Update) -> bool:
    """Whether ``update`` goes whole in a batch; else ``send_parts`` sends it."""
    return len(update.changes) <= PART_CHANGES


_WHOLE: Any = {"updates": {"__all__": {"part"}}}
"""A whole update's body leaves ``part`` out: it is what managers before parts take."""


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
    ) -> None:
        self.source = source
        self._url = manager_url.rstrip("/") + "/v1/updates"
        self._client = client
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._wait = wait_exponential(multiplier=first_wait, max=max_wait)

    async def send(self, updates: list[Update], last_seq: int) -> int:
        """Post ``updates`` (consecutive seqs) until the manager holds at least the first one.

        Returns the seq through which the manager acknowledged, never above ``last_seq`` (the
        last seq this wrapper assigned).
        """
        batch = UpdateBatch(source=self.source, updates=updates).model_dump_json(exclude=_WHOLE)
        return await self._retrying(lambda: self._post(batch, updates[0].seq, last_seq))

    async def send_parts(self, update: Update, last_seq: int) -> int:
        """Post ``update`` in parts of ``PART_CHANGES`` changes, from part 0, until the manager
        holds it whole (every failure starts again from part 0); the seq acknowledged through,
        as ``send``."""
        return await self._retrying(lambda: self._post_parts(update, last_seq))

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

    async def _post_parts(self, update: Update, last_seq: int) -> int:
        size = PART_CHANGES
        count = max(1, -(-len(update.changes) // size))
        for index in range(count):
            part = Update(
                seq=update.seq,
                changes=update.changes[index * size : (index + 1) * size],
                txid=update.txid,
                captured_at=update.captured_at,
                part=UpdatePart(index=index, last=index == count - 1),
            )
            ack = await self._acknowledgment(
                UpdateBatch(source=self.source, updates=[part]).model_dump_json(), last_seq
            )
            if ack.through >= update.seq:
                return ack.through  # whole (part 0 of a seq the manager has: it says so at once)
            if index == count - 1:
                raise ShipError(f"the manager acknowledged only through seq {ack.through} after the last part")
            if ack.parts != index + 1:
                raise ShipError(
                    f"the manager holds {ack.parts} part(s) of seq {update.seq} after part {index}; resending from part 0"
                )
        raise AssertionError("unreachable: the last part returns or raises")

    async def _post(self, body: str, first: int, last_seq: int) -> int:
        ack = await self._acknowledgment(body, last_seq)
        if ack.through < first:
            raise ShipError(f"the manager acknowledged only through seq {ack.through} (held: {ack.held[:10]})")
        return ack.through

    async def _acknowledgment(self, body: str, last_seq: int) -> Ack:
        response = await self._client.post(self._url, content=body, headers=self._headers)
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
