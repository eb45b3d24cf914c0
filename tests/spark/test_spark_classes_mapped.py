"""The session's JVM really maps the class archive setup wrote (docs/spark.md, "Class data
sharing"): a JVM that rejects it (another class path, another JDK) starts just as well,
silently, so only its memory map tells the two apart."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from warehouse.store import spark_classes


def test_the_sessions_jvm_maps_the_class_archive(spark: SparkSession) -> None:
    archive = spark_classes.archive_path()
    assert archive is not None and archive.is_file(), f"no class archive at {archive}: run scripts/setup.sh"
    jvm = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    assert str(archive) in Path(f"/proc/{jvm}/maps").read_text()
