"""What ``pvm serve`` checks of a cluster at start (``warehouse.store.spark_cluster``), on the
shared local session: a store directory the executors cannot write is named, and the wait
for executors ends at its timeout. (On a real cluster: tests/spark/test_cluster_deployment.py.)"""

from __future__ import annotations

import time
from pathlib import Path

from pyspark.sql import SparkSession

from warehouse.store.spark_cluster import PROBE, executor_count, store_problem, wait_for_executors


def test_a_writable_store_directory_passes_and_keeps_no_probe(spark: SparkSession, tmp_path: Path) -> None:
    assert store_problem(spark, tmp_path) is None
    assert not (tmp_path / PROBE).exists()


def test_a_store_path_the_executors_cannot_write_is_named(spark: SparkSession, tmp_path: Path) -> None:
    not_a_directory = tmp_path / "store"
    not_a_directory.write_text("a file where the store's directory should be")
    problem = store_problem(spark, not_a_directory)
    assert problem is not None and problem.startswith(f"writing {not_a_directory / PROBE} failed: ")


def test_the_wait_for_executors_ends_at_its_timeout(spark: SparkSession) -> None:
    """``local[…]`` runs its tasks in the driver: no executor ever registers."""
    assert executor_count(spark) == 0
    started = time.monotonic()
    assert wait_for_executors(spark, 0.5, interval_s=0.1) == 0
    assert 0.5 <= time.monotonic() - started < 5
