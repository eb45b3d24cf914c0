"""What every test shares: the markers, and fixtures of fresh databases on the real servers.

Markers (declared in pyproject.toml, checked with ``--strict-markers``):

- ``spark``: needs the shared Spark session. Every test under ``tests/spark/`` has it.
- ``servers``: needs the PostgreSQL and MariaDB servers (``bash scripts/services.sh``). A test
  that takes one of the fixtures below has it without saying so.
- ``cluster``: starts a Spark standalone cluster (``deploy/spark-cluster.sh``) and ``pvm serve``
  on it (tests/spark/test_cluster_deployment.py: minutes). ``make test`` runs it, as CI does;
  ``-m "not cluster"`` leaves it out of a quicker local run.
- ``browser``: drives headless Chromium, which ``scripts/setup.sh`` installs; it fails, rather
  than skips, without it. It needs neither Spark nor the servers, and takes a few seconds.

``make test-fast`` runs the rest: no Spark, no servers, for the edit-test loop.

``make test`` runs on pytest-xdist workers with ``--dist loadgroup``: the tests under
``tests/spark/`` are in the group ``spark``, so one worker runs them all, on one Spark session
and one analysts' query process, and the other tests spread over every worker. The exceptions
(``OWN_JVMS`` below) start a JVM or two of their own and never touch the session's: the
script's own master and worker, a session started as ``pvm serve`` starts its own, and one
``pvm serve`` on ``local[1]``; they spread like the rest. (Letting the cluster deployment's
tests spread too, a cluster and ``pvm serve`` on it, made the run no faster and overloaded
the machine: they then ran beside the session's Spark tests.) A test must therefore not
assume the machine to itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.capture_support import (
    MARIADB_ADMIN,
    PG_ADMIN,
    admin_engine,
    drop_log_capture,
    pg_schema_url,
    unique_name,
)

SERVER_FIXTURES = frozenset({"pg_url", "pg_log_url", "maria_url", "postgresql_catalog"})
SPARK_TESTS = Path(__file__).parent / "spark"
# Spark tests (files, or file::test) that start a JVM or two of their own, on local[1] or a
# master and a worker, and never use the session's: any worker may run them, beside the
# session's Spark tests
OWN_JVMS = frozenset(
    {
        "test_spark_cluster.py",
        "test_spark_quiet.py",
        "test_serve_startup.py::test_serve_answers_503_while_spark_starts_and_reports_a_dead_jvm",
    }
)
SESSION_JVMS = frozenset({"spark", "analysts", "analysts_started"})  # session fixtures of tests/spark/conftest.py


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SPARK_TESTS in Path(item.path).parents:
            item.add_marker(pytest.mark.spark)
            # under pytest-xdist (--dist loadgroup) the Spark tests share one worker: the run
            # starts the session's Spark and analysts' query process once, not once a worker,
            # and the JVM-heavy tests (the cluster deployment's) do not run beside them
            if not own_jvms(item):
                item.add_marker(pytest.mark.xdist_group("spark"))
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.servers)


def own_jvms(item: pytest.Item) -> bool:
    """Whether ``item`` is one of ``OWN_JVMS``; such a test that took the session's Spark or
    query process would start them on a second worker too, so it is refused."""
    name = Path(item.path).name
    if name not in OWN_JVMS and f"{name}::{item.name}" not in OWN_JVMS:
        return False
    if used := SESSION_JVMS & set(getattr(item, "fixturenames", ())):
        raise pytest.UsageError(f"{item.nodeid} is in OWN_JVMS but uses the session's {sorted(used)}")
    return True


@contextmanager
def created(admin_url: str, create: str, drop: str) -> Iterator[None]:
    """Run ``create`` on the server of ``admin_url``, and ``drop`` once the block is done."""
    admin = admin_engine(admin_url)
    with admin.connect() as conn:
        conn.exec_driver_sql(create)
    try:
        yield
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(drop)
        admin.dispose()


@pytest.fixture()
def pg_url() -> Iterator[str]:
    """A URL whose current schema is a fresh, empty schema of the test database."""
    schema = unique_name()
    with created(PG_ADMIN, f"CREATE SCHEMA {schema}", f"DROP SCHEMA {schema} CASCADE"):
        yield pg_schema_url(schema)


@pytest.fixture()
def pg_log_url(pg_url: str) -> Iterator[str]:
    """``pg_url``, whose log capture slot and publication (``pvm_test_<schema>``) are dropped
    afterwards: an abandoned slot keeps the server's WAL."""
    try:
        yield pg_url
    finally:
        drop_log_capture(pg_url)


@pytest.fixture()
def maria_url() -> Iterator[str]:
    """A URL of a fresh, empty MariaDB database."""
    database = unique_name()
    with created(MARIADB_ADMIN, f"CREATE DATABASE {database} CHARACTER SET utf8mb4", f"DROP DATABASE {database}"):
        yield f"mysql+pymysql://root@127.0.0.1:3306/{database}"


@pytest.fixture
def postgresql_catalog() -> Iterator[str]:
    """The URL of a fresh PostgreSQL database for a catalog, dropped afterwards."""
    name = f"pvm_catalog_{uuid.uuid4().hex[:10]}"
    with created(PG_ADMIN, f"CREATE DATABASE {name}", f"DROP DATABASE {name} WITH (FORCE)"):
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
