"""The manager's client of a source, against a real HTTP server that misbehaves on purpose:
transport failures and 5xx answers are retried until the budget runs out, a 4xx answer is
raised at once with the server's message, and bodies travel as the wire schemas say."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from contract.schemas import Interest, RelationInterest, Subquery
from pvm.http_server import http_url, listen, start_serving, uvicorn_server
from warehouse.sources import HttpSourceClient, SourceError


class FlakySource:
    """A wrapper stand-in that fails the first ``failures`` subqueries with ``status``."""

    def __init__(self, failures: int = 0, status: int = 503) -> None:
        self.failures = failures
        self.status = status
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.app = FastAPI()

        @self.app.post("/v1/subquery")
        async def subquery(request: Request) -> JSONResponse:
            self.bodies.append(json.loads(await request.body()))
            self.headers.append(dict(request.headers))
            if len(self.bodies) <= self.failures:
                return JSONResponse({"detail": f"failure {len(self.bodies)}"}, status_code=self.status)
            return JSONResponse({"watermark": 7, "rows": [[0, "x", 1]], "elapsed_ms": 1.5})

        @self.app.put("/v1/interest")
        async def interest(request: Request) -> JSONResponse:
            self.bodies.append(json.loads(await request.body()))
            return JSONResponse({"boundary": 12})

        @self.app.get("/v1/schema")
        async def schema() -> JSONResponse:
            return JSONResponse(
                {"source": "s", "tables": {"r": {"columns": [{"name": "k", "type": "INTEGER"}], "primary_key": ["k"]}}}
            )

        @self.app.get("/v1/health")
        async def health() -> JSONResponse:
            return JSONResponse({"source": "s", "pending": 0})


@contextlib.asynccontextmanager
async def serving(app: FastAPI, sock: socket.socket | None = None):
    sock = sock or listen("127.0.0.1", 0)
    server = uvicorn_server(app)
    task = await start_serving(server, sock)
    try:
        yield http_url(sock)
    finally:
        server.should_exit = True
        await task


def request() -> Subquery:
    return Subquery(relation="r", alias="r", keys=[[1], ["a"]], select=["k"], priority=3.5)


@contextlib.asynccontextmanager
async def client_of(source: FlakySource, **options):
    """The manager's client of ``source``, served on a free port."""
    async with serving(source.app) as url:
        client = HttpSourceClient("s", url, **options)
        try:
            yield client
        finally:
            await client.aclose()


async def test_an_answer_and_what_was_sent() -> None:
    source = FlakySource()
    async with client_of(source, token="t" * 40) as client:
        answer = await client.subquery(request())
        assert (answer.watermark, answer.rows, answer.elapsed_ms) == (7, [[0, "x", 1]], 1.5)
        assert source.bodies == [request().model_dump(exclude={"at_least"})]  # sent only where given
        assert source.headers[0]["authorization"] == "Bearer " + "t" * 40
        assert source.headers[0]["content-type"] == "application/json"
        assert (await client.schema())["r"].primary_key == ("k",)
        assert await client.set_interest(Interest(relations={"r": RelationInterest(columns=["k"], where=[None])})) == 12
        assert (await client.health())["pending"] == 0


class OlderSource(FlakySource):
    """A wrapper older than ``Subquery.at_least``: it refuses the field as it refuses any
    unknown one (422, naming it)."""

    def __init__(self) -> None:
        super().__init__()
        self.app = FastAPI()

        @self.app.post("/v1/subquery")
        async def subquery(request: Request) -> JSONResponse:
            body = json.loads(await request.body())
            self.bodies.append(body)
            if "at_least" in body:
                problem = {
                    "type": "extra_forbidden",
                    "loc": ["body", "at_least"],
                    "msg": "Extra inputs are not permitted",
                }
                return JSONResponse({"detail": f"invalid request body: {[problem]}"}, status_code=422)
            return JSONResponse({"watermark": 7, "rows": [], "elapsed_ms": 1.0})


async def test_a_wrapper_that_refuses_at_least_is_asked_without_it() -> None:
    source = OlderSource()
    async with client_of(source) as client:
        floored = request().model_copy(update={"at_least": 4})
        assert (await client.subquery(floored)).watermark == 7
        assert (await client.subquery(floored)).watermark == 7
        # refused once, then sent without it: such a wrapper answers as of now, always allowed
        assert ["at_least" in b for b in source.bodies] == [True, False, False]
        assert not client.takes_at_least


async def test_at_least_goes_to_a_wrapper_that_takes_it() -> None:
    source = FlakySource()
    async with client_of(source) as client:
        await client.subquery(request().model_copy(update={"at_least": 4}))
        assert source.bodies[0]["at_least"] == 4


async def test_server_errors_are_retried() -> None:
    source = FlakySource(failures=2, status=503)
    async with client_of(source, retry_seconds=30) as client:
        assert (await client.subquery(request())).watermark == 7
        assert len(source.bodies) == 3


@pytest.mark.parametrize(
    "status, budget, message, tries",
    [
        (500, 0.3, "answered POST /v1/subquery with 500: failure", "several"),  # retried, then raised
        (422, 30, "refused POST /v1/subquery: failure 1", "one"),  # raised at once with its reason
    ],
)
async def test_failures_are_raised_as_source_errors(status: int, budget: float, message: str, tries: str) -> None:
    source = FlakySource(failures=1000, status=status)
    async with client_of(source, retry_seconds=budget) as client:
        with pytest.raises(SourceError, match=message):
            await client.subquery(request())
        assert (len(source.bodies) > 1) if tries == "several" else (len(source.bodies) == 1)


async def test_a_source_that_comes_up_late_is_waited_for() -> None:
    """Connection refused is a transport failure: retried until the wrapper listens."""
    sock = listen("127.0.0.1", 0)
    url = http_url(sock)
    sock.close()  # nothing listens on the port for now
    source = FlakySource()
    client = HttpSourceClient("s", url, retry_seconds=30)
    try:
        pending = asyncio.create_task(client.subquery(request()))
        await asyncio.sleep(0.3)
        assert not pending.done()
        async with serving(source.app, listen("127.0.0.1", int(url.rsplit(":", 1)[1]))):
            assert (await asyncio.wait_for(pending, 30)).watermark == 7
    finally:
        await client.aclose()
