"""The process's one Spark session.

A session costs about 10 s and 1.4 GiB to start, so the service (and a test run) starts one
and shares it: every ``SparkStore`` and every analyst query of a process goes through it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from warehouse.store import file_access

_lock = threading.Lock()
_session: SparkSession | None = None

# Settings that suit a small, latency-bound workload: appends of a few thousand rows and
# aggregations over modest views, where the default 200 shuffle partitions would mostly
# schedule empty tasks. The JIT stops at its first tier (C1): the optimizing compiler (C2)
# kept a core half busy for minutes after start while the service's many small Spark jobs
# warmed up, and on two cores that CPU came out of commit latency (``pvm bench commit``:
# freshness p99 1.5 s with C1 against 2.2-2.4 s with C2). A deployment with cores to spare
# and long, heavy jobs can turn C2 back on (``pvm serve --spark-conf``).
#
# Every session caches a table's file listing when it first reads the table, and only the
# session that appends to or moves a table refreshes its own cache: a Spark Connect client's
# session would go on reading the files (and locations) of its first query. Without the cache
# every query lists the table's directory afresh, which costs little for the store's few
# files per version.
_DEFAULTS: dict[str, str] = {
    "spark.sql.filesourceTableRelationCacheSize": "0",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.catalogImplementation": "in-memory",
    "spark.sql.session.timeZone": "UTC",
    "spark.log.level": "ERROR",
}

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def bind_settings(host: str) -> dict[str, str]:
    """Where the driver's RPC and block-manager ports listen: the interface the service
    listens on (``pvm serve --host``), never every interface unasked. Spark binds them to the
    address of the machine's hostname by default, reachable from other machines even when the
    service itself is on loopback. A wildcard host binds every interface and leaves the
    address executors are told to Spark (the hostname's).

    >>> bind_settings("127.0.0.1")
    {'spark.driver.bindAddress': '127.0.0.1', 'spark.driver.host': '127.0.0.1'}
    >>> bind_settings("0.0.0.0")
    {'spark.driver.bindAddress': '0.0.0.0'}
    """
    if host in WILDCARD_HOSTS:
        return {"spark.driver.bindAddress": host or "0.0.0.0"}
    return {"spark.driver.bindAddress": host, "spark.driver.host": host}


def get_spark(
    master: str | None = None,
    warehouse_dir: Path | None = None,
    app_name: str = "pvm",
    conf: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
) -> SparkSession:
    """Return the process's Spark session, starting it on first use.

    ``master`` defaults to an embedded ``local[*]`` session; give a ``spark://…`` URL to run
    on a cluster. ``warehouse_dir`` should sit under the service's data directory so that
    nothing lands in the working directory. The driver's ports listen on ``host``
    (``bind_settings``) and the store's files get the modes of ``file_access.store_files()``.
    ``conf`` overrides all of these (tests use it to pin ``spark.sql.shuffle.partitions``, a
    deployment may set ``spark.driver.host``). Arguments of later calls are ignored: the
    session, its master and its static settings are fixed for the life of the process.
    """
    global _session
    with _lock:
        if _session is None:
            builder = SparkSession.builder.master(master or "local[*]").appName(app_name)
            settings = {**_DEFAULTS, **bind_settings(host), **file_access.spark_settings()}
            if warehouse_dir is not None:
                settings["spark.sql.warehouse.dir"] = str(Path(warehouse_dir).resolve())
            settings.update(conf or {})
            for key, value in settings.items():
                builder = builder.config(key, value)
            _session = builder.getOrCreate()
            _session.sparkContext.setLogLevel(settings["spark.log.level"])
        return _session
