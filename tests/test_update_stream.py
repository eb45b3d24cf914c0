"""The update stream (``contract.update_stream``), the columnar body of ``POST /v1/updates``:
every wire value comes back from it exactly as from the JSON body (the same ``PlainUpdate``s,
the same content digest), the manager takes it end to end (whole updates and parts, a seq
sent once as a stream and again as JSON is one update), a body that is not a valid stream is
4xx naming what is wrong, and the wrapper chooses it by size, falling back to JSON for a
manager that does not read it."""

from __future__ import annotations

import io
import json
from typing import Any

import httpx
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from api.ingest import read_batch, read_stream
from contract.relation_snapshot import SnapshotWriter, snapshot_schema
from contract.schemas import INT64_MAX, NAN, Change, Update, UpdateBatch, UpdatePart
from contract.update_stream import (
    BATCH_KEY,
    MAX_SHAPES,
    UPDATE_STREAM_CONTENT_TYPE,
    VERSION_KEY,
    encode_update_batch,
)
from tests.api_support import api_env
from warehouse.catalog.db import Catalog, content_digest
from wrappers.parts import UpdateHead
from wrappers.shipper import Shipper, uses_stream

STREAM = {"content-type": UPDATE_STREAM_CONTENT_TYPE}

# -- every wire value, as JSON and as a stream -----------------------------------------------------
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-INT64_MAX - 1, INT64_MAX),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
COLUMNS = st.sampled_from(["k", "v", "w", "é", "a b"])
ROWS = st.dictionaries(COLUMNS, VALUES, max_size=4)
CHANGES = st.lists(
    st.builds(Change, relation=st.sampled_from(["R", "S", "t" * 200]), sign=st.sampled_from([1, -1]), row=ROWS),
    max_size=12,
)


@st.composite
def batches(draw: st.DrawFn) -> list[Update]:
    changes = draw(st.lists(CHANGES, min_size=1, max_size=4))
    txids = st.one_of(st.none(), st.text(max_size=8))
    return [
        Update(seq=i + 1, changes=c, txid=draw(txids), captured_at=draw(st.one_of(st.none(), st.floats(0, 2e9))))
        for i, c in enumerate(changes)
    ]


def json_body(updates: list[Update]) -> bytes:
    """The JSON body the wrapper sends (``Shipper.body``)."""
    return UpdateBatch(source="a", updates=updates).model_dump_json(exclude={"updates": {"__all__": {"part"}}}).encode()


def stream_body(updates: list[Update]) -> bytes:
    body = encode_update_batch("a", updates)
    assert body is not None
    return body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
@example([Update(seq=1, changes=[Change(relation="R", sign=1, row={"k": 2**63 - 1, "v": "\x00é", "w": -0.0})])])
@example([Update(seq=1, changes=[Change(relation="R", sign=-1, row={"k": 1, "v": 1.0, "w": True})])])  # mixed
@example(
    [Update(seq=1, changes=[Change(relation="R", sign=1, row={"k": NAN}), Change(relation="R", sign=1, row={"k": 1})])]
)
def test_every_wire_value_comes_back_as_from_json(updates: list[Update]) -> None:
    from_json, from_stream = read_batch(json_body(updates)), read_stream(stream_body(updates))
    assert from_stream == from_json  # NaN is one object (NAN) on both sides: dicts compare it equal
    for mine, theirs in zip(from_stream.updates, from_json.updates, strict=True):
        assert content_digest(mine.changes) == content_digest(theirs.changes)
        for a, b in zip(mine.changes, theirs.changes, strict=True):
            assert [type(v) for v in a["row"].values()] == [type(v) for v in b["row"].values()]
            assert list(a["row"]) == list(b["row"])  # the columns in their order


def test_a_part_travels_with_its_position() -> None:
    part = Update(
        seq=4, txid="t", changes=[Change(relation="R", sign=1, row={"k": 1})], part=UpdatePart(index=2, last=True)
    )
    (update,) = read_stream(stream_body([part])).updates
    assert (update.seq, update.txid, update.part, update.changes) == (4, "t", part.part, [part.changes[0].model_dump()])


