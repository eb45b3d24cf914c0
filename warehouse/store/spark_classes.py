"""Spark's classes archived once per installation, so that every Spark JVM starts sooner.

A Spark driver loads and verifies some twenty thousand classes from its jars before its
first job, and every JVM the service starts does it again: ``pvm serve``'s driver, the
analysts' query process (and each of its restarts), a cluster's master, workers and
executors. On two busy cores that took 35 to 40 seconds of a driver's start. The JDK's
class data sharing (AppCDS) keeps the classes a run loaded in an archive that later JVMs
map instead of loading them again: a session with its first jobs, 65-69 s without and
24-28 s with the archive on the loaded machine (docs/spark.md, "Class data sharing").

``python -m warehouse.store.spark_classes`` (``scripts/setup.sh`` runs it) writes the
archive once for this installation's PySpark and Java, by running a few typical jobs in a
JVM that archives what it loaded when it exits (``-XX:ArchiveClassesAtExit``).
``java_options`` then names it to every JVM the service starts (``-XX:SharedArchiveFile``).
Using the archive is safe by construction: the JVM checks that it was written by the same
JDK build over the same class path, and where it was not (another Java, extra jars first on
the class path, no archive at all) it loads the classes as usual, silently (the options
turn the JVM's CDS warnings off).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ARCHIVE_DIR = Path(sys.prefix) / "share" / "pvm"
"""Where the archive lives: the installation's own (a virtualenv's) share directory."""

QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
"""The JVM's warnings about an archive it cannot use (another JDK, another class path)."""


def java_binary() -> str | None:
    """The ``java`` PySpark starts: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else shutil.which("java")


def archive_path() -> Path | None:
    """The archive for this PySpark and this Java (None: no Java found), whether or not
    it has been written. Another Java gets another file: an archive is of one JDK build."""
    import pyspark

    java = java_binary()
    if java is None:
        return None
    key = hashlib.sha256(os.path.realpath(java).encode()).hexdigest()[:12]
    return ARCHIVE_DIR / f"spark-classes-{pyspark.__version__}-{key}.jsa"


def java_options() -> str:
    """The JVM options that map the archive, or "" if there is none yet.

    >>> import re
    >>> options = java_options()
    >>> options == "" or bool(re.fullmatch(r"-XX:SharedArchiveFile=\\S+ -Xlog:cds=off -Xlog:cds\\+dynamic=off", options))
    True
    """
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={shlex.quote(str(path))} {QUIET}"


def write_archive(path: Path) -> None:
    """Run typical jobs in a JVM of their own that archives the classes it loaded into
    ``path`` when it exits; the file appears whole or not at all."""
    from pyspark import SparkContext

    from warehouse.store.spark_session import bind_settings, log_settings, start_session

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".archiving-") as work:
        partial = Path(work) / path.name
        settings = {
            **bind_settings("127.0.0.1"),
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.sql.warehouse.dir": str(Path(work) / "warehouse"),
            "spark.local.dir": str(Path(work) / "tmp"),
            "spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={shlex.quote(str(partial))} {QUIET}",
        }
        # Spark's own lines go to a log in the work directory, quoted if this fails
        try:
            spark = start_session("local[2]", "pvm-archive-classes", log_settings(Path(work), settings), Path(work))
            _typical_jobs(spark, Path(work))
            spark.stop()
            gateway = SparkContext._gateway
            if gateway is not None:  # the JVM exits when its stdin closes, and archives then
                process = gateway.proc
                process.stdin.close()
                process.wait(timeout=300)
        except Exception as exc:
            log = Path(work) / "spark.log"
            tail = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
            raise RuntimeError(f"{type(exc).__name__}: {exc}\n{tail}") from exc
        if not partial.is_file():
            raise RuntimeError(f"the JVM wrote no class archive at {partial}")
        os.replace(partial, path)


def _typical_jobs(spark: Any, work: Path) -> None:
    """What the service's JVMs do first: SQL with joins and aggregates, Parquet written and
    read, rows to and from Python through Arrow, a table and a view in the catalog."""
    import pyarrow as pa

    rows = pa.table({"k": list(range(200)), "v": [f"v{i}" for i in range(200)], "w": [1] * 200})
    frame = spark.createDataFrame(rows.to_pandas())
    frame.write.mode("overwrite").parquet(str(work / "z"))
    staged = spark.read.parquet(str(work / "z"))
    staged.createOrReplaceTempView("z")
    joined = spark.sql(
        "SELECT a.k % 7 AS g, COUNT(*) AS n, SUM(a.w * b.w) AS w, MAX(b.v) AS m FROM z a JOIN z b ON a.k = b.k "
        "WHERE a.v <> 'x' GROUP BY a.k % 7 HAVING SUM(a.w * b.w) <> 0 ORDER BY g"
    )
    joined.toArrow()
    joined.write.mode("append").format("parquet").saveAsTable("archived_t")
    spark.sql("SELECT * FROM archived_t UNION ALL SELECT * FROM archived_t").collect()


def main() -> int:
    """Write the archive unless this installation has it; say so when it writes one."""
    path = archive_path()
    if path is None:
        print("spark classes: no java found; Spark's JVMs start without a class archive", file=sys.stderr)
        return 0
    if path.is_file():
        return 0
    print(f"setup: archiving Spark's classes for faster JVM starts (once): {path}", file=sys.stderr)
    try:
        write_archive(path)
    except Exception as exc:  # the service works without it, only its JVMs start slower
        print(f"setup: could not archive Spark's classes ({exc}); Spark's JVMs start without", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
