"""Analysts' Spark Connect: ``pvm serve``'s Spark services start a Connect server on the
manager's session and print its address; a separate analyst process connects with
``SparkSession.builder.remote`` and reads a view as the store publishes it."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import pytest
from pyspark.sql import SparkSession

from pvm.serve import start_spark_services
from warehouse.store.base import Effect
from warehouse.store.spark import SparkStore
from warehouse.zset import ZSet

pytestmark = pytest.mark.spark

ANALYST = """
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
print(json.dumps([list(r) for r in spark.sql(sys.argv[2]).collect()]))
"""


def test_an_analyst_reads_a_view_through_spark_connect(spark: SparkSession, spark_store: SparkStore, view: str, capsys) -> None:
    pytest.importorskip("grpc", reason="the Spark Connect client needs grpcio (pip install '.[connect]')")
    spark_store.create(view, ["k", "name"], types=["BIGINT", "STRING"])
    spark_store.commit(view, [Effect(1, ZSet({(1, "a"): 2, (2, "b"): 1})), Effect(2, ZSet({(3, "c"): 1}))])
    spark_store.publish(view, 1)

    args = argparse.Namespace(compaction_interval=3600.0, connect_port=0, connect_host=None, host="127.0.0.1", connect_token=None)
    stoppers = start_spark_services(spark_store, args)
    try:
        line = capsys.readouterr().out
        match = re.search(r"spark connect on (sc://127\.0\.0\.1:\d+)", line)
        assert match, line
        done = subprocess.run(
            [sys.executable, "-c", ANALYST, match.group(1), f"SELECT k, name FROM {view} ORDER BY k"],
            capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout.strip().splitlines()[-1]) == [[1, "a"], [1, "a"], [2, "b"]]
    finally:
        for stop in reversed(stoppers):
            stop()
