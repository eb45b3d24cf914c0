"""Reading a ``POST /v1/updates`` body without holding up the event loop.

A batch may be tens of megabytes. Parsing JSON (``json.loads``, pydantic's
``model_validate_json``) and validating with pydantic are single calls into C or Rust that
keep the GIL for as long as they run: run on a worker thread they still stop the event loop
(measured: a 60 MB batch, 5.5 s without an answer from ``/v1/health``). So:

* the body is parsed by ijson's C parser fed through a Python ``read`` of 64 KiB at a time,
  and validated one update at a time, its changes in slices of ``SLICE``: the thread returns
  to Python between pieces of a few milliseconds, where the interpreter hands the GIL to the
  loop;
* the changes come out as plain dicts (validated by the ``Change`` model a slice at a time,
  then dumped): a model per change would be three more objects each, for the receiver to
  dump again;
* while a large batch is in flight the cyclic garbage collector waits (``collector_paused``):
  with millions of the batch's objects alive, each of its full passes stops every thread for
  up to a second; they die by reference counting, a piece at a time (``drop``).

The result holds what FastAPI would have made of the body (the same validation, the same
error locations), with two differences, both refusals of what the manager cannot use anyway:
the body must be standard JSON (no ``NaN``/``Infinity`` literals), and a number must fit the
wire's range: an integer in signed 64 bits, a float below ~1.8e308 (422 otherwise).

A body of the update stream's media type (``contract.update_stream``, a wrapper's larger
batches) is read on the same thread into the same ``PlainUpdate``s: the batch without its
changes (the stream's ``pvm.batch``) is validated by the same model, the changes come out of
the columns a slice at a time, and what is wrong is answered alike: 400 for a body that is not
a whole Arrow stream, 422 naming the update, the change and its member for a stream that is
not a valid batch, 415 for a version of the stream this manager does not read.
"""

from __future__ import annotations

import asyncio
import gc
import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import ijson
from fastapi import FastAPI, HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

from contract.schemas import MAX_CHANGES_PER_UPDATE, Change, UpdateBatch
from contract.update_stream import (
    UPDATE_STREAM_CONTENT_TYPE,
    UPDATE_STREAM_MEDIA_TYPE,
    UPDATE_STREAM_VERSION,
    UpdateStreamBroken,
    UpdateStreamInvalid,
    read_update_stream,
)
from contract.value_fit import INT64_MAX, INT64_MIN
from warehouse.receiver import PlainUpdate

SLICE = 1000  # changes validated per call: ~2 ms of GIL
READ_SIZE = 64 * 1024  # bytes parsed per call
MAX_PROBLEMS = 100  # validation problems reported at most
LARGE_BODY = 1 << 20  # bytes from which the garbage collector waits for the batch

_CHANGES = TypeAdapter(list[Change])
PARSER = ThreadPoolExecutor(1, thread_name_prefix="pvm-ingest")
"""The thread update batches are parsed on: one, so that concurrent batches queue instead of
taking turns at the GIL, and never the default pool that other work shares."""


@dataclass(frozen=True)
class IncomingBatch:
    source: str
    updates: list[PlainUpdate]


class BatchInvalid(Exception):
    """A body that is valid JSON but not a valid batch: pydantic-style problems, as FastAPI
    reports them (``loc`` starting with ``body``)."""

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        super().__init__(f"{len(problems)} problem(s)")
        self.problems = problems


ACCEPTED = f"application/json, {UPDATE_STREAM_CONTENT_TYPE}"
"""The bodies ``POST /v1/updates`` takes (its ``Accept-Post`` header, and the 415's words)."""


def is_update_stream(content_type: str | None) -> bool:
    """Whether a request's ``Content-Type`` names the update stream (any other is read as
    JSON, as it always was); HTTPException 415 for a version of it this manager does not read.

    >>> is_update_stream("application/vnd.apache.arrow.stream; version=1"), is_update_stream("application/json")
    (True, False)
    """
    media, _, parameters = (content_type or "").partition(";")
    if media.strip().lower() != UPDATE_STREAM_MEDIA_TYPE:
        return False
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "version" and value.strip().strip('"') != UPDATE_STREAM_VERSION:
            raise HTTPException(
                415,
                f"update stream version {value.strip()[:20]!r}: this manager reads {ACCEPTED}",
                headers={"Accept-Post": ACCEPTED},
            )
    return True


