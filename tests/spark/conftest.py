"""One Spark session for the whole run: starting one costs ~10 s and ~1.4 GiB."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from warehouse.analysts.supervisor import AnalystProcess, AnalystSettings
from warehouse.store.published import PublishedViews
from warehouse.store.spark import SparkStore
from warehouse.store.spark_session import get_spark


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "ignore:PySpark does not yet fully support pandas:FutureWarning")


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> SparkSession:
    if any("analysts" in getattr(item, "fixturenames", ()) for item in request.session.items):
        # a test of the run needs the analysts' query process: its JVM and warm-up start now,
        # beside the session's, rather than when that test comes and waits for them
        request.getfixturevalue("analysts_started")
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


@pytest.fixture(scope="session")
def published(spark: SparkSession) -> PublishedViews:
    """The analysts' views, shown in the test session itself (the service shows them in the
    analysts' query process, which runs the same ``PublishedViews``)."""
    return PublishedViews(spark)


@pytest.fixture
def spark_store(spark: SparkSession, data_dir: Path, published: PublishedViews) -> Iterator[SparkStore]:
    """A store on a fresh data directory whose views the test session shows; its views are
    dropped afterwards so that later tests start from a clean session catalog."""
    store = SparkStore(spark, data_dir)
    store.subscribe(published.apply)
    yield store
    for view in store.views():
        store.drop(view)


@pytest.fixture
def view() -> str:
    """A view name no other test uses: all stores share the session's table namespace."""
    return f"v_{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def analysts_started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AnalystProcess]:
    """The analysts' query process of the run (a second JVM, as the service has), started and
    not waited for: views of stores subscribed to it are shown there; its Spark Connect
    server listens on loopback."""
    process = AnalystProcess(
        AnalystSettings(
            work_dir=tmp_path_factory.mktemp("analysts"),
            master="local[1]",
            connect_port=0,
            timeout_s=30.0,
            grace_s=3.0,
            spark_conf={"spark.sql.shuffle.partitions": "2"},
        )
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def analysts(analysts_started: AnalystProcess) -> AnalystProcess:
    """The run's analysts' query process, once it answers."""
    assert analysts_started.wait_ready(180), analysts_started.status()
    return analysts_started


@pytest.fixture
def analyst_store(spark_store: SparkStore, analysts: AnalystProcess) -> SparkStore:
    """``spark_store`` whose views the analysts' query process shows too."""
    spark_store.subscribe(analysts.publish)
    return spark_store
