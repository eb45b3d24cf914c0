"""One Spark session for the whole run: starting one costs ~10 s and ~1.4 GiB."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from warehouse.store.spark import SparkStore
from warehouse.store.spark_session import get_spark


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "filterwarnings", "ignore:PySpark does not yet fully support pandas:FutureWarning"
    )


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> SparkSession:
    return get_spark(
        master="local[2]",
        warehouse_dir=tmp_path_factory.mktemp("spark-warehouse"),
        app_name="pvm-tests",
        conf={"spark.sql.shuffle.partitions": "2"},
        host="127.0.0.1",  # as pvm serve's default: the driver's ports on loopback only
    )


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def spark_store(spark: SparkSession, data_dir: Path) -> Iterator[SparkStore]:
    """A store on a fresh data directory; its views are dropped afterwards so that later
    tests start from a clean session catalog."""
    store = SparkStore(spark, data_dir)
    yield store
    for view in store.views():
        store.drop(view)


@pytest.fixture
def view() -> str:
    """A view name no other test uses: all stores share the session's table namespace."""
    return f"v_{uuid.uuid4().hex[:10]}"
