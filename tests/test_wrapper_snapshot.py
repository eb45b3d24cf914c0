"""A relation snapshot in the source (``wrappers.query.scan``, ``wrappers.relation_stream``):
on SQLite, PostgreSQL and MariaDB it holds exactly the rows ``contract.expr`` keeps (text
compared by code point, LIKE case-sensitive), and the stream, read a batch at a time in the
snapshot's transaction, reads back as those rows with the snapshot's watermark."""

from __future__ import annotations

import io
import sqlite3

import pytest
import sqlalchemy as sa

from contract.expr import Cmp, Col, Like, Lit, Or, compile_filter, to_wire
from contract.relation_snapshot import SnapshotReader
from wrappers import query, relation_stream
from wrappers.capture import dialect_for
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
