"""A relation snapshot in the source (``wrappers.query.scan``, ``wrappers.relation_stream``):
on SQLite, PostgreSQL and MariaDB it holds exactly the rows ``contract.expr`` keeps (text
compared by code point, LIKE case-sensitive), and the stream, read a batch at a time in the
snapshot's transaction, reads back as those rows with the snapshot's watermark."""

from __future__ import annotations

import io
import sqlite3

import numpy as np
import pytest
import sqlalchemy as sa

from contract.expr import Cmp, Col, Like, Lit, Or, compile_filter, to_wire
from contract.relation_snapshot import SnapshotReader, encode_batch, snapshot_schema
from wrappers import mariadb_columns, query, relation_stream
from wrappers.capture import dialect_for
from wrappers.capture.types import wire_value
from wrappers.errors import InvalidRequest
from wrappers.schema import SourceSchema
from wrappers.snapshot import Snapshot

ROWS = [(1, 1, "xa"), (2, 1, "Xa"), (3, 2, "xb "), (4, None, "xc"), (5, 3, None), (6, 3, "y"), (7, 2, "é")]
WHERE = Or((Like(Col("r", "v"), "x%"), Cmp(">", Col("r", "v"), Lit("xz")), Cmp("=", Col("r", "b"), Lit(3))))


def fill(url: str) -> tuple[sa.Engine, SourceSchema]:
    if url.startswith("sqlite:///"):
        sqlite3.connect(url.removeprefix("sqlite:///")).close()  # the wrapper opens existing files only
    capture = dialect_for(url)
    engine = capture.open_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE r (id INTEGER PRIMARY KEY, b INTEGER, v VARCHAR(10))")
        conn.execute(sa.text("INSERT INTO r VALUES (:id, :b, :v)"), [dict(zip(("id", "b", "v"), r)) for r in ROWS])
    return engine, SourceSchema.reflect(engine, ["r"])


def expected(select: list[str]) -> list[tuple]:
    keep = compile_filter(WHERE, {Col("r", c): i for i, c in enumerate(("id", "b", "v"))})
    return sorted((tuple(row[("id", "b", "v").index(c)] for c in select) for row in ROWS if keep(row)), key=repr)


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def source(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'src.db'}"
    return request.getfixturevalue("pg_url" if request.param == "postgresql" else "maria_url")


def test_the_scan_keeps_the_rows_the_manager_would(source: str) -> None:
    engine, schema = fill(source)
    try:
        statement = query.scan(schema.table("r"), "r", to_wire(WHERE), ["v", "id"], engine.dialect.name)
        with engine.connect() as conn:
            got = sorted((tuple(row) for row in conn.execute(statement)), key=repr)
        assert got == expected(["v", "id"])
        assert len(got) == 6  # not "Xa" (LIKE is case-sensitive); "é" > "xz" by code point
    finally:
        engine.dispose()


