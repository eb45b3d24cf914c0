"""The engine of the analysts' query process: a Spark application of its own that answers
analysts' SQL and row pages over the views, as the manager's store records them, and
recomputes and compares views for verifications.

``api/analysts_worker.py`` serves it over HTTP on a Unix socket; ``supervisor.py`` starts,
watches and restarts that process. Queries run on a pool of ``concurrency`` threads, never
on the event loop, so health and cancellation answer while every thread is busy. When the JVM
dies (an out-of-memory error ends it: ``-XX:+ExitOnOutOfMemoryError``), or tasks of cancelled
jobs keep running past ``reap_after`` (a tight loop never looks at its interrupt, and it holds
a core), ``watch_jvm`` ends the process, and the manager starts a new one.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import decimal
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from contract.schemas import encode_value
from warehouse.analysts.messages import (
    PinnedView,
    Published,
    QueryRequest,
    QueryResult,
    RowsRequest,
    RowsResult,
    VerifyRequest,
    VerifyResult,
)

log = logging.getLogger("pvm.analysts")

CONNECT_TOKEN_ENV = "PVM_ANALYST_CONNECT_TOKEN"
"""The secret the process's own Spark Connect server requires: only the manager's gateway
knows it (passed in the environment, never on the command line)."""

JVM_DIED_EXIT = 70
ZOMBIES_EXIT = 71
ORPHANED_EXIT = 72

T = TypeVar("T")


class QueryFailed(Exception):
    """Spark refused or failed the query; the message is for the analyst."""


def json_value(value: Any) -> Any:
    """A JSON-friendly form of what Spark returns.

    >>> json_value(float("inf")), json_value(decimal.Decimal("1.50")), json_value(b"\\x00")
    ({'$float': 'Infinity'}, '1.50', 'AA==')
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else encode_value(value)  # tagged, as on every wire
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if all(isinstance(item, tuple) and len(item) == 2 for item in value) and value:
            return {str(k): json_value(v) for k, v in value}  # Arrow maps come as pairs
        return [json_value(v) for v in value]
    return str(value)


