"""The process's one Spark session.

A session costs about 10 s and 1.4 GiB to start, so the service (and a test run) starts one
and shares it: every ``SparkStore`` and every analyst query of a process goes through it.

Spark's own logs (its JVM's log4j lines, and whatever else the JVM writes to stderr) go to
``spark.log`` in the directory the caller names (``pvm serve``: the data directory), not to
the terminal, where the service's own lines are (``log_settings``, ``start_session``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import threading
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from warehouse.store import file_access, spark_classes

_lock = threading.Lock()
_session: SparkSession | None = None

C1_ONLY = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
"""The JIT at its first tier, with the code cache tiered compilation would have: C1 alone
gets 48 MB by default, and a long-lived JVM answering many distinct queries (the analysts'
process behind Spark Connect) ran out of it ("Out of space in CodeCache for adapters")."""

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
# files per version. The store relies on it in every session, the writing one too: commits
# write their files past Spark (``SparkStore.commit``), so no session refreshes a listing.
LISTING_CACHE = "spark.sql.filesourceTableRelationCacheSize"
_DEFAULTS: dict[str, str] = {
    LISTING_CACHE: "0",
    "spark.driver.extraJavaOptions": C1_ONLY,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.catalogImplementation": "in-memory",
    "spark.sql.session.timeZone": "UTC",
    "spark.log.level": "ERROR",
}

JAVA_OPTIONS = "spark.driver.extraJavaOptions"
EXECUTOR_JAVA_OPTIONS = "spark.executor.extraJavaOptions"
LOG4J_OPTION = "-Dlog4j2.configurationFile="
LOG_FILE = "spark.log"
LOG4J_FILE = "spark-log4j2.properties"

# Spark's default profile, less the console: everything to the file, warnings and worse (the
# session then sets its level to ``spark.log.level``).
_LOG4J_PROPERTIES = """\
# Written by pvm each time Spark starts: where Spark's own log lines go.
status = error
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
# chatty third parties, as in Spark's defaults
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.hive.name = org.apache.hadoop.hive.metastore.RetryingHMSHandler
logger.hive.level = fatal
"""


def with_log_config(java_options: str, config: Path) -> str:
    """``java_options`` with the JVM told to read its log4j configuration from ``config``,
    unless they name a configuration already (a deployment's own, ``pvm serve --spark-conf``).

    >>> with_log_config("-XX:TieredStopAtLevel=1", Path("/var/pvm/spark-log4j2.properties"))
    '-XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile=/var/pvm/spark-log4j2.properties'
    >>> with_log_config("", Path("/my data/log.properties"))
    "-Dlog4j2.configurationFile='/my data/log.properties'"
    >>> with_log_config("-Dlog4j2.configurationFile=mine.properties", Path("/x"))
    '-Dlog4j2.configurationFile=mine.properties'
    """
    if LOG4J_OPTION in java_options:
        return java_options
    return f"{java_options} {LOG4J_OPTION}{shlex.quote(str(config))}".strip()


def log_settings(log_dir: Path, settings: Mapping[str, str]) -> dict[str, str]:
    """Write the log4j configuration that sends Spark's logs to ``log_dir/spark.log`` and
    return ``settings`` whose driver Java options read it (after whatever options they have)."""
    log_dir = Path(log_dir).resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    config = log_dir / LOG4J_FILE
    log_file = str(log_dir / LOG_FILE).replace("\\", "\\\\")
    config.write_text(_LOG4J_PROPERTIES.format(log_file=log_file))
    return {**settings, JAVA_OPTIONS: with_log_config(settings.get(JAVA_OPTIONS, ""), config)}


def session_settings(
    warehouse_dir: Path | None = None,
    conf: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    log_dir: Path | None = None,
) -> dict[str, str]:
    """The settings ``get_spark`` starts its session with: the defaults, the driver bound to
    ``host``, the store's file modes, then ``conf`` over them, and with ``log_dir`` Spark's
    logs sent to ``log_dir/spark.log`` (also when ``conf`` replaces the Java options)."""
    settings = {**_DEFAULTS, **bind_settings(host), **file_access.spark_settings()}
    if archived := spark_classes.java_options():  # every JVM maps the installation's class archive
        settings[JAVA_OPTIONS] = f"{settings[JAVA_OPTIONS]} {archived}"
        settings[EXECUTOR_JAVA_OPTIONS] = archived  # an executor without the file loads its classes as usual
    if warehouse_dir is not None:
        settings["spark.sql.warehouse.dir"] = str(Path(warehouse_dir).resolve())
    settings.update(conf or {})
    if log_dir is not None:
        settings = log_settings(log_dir, settings)
    return settings


def start_session(
    master: str,
    app_name: str,
    settings: Mapping[str, str],
    log_dir: Path | None = None,
    secret_settings: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or get) the process's session with ``settings``. With ``log_dir``, the JVM's
    stderr goes to ``log_dir/spark.log`` too (lines no log4j configuration reaches, such as the
    JVM's own warnings), and the error of a JVM that would not start quotes its last lines.

    ``secret_settings`` (``spark.authenticate.secret``) are kept off the JVM's command line,
    which every user of the machine can read: PySpark starts the JVM with ``spark-submit
    --conf KEY=VALUE`` for each setting it is given, so the JVM is started with the others
    and these are set in it before the SparkContext is made."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    driver_host = settings.get("spark.driver.host")
    if driver_host and "SPARK_LOCAL_IP" not in os.environ:
        # what Spark would otherwise look up (and warn about) before it reads its settings
        os.environ["SPARK_LOCAL_IP"] = driver_host
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**settings, **(secret_settings or {})}.items():
        builder = builder.config(key, value)
    if (log_dir is not None or secret_settings) and SparkContext._gateway is None:
        conf = SparkConf().setMaster(master).setAppName(app_name).setAll(list(settings.items()))
        log_file = None if log_dir is None else Path(log_dir) / LOG_FILE
        with open(log_file, "ab") if log_file else contextlib.nullcontext() as err:
            try:
                gateway = launch_gateway(conf, popen_kwargs=None if err is None else {"stderr": err})
            except Exception as exc:
                tail = "" if log_file is None else f"; the end of {log_file}:\n{_tail(log_file)}"
                raise RuntimeError(f"Spark did not start{tail}") from exc
        SparkContext._ensure_initialized(gateway=gateway)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.get("spark.log.level", "ERROR"))
    return spark


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


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
    log_dir: Path | None = None,
    secret_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return the process's Spark session, starting it on first use.

    ``master`` defaults to an embedded ``local[*]`` session; give a ``spark://…`` URL to run
    on a cluster. ``warehouse_dir`` should sit under the service's data directory so that
    nothing lands in the working directory. The driver's ports listen on ``host``
    (``bind_settings``) and the store's files get the modes of ``file_access.store_files()``.
    ``conf`` overrides all of these (tests use it to pin ``spark.sql.shuffle.partitions``, a
    deployment may set ``spark.driver.host``). With ``log_dir`` Spark's logs go to
    ``log_dir/spark.log`` (``session_settings``, ``start_session``). ``secret_conf`` (the
    cluster's ``spark.authenticate.secret``) never reaches a command line. Arguments of later calls
    are ignored: the session, its master and its static settings are fixed for the life of
    the process.
    """
    global _session
    with _lock:
        if _session is None:
            settings = session_settings(warehouse_dir, conf, host, log_dir)
            _session = start_session(master or "local[*]", app_name, settings, log_dir, secret_conf)
        return _session
