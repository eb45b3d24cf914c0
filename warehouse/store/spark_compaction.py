"""The Spark jobs of a compaction: fold a view's z-log up to the watermark into a new base
version, and carry the rest over into a new z-log version.

Which files to fold, and the swap to the new versions, are the store's
(``SparkStore.compact``); when to compact is ``warehouse/store/compaction.py``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from warehouse.store.file_access import store_files
from warehouse.store.spark_files import Footer, link, part_files, unit_part
from warehouse.store.spark_names import ORDER, WEIGHT
from warehouse.store.spark_records import ViewMeta
from warehouse.store.spark_rows import RowCodec

__all__ = ["write_compacted"]


def _read(spark: SparkSession, schema: StructType, paths: Sequence[str]) -> DataFrame:
    return spark.read.schema(schema).parquet(*paths)


def write_compacted(
    spark: SparkSession,
    codec: RowCodec,
    start: ViewMeta,
    zlog_files: Sequence[str],
    footers: Sequence[Footer],
    new_base: str,
    new_zlog: str,
) -> None:
    """New base: old base plus z-log rows up to W, summed, zeros dropped (negative sums
    stay: a later insert must still cancel them); for an aggregate view, per key, its
    numbers times the weights (one row per group and MIN/MAX value). New z-log: the rows
    after W.

    Each Spark job reads only the files that hold rows for it (by the ``_order`` range
    in their footers); a job with no such file is not run: the old base is linked into
    the new version, or the new z-log starts empty. The rows after W are rewritten into few
    files, except a unit's parts (``spark_files.unit_part_file``, one order each): they are
    linked into the new z-log as they are, keeping the names that say which part they are."""
    bound = start.watermark
    spans = {f: footer.span for f, footer in zip(zlog_files, footers)}
    upto = [f for f, span in spans.items() if span is None or span[0] <= bound]
    later = {f for f, span in spans.items() if unit_part(f) is not None and span is not None and span[0] > bound}
    after = [f for f, span in spans.items() if (span is None or span[1] > bound) and f not in later]
    if upto:
        base = _read(spark, codec.base_schema, [start.base_location])
        zlog = _read(spark, codec.zlog_schema, upto).where(F.col(ORDER) <= bound).drop(ORDER)
        both = base.unionByName(zlog)
        if start.summed is None:
            summed = both.groupBy(*codec.columns).agg(F.sum(WEIGHT).alias(WEIGHT)).where(F.col(WEIGHT) != 0)
        else:  # an aggregate view: one row per key, its numbers summed, of weight 1
            keys, numbers = codec.columns[: start.summed.keys], codec.columns[start.summed.keys :]
            summed = (
                both.groupBy(*keys)
                .agg(*(F.sum(F.col(c) * F.col(WEIGHT)).alias(c) for c in numbers))
                .where(reduce(lambda a, b: a | b, (F.col(c) != 0 for c in numbers)))
                .select(*codec.columns, F.lit(1).cast("bigint").alias(WEIGHT))
            )
        summed.write.mode("overwrite").parquet(new_base)
    else:
        link(part_files(start.base_location), new_base)
    if after:
        zlog = _read(spark, codec.zlog_schema, after).where(F.col(ORDER) > bound)
        zlog.write.mode("overwrite").parquet(new_zlog)
    else:
        store_files().make_dir(Path(new_zlog))
    link(sorted(later), new_zlog)