async def read_update_batch(body: bytes, stream: bool = False) -> IncomingBatch:
    """The batch in a request's body (an update stream if ``stream``, else JSON), parsed on
    ``PARSER``: 400 for a body that is not JSON (or not a whole Arrow stream), 422
    (RequestValidationError, FastAPI's own) for one that is not a valid batch."""
    try:
        return await asyncio.get_running_loop().run_in_executor(PARSER, read_stream if stream else read_batch, body)
    except BatchInvalid as invalid:
        raise RequestValidationError(invalid.problems) from None


def read_batch(body: bytes) -> IncomingBatch:
    """The batch in ``body``; HTTPException 400 for a body that is not JSON, 422 for a number
    out of range, BatchInvalid for a document that is not a valid batch. Blocking: call it on
    ``PARSER``."""
    document = _parse(body)
    skeleton, problems = _skeleton(document)
    if skeleton is None:
        raise BatchInvalid(problems)
    updates = []
    for index, update in enumerate(skeleton.updates):
        raw = document["updates"][index]
        changes = _changes(raw["changes"], ("body", "updates", index, "changes"), problems)
        document["updates"][index] = None  # its parsed form is freed now, not all at the end
        if len(problems) >= MAX_PROBLEMS:
            break
        updates.append(PlainUpdate(update.seq, changes, update.txid, update.captured_at, update.part))
    if problems:
        raise BatchInvalid(problems[:MAX_PROBLEMS])
    return IncomingBatch(skeleton.source, updates)


def read_stream(body: bytes) -> IncomingBatch:
    """The batch in an update stream (``contract.update_stream``); HTTPException 400 for a
    body that is not a whole Arrow stream, BatchInvalid for one that is not a valid batch
    (located as in a JSON body: ``body.updates.<i>.changes.<j>.sign``). Blocking: call it on
    ``PARSER``."""
    try:
        stream = read_update_stream(body)
    except UpdateStreamBroken as broken:
        raise HTTPException(400, f"malformed Arrow update stream: {broken}") from None
    except UpdateStreamInvalid as invalid:
        raise BatchInvalid([_stream_problem(("body",), str(invalid))]) from None
    document, counts, problems = _without_counts(stream.header)
    skeleton, refused = _skeleton(document)
    problems.extend(refused)
    if skeleton is None or problems:
        raise BatchInvalid(problems[:MAX_PROBLEMS])
    try:
        changes = stream.changes()
    except UpdateStreamBroken as broken:
        raise HTTPException(400, f"malformed Arrow update stream: {broken}") from None
    except UpdateStreamInvalid as invalid:
        raise BatchInvalid([_stream_problem(_change_location(counts, invalid), str(invalid))]) from None
    declared = sum(counts)
    if len(changes) < declared:
        raise HTTPException(
            400, f"malformed Arrow update stream: it ends after {len(changes)} changes, its updates declare {declared}"
        )
    if len(changes) > declared:
        problem = f"the stream carries {len(changes)} changes, its updates declare {declared} (pvm.batch)"
        raise BatchInvalid([_stream_problem(("body", "updates"), problem)])
    updates, first = [], 0
    for update, count in zip(skeleton.updates, counts, strict=True):
        updates.append(
            PlainUpdate(update.seq, changes[first : first + count], update.txid, update.captured_at, update.part)
        )
        first += count
    return IncomingBatch(skeleton.source, updates)


