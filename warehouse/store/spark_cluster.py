"""What the service checks of a Spark cluster before it uses it as the view store.

On a standalone cluster the SparkContext starts without a single executor: the master
hands the application executors only when some worker has the cores and memory it asks
for. Until then every job waits, with no error and no end ("Initial job has not accepted
any resources"). And the executors read the store's files, and write its compactions' and
initial loads', where the driver names them (``file:`` paths; the manager writes commits'
files there itself): a worker on another machine without the store's directory at the
same path (a shared file system) fails every query and compaction. Both are found here, at
start, with a message that says what is wrong.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pyspark.sql import SparkSession

T = TypeVar("T")


class NotAccepted(RuntimeError):
    """The master did not take the application within the time allowed."""


def within_registration(
    start: Callable[[], T],
    jvm_started: Callable[[], bool],
    timeout_s: float,
    interval_s: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """What ``start()`` returns, run in a thread of its own, or NotAccepted if it has not
    returned ``timeout_s`` after ``jvm_started()`` first held.

    Making a SparkContext on a standalone master blocks until the master registers the
    application, and Spark tries three times, 20 s each, before it gives up (constants of
    its ``StandaloneAppClient``, no setting): a master that drops the application, as one
    that authenticates does for a driver without its secret, costs a minute. The clock
    starts once the driver's JVM runs, so a slow JVM start is not counted against the
    master. The thread is a daemon: after NotAccepted the process is expected to exit."""
    values: list[T] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            values.append(start())
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="spark-start", daemon=True).start()
    deadline: float | None = None
    while not done.wait(interval_s):
        if deadline is None:
            if jvm_started():
                deadline = clock() + timeout_s
        elif clock() >= deadline:
            raise NotAccepted(f"the master did not take the application within {timeout_s:g} s")
    if errors:
        raise errors[0]
    return values[0]


def executor_count(spark: SparkSession) -> int:
    """The executors registered with the driver (the driver itself not counted)."""
    return int(spark.sparkContext._jsc.sc().getExecutorIds().size())


def wait_for_executors(
    spark: SparkSession, timeout_s: float, interval_s: float = 0.25, clock: Callable[[], float] = time.monotonic
) -> int:
    """The number of executors once there is at least one; 0 if none registered within
    ``timeout_s``."""
    deadline = clock() + timeout_s
    while True:
        count = executor_count(spark)
        if count or clock() >= deadline:
            return count
        time.sleep(interval_s)


PROBE = ".executor-probe"


def store_problem(spark: SparkSession, path: Path) -> str | None:
    """Why the executors cannot write the store's directory ``path``, or None when they can.

    A job of one task per executor (per core on ``local[…]``) writes a file each into
    ``path/.executor-probe`` through Spark's own file output, the way compactions and initial
    loads write; the driver then counts them. An executor without the directory (a worker on a
    machine that lacks the shared file system) fails its task, or writes where the driver
    does not see it. The probe's files are removed afterwards."""
    sc = spark.sparkContext
    tasks = max(executor_count(spark), sc.defaultParallelism, 1)
    probe = path / PROBE
    shutil.rmtree(probe, ignore_errors=True)
    try:
        spark.range(0, tasks, 1, tasks).selectExpr("CAST(id AS STRING) AS value").write.text(f"file:{probe}")
        written = len(list(probe.glob("part-*")))
    except Exception as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        return f"writing {probe} failed: {lines[0] if lines else type(exc).__name__}"
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    if written != tasks:
        return f"{tasks - written} of the {tasks} files the executors wrote into {probe} are not there"
    return None
