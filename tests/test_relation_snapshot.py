"""The relation snapshot stream (``contract.relation_snapshot``) and the engine load's plan
(``warehouse.engine_load``): what the wrapper writes reads back exactly, a stream cut
anywhere before its end marker is refused as truncated, a stream of another version or of
other columns is refused, and only joins that mean the same in Spark are loaded there."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contract.expr import Cmp, Col, Lit
from contract.relation_snapshot import (
    VERSION_KEY,
    SnapshotReader,
    SnapshotStreamError,
    SnapshotWriter,
    TruncatedSnapshot,
    encode_batch,
    snapshot_schema,
)
from contract.zset import ZSet
from warehouse.engine_load import EngineLoad, LoadProgress, stage, supports
from warehouse.plan import OutputColumn, RelationRef, ViewPlan
from warehouse.protocol import ViewProtocol, ViewUpdate

COLUMNS = ["id", "name", "price", "flag", "ratio"]
TYPES = ["INTEGER", "VARCHAR(10)", "NUMERIC(6,2)", "BOOLEAN", "REAL"]
ROWS = [(1, "é", 2.5, 1, 3), (2, None, 7, 0, float("nan")), (3, "x", None, None, -0.0)]


def stream(rows=ROWS, per_batch: int = 2, estimate: int | None = None) -> bytes:
    sink = io.BytesIO()
    writer = SnapshotWriter(sink, snapshot_schema(COLUMNS, TYPES, watermark=42, rows_estimate=estimate))
    for i in range(0, len(rows), per_batch):
        writer.write_rows(rows[i : i + per_batch])
    writer.close()
    return sink.getvalue()


def test_what_is_written_reads_back_in_the_view_columns_types() -> None:
    reader = SnapshotReader(io.BytesIO(stream()))
    table = pa.Table.from_batches(list(reader.batches()))
    assert reader.watermark == 42 and reader.complete and reader.rows == 3
    assert [str(f.type) for f in table.schema] == ["int64", "string", "string", "bool", "double"]
    assert table.column("id").to_pylist() == [1, 2, 3]
    assert table.column("flag").to_pylist() == [True, False, None]  # SQLite's 0 and 1
    # untyped columns hold the exact JSON text the Spark store keeps for them
    assert table.column("price").to_pylist() == ["2.5", "7", None]
    assert [json.loads(v) for v in table.column("price").to_pylist()[:2]] == [2.5, 7]
    ratio = table.column("ratio").to_pylist()
    assert ratio[0] == 3.0 and math.isnan(ratio[1]) and math.copysign(1, ratio[2]) == -1


@pytest.mark.parametrize("keep", [0, 10, 100, 200, 300, -60, -12])
def test_a_stream_cut_before_its_end_marker_is_truncated(keep: int) -> None:
    data = stream()
    with pytest.raises(TruncatedSnapshot):
        reader = SnapshotReader(io.BytesIO(data[:keep]))
        list(reader.batches())


def test_only_the_ipc_end_of_stream_may_be_missing() -> None:
    reader = SnapshotReader(io.BytesIO(stream()[:-8]))  # the end marker came: complete
    assert sum(b.num_rows for b in reader.batches()) == 3 and reader.complete


def test_another_version_is_refused() -> None:
    schema = snapshot_schema(COLUMNS, TYPES, 1).with_metadata({VERSION_KEY: b"2", b"pvm.watermark": b"1"})
    sink = io.BytesIO()
    SnapshotWriter(sink, schema).close()
    with pytest.raises(SnapshotStreamError, match="version '2'"):
        SnapshotReader(io.BytesIO(sink.getvalue()))


def test_a_value_that_does_not_fit_its_column_is_refused() -> None:
    with pytest.raises(SnapshotStreamError, match="'id'"):
        encode_batch(snapshot_schema(["id"], ["INTEGER"], 1), [("seven",)])


def test_staging_writes_parquet_and_checks_the_columns(tmp_path) -> None:
    progress: dict[int, int] = {}
    watermark, _ = stage(io.BytesIO(stream(per_batch=1)), tmp_path / "r.parquet", COLUMNS, TYPES, progress, 0)
    assert watermark == 42 and progress == {0: 3}
    assert pq.read_table(tmp_path / "r.parquet").num_rows == 3
    with pytest.raises(SnapshotStreamError, match="the view expects"):
        stage(io.BytesIO(stream()), tmp_path / "s.parquet", COLUMNS, ["TEXT", *TYPES[1:]], progress, 1)


def test_staging_keeps_the_sources_estimate_for_the_progress(tmp_path) -> None:
    progress: dict[int, int] = {}
    estimates: dict[int, int] = {}
    stage(io.BytesIO(stream(estimate=5)), tmp_path / "r.parquet", COLUMNS, TYPES, progress, 0, estimates)
    stage(io.BytesIO(stream()), tmp_path / "s.parquet", COLUMNS, TYPES, progress, 1, estimates)  # none sent
    assert progress == {0: 3, 1: 3} and estimates == {0: 5}
    load = LoadProgress(2, started_at=0.0, staged=2, rows=progress, expected=estimates)
    assert load.status(now=1.0)["rows_expected"] is None  # not every relation has an estimate
    assert load.status(now=1.0)["percent"] == 100.0  # relations staged whole
    load.expected[1] = 5
    assert load.status(now=1.0)["rows_expected"] == 10
    assert load.status(now=1.0)["percent"] == 60.0 and load.status(now=1.0)["eta_seconds"] == round(1.0 * 4 / 6, 1)
    load.phase = "joining"
    assert load.status(now=2.0)["percent"] == 100.0 and load.status(now=2.0)["eta_seconds"] is None


def plan_of(*join) -> ViewPlan:
    r = RelationRef("r", "a", "r", ("k", "x", "f"))
    s = RelationRef("s", "b", "s", ("k", "x", "f"))
    return ViewPlan("v", (r, s), join, (OutputColumn("k", Col("r", "k")),))


def test_spark_loads_only_joins_that_mean_the_same_there() -> None:
    declared = [["INTEGER", "TEXT", "REAL"], ["BIGINT", "DATE", "REAL"]]
    assert supports(plan_of(Cmp("=", Col("r", "k"), Col("s", "k"))), declared) is None
    assert "types" in supports(plan_of(Cmp("=", Col("r", "f"), Col("s", "f"))), declared)  # NaN, -0.0
    assert "types" in supports(plan_of(Cmp("=", Col("r", "x"), Col("s", "x"))), declared)  # text against JSON
    assert "equality" in supports(plan_of(Cmp("<", Col("r", "k"), Col("s", "k"))), declared)
    assert "equality" in supports(plan_of(Cmp("=", Col("r", "k"), Lit(1))), declared)


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("SELECT r.k, COUNT(*) AS n, MAX(s.y) AS top FROM a.r, b.s WHERE r.k = s.k GROUP BY r.k", None),
        ("SELECT DISTINCT r.k FROM a.r, b.s WHERE r.k = s.k", None),
        ("SELECT r.x, COUNT(*) AS n FROM a.r, b.s WHERE r.k = s.k GROUP BY r.x", "floating-point columns ['r.x']"),
        ("SELECT r.k, MIN(r.x) AS low FROM a.r, b.s WHERE r.k = s.k GROUP BY r.k", "floating-point columns ['r.x']"),
        ("SELECT r.k, s.k AS sk FROM a.r LEFT JOIN b.s ON r.k = s.k", "NULL-extended"),
    ],
)
def test_which_views_with_operators_over_the_join_the_engine_loads(sql: str, why: str | None) -> None:
    """Aggregates and DISTINCT are computed from the join's rows (``aggregate.encode_sql``),
    unless they group or take MIN/MAX of floats; a LEFT JOIN keeps the subqueries."""
    from warehouse.sql_views import parse_view

    tables = {("a", "r"): ["k", "x"], ("b", "s"): ["k", "y"]}
    plan = parse_view(sql, lambda source, table: tables.get((source, table)), "v")
    reason = supports(plan, [["INTEGER", "REAL"], ["INTEGER", "INTEGER"]][: len(plan.relations)])
    assert reason is None if why is None else (reason is not None and why in reason), reason


class FakeSource:
    """Streams a fixed relation as of a fixed watermark."""

    def __init__(self, rows, watermark: int, columns=("k", "x"), types=("INTEGER", "TEXT")) -> None:
        self.rows, self.watermark, self.columns, self.types = rows, watermark, columns, types
        self.asked = 0

    @contextlib.contextmanager
    def open_snapshot(self, request):
        self.asked += 1
        sink = io.BytesIO()
        writer = SnapshotWriter(sink, snapshot_schema(list(self.columns), list(self.types), self.watermark))
        writer.write_rows(self.rows)
        writer.close()
        yield io.BytesIO(sink.getvalue())


class FakeStore:
    """Keeps what the load would join: each staged file's rows, read when ``load`` runs."""

    def __init__(self, root, held=()) -> None:
        self.root, self.held, self.staged = root, set(held), {}

    def staging_dir(self, view):
        return self.root / view

    def committed_orders(self, view):
        return set(self.held)

    def load(self, view, order, sql):
        for path in re.findall(r"parquet\.`([^`]+)`", sql):
            self.staged[Path(path).name] = pq.read_table(path).to_pylist()
        self.held.add(order)
        return True


