"""Spark's class archive (``warehouse.store.spark_classes``): named to every JVM once it
exists, never required, and a JVM that cannot use it starts silently."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from warehouse.store import spark_classes
from warehouse.store.spark_session import EXECUTOR_JAVA_OPTIONS, JAVA_OPTIONS, session_settings


@pytest.fixture
def archive_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(spark_classes, "ARCHIVE_DIR", tmp_path)
    return tmp_path


def test_without_the_archive_the_jvms_start_as_they_did(archive_dir: Path) -> None:
    assert spark_classes.java_options() == ""
    settings = session_settings()
    assert "SharedArchiveFile" not in settings[JAVA_OPTIONS] and EXECUTOR_JAVA_OPTIONS not in settings


def test_the_archive_is_named_to_the_driver_and_the_executors(archive_dir: Path) -> None:
    path = spark_classes.archive_path()
    assert path is not None and path.parent == archive_dir
    path.write_bytes(b"")
    settings = session_settings()
    assert f"-XX:SharedArchiveFile={path}" in settings[JAVA_OPTIONS]
    assert "-XX:TieredStopAtLevel=1" in settings[JAVA_OPTIONS]  # the defaults stay
    assert settings[EXECUTOR_JAVA_OPTIONS] == spark_classes.java_options()
    # a deployment's own driver options replace the defaults, the archive's with them
    replaced = session_settings(conf={JAVA_OPTIONS: "-XX:+UseG1GC"})
    assert replaced[JAVA_OPTIONS] == "-XX:+UseG1GC"


def test_another_java_gets_another_archive(archive_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = spark_classes.archive_path()
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    other = spark_classes.archive_path()
    assert other is not None and other != ours and other.parent == ours.parent  # type: ignore[union-attr]


def test_setup_archived_the_classes_and_a_jvm_that_cannot_use_them_starts_silently() -> None:
    """``make test`` runs setup, which writes the archive. A JVM of another class path cannot
    use it, and may say so on stderr (where it would reach spark.log or a terminal) unless
    told not to (``QUIET``)."""
    java, archive = spark_classes.java_binary(), spark_classes.archive_path()
    assert java is not None and archive is not None, "no java: scripts/setup.sh installs one"
    assert archive.is_file(), f"no class archive at {archive}: run scripts/setup.sh"
    quiet = subprocess.run(
        [
            java,
            "-cp",
            str(Path(__file__).parent),
            f"-XX:SharedArchiveFile={archive}",
            *spark_classes.QUIET.split(),
            "-version",
        ],
        capture_output=True,
        text=True,
    )
    assert quiet.returncode == 0 and "warning" not in quiet.stderr.lower(), quiet.stderr