def test_more_row_shapes_than_a_stream_holds_go_as_json() -> None:
    changes = [Change(relation="R", sign=1, row={f"c{i}": i}) for i in range(MAX_SHAPES + 1)]
    assert encode_update_batch("a", [Update(seq=1, changes=changes[:MAX_SHAPES])]) is not None
    assert encode_update_batch("a", [Update(seq=1, changes=changes)]) is None


# -- the manager, end to end ------------------------------------------------------------------------
@pytest.fixture
async def env(tmp_path):
    async with api_env(tmp_path) as e:
        yield e


def updates_of(n: int, seq: int = 1, v: str = "x") -> list[Update]:
    return [Update(seq=seq, txid="7", changes=[Change(relation="R", sign=1, row={"k": i, "v": v}) for i in range(n)])]


async def test_the_manager_takes_a_stream_as_it_takes_json(env) -> None:
    c, wrapper = env.client, env.auth("wrapper_a")
    r = await c.post("/v1/updates", content=stream_body(updates_of(150)), headers={**wrapper, **STREAM})
    assert r.status_code == 200 and r.json() == {"through": 1, "held": []}, r.text
    assert r.headers["accept-post"] == f"application/json, {UPDATE_STREAM_CONTENT_TYPE}"  # what it reads
    (entry,) = await env.manager.db(Catalog.log_entries, "a", 0)
    assert entry.changes == [{"relation": "R", "sign": 1, "row": {"k": i, "v": "x"}} for i in range(150)]
    # the same seq again as JSON: the same content, acknowledged and ignored; other content is 409
    r = await c.post("/v1/updates", content=json_body(updates_of(150)), headers=wrapper)
    assert r.json() == {"through": 1, "held": []}, r.text
    r = await c.post("/v1/updates", content=stream_body(updates_of(150, v="y")), headers={**wrapper, **STREAM})
    assert r.status_code == 409 and "seq 1 " in r.json()["detail"], r.text
    # the receiver's own checks hold for a stream as for JSON
    unknown = [Update(seq=2, changes=[Change(relation="R", sign=1, row={"k": 1, "nope": 2})])]
    r = await c.post("/v1/updates", content=stream_body(unknown), headers={**wrapper, **STREAM})
    assert r.status_code == 422 and "has no column(s) nope" in r.json()["detail"], r.text
    r = await c.post("/v1/updates", content=stream_body(updates_of(3, seq=2)), headers=env.auth("wrapper_b") | STREAM)
    assert r.status_code == 403, r.text  # the token of another source


async def test_parts_ship_as_streams_and_are_logged_whole(env) -> None:
    posted: list[str] = []
    (update,) = updates_of(150)
    parts = [update.changes[i : i + 40] for i in range(0, 150, 40)]

    async def read_part(index: int) -> list[Change]:
        return parts[index]

    async with httpx.AsyncClient(transport=env.client._transport, base_url="http://pvm.test") as client:
        client.event_hooks["request"] = [lambda request: _record(posted, request)]
        ship = Shipper("a", "http://pvm.test", client, env.tokens["wrapper_a"], arrow_from=1)
        head = UpdateHead(update.seq, update.txid, update.captured_at, len(parts), 150, 0)
        assert await ship.send_parts(head, read_part, last_seq=lambda: 1) == 1
        assert (ship.held.now, ship.held.peak) == (0, 40)  # one part at a time
    assert posted == [UPDATE_STREAM_CONTENT_TYPE] * 4
    (entry,) = await env.manager.db(Catalog.log_entries, "a", 0)
    assert entry.changes == [c.model_dump() for c in update.changes]


async def _record(posted: list[str], request: httpx.Request) -> None:
    posted.append(request.headers["content-type"])


def _stream(schema: pa.Schema, *batches: pa.RecordBatch) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return sink.getvalue()


def _with_metadata(body: bytes, **changes: bytes) -> bytes:
    """``body``'s stream with schema metadata replaced (keys with dots spelled with __)."""
    reader = pa.ipc.open_stream(body)
    meta = {**reader.schema.metadata, **{k.replace("__", ".").encode(): v for k, v in changes.items()}}
    return _stream(reader.schema.with_metadata(meta), *reader)


