"""The commit benchmark runs end to end (tiny sizes; real figures come from a manual run)."""

from __future__ import annotations

import pytest

from pvm.bench.grouped_appends import bench_commit
from warehouse.store.spark import SparkStore

pytestmark = pytest.mark.spark


def test_bench_commit_reports_both_ways(spark_store: SparkStore) -> None:
    figures = bench_commit(
        spark_store,
        effects_per_group=5,
        rows_per_effect=4,
        groups=1,
        single_effects=2,
        warmup_appends=1,
    )
    assert figures["grouped_rows_per_s"] > 0 and figures["single_rows_per_s"] > 0
    assert figures["speedup"] == figures["grouped_rows_per_s"] / figures["single_rows_per_s"]
    assert figures["single_append_ms"] == 1000 * 4 / figures["single_rows_per_s"]
    assert figures["grouped_append_ms"] == 1000 * 20 / figures["grouped_rows_per_s"]
    assert spark_store.views() == []