def _without_counts(header: Any) -> tuple[Any, list[int], list[dict[str, Any]]]:
    """The stream's ``pvm.batch`` as the JSON batch it stands for, every update's count of
    changes taken out (and its list of changes left empty, for ``_skeleton``); the counts,
    and the problems with them."""
    counts: list[int] = []
    problems: list[dict[str, Any]] = []
    if not (isinstance(header, dict) and isinstance(header.get("updates"), list)):
        return header, counts, problems  # _skeleton says what is wrong
    updates = []
    for index, update in enumerate(header["updates"]):
        if isinstance(update, dict):
            count = update.get("changes")
            loc = ("body", "updates", index, "changes")
            if type(count) is not int or count < 0:
                problems.append(_stream_problem(loc, "the number of the update's changes, an integer from 0"))
            elif count > MAX_CHANGES_PER_UPDATE:
                message = f"List should have at most {MAX_CHANGES_PER_UPDATE} items, not {count}"
                problems.append({"loc": loc, "msg": message, "type": "too_long"})
            counts.append(count if type(count) is int else 0)
            update = {**update, "changes": []}
        updates.append(update)
    return {**header, "updates": updates}, counts, problems


def _change_location(counts: list[int], invalid: UpdateStreamInvalid) -> tuple[Any, ...]:
    """Where a stream's problem lies, as in a JSON body: the update and change of the
    change at fault, found by its index among all the stream's changes."""
    if invalid.change is None:
        return ("body",)
    index = invalid.change
    for update, count in enumerate(counts):
        if index < count:
            return ("body", "updates", update, "changes", index, *invalid.field)
        index -= count
    return ("body", "updates")  # beyond the changes declared: the count is the problem


def _stream_problem(loc: tuple[Any, ...], message: str) -> dict[str, Any]:
    return {"loc": loc, "msg": message, "type": "update_stream"}


class _Reader:
    """A file whose ``read`` is Python code: ijson's C parser calls it for every piece, and
    each call is a point where the interpreter may hand the GIL to another thread."""

    def __init__(self, body: bytes) -> None:
        self._body = io.BytesIO(body)
        self.offset = 0

    def read(self, size: int) -> bytes:
        piece = self._body.read(min(size, READ_SIZE))
        self.offset += len(piece)
        return piece