def _header(body: bytes) -> dict[str, Any]:
    return json.loads(pa.ipc.open_stream(body).schema.metadata[BATCH_KEY])


def _with_header(body: bytes, **update: Any) -> bytes:
    header = _header(body)
    header["updates"][0].update(update)
    return _with_metadata(body, pvm__batch=json.dumps(header).encode())


def _with_signs(body: bytes, signs: list[int]) -> bytes:
    reader = pa.ipc.open_stream(body)
    (batch,) = list(reader)
    changed = pa.RecordBatch.from_arrays([pa.array(signs, pa.int8()), batch.column(1)], schema=reader.schema)
    return _stream(reader.schema, changed)


async def test_bad_streams_are_4xx_naming_what_is_wrong(env) -> None:
    c, wrapper = env.client, {**env.auth("wrapper_a"), **STREAM}
    good = stream_body(updates_of(3))
    snapshot = io.BytesIO()
    writer = SnapshotWriter(snapshot, snapshot_schema(["k"], ["INTEGER"], watermark=1))
    writer.write_rows([(1,)])
    writer.close()
    text = [Update(seq=1, changes=[Change(relation="R", sign=1, row={"k": 1, "v": "x"})])]
    for body, status, words in (
        (b"", 400, "malformed Arrow update stream"),
        (b"not arrow at all", 400, "malformed Arrow update stream"),
        (good[: len(good) // 2], 400, "malformed Arrow update stream"),
        (json_body(updates_of(3)), 400, "malformed Arrow update stream"),  # JSON under the stream's type
        (snapshot.getvalue(), 422, "update stream version '(none)'"),
        (_with_metadata(good, pvm__updates=b"2"), 422, "update stream version '2'"),
        (_with_metadata(good, pvm__batch=b"{"), 422, "no JSON pvm.batch"),
        (_with_header(good, seq=0), 422, "body.updates.0.seq"),
        (_with_header(good, changes=2), 422, "the stream carries 3 changes, its updates declare 2"),
        (_with_header(good, changes=4), 400, "ends after 3 changes, its updates declare 4"),
        (_with_header(good, changes="3"), 422, "body.updates.0.changes"),
        (_with_header(good, changes=100_001), 422, "at most 100000"),
        (_with_signs(good, [1, 2, 1]), 422, "body.updates.0.changes.1.sign: a change's sign is 1 or -1"),
        (_with_text(stream_body(text), '"v"', "1e999"), 422, "body.updates.0.changes.0.row.v"),
        (_with_text(stream_body(text), '"v"', "99999999999999999999"), 422, "signed 64 bits"),
        (_with_text(stream_body(text), '"v"', '{"a": 1}'), 422, "a JSON scalar"),
        (
            _stream(
                pa.schema([("sign", pa.int8()), ("row", pa.int64())]).with_metadata(
                    {VERSION_KEY: b"1", BATCH_KEY: b"{}"}
                )
            ),
            422,
            "dense union",
        ),
        (
            _stream(pa.schema([("x", pa.int8())]).with_metadata({VERSION_KEY: b"1", BATCH_KEY: b"{}"})),
            422,
            "two fields",
        ),
    ):
        r = await c.post("/v1/updates", content=body, headers=wrapper)
        assert r.status_code == status, (words, r.text)
        assert words in r.json()["detail"], (words, r.text)
    r = await c.post(
        "/v1/updates",
        content=good,
        headers={**wrapper, "content-type": "application/vnd.apache.arrow.stream; version=2"},
    )
    assert r.status_code == 415 and "version=1" in r.headers["accept-post"], r.text
    assert "update stream version '2'" in r.json()["detail"]
    r = await c.post(
        "/v1/updates", content=good, headers={**wrapper, "content-type": "application/vnd.apache.arrow.stream"}
    )
    assert r.status_code == 200, r.text  # without a version: the stream's own says which
    assert await env.manager.db(Catalog.log_entries, "a", 0) != []


def _with_text(body: bytes, column: str, text: str) -> bytes:
    """``body`` with the first value of ``column`` (a string column) replaced by the JSON
    ``text`` the stream carries for a column of mixed values."""
    reader = pa.ipc.open_stream(body)
    (batch,) = list(reader)
    union = batch.column(1)
    member = union.field(0)
    name = json.loads(column)
    fields = [pa.field(f.name, f.type, metadata={b"pvm.json": b"1"} if f.name == name else None) for f in member.type]
    arrays = [
        pa.array([text, *member.field(i).to_pylist()[1:]], pa.string()) if f.name == name else member.field(i)
        for i, f in enumerate(member.type)
    ]
    struct = pa.StructArray.from_arrays(arrays, fields=fields)
    rows = pa.UnionArray.from_dense(union.type_codes, union.offsets, [struct], field_names=[union.type.field(0).name])
    schema = pa.schema([reader.schema.field(0), pa.field("row", rows.type)], metadata=reader.schema.metadata)
    return _stream(schema, pa.RecordBatch.from_arrays([batch.column(0), rows], schema=schema))


# -- the wrapper's choice -------------------------------------------------------------------------------
def test_the_wrapper_chooses_a_stream_by_size() -> None:
    (small,) = updates_of(99)
    assert not uses_stream([small], 100) and uses_stream([small, *updates_of(1, seq=2)], 100)


async def test_a_manager_that_refuses_streams_gets_json_from_then_on() -> None:
    seen: list[str] = []

    def older_manager(request: httpx.Request) -> httpx.Response:
        """A manager before update streams: every body is JSON to it."""
        seen.append(request.headers["content-type"])
        try:
            batch = UpdateBatch.model_validate_json(request.content)
        except ValueError:
            return httpx.Response(400, json={"detail": "malformed JSON body: …"})
        return httpx.Response(200, json={"through": batch.updates[-1].seq, "held": []})

    async with httpx.AsyncClient(transport=httpx.MockTransport(older_manager)) as client:
        ship = Shipper("a", "http://old.test", client, first_wait=0.001)
        assert await ship.send([*updates_of(150), *updates_of(1, seq=2)], last_seq=lambda: 2) == 2
        assert not ship.streams
        assert await ship.send(updates_of(150, seq=3), last_seq=lambda: 3) == 3
    assert seen == [UPDATE_STREAM_CONTENT_TYPE, "application/json", "application/json"]


async def test_json_only_sends_no_stream() -> None:
    seen: list[str] = []

    def manager(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["content-type"])
        return httpx.Response(200, json={"through": 1, "held": []})

    async with httpx.AsyncClient(transport=httpx.MockTransport(manager)) as client:
        assert (
            await Shipper("a", "http://m.test", client, encoding="json").send(updates_of(500), last_seq=lambda: 1) == 1
        )
        assert await Shipper("a", "http://m.test", client).send(updates_of(500), last_seq=lambda: 1) == 1
        assert await Shipper("a", "http://m.test", client).send(updates_of(99), last_seq=lambda: 1) == 1
    assert seen == ["application/json", UPDATE_STREAM_CONTENT_TYPE, "application/json"]
    with pytest.raises(ValueError, match="update encoding 'arrow'"):
        Shipper("a", "http://m.test", httpx.AsyncClient(), encoding="arrow")


def test_a_damaged_stream_is_refused_never_an_error_of_the_manager() -> None:
    """Bytes changed or cut anywhere in a stream: the ingest answers 400 or 422 (or takes what
    is still a valid batch), and never fails otherwise (a 500, or pyarrow crashing the process)."""
    import random

    from fastapi import HTTPException

    from api.ingest import BatchInvalid

    rows = [
        {"k": i, "v": f"x{i}", "f": i * 0.5, "b": i % 2 == 0, "n": None, "m": 1 if i % 3 else 1.5} for i in range(20)
    ]
    changes = [Change(relation="R", sign=1, row=r) for r in rows] + [Change(relation="S", sign=-1, row={"a": 1})]
    good = stream_body([Update(seq=1, changes=changes)])
    rng = random.Random(7)
    for _ in range(1500):
        body = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        if rng.random() < 0.2:
            body = body[: rng.randrange(len(body))]
        try:
            read_stream(bytes(body))
        except HTTPException as refused:
            assert refused.status_code == 400, refused.detail
        except BatchInvalid:
            pass