def two_relation_plan() -> ViewPlan:
    r = RelationRef("r", "a", "r", ("k", "x"))
    s = RelationRef("s", "b", "s", ("k", "x"))
    return ViewPlan("v", (r, s), (Cmp("=", Col("r", "k"), Col("s", "k")),), (OutputColumn("k", Col("r", "k")),))


async def test_the_load_stages_what_its_snapshots_reflect_but_must_not(tmp_path) -> None:
    """Updates of source a with seq <= 5 (its snapshot's watermark) are queued, so ordered
    after the load: staged negated beside r's snapshot. Seq 6 is not reflected; source b's
    snapshot reflects none of its queued updates."""
    protocol = ViewProtocol(parallelism=2)
    load = protocol.start_initial()
    for seq, source, row in ((4, "a", (1, "new")), (5, "a", (2, "newer")), (6, "a", (3, "later")), (9, "b", (7, "s"))):
        protocol.receive(ViewUpdate(seq, source, seq, {0 if source == "a" else 1: ZSet({row: 1})}))
    sources = {"a": FakeSource([(1, "new"), (2, "newer"), (5, "old")], 5), "b": FakeSource([(1, "y")], 8)}
    store = FakeStore(tmp_path)
    engine = EngineLoad(two_relation_plan(), protocol, sources, store, [["INTEGER", "TEXT"]] * 2)
    effect, compensated, from_log = await engine.run(load)
    assert effect.is_empty() and compensated == 2 and from_log == 0
    assert store.staged["c0.parquet"] == [{"k": 1, "x": "new", "_w": -1}, {"k": 2, "x": "newer", "_w": -1}]
    assert "c1.parquet" not in store.staged and len(store.staged["r0.parquet"]) == 3
    assert not list((tmp_path / "v").iterdir())  # the staging is removed
    assert engine.progress is None

    again = EngineLoad(
        two_relation_plan(), protocol, sources, FakeStore(tmp_path, held={load.order}), [["INTEGER", "TEXT"]] * 2
    )
    assert await again.run(load) == (ZSet(), 0, 0)  # the store holds the load: nothing is asked again
    assert sources["a"].asked == 1


