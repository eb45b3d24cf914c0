"""SendUpdates: post pending updates to the manager until it acknowledges them.

Posting is idempotent per ``(source, seq)``, so every failure (network, 5xx, a malformed or
short acknowledgment) is simply retried with capped exponential backoff for as long as the
wrapper runs. A failure streak is logged once when it starts and once when it ends.
"""

from __future__ import annotations

import logging

import httpx
import pydantic
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never, wait_exponential

from contract.schemas import Ack, Update, UpdateBatch

log = logging.getLogger(__name__)


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
        batch = UpdateBatch(source=self.source, updates=updates).model_dump_json()
        retrying = AsyncRetrying(
            wait=self._wait,
            stop=stop_never,
            retry=retry_if_exception_type((httpx.HTTPError, ShipError)),
            before_sleep=self._log_failure,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                through = await self._post(batch, updates[0].seq, last_seq)
                if attempt.retry_state.attempt_number > 1:
                    log.info(
                        "shipping to %s recovered after %d attempts", self._url, attempt.retry_state.attempt_number
                    )
        return through

    async def _post(self, body: str, first: int, last_seq: int) -> int:
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
        if ack.through < first:
            raise ShipError(f"the manager acknowledged only through seq {ack.through} (held: {ack.held[:10]})")
        return ack.through

    def _log_failure(self, state: RetryCallState) -> None:
        if state.attempt_number == 1 and state.outcome is not None:
            log.warning("cannot ship updates to %s (retrying until it works): %s", self._url, state.outcome.exception())