async def test_the_stream_reads_back_in_batches(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(relation_stream, "ROWS_PER_BATCH", 2)
    url = f"sqlite:///{tmp_path / 'src.db'}"
    engine, schema = fill(url)
    try:
        statement = query.scan(schema.table("r"), "r", to_wire(WHERE), ["id", "v"], "sqlite")
        snapshot = await Snapshot.open(dialect_for(url), engine)
        chunks = [
            c async for c in relation_stream.stream(snapshot, statement, "r", ["id", "v"], ["INTEGER", "TEXT"], 17)
        ]
        assert len(chunks) >= 4  # the schema, three batches of at most two rows, the end
        reader = SnapshotReader(io.BytesIO(b"".join(chunks)))
        batches = list(reader.batches())
        assert reader.watermark == 17 and reader.complete and max(b.num_rows for b in batches) == 2
        assert reader.rows_estimate == len(ROWS)  # the table's rows, before the predicate
        rows = sorted((row for b in batches for row in zip(*(c.to_pylist() for c in b.columns))), key=repr)
        assert rows == expected(["id", "v"])
    finally:
        engine.dispose()


def test_each_database_estimates_the_relation_for_the_loads_progress(source: str) -> None:
    """From the statistics where the database keeps them (after ANALYZE), by counting in
    SQLite; a PostgreSQL table never analyzed has no estimate."""
    engine, _ = fill(source)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                if conn.exec_driver_sql("SELECT current_setting('server_version_num')::int").scalar_one() >= 140000:
                    assert relation_stream.estimated_rows(conn, "r") is None  # reltuples -1: never analyzed
                conn.exec_driver_sql("ANALYZE r")
            elif engine.dialect.name != "sqlite":
                conn.exec_driver_sql("ANALYZE TABLE r")
            assert relation_stream.estimated_rows(conn, "r") == len(ROWS)
    finally:
        engine.dispose()


def test_bad_requests_are_refused_before_any_snapshot(tmp_path) -> None:
    engine, schema = fill(f"sqlite:///{tmp_path / 'src.db'}")
    try:
        with pytest.raises(InvalidRequest, match="no column 'w'"):
            query.scan(schema.table("r"), "r", None, ["w"])
        with pytest.raises(InvalidRequest, match="unknown relation 's'"):
            query.scan(schema.table("r"), "r", to_wire(Cmp("=", Col("s", "b"), Lit(1))), ["id"])
        with pytest.raises(InvalidRequest, match="reserved"):
            query.scan(schema.table("r"), "$key", None, ["id"])
    finally:
        engine.dispose()


FAMILIES = {  # column: declared type (the same text in the three dialects)
    "id": "INTEGER",
    "i": "BIGINT",
    "x": "DOUBLE PRECISION",
    "t": "TEXT",
    "n": "NUMERIC(10, 2)",
    "d": "DATE",
    "f": "BOOLEAN",
}
LONG = "é" * 150 + "ü" * 30_000  # 60,300 bytes: a two-byte length in MariaDB's rows
VALUES = [
    (1, 2**62, 0.1, 'a,"b"\nc', "12.50", "2024-02-29", True),
    (2, None, None, None, None, None, None),
    (3, -(2**63), -1.5e-300, "", "-3", "0001-01-01", False),
    (4, 0, 1.7976931348623157e308, "x" * 300, "0.01", "9999-12-31", True),
    (5, 7, 3.0, LONG, "99999999.99", "1970-01-01", None),
]
NON_FINITE = [(6, 1, float("nan"), "nan", "0", None, None), (7, 1, float("inf"), "", "0", None, None)]


def fill_families(url: str) -> tuple[sa.Engine, SourceSchema]:
    if url.startswith("sqlite:///"):
        sqlite3.connect(url.removeprefix("sqlite:///")).close()
    engine = dialect_for(url).open_engine(url)
    rows = VALUES + (NON_FINITE if engine.dialect.name != "mysql" else [])  # MariaDB stores no NaN
    columns = ", ".join(f"{c} {t}{' PRIMARY KEY' if c == 'id' else ''}" for c, t in FAMILIES.items())
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE fam ({columns})")
        names = ", ".join(f":{c}" for c in FAMILIES)
        conn.execute(sa.text(f"INSERT INTO fam VALUES ({names})"), [dict(zip(FAMILIES, r)) for r in rows])
    return engine, SourceSchema.reflect(engine, ["fam"])


async def test_every_type_family_streams_as_the_drivers_rows_encode(source: str, monkeypatch) -> None:
    """The stream reads the driver's cursor itself (MariaDB's rows as Arrow columns, without
    PyMySQL's row objects): every value is what SQLAlchemy's rows of the same statement
    give in wire form, also across batch boundaries."""
    monkeypatch.setattr(relation_stream, "ROWS_PER_BATCH", 2)
    engine, schema = fill_families(source)
    table = schema.table("fam")
    select = list(FAMILIES)
    types = [table.types[table.columns.index(c)] for c in select]
    try:
        statement = query.scan(table, "fam", None, select, engine.dialect.name)
        with engine.connect() as conn:
            rows = [[wire_value(v) for v in row] for row in conn.execute(statement)]
        encoded = encode_batch(snapshot_schema(select, types, 0), rows)
        want = sorted(zip(*(c.to_pylist() for c in encoded.columns)), key=repr)
        snapshot = await Snapshot.open(dialect_for(source), engine)
        chunks = [c async for c in relation_stream.stream(snapshot, statement, "fam", select, types, 3)]
        reader = SnapshotReader(io.BytesIO(b"".join(chunks)))
        got = sorted((row for b in reader.batches() for row in zip(*(c.to_pylist() for c in b.columns))), key=repr)
        assert repr(got) == repr(want)  # repr: NaN equals itself
        assert len(got) == len(VALUES) + (len(NON_FINITE) if engine.dialect.name != "mysql" else 0)
        with engine.connect() as conn:  # the snapshot's connection went back to the pool usable
            assert conn.exec_driver_sql("SELECT COUNT(*) FROM fam").scalar_one() == len(got)
    finally:
        engine.dispose()


async def test_a_mariadb_stream_abandoned_midway_leaves_no_broken_connection(maria_url, monkeypatch) -> None:
    """PyMySQL cannot skip the rest of a result its reader took bytes of: the connection
    is dropped from the pool, and the next one works."""
    monkeypatch.setattr(relation_stream, "ROWS_PER_BATCH", 1)
    engine, schema = fill(maria_url)
    try:
        statement = query.scan(schema.table("r"), "r", None, ["id", "v"], engine.dialect.name)
        snapshot = await Snapshot.open(dialect_for(maria_url), engine)
        stream = relation_stream.stream(snapshot, statement, "r", ["id", "v"], ["INTEGER", "TEXT"], 1)
        assert [await anext(stream) for _ in range(3)]
        await stream.aclose()
        for _ in range(3):
            with engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT COUNT(*) FROM r").scalar_one() == len(ROWS)
    finally:
        engine.dispose()


def test_mariadb_rows_are_cut_into_columns_by_their_length_prefixes() -> None:
    """Lengths below 251 in one byte, NULL as 251, longer values after 252 (two bytes) and
    253 (three bytes)."""
    values = [b"", b"a" * 250, None, b"b" * 300, b"c" * 70_000]

    def encoded(value: bytes | None) -> bytes:
        if value is None:
            return b"\xfb"
        n = len(value)
        prefix = (
            bytes([n])
            if n < 251
            else b"\xfc" + n.to_bytes(2, "little")
            if n < 2**16
            else b"\xfd" + n.to_bytes(3, "little")
        )
        return prefix + value

    data, starts = b"", []
    for value in values:  # rows of two columns: the value, then its length as text
        payload = encoded(value) + encoded(None if value is None else str(len(value)).encode())
        data += len(payload).to_bytes(3, "little") + b"\0"
        starts.append(len(data))
        data += payload
    first, second = mariadb_columns._cut(np.frombuffer(data, np.uint8), starts, 2)
    assert first.to_pylist() == values
    assert second.to_pylist() == [None if v is None else str(len(v)).encode() for v in values]