def _parse(body: bytes) -> Any:
    reader = _Reader(body)
    try:
        [document] = ijson.items(reader, "", use_float=True)  # to the end: trailing garbage is an error
        return document
    except (ijson.JSONError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else "the body is empty"
        where = f"in the first {reader.offset} bytes" if reader.offset > 0 else "at the start"
        if "overflow" in reason:
            return _parse_past_overflow(body, f"a number {where} of the body is out of range ({reason})")
        raise HTTPException(400, f"malformed JSON body: {reason} ({where})") from None


def _parse_past_overflow(body: bytes, reason: str) -> Any:
    """The body the C parser called out of range, read again by ijson's Python parser.

    The C parser (yajl) reads a negative integer as a positive one and then negates it, so it
    refuses -2**63, which fits in 64 bits. The Python parser reads integers of any size: the
    document is taken if every integer in it fits, else refused (422) as before. Only bodies
    with such a number pay for the slower parser.
    """
    from ijson.backends import python as ijson_python

    out_of_range = HTTPException(422, f"{reason}: integers must fit in signed 64 bits, floats below 1.8e308")
    if "integer" not in reason:
        raise out_of_range
    try:
        [document] = ijson_python.items(io.BytesIO(body), "", use_float=True)
    except (ijson.JSONError, ValueError):
        raise out_of_range from None
    if not _integers_fit(document):
        raise out_of_range
    return document


def _integers_fit(value: Any) -> bool:
    if type(value) is int:
        return INT64_MIN <= value <= INT64_MAX
    if isinstance(value, dict):
        return all(_integers_fit(v) for v in value.values())
    if isinstance(value, list):
        return all(_integers_fit(v) for v in value)
    return True


def _skeleton(document: Any) -> tuple[UpdateBatch | None, list[dict[str, Any]]]:
    """The batch validated with every list of changes left empty: everything but the changes,
    at the cost of a small document; the problems found."""
    if isinstance(document, dict) and isinstance(document.get("updates"), list):
        document = {**document, "updates": [_without_changes(u) for u in document["updates"]]}
    try:
        return UpdateBatch.model_validate(document), []
    except ValidationError as error:
        return None, _problems(error, ("body",))


def _without_changes(update: Any) -> Any:
    if isinstance(update, dict) and isinstance(update.get("changes"), list):
        return {**update, "changes": []}
    return update


def _changes(changes: list[Any], loc: tuple, problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``changes`` validated by the ``Change`` model and dumped, a slice at a time."""
    if len(changes) > MAX_CHANGES_PER_UPDATE:
        message = f"List should have at most {MAX_CHANGES_PER_UPDATE} items, not {len(changes)}"
        problems.append({"loc": loc, "msg": message, "type": "too_long"})
        return []
    out: list[dict[str, Any]] = []
    for start in range(0, len(changes), SLICE):
        try:
            out.extend(_CHANGES.dump_python(_CHANGES.validate_python(changes[start : start + SLICE])))
        except ValidationError as error:
            problems.extend(_problems(error, loc, shift=start))
            if len(problems) >= MAX_PROBLEMS:
                break
    return out


def _problems(error: ValidationError, loc: tuple, shift: int = 0) -> list[dict[str, Any]]:
    """``error``'s problems located under ``loc``; the first index shifted by ``shift`` (a
    slice's offset in its list)."""
    located = []
    for problem in error.errors(include_url=False, include_context=False, include_input=False):
        where = list(problem["loc"])
        if shift and where and isinstance(where[0], int):
            where[0] += shift
        located.append({**problem, "loc": (*loc, *where)})
    return located


# -- the batch's objects, alive and dead ------------------------------------------------------------
_paused = 0  # large batches in flight (the count lives on the event loop's thread)


@contextmanager
def collector_paused(size: int) -> Iterator[None]:
    """The cyclic garbage collector waits while a batch of ``size`` bytes (from
    ``LARGE_BODY`` on) is in flight, however many are. Only reference cycles made meanwhile
    wait to be collected; everything else is freed as usual."""
    global _paused
    if size < LARGE_BODY:
        yield
        return
    if _paused == 0:
        gc.disable()
    _paused += 1
    try:
        yield
    finally:
        _paused -= 1
        if _paused == 0:
            gc.enable()


async def drop(updates: list[PlainUpdate]) -> None:
    """Free a batch's updates on ``PARSER``, one at a time: freeing them all at once is one
    uninterruptible call that would stop the loop for a tenth of a second per million changes."""
    await asyncio.get_running_loop().run_in_executor(PARSER, _empty, updates)


def _empty(updates: list[PlainUpdate]) -> None:
    while updates:
        updates.pop()


BODY_DOCS = {
    "requestBody": {
        "required": True,
        "description": "An `UpdateBatch` as JSON, or (from about 100 changes on) as an update stream: one Arrow "
        f"IPC stream, `Content-Type: {UPDATE_STREAM_CONTENT_TYPE}`, its schema metadata `pvm.updates` (the "
        "version, `1`) and `pvm.batch` (the batch without its changes, each update's `changes` their number), "
        "its fields `sign` (int8) and `row` (a dense union of one struct per relation and columns); see docs/api.md, "
        "Shipping updates.",
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/UpdateBatch"}},
            UPDATE_STREAM_MEDIA_TYPE: {
                "schema": {"type": "string", "format": "binary"},
                "example": "(an Arrow IPC stream: contract/update_stream.py)",
            },
        },
    }
}
"""The OpenAPI ``requestBody`` of a route that reads an ``UpdateBatch`` with ``read_update_batch``."""


def document_update_batch(app: FastAPI) -> None:
    """Put ``UpdateBatch`` and the models it refers to among ``app``'s OpenAPI components:
    a route that reads its body itself declares none that FastAPI would describe."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = build()
            schema = UpdateBatch.model_json_schema(ref_template="#/components/schemas/{model}")
            components = spec.setdefault("components", {}).setdefault("schemas", {})
            components.update(schema.pop("$defs", {}))
            components["UpdateBatch"] = schema
        assert app.openapi_schema is not None  # FastAPI's openapi() keeps what it built there
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = [
    "ACCEPTED",
    "BODY_DOCS",
    "PARSER",
    "BatchInvalid",
    "IncomingBatch",
    "collector_paused",
    "document_update_batch",
    "drop",
    "is_update_stream",
    "read_batch",
    "read_stream",
    "read_update_batch",
]
