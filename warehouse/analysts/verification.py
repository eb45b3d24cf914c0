"""The query process's part of a verification (``warehouse/verify.py`` is the manager's):
recompute a view in Spark SQL from its relations, read the stored view as of W from the
files of a store record, and compare the two row by row with multiplicities.

It runs in the analysts' query process, on its Spark application and within its limits, not
in the manager's Spark session (the one that commits): a verification competes with
analysts' queries, never with maintenance for the writer's memory and cores. The stored side
is read as ``/rows`` reads it, from the immutable files a record names, so no store lock is
held while it is read, and the view never passes through the manager.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from contract.schemas import NAN
from contract.zset import ZSet, row_order
from warehouse.analysts.messages import VerifyRelation, VerifyRequest, VerifyResult

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

STORED_BASE = "verify_stored_base"  # the temporary views of the stored side
STORED_ZLOG = "verify_stored_zlog"


def differences(expected: ZSet, stored: ZSet, limit: int) -> tuple[list, list, int, int]:
    """Rows missing from the store and extra in it, with counts (first ``limit`` of each)."""
    diff = stored - expected
    missing = sorted(((r, -w) for r, w in diff.items() if w < 0), key=lambda x: row_order(x[0]))
    extra = sorted(((r, w) for r, w in diff.items() if w > 0), key=lambda x: row_order(x[0]))
    return missing[:limit], extra[:limit], sum(n for _, n in missing), sum(n for _, n in extra)


def _infer_type(values: Sequence[Any]):
    from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType

    kinds = {type(v) for v in values if v is not None}
    if not kinds or kinds <= {str}:
        return StringType(), None
    if kinds <= {bool}:
        return BooleanType(), None
    if kinds <= {int} and all(-(2**63) <= v < 2**63 for v in values if v is not None):
        return LongType(), None
    if kinds <= {int, float}:
        return DoubleType(), None
    return StringType(), "mixes value types " + ", ".join(sorted(k.__name__ for k in kinds)) + "; compared as text"


def frame(spark: SparkSession, columns: Sequence[str], contents: ZSet, notes: list[str], label: str) -> DataFrame:
    """A DataFrame of the bag ``contents`` (each row repeated by its weight)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import StringType, StructField, StructType

    negative = [r for r, w in contents.items() if w < 0]
    if negative:
        notes.append(f"{label}: {len(negative)} row(s) with a negative count in the rolled-back snapshot")
    rows = contents.expand()
    fields, arrays = [], []
    for i, name in enumerate(columns):
        values = [r[i] for r in rows]
        kind, note = _infer_type(values)
        if note:
            notes.append(f"{label}.{name} {note}")
        if note or isinstance(kind, StringType):
            values = [None if v is None else v if isinstance(v, str) else str(v) for v in values]
        fields.append(StructField(name, kind))
        arrays.append(pa.array(values, type=to_arrow_type(kind)))
    schema = StructType(fields)
    table = pa.Table.from_arrays(arrays, names=list(columns))
    return spark.createDataFrame(table, schema=schema)


def relation_contents(relation: VerifyRelation) -> ZSet:
    """The relation's rows as a Z-set (each message row is its values, then its weight)."""
    return ZSet((tuple(row[:-1]), int(row[-1])) for row in relation.rows)


def recompute(session: SparkSession, sql: str, relations: Sequence[VerifyRelation], notes: list[str]) -> ZSet:
    """The view's SELECT (``sql``) over the relations, each a temporary view of ``session``."""
    for relation in relations:
        contents = relation_contents(relation)
        frame(session, relation.columns, contents, notes, relation.label).createOrReplaceTempView(relation.name)
    result = session.sql(sql).toArrow()
    columns = [[NAN if v != v else v for v in result.column(i).to_pylist()] for i in range(result.num_columns)]
    return ZSet.from_rows(zip(*columns))  # every NaN the one object Z-sets can cancel


def stored_as_of(session: SparkSession, record: dict[str, Any], as_of: int) -> ZSet:
    """The stored view's signed weights as of ``as_of``, from the files ``record`` names:
    the base plus the z-log rows with ``_order <= as_of``, summed per row (zeros dropped,
    negative sums kept), as the store's own read sums them; an aggregate view's rows as
    its readers see them."""
    from warehouse.store.spark_records import ViewMeta
    from warehouse.store.spark_rows import RowCodec, shown_codec
    from warehouse.store.spark_sql import shown_sql, sums_sql

    meta = ViewMeta.from_record(record)
    if as_of < meta.compacted_through:
        raise ValueError(f"the record holds the view as of order {meta.compacted_through} onwards, not {as_of}")
    codec = RowCodec(meta.columns, meta.types)
    session.read.schema(codec.base_schema).parquet(meta.base_location).createOrReplaceTempView(STORED_BASE)
    session.read.schema(codec.zlog_schema).parquet(meta.zlog_location).createOrReplaceTempView(STORED_ZLOG)
    if meta.summed is not None:  # an aggregate view: its rows, each once
        table = session.sql(shown_sql(STORED_BASE, STORED_ZLOG, meta.columns, meta.summed, as_of)).toArrow()
        return ZSet.from_rows(shown_codec(meta).decode(table))
    table = session.sql(sums_sql(STORED_BASE, STORED_ZLOG, meta.columns, as_of, "<> 0")).toArrow()
    return ZSet(codec.decode_weighted(table))