def spark_message(exc: BaseException) -> str:
    """The first line of a Spark error, without the JVM stack trace."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0][:1000] if lines else type(exc).__name__


def _fit(rows: list[list[Any]], max_bytes: int) -> tuple[list[list[Any]], bool]:
    """The longest prefix of ``rows`` whose JSON stays within ``max_bytes``; whether it was cut."""
    import json

    total = 0
    for i, row in enumerate(rows):
        total += len(json.dumps(row, default=str)) + 1
        if total > max_bytes:
            return rows[:i], True
    return rows, False


class Engine:
    """Analyst queries and row reads on the process's Spark session."""

    def __init__(self, spark: Any, concurrency: int) -> None:
        from warehouse.store.published import PublishedViews

        self.spark = spark
        self.views = PublishedViews(spark)
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="query")
        self._control = ThreadPoolExecutor(2, thread_name_prefix="control")
        self._publishing = ThreadPoolExecutor(1, thread_name_prefix="publish")  # records in order
        self._running: set[str] = set()
        self._lock = threading.Lock()

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self._running)

    async def in_pool(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def in_control(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._control, fn, *args)

    async def publish(self, published: Published) -> None:
        await asyncio.get_running_loop().run_in_executor(self._publishing, self._apply, published)

    def _apply(self, published: Published) -> None:
        from warehouse.store.spark_records import ViewMeta

        if published.reset:
            for name in set(self.views.names()) - set(published.views):
                self.views.apply(name, None)
        for name, record in published.views.items():
            self.views.apply(name, None if record is None else ViewMeta.from_record(record))
        if published.consistent is not None:
            try:
                self.views.show_consistent(
                    {name: (ViewMeta.from_record(pin.record), pin.as_of) for name, pin in published.consistent.items()}
                )
            except Exception as exc:  # the records above are shown; the consistent views stay at the cut before
                exit_if_jvm_gone(self.spark)
                log.error("could not show the consistent cut over all views: %s", spark_message(exc))

    def _tagged(self, tag: str, work: Callable[[], T]) -> T:
        """Run ``work`` with its Spark jobs under ``tag``; cancelling the tag interrupts their
        tasks' threads (``setInterruptOnCancel``), not only the scheduling of new ones."""
        context = self.spark.sparkContext
        with self._lock:
            self._running.add(tag)
        context.setInterruptOnCancel(True)
        context.addJobTag(tag)
        try:
            return work()
        except Exception as exc:
            exit_if_jvm_gone(self.spark)
            raise QueryFailed(spark_message(exc)) from exc
        finally:
            try:
                context.removeJobTag(tag)
            except Exception:
                pass
            with self._lock:
                self._running.discard(tag)

    def query(self, request: QueryRequest) -> QueryResult:
        def work() -> QueryResult:
            session = self._pinned(request.views) if request.views else self.spark
            frame = session.sql(request.sql)
            table = frame.limit(request.limit + 1).toArrow()
            columns = list(frame.columns)
            data = [table.column(i).to_pylist() for i in range(table.num_columns)]
            rows = [[json_value(v) for v in row] for row in zip(*data)] if data else []
            fitted, cut = _fit(rows[: request.limit], request.max_bytes)
            return QueryResult(columns=columns, rows=fitted, truncated=cut or len(rows) > request.limit)

        return self._tagged(request.tag, work)

    def _pinned(self, views: dict[str, PinnedView]) -> Any:
        """A session of its own in which each of ``views`` is a temporary view of its state as
        of its order, read from the files its record names: temporary views hide the catalog
        views of the same name (the published ones), and a CTE still hides both."""
        from warehouse.store.published import as_of_sql
        from warehouse.store.spark_records import ViewMeta
        from warehouse.store.spark_rows import table_schemas

        session = self.spark.newSession()
        for i, (name, pinned) in enumerate(sorted(views.items())):
            meta = ViewMeta.from_record(pinned.record)
            base_schema, zlog_schema = table_schemas(meta.columns, meta.types)
            base, zlog = f"pvm_cut_base_{i}", f"pvm_cut_zlog_{i}"
            session.read.schema(base_schema).parquet(meta.base_location).createOrReplaceTempView(base)
            session.read.schema(zlog_schema).parquet(meta.zlog_location).createOrReplaceTempView(zlog)
            session.sql(as_of_sql(meta, base, zlog, pinned.as_of)).createOrReplaceTempView(name)
        return session

    def rows(self, request: RowsRequest) -> RowsResult:
        from warehouse.store.spark_names import WEIGHT
        from warehouse.store.spark_records import ViewMeta
        from warehouse.store.spark_rows import RowCodec, shown_codec
        from warehouse.store.spark_sql import shown_sql, sums_sql

        meta = ViewMeta.from_record(request.record)
        codec = RowCodec(meta.columns, meta.types)
        shown = shown_codec(meta, codec)

        def work() -> RowsResult:
            session = self.spark.newSession()  # temporary views of its own
            session.read.schema(codec.base_schema).parquet(meta.base_location).createOrReplaceTempView("base")
            session.read.schema(codec.zlog_schema).parquet(meta.zlog_location).createOrReplaceTempView("zlog")
            order = ", ".join(f"`{c}` ASC NULLS LAST" for c in shown.columns)
            rows_sql = shown_sql("base", "zlog", meta.columns, meta.summed, request.as_of)
            page = (
                session.sql(
                    f"SELECT * FROM ({rows_sql}) ORDER BY {order} LIMIT {int(request.limit)} OFFSET {int(request.offset)}"
                ).toArrow()
                if request.limit
                else None
            )
            # a bag's rows are counted from its sums, not from the repeated rows
            total_sql = (
                f"SELECT COALESCE(SUM({WEIGHT}), 0) FROM ({sums_sql('base', 'zlog', meta.columns, request.as_of, '> 0')})"
                if meta.summed is None
                else f"SELECT COUNT(*) FROM ({rows_sql})"
            )
            total = session.sql(total_sql).toArrow()
            rows = [] if page is None else [[json_value(v) for v in row] for row in shown.decode(page)]
            fitted, cut = _fit(rows, request.max_bytes)
            return RowsResult(
                columns=list(shown.columns), rows=fitted, total=int(total.column(0)[0].as_py()), truncated=cut
            )

        return self._tagged(request.tag, work)

    def verify(self, request: VerifyRequest) -> VerifyResult:
        """Recompute a view from the relations the manager brought to its watermark and
        compare it with the stored view as of W, read from the files of the request's record
        (``warehouse/analysts/verification.py``)."""
        from warehouse.analysts.verification import compare

        return self._tagged(request.tag, lambda: compare(self.spark, request))

    def zombie_tasks(self) -> int:
        """Tasks still running that belong to no active stage: tasks of cancelled jobs that
        ignore their interrupt (a tight loop never checks it). In local mode Spark's task
        reaper only logs them; ``watch_jvm`` ends the process instead."""
        tracker = self.spark.sparkContext.statusTracker()
        active = 0
        for stage in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage)
            active += info.numActiveTasks if info is not None else 0
        infos = self.spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
        running = sum(infos[i].numRunningTasks() for i in range(len(infos)))
        return max(0, running - active)

    def cancel(self, tag: str) -> None:
        try:
            self.spark.sparkContext.cancelJobsWithTag(tag)
        except Exception:
            exit_if_jvm_gone(self.spark)
            raise


