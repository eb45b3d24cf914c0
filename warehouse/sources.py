"""How the manager talks to a source: the ``SourceClient`` protocol and its HTTP client.

The wrapper of a source answers three requests: its schema, a SWEEP subquery (answered
with the source's watermark, docs/design.md, invariant 3) and the views' interest (which changes
are worth shipping). Transport failures and 5xx answers are retried with backoff: a
subquery may be asked again at any time, since its answer is compensated by its own
watermark. A 4xx answer is a bug or a misconfiguration and is raised at once.

Subqueries are the manager's hot path: with p units in flight it sends one every few
milliseconds. The client is aiohttp's, which sends and parses a request with a third of the
CPU httpx takes (0.4 against 1.4-2 ms per subquery on the development machine), and the
bodies are encoded and decoded by pydantic in one step each.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from contract.relation_snapshot import Readable, RelationSnapshot, TruncatedSnapshot
from contract.schemas import Interest, InterestAck, Subquery, SubqueryAnswer

log = logging.getLogger(__name__)

SCHEMA_RETRY_SECONDS = 15.0
SNAPSHOT_READ_SECONDS = 600.0
"""How long a snapshot stream may stay silent: before its first batch the wrapper takes the
snapshot and ships every change visible in it."""


@dataclass(frozen=True)
class TableSchema:
    columns: tuple[str, ...]
    types: tuple[str, ...]
    primary_key: tuple[str, ...]


class SourceError(Exception):
    """A source refused a request (4xx), or kept failing (5xx) past the retry budget. A
    transport failure past the budget is raised as aiohttp's error (the manager raises a
    SourceError for it where a person waits: registering a source)."""


class SourceClient(Protocol):
    async def schema(self) -> dict[str, TableSchema]: ...

    async def subquery(self, request: Subquery) -> SubqueryAnswer: ...

    async def set_interest(self, interest: Interest) -> int: ...

    async def health(self) -> dict[str, Any]:
        """The wrapper's own report (``api/wrapper_app.py``'s Health): ``ok``, seqs, the
        capture ``method``, a ``blocked`` capture, quarantined rows."""
        ...

    async def aclose(self) -> None: ...


class _ServerFailed(SourceError):
    """A 5xx answer: the wrapper is there but could not answer now (retried; raised once the
    retry budget is spent)."""


def is_transient(exc: BaseException) -> bool:
    """A failure that may go away by itself (the wrapper unreachable, slow, or answering 5xx):
    retried here, and past the budget by the view's maintainer too."""
    return isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, _ServerFailed))


_JSON = {"Content-Type": "application/json"}