def compare(spark: SparkSession, request: VerifyRequest) -> VerifyResult:
    """Recompute, read the stored view, compare: the whole answer of a verification but the
    sources' cut, which the manager reports itself."""
    session = spark.newSession()  # temporary views of its own
    if request.staged:
        return compare_staged(session, request)
    notes: list[str] = []
    expected = recompute(session, request.sql, request.relations, notes)
    stored = stored_as_of(session, request.record, request.as_of)
    missing, extra, missing_total, extra_total = differences(expected, stored, request.max_differences)
    return VerifyResult(
        expected_rows=sum(w for _, w in expected.items()),
        stored_rows=sum(max(w, 0) for _, w in stored.items()),
        missing=[(list(r), n) for r, n in missing],
        extra=[(list(r), n) for r, n in extra],
        missing_total=missing_total,
        extra_total=extra_total,
        notes=notes,
    )


RECOMPUTED = "verify_recomputed"
RECOMPUTED_BASE = "verify_recomputed_base"
RECOMPUTED_ZLOG = "verify_recomputed_zlog"


def compare_staged(session: SparkSession, request: VerifyRequest) -> VerifyResult:
    """The comparison of a view recomputed from staged relations, all in Spark: no row of
    either side becomes a Python object, only the differences listed. ``request.sql``
    yields the view's stored rows and their weights (what an initial load in Spark appends);
    read as a z-log of one order, the recomputed view is read exactly as the stored one is
    (``shown_sql``), and the two are compared per row of what readers see: summed weights
    for a plain view, each row once for an aggregate view."""
    from warehouse.store.spark_records import ViewMeta
    from warehouse.store.spark_rows import RowCodec, shown_codec
    from warehouse.store.spark_sql import shown_sql, sums_sql

    meta = ViewMeta.from_record(request.record)
    if request.as_of < meta.compacted_through:
        raise ValueError(f"the record holds the view as of order {meta.compacted_through} onwards, not {request.as_of}")
    codec = RowCodec(meta.columns, meta.types)
    session.read.schema(codec.base_schema).parquet(meta.base_location).createOrReplaceTempView(STORED_BASE)
    session.read.schema(codec.zlog_schema).parquet(meta.zlog_location).createOrReplaceTempView(STORED_ZLOG)
    stored_cols = ", ".join(f"`{c}`" for c in meta.columns)
    session.sql(f"SELECT * FROM ({request.sql}) AS recomputed({stored_cols}, _w)").createOrReplaceTempView(RECOMPUTED)
    session.sql(f"SELECT {stored_cols}, _w, 0L AS _order FROM {RECOMPUTED}").createOrReplaceTempView(RECOMPUTED_ZLOG)
    session.sql(f"SELECT {stored_cols}, _w FROM {RECOMPUTED} WHERE false").createOrReplaceTempView(RECOMPUTED_BASE)
    shown = shown_codec(meta, codec)
    out = ", ".join(f"`{c}`" for c in shown.columns)

    def counted(base: str, zlog: str, as_of: int) -> str:
        """Per row readers see, how often they see it (a negative sum kept: owed deletes)."""
        if meta.summed is None:
            return sums_sql(base, zlog, meta.columns, as_of, "<> 0")
        return f"SELECT {out}, COUNT(*) AS _w FROM ({shown_sql(base, zlog, meta.columns, meta.summed, as_of)}) GROUP BY {out}"

    expected, stored = counted(RECOMPUTED_BASE, RECOMPUTED_ZLOG, 0), counted(STORED_BASE, STORED_ZLOG, request.as_of)
    # per row, both counts: one pass over each side answers every total
    both = (
        f"SELECT {out}, SUM(_s) AS _s, SUM(_e) AS _e FROM (SELECT {out}, _w AS _s, 0L AS _e FROM ({stored}) "
        f"UNION ALL SELECT {out}, 0L AS _s, _w AS _e FROM ({expected})) GROUP BY {out}"
    )
    session.sql(both).createOrReplaceTempView("verify_both")
    totals = session.sql(
        "SELECT COALESCE(SUM(_e), 0) AS expected, COALESCE(SUM(CASE WHEN _s > 0 THEN _s END), 0) AS stored, "
        "COALESCE(SUM(CASE WHEN _s < _e THEN _e - _s END), 0) AS missing, "
        "COALESCE(SUM(CASE WHEN _s > _e THEN _s - _e END), 0) AS extra FROM verify_both"
    ).collect()[0]

    def listed(sign: str) -> list[tuple[list[Any], int]]:
        """The first differing rows of one kind: read again only when there are some."""
        table = session.sql(
            f"SELECT {out}, _s - _e AS _w FROM verify_both WHERE _s - _e {sign} 0 LIMIT {int(request.max_differences)}"
        ).toArrow()
        rows = sorted(shown.decode_weighted(table), key=lambda x: row_order(x[0]))
        return [(list(r), abs(int(w))) for r, w in rows]

    try:
        return VerifyResult(
            expected_rows=int(totals["expected"]),
            stored_rows=int(totals["stored"]),
            missing=listed("<") if totals["missing"] else [],
            extra=listed(">") if totals["extra"] else [],
            missing_total=int(totals["missing"]),
            extra_total=int(totals["extra"]),
            notes=[],
        )
    finally:
        session.catalog.dropTempView("verify_both")
