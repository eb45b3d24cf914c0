"""A stand-in for the manager's update receiver, for wrapper tests and demos.

It behaves like the real receiver where wrappers can tell: ``(source, seq)`` is idempotent,
the acknowledgment covers the contiguous prefix and lists held seqs above a gap. It can
refuse posts with 503 (``fail_posts`` next posts, all while ``down``, or every part from index
``refuse_parts_from`` on), or every post with ``refuse_status`` (a permanent refusal: 413,
422), hold each next post for one of ``delays`` (seconds) before handling it (taking others
meanwhile, as the manager does), and records every
post, accepted or not, so tests can check what was sent and how often. An update in parts
is put together as the receiver does (in order from part 0, which starts it afresh; 409
otherwise, saying what it holds as ``contract.schemas.PartRefusal``, or only why with
``old_refusals``, as a manager older than that) and stored whole with its last part;
``forget_parts`` drops what is staged, as an older manager's restart did. It reads a batch
as JSON or as an update stream (``contract.update_stream``), as the manager does, and
records which (``streams``).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pydantic
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from api.ingest import BatchInvalid, is_update_stream, read_stream
from contract.schemas import Ack, PartRefusal, Update, UpdateBatch
from pvm.http_server import http_url, listen


class FakeManager:
    def __init__(self, token: str | None = None, fail_posts: int = 0) -> None:
        self.token = token
        self.fail_posts = fail_posts
        self.down = False
        self.refuse_parts_from: int | None = None
        self.refuse_status: int | None = None
        self.old_refusals = False
        self.delays: list[float] = []  # seconds each next post waits before it is handled
        self.posts: list[UpdateBatch] = []
        self.streams = 0  # posts that came as update streams
        self.conflicts: list[tuple[int, Update, Update]] = []
        self._updates: dict[str, dict[int, Update]] = {}
        self._parts: dict[str, list[Update]] = {}  # per source: the parts of an unfinished update
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # -- the receiver -----------------------------------------------------------------------
    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/updates", response_model=Ack)
        async def receive(request: Request) -> Ack | JSONResponse:
            stream = is_update_stream(request.headers.get("content-type"))
            try:
                batch = _batch(await request.body(), stream)
            except (pydantic.ValidationError, BatchInvalid) as exc:
                return JSONResponse({"detail": str(exc)}, status_code=422)
            if self.token is not None and request.headers.get("authorization") != f"Bearer {self.token}":
                return JSONResponse({"detail": "bad token"}, status_code=401)
            with self._lock:
                delay = self.delays.pop(0) if self.delays else 0.0
            if delay:
                await asyncio.sleep(delay)  # other posts are taken meanwhile
            with self._lock:
                self.posts.append(batch)
                self.streams += stream
                if self.down or self.fail_posts > 0:
                    self.fail_posts = max(0, self.fail_posts - 1)
                    return JSONResponse({"detail": "unavailable"}, status_code=503)
                if self.refuse_status is not None:
                    return JSONResponse({"detail": "refused for good"}, status_code=self.refuse_status)
                log = self._updates.setdefault(batch.source, {})
                if len(batch.updates) == 1 and (part := batch.updates[0].part) is not None:
                    if self.refuse_parts_from is not None and part.index >= self.refuse_parts_from:
                        return JSONResponse({"detail": "unavailable"}, status_code=503)
                    held = self._parts.setdefault(batch.source, [])
                    update = batch.updates[0]
                    if update.seq in log:
                        if part.index == 0:
                            return Ack(through=self._through(batch.source), held=[])
                        return self._refused(batch.source, "seq complete already", 0)
                    if part.index == 0:
                        held.clear()
                    elif not held or held[0].seq != update.seq or len(held) != part.index:
                        staged = len(held) if held and held[0].seq == update.seq else 0
                        return self._refused(batch.source, "part out of order", staged)
                    held.append(update)
                    if not part.last:
                        return Ack(through=self._through(batch.source), held=[], parts=len(held))
                    changes = [c for piece in held for c in piece.changes]
                    whole = Update.model_construct(seq=update.seq, changes=changes, txid=update.txid, part=None)
                    held.clear()
                    batch = UpdateBatch.model_construct(source=batch.source, updates=[whole])
                for update in batch.updates:
                    known = log.setdefault(update.seq, update)
                    if known != update:
                        self.conflicts.append((update.seq, known, update))
                through = self._through(batch.source)
                return Ack(through=through, held=sorted(s for s in log if s > through))

        return app

    def _refused(self, source: str, why: str, parts: int) -> JSONResponse:
        """A part refused with 409, saying what is held (``parts`` of the part's update)
        unless ``old_refusals``."""
        if self.old_refusals:
            return JSONResponse({"detail": why}, status_code=409)
        refusal = PartRefusal(detail=why, through=self._through(source), parts=parts)
        return JSONResponse(refusal.model_dump(), status_code=409)

    def _through(self, source: str) -> int:
        log = self._updates.get(source, {})
        n = 0
        while n + 1 in log:
            n += 1
        return n

    # -- reading what arrived -----------------------------------------------------------------
    def parts_held(self, source: str) -> int:
        """How many parts of an unfinished update of ``source`` are held."""
        with self._lock:
            return len(self._parts.get(source, []))

    def forget_parts(self, source: str) -> None:
        """Drop the parts of ``source``'s unfinished update, as an older manager's restart did."""
        with self._lock:
            self._parts.pop(source, None)

    def through(self, source: str) -> int:
        with self._lock:
            return self._through(source)

    def updates(self, source: str) -> list[Update]:
        """The acknowledged updates of ``source``, seq 1, 2, …"""
        with self._lock:
            log = self._updates.get(source, {})
            return [log[s] for s in range(1, self._through(source) + 1)]

    def wait_through(self, source: str, seq: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.through(source) < seq:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{source}: acknowledged through {self.through(source)}, waited for {seq}")
            time.sleep(0.01)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> FakeManager:
        sock = listen("127.0.0.1", 0)
        self.url = http_url(sock)
        self._server = uvicorn.Server(uvicorn.Config(self._app(), log_level="warning", access_log=False))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake manager did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(10)

    def __enter__(self) -> FakeManager:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _batch(body: bytes, stream: bool) -> UpdateBatch:
    """The batch in a post's body, as models (ValidationError if it is not one)."""
    if not stream:
        return UpdateBatch.model_validate_json(body)
    incoming = read_stream(body)
    updates = [
        {"seq": u.seq, "changes": u.changes, "txid": u.txid, "captured_at": u.captured_at, "part": u.part}
        for u in incoming.updates
    ]
    return UpdateBatch.model_validate({"source": incoming.source, "updates": updates})