class LoggedUpdates:
    """A ``SpillLog`` over a list of updates (warehouse/spill.py)."""

    def __init__(self, updates: list[ViewUpdate]) -> None:
        self.updates = updates

    async def read_back(self, after, most):  # not asked while the load runs
        raise AssertionError("the load does not read the queue back")

    async def spilled(self, spilled):
        yield [u for u in self.updates if u.source == spilled.source and spilled.after < u.seq <= spilled.through]


async def test_the_load_takes_back_spilled_updates_read_from_the_log(tmp_path) -> None:
    """With a queue budget of one change, the updates after the first stay in the update
    log: the load reads those its snapshots reflect from there, and stages the same."""
    protocol = ViewProtocol(parallelism=2, queue_budget=1)
    load = protocol.start_initial()
    updates = [
        ViewUpdate(seq, source, seq, {0 if source == "a" else 1: ZSet({row: 1})})
        for seq, source, row in (
            (4, "a", (1, "new")),
            (5, "a", (2, "newer")),
            (6, "a", (3, "later")),
            (9, "b", (7, "s")),
        )
    ]
    for update in updates:
        protocol.receive(update)
    assert [u.seq for u in protocol.umq] == [4] and protocol.shelf is not None
    sources = {"a": FakeSource([(1, "new"), (2, "newer"), (5, "old")], 5), "b": FakeSource([(1, "y")], 8)}
    store = FakeStore(tmp_path)
    engine = EngineLoad(
        two_relation_plan(), protocol, sources, store, [["INTEGER", "TEXT"]] * 2, spill_log=LoggedUpdates(updates)
    )
    effect, compensated, from_log = await engine.run(load)
    assert effect.is_empty() and compensated == 2 and from_log == 1  # seq 5 from the log
    assert sorted(store.staged["c0.parquet"], key=lambda r: r["k"]) == [
        {"k": 1, "x": "new", "_w": -1},
        {"k": 2, "x": "newer", "_w": -1},
    ]
    assert "c1.parquet" not in store.staged
