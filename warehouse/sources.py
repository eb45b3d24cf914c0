"""How the manager talks to a source: the ``SourceClient`` protocol and its HTTP client.

The wrapper of a source answers three requests: its schema, a SWEEP subquery (answered
with the source's watermark, DESIGN.md invariant 3) and the views' interest (which changes
are worth shipping). Transport failures and 5xx answers are retried with backoff: a
subquery may be asked again at any time, since its answer is compensated by its own
watermark. A 4xx answer is a bug or a misconfiguration and is raised at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from api.schemas import Interest, InterestAck, Subquery, SubqueryAnswer

log = logging.getLogger(__name__)

SCHEMA_RETRY_SECONDS = 15.0


@dataclass(frozen=True)
class TableSchema:
    columns: tuple[str, ...]
    types: tuple[str, ...]
    primary_key: tuple[str, ...]


class SourceError(Exception):
    """A source refused a request (4xx) or stayed unreachable past the retry budget."""


class SourceClient(Protocol):
    async def schema(self) -> dict[str, TableSchema]: ...

    async def subquery(self, request: Subquery) -> SubqueryAnswer: ...

    async def set_interest(self, interest: Interest) -> int: ...

    async def aclose(self) -> None: ...


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code >= 500


class HttpSourceClient:
    def __init__(self, name: str, url: str, token: str | None = None, retry_seconds: float = 600.0) -> None:
        self.name = name
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(120.0, connect=5.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )
        self._retry_seconds = retry_seconds

    async def _call(self, method: str, path: str, body: dict | None = None, retry_seconds: float | None = None) -> dict:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_retryable),
            wait=wait_exponential(multiplier=0.05, max=5.0),
            stop=stop_after_delay(self._retry_seconds if retry_seconds is None else retry_seconds),
            reraise=True,
        ):
            with attempt:
                response = await self._http.request(method, path, json=body)
                if 400 <= response.status_code < 500:
                    detail = _detail(response)
                    raise SourceError(f"source {self.name!r} refused {method} {path}: {detail}")
                response.raise_for_status()
                return response.json()
        raise AssertionError("unreachable")

    async def schema(self) -> dict[str, TableSchema]:
        # Asked when a source is registered: an administrator waits for the answer.
        data = await self._call("GET", "/v1/schema", retry_seconds=min(self._retry_seconds, SCHEMA_RETRY_SECONDS))
        return {
            table: TableSchema(
                tuple(c["name"] for c in info["columns"]),
                tuple(str(c.get("type", "")) for c in info["columns"]),
                tuple(info.get("primary_key", [])),
            )
            for table, info in data["tables"].items()
        }

    async def subquery(self, request: Subquery) -> SubqueryAnswer:
        return SubqueryAnswer.model_validate(await self._call("POST", "/v1/subquery", request.model_dump()))

    async def set_interest(self, interest: Interest) -> int:
        return InterestAck.model_validate(await self._call("PUT", "/v1/interest", interest.model_dump())).boundary

    async def health(self, timeout: float = 2.0) -> dict:
        """The wrapper's ``/v1/health``, asked once without retries (for status pages)."""
        response = await self._http.get("/v1/health", timeout=timeout)
        response.raise_for_status()
        return response.json()

    async def aclose(self) -> None:
        await self._http.aclose()


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))
    except ValueError:
        return response.text[:500]