def exit_if_jvm_gone(spark: Any) -> None:
    """End this process if the JVM no longer answers a trivial call (an out-of-memory exit,
    a crash): it is of no use any more, and the manager starts a new one."""
    try:
        spark.sparkContext._jvm.java.lang.System.currentTimeMillis()
    except Exception as exc:
        log.error("the JVM is gone (%s): exiting", spark_message(exc))
        logging.shutdown()
        os._exit(JVM_DIED_EXIT)


def exit_with_parent(parent: int | None = None, interval: float = 1.0) -> None:
    """End this process, and its JVM, once the manager that started it is gone: a manager
    killed with -9 cannot end it, and every restart would leave one more JVM holding its
    memory. The supervisor starts it as the leader of a process group of its own, so the
    whole group goes; started any other way, only this process exits.

    ``parent``: the manager's pid, as the supervisor passes it. A manager killed while this
    process was still importing has already handed it to another parent, so the parent it
    has now would be watched for ever; with the pid it was started by, it exits at once.
    None: the parent it has now."""
    parent = os.getppid() if parent is None else parent

    def orphaned() -> None:
        log.error("the manager that started this process is gone: exiting")
        logging.shutdown()
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os._exit(ORPHANED_EXIT)

    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        orphaned()

    if os.getppid() != parent:
        orphaned()  # here, before the caller goes on to start a JVM
    threading.Thread(target=loop, name="parent-watch", daemon=True).start()


def watch_jvm(engine: Engine, reap_after: float, interval: float = 1.0) -> None:
    """Exit when the JVM stops answering (it died between queries), or when tasks of
    cancelled jobs keep running ``reap_after`` seconds: they hold the process's cores, and
    only a new JVM gets them back."""
    if reap_after <= 0:
        raise ValueError("reap_after must be positive")

    def loop() -> None:
        zombies_since: float | None = None
        while True:
            time.sleep(interval)
            try:
                zombies = engine.zombie_tasks()
            except Exception:
                exit_if_jvm_gone(engine.spark)
                continue
            now = time.monotonic()
            zombies_since = None if not zombies else zombies_since or now
            if zombies_since is not None and now - zombies_since >= reap_after:
                log.error("%d cancelled tasks still run after %.0f s: exiting to free the cores", zombies, reap_after)
                logging.shutdown()
                os._exit(ZOMBIES_EXIT)

    threading.Thread(target=loop, name="jvm-watch", daemon=True).start()


SPARK_DEFAULTS: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.catalogImplementation": "in-memory",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # every query lists the store's directories afresh: new commits and versions are seen
    "spark.sql.filesourceTableRelationCacheSize": "0",
    # the process serves its own loopback only
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    # cancelled tasks are watched (local mode only logs those that ignore their interrupt;
    # ``watch_jvm`` ends the process for them), and the status tracker that ``zombie_tasks``
    # reads is kept current: by default Spark writes an executor's running-task count only
    # every few seconds, and a stale count would look like a task that never stopped
    "spark.task.reaper.enabled": "true",
    "spark.ui.liveUpdate.period": "0",
    "spark.log.level": "ERROR",
}


def start_spark(args: argparse.Namespace) -> Any:
    from warehouse.store import spark_classes
    from warehouse.store.spark_session import C1_ONLY, log_settings, start_session

    work = Path(args.work_dir)
    (work / "tmp").mkdir(parents=True, exist_ok=True)
    settings = dict(SPARK_DEFAULTS)
    settings.update(
        {
            "spark.driver.memory": args.memory,
            "spark.driver.extraJavaOptions": (
                f"{C1_ONLY} -XX:+ExitOnOutOfMemoryError -Djava.io.tmpdir={work / 'tmp'} " + spark_classes.java_options()
            ).strip(),
            "spark.local.dir": str(work / "tmp"),
            "spark.sql.warehouse.dir": str(work / "warehouse"),
        }
    )
    for pair in args.spark_conf:
        key, _, value = pair.partition("=")
        settings[key] = value
    # Spark's own lines go to the work dir's spark.log; query-process.log keeps the process's
    spark = start_session(args.master, "pvm-analysts", log_settings(work, settings), work)
    warm_up(spark)
    return spark


def warm_up(spark: Any) -> float:
    """Run one small join and aggregate before the process says it is ready; its seconds.

    A fresh JVM loads and compiles the planner, code generation and the shuffle on its first
    query: seconds that would otherwise count against the first analyst's time limit, and
    after a restart make the first query time out on a busy machine.
    """
    started = time.monotonic()
    numbers = spark.range(2000).selectExpr("id", "id % 7 AS k")
    numbers.join(numbers.withColumnRenamed("id", "other"), "k").groupBy("k").count().collect()
    seconds = time.monotonic() - started
    log.info("query process warmed up in %.1f s", seconds)
    return seconds
