"""Non-finite floats in the Spark store: a DOUBLE column (and an untyped one, kept as JSON
text) holds infinities and NaN through commit and read, and signed weights of a NaN row sum
as one group (Spark groups NaN with NaN), so a delete cancels its insert."""

from __future__ import annotations

import math

import pytest
from pyspark.sql import SparkSession

from contract.schemas import NAN
from contract.zset import ZSet
from warehouse.store.base import Effect
from warehouse.store.spark import SparkStore

pytestmark = pytest.mark.spark


def canonical(rows) -> list[tuple]:
    """Rows with every NaN the wire's one NaN (Spark hands out fresh ones), in a stable order."""
    return sorted((tuple(NAN if v != v else v for v in row) for row in rows), key=repr)


@pytest.mark.parametrize(
    ("value_type", "in_sql"),
    [("DOUBLE", [(1, NAN), (3, -math.inf), (4, 0.5)]), (None, [(1, "NaN"), (3, "-Infinity"), (4, "0.5")])],
)
def test_non_finite_floats_survive_commit_and_read(
    spark: SparkSession, spark_store: SparkStore, view: str, value_type: str | None, in_sql: list[tuple]
) -> None:
    """Analysts' SQL sees a DOUBLE column's floats, and an untyped column's JSON text."""
    spark_store.create(view, ["k", "x"], types=["BIGINT", value_type])
    spark_store.commit(view, [Effect(1, ZSet({(1, NAN): 2, (2, math.inf): 1, (3, -math.inf): 1, (4, 0.5): 1}))])
    spark_store.commit(view, [Effect(2, ZSet({(1, NAN): -1, (2, math.inf): -1}))])
    spark_store.publish(view, 2)
    expected = canonical([(1, NAN), (3, -math.inf), (4, 0.5)])
    assert canonical(spark_store.read_rows(view)) == expected
    assert canonical(r for r in spark.sql(f"SELECT * FROM {view}").collect()) == canonical(in_sql)
    assert canonical(spark_store.read_rows(view, as_of=1)) == canonical(
        [(1, NAN), (1, NAN), (2, math.inf), (3, -math.inf), (4, 0.5)]
    )


@pytest.mark.parametrize("value_type", ["DOUBLE", None])
def test_every_nan_read_back_is_the_one_nan(spark_store: SparkStore, view: str, value_type: str | None) -> None:
    """Reads hand out the wire's one NaN, so a Z-set of a view's rows (verify's comparison,
    a restart's sums) cancels and compares rows holding NaN like any other."""
    spark_store.create(view, ["k", "x"], types=["BIGINT", value_type])
    spark_store.commit(view, [Effect(1, ZSet({(1, NAN): 2, (2, 0.5): 1}))])
    spark_store.publish(view, 1)
    read = spark_store.read(view)
    assert read == ZSet({(1, NAN): 2, (2, 0.5): 1})  # equal only with the same NaN object
    assert all(row[1] is NAN for row in read.expand() if row[0] == 1)
    assert (read + ZSet({(1, NAN): -2})) == ZSet({(2, 0.5): 1})