class HttpSourceClient:
    def __init__(self, name: str, url: str, token: str | None = None, retry_seconds: float = 600.0) -> None:
        self.name = name
        self._base = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._retry_seconds = retry_seconds
        self._session: aiohttp.ClientSession | None = None  # made in the event loop that uses it
        self.takes_at_least = True  # until a wrapper older than ``Subquery.at_least`` refuses it

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=120.0, connect=5.0),
                connector=aiohttp.TCPConnector(limit=64),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def _call(self, method: str, path: str, body: str | None = None, retry_seconds: float | None = None) -> bytes:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential(multiplier=0.05, max=5.0),
            stop=stop_after_delay(self._retry_seconds if retry_seconds is None else retry_seconds),
            reraise=True,
        ):
            with attempt:
                headers = _JSON if body is not None else None
                async with self._http().request(method, self._base + path, data=body, headers=headers) as response:
                    payload = await response.read()
                if response.status >= 500:
                    raise _ServerFailed(
                        f"source {self.name!r} answered {method} {path} with {response.status}: {_detail(payload)}"
                    )
                if response.status >= 300:
                    raise SourceError(f"source {self.name!r} refused {method} {path}: {_detail(payload)}")
                return payload
        raise AssertionError("unreachable")

    async def schema(self) -> dict[str, TableSchema]:
        # Asked when a source is registered: an administrator waits for the answer.
        payload = await self._call("GET", "/v1/schema", retry_seconds=min(self._retry_seconds, SCHEMA_RETRY_SECONDS))
        return {
            table: TableSchema(
                tuple(c["name"] for c in info["columns"]),
                tuple(str(c.get("type", "")) for c in info["columns"]),
                tuple(info.get("primary_key", [])),
            )
            for table, info in json.loads(payload)["tables"].items()
        }

    async def subquery(self, request: Subquery) -> SubqueryAnswer:
        """The wrapper's answer. ``at_least`` goes only where given, and no more to a wrapper
        that refused it once (one older than it: its 422 names the field): such a wrapper
        answers in a snapshot taken after the request, which is always allowed."""
        if request.at_least is None or not self.takes_at_least:
            body = request.model_dump_json(exclude={"at_least"})
            return SubqueryAnswer.model_validate_json(await self._call("POST", "/v1/subquery", body))
        try:
            return SubqueryAnswer.model_validate_json(
                await self._call("POST", "/v1/subquery", request.model_dump_json())
            )
        except SourceError as exc:
            if isinstance(exc, _ServerFailed) or "at_least" not in str(exc):
                raise
            self.takes_at_least = False
            log.warning("source %r does not take at_least (an older wrapper): answers come as of now", self.name)
            return await self.subquery(request)

    @contextmanager
    def open_snapshot(self, request: RelationSnapshot) -> Iterator[Readable]:
        """The relation snapshot stream of ``request`` (``contract.relation_snapshot``), read
        from the calling thread as it arrives (the initial load stages it batch by batch). A
        4xx answer is a SourceError, a 5xx one or a stream cut short is transient."""
        timeout = httpx.Timeout(SNAPSHOT_READ_SECONDS, connect=5.0)
        body = request.model_dump_json()
        with (
            httpx.Client(headers=self._headers, timeout=timeout) as http,
            http.stream("POST", self._base + "/v1/snapshot", content=body, headers=_JSON) as response,
        ):
            if response.status_code >= 300:
                detail = _detail(response.read())
                failed = _ServerFailed if response.status_code >= 500 else SourceError
                raise failed(f"source {self.name!r} answered POST /v1/snapshot with {response.status_code}: {detail}")
            yield _Chunks(self.name, response.iter_raw())

    async def set_interest(self, interest: Interest) -> int:
        payload = await self._call("PUT", "/v1/interest", interest.model_dump_json())
        return InterestAck.model_validate_json(payload).boundary

    async def health(self, timeout: float = 2.0) -> dict[str, Any]:
        """The wrapper's ``/v1/health``, asked once without retries (for status pages)."""
        async with self._http().get(
            self._base + "/v1/health", timeout=aiohttp.ClientTimeout(total=timeout)
        ) as response:
            response.raise_for_status()
            return await response.json()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class _Chunks:
    """A file-like object over a response's byte chunks, for pyarrow to read from; a broken
    connection is a TruncatedSnapshot (transient: the load is retried)."""

    def __init__(self, source: str, chunks: Iterator[bytes]) -> None:
        self._source = source
        self._chunks = chunks
        self._buffer = bytearray()

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            try:
                chunk = next(self._chunks, None)
            except httpx.HTTPError as exc:
                raise TruncatedSnapshot(f"source {self._source!r}: the snapshot stream broke: {exc}") from exc
            if chunk is None:
                break
            self._buffer += chunk
        end = len(self._buffer) if size < 0 else min(size, len(self._buffer))
        out = bytes(self._buffer[:end])
        del self._buffer[:end]
        return out


def _detail(payload: bytes) -> str:
    try:
        return str(json.loads(payload).get("detail", payload.decode(errors="replace")))
    except (ValueError, AttributeError):
        return payload[:500].decode(errors="replace")
