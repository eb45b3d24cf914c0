"""``pvm bench capture``, part 1: what each capture method costs the source's writers.

The same seeded workload runs with no capture, with trigger capture and with log capture
installed, in rounds (``pvm.bench.capture`` has the options). What each mode means on each
server:

* **PostgreSQL**: trigger capture installs its triggers and outbox; log capture sets
  REPLICA IDENTITY FULL and creates a slot and a publication. ``wal_level = logical`` is a
  server setting, on in every mode. Each run counts the WAL the server wrote meanwhile.
* **MariaDB**: the ROW binary log with full images is a server setting too, but a session
  may write without it (``SET SESSION sql_log_bin = 0``). So the writers of "none" and of
  "trigger" run without the binary log, those of "log" with it: log/none is the binary
  log's cost, what log capture needs of the server, measured side by side without
  restarting it. Trigger capture needs no binary log, so trigger/none is the triggers'
  cost alone. Each run sums its writers' own session counters: the binary log bytes they
  wrote (``Binlog_bytes_written``) and the prepare calls of two-phase commits
  (``Handler_prepare``): 0 and 0 without the binary log, which the tests assert.

Why "trigger" runs without the binary log: it is what trigger capture needs, and it keeps
trigger/none and log/none each the cost of one method on a server that had no capture.
A server that keeps a ROW binary log anyway (for replicas) pays for it in every mode; there
log capture adds nothing, and trigger capture also logs its outbox rows (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from pvm.cli import CliError

if TYPE_CHECKING:
    from wrappers.capture.base import CaptureDialect

BINARY_LOG = {"none": False, "trigger": False, "log": True}
"""MariaDB: whether the writers of each mode write the binary log."""


@dataclass
class SessionLog:
    """What one run's writers wrote to MariaDB's binary log, from their session counters."""

    binlog_bytes: int = 0
    handler_prepares: int = 0


def write_cost(url: str, methods: Sequence[str], args: argparse.Namespace) -> dict[str, Any]:
    """Seconds of every run per method (and "none", in round order), the throughput of each
    at its median, each method's median time over that of no capture, the spread of both
    (``spread``), on PostgreSQL the WAL bytes each run wrote (``wal_bytes``), and on MariaDB
    the binary log bytes and two-phase commit prepares of each run's writers
    (``binlog_bytes``, ``handler_prepares``)."""
    modes = ("none", *methods)
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    wal_bytes: dict[str, list[int]] = {mode: [] for mode in modes}
    session_logs: dict[str, list[SessionLog]] = {mode: [] for mode in modes}
    for round_ in range(args.rounds):
        shift = round_ % len(modes)  # no method always runs first (a cold cache) or last
        for mode in modes[shift:] + modes[:shift]:
            reset_table(url, args.rows)
            took, wrote, logged = timed_run(url, mode, args)
            seconds[mode].append(took)
            if wrote is not None:
                wal_bytes[mode].append(wrote)
            if logged is not None:
                session_logs[mode].append(logged)
    median = {mode: statistics.median(s) for mode, s in seconds.items()}
    cost: dict[str, Any] = {
        "seconds": seconds,
        "transactions_per_second": {mode: args.transactions / median[mode] for mode in modes},
        "ratio_to_none": {method: median[method] / median["none"] for method in methods},
        "spread": write_cost_spread(seconds, methods, args.transactions),
    }
    if all(wal_bytes.values()):
        cost["wal_bytes"] = wal_bytes
        cost["wal_bytes_per_transaction"] = {
            mode: statistics.median(written) / args.transactions for mode, written in wal_bytes.items()
        }
    if all(session_logs.values()):
        cost["binary_log"] = {mode: BINARY_LOG[mode] for mode in modes}
        cost["binlog_bytes"] = {mode: [r.binlog_bytes for r in runs] for mode, runs in session_logs.items()}
        cost["binlog_bytes_per_transaction"] = {
            mode: statistics.median(written) / args.transactions for mode, written in cost["binlog_bytes"].items()
        }
        cost["handler_prepares"] = {mode: [r.handler_prepares for r in runs] for mode, runs in session_logs.items()}
    return cost


def write_cost_spread(seconds: dict[str, list[float]], methods: Sequence[str], transactions: int) -> dict[str, Any]:
    """Fastest, median and slowest throughput of every mode, and per method the fastest,
    median and slowest of its time over that of no capture in the same round.

    >>> spread = write_cost_spread({"none": [1.0, 1.2, 1.1], "log": [1.1, 1.2, 1.0]}, ["log"], 100)
    >>> spread["transactions_per_second"]["none"]
    {'min': 83.33333333333334, 'median': 90.9090909090909, 'max': 100.0}
    >>> {k: round(v, 3) for k, v in spread["ratio_in_round"]["log"].items()}
    {'min': 0.909, 'median': 1.0, 'max': 1.1}
    """
    return {
        "transactions_per_second": {
            mode: _min_median_max([transactions / x for x in s]) for mode, s in seconds.items()
        },
        "ratio_in_round": {
            method: _min_median_max([m / n for m, n in zip(seconds[method], seconds["none"])]) for method in methods
        },
    }


def _min_median_max(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def check_binlog_control(url: str) -> None:
    """CliError unless the MariaDB user of ``url`` may write without the binary log (the
    writers of "none" and "trigger" do)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SET SESSION sql_log_bin = 0")
    except sa.exc.DBAPIError as exc:
        raise CliError(
            f"the MariaDB user cannot write without the binary log ({exc.orig}): the write cost compares log capture "
            "with writers that log nothing (SET SESSION sql_log_bin = 0), which needs the BINLOG ADMIN privilege "
            "(SUPER before MariaDB 10.5.2); grant it to the benchmark's user, or measure PostgreSQL alone"
        ) from exc
    finally:
        engine.dispose()


def timed_run(url: str, mode: str, args: argparse.Namespace) -> tuple[float, int | None, SessionLog | None]:
    """The workload's seconds with ``mode``'s capture installed for it alone; on PostgreSQL
    the bytes of WAL the server wrote meanwhile, on MariaDB what the writers wrote to the
    binary log (None elsewhere)."""
    from wrappers.capture import dialect_for

    dialect = dialect_for(url)
    engine = dialect.open_engine(url)
    try:
        with capture_installed(mode, dialect, engine, ["w"]):
            start = wal_position(engine)
            binlog = BINARY_LOG[mode] if engine.dialect.name in ("mysql", "mariadb") else None
            took, logged = workload(engine, args, binlog)
            end = wal_position(engine)
            return took, None if start is None or end is None else end - start, logged
    finally:
        engine.dispose()


def wal_position(engine: sa.Engine) -> int | None:
    """PostgreSQL's WAL insert position (None for other servers)."""
    if engine.dialect.name != "postgresql":
        return None
    with engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint").scalar_one())


@contextmanager
def capture_installed(mode: str, dialect: CaptureDialect, engine: sa.Engine, tables: list[str]) -> Iterator[None]:
    """``mode``'s capture ("none", "trigger" or "log") installed on ``tables``, and
    uninstalled afterwards (a slot left behind would keep the server's WAL)."""
    from wrappers.capture import CaptureConfig, install_log, uninstall_log
    from wrappers.errors import WrapperError

    try:
        if mode == "trigger":
            dialect.install(engine, tables)
        elif mode == "log":
            install_log(CaptureConfig("log"), engine, tables)
    except WrapperError as exc:
        raise CliError(f"cannot install {mode} capture: {exc}") from exc
    try:
        yield
    finally:
        if mode == "trigger":
            dialect.uninstall(engine, tables)
        elif mode == "log":
            uninstall_log(CaptureConfig("log"), engine, tables)


def reset_table(url: str, rows: int) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE IF EXISTS w")
        conn.exec_driver_sql("CREATE TABLE w (id BIGINT PRIMARY KEY, a INTEGER, b VARCHAR(40))")
        conn.execute(
            sa.text("INSERT INTO w VALUES (:id, :a, :b)"),
            [{"id": i, "a": i % 97, "b": f"row {i}"} for i in range(1, rows + 1)],
        )
    engine.dispose()


def session_log(conn: sa.Connection) -> SessionLog:
    """MariaDB: this session's binary log bytes and two-phase commit prepares so far."""
    found = {
        str(name).lower(): int(str(value))
        for name, value in conn.exec_driver_sql(
            "SHOW SESSION STATUS WHERE Variable_name IN ('Binlog_bytes_written', 'Handler_prepare')"
        )
    }
    return SessionLog(found["binlog_bytes_written"], found["handler_prepare"])


def workload(
    engine: sa.Engine, args: argparse.Namespace, binlog: bool | None = None
) -> tuple[float, SessionLog | None]:
    """Seconds for ``args.connections`` threads to commit ``args.transactions`` transactions;
    on MariaDB (``binlog`` not None) the writers write the binary log or not, and what
    they wrote to it is counted."""
    share = -(-args.transactions // args.connections)
    ready = threading.Barrier(args.connections + 1)
    errors: list[BaseException] = []
    logged: list[SessionLog] = []

    def write(i: int) -> None:
        rng = random.Random(f"{args.seed}-{i}")
        fresh = itertools.count(10_000_000 * (i + 1))
        try:
            with engine.connect() as conn:
                if binlog is not None:
                    conn.exec_driver_sql(f"SET SESSION sql_log_bin = {int(binlog)}")
                    before = session_log(conn)
                ready.wait()
                for _ in range(share):
                    for _ in range(args.statements):
                        action = rng.random()
                        if action < 0.5:
                            conn.execute(
                                sa.text("UPDATE w SET a = a + 1, b = :b WHERE id = :id"),
                                {"b": f"v{rng.random()}", "id": rng.randint(1, args.rows)},
                            )
                        elif action < 0.75:
                            conn.execute(sa.text("INSERT INTO w VALUES (:id, 1, 'new')"), {"id": next(fresh)})
                        else:
                            conn.execute(sa.text("DELETE FROM w WHERE id = :id"), {"id": rng.randint(1, args.rows)})
                    conn.commit()
                if binlog is not None:
                    after = session_log(conn)
                    logged.append(
                        SessionLog(
                            after.binlog_bytes - before.binlog_bytes, after.handler_prepares - before.handler_prepares
                        )
                    )
                    conn.exec_driver_sql("SET SESSION sql_log_bin = 1")  # the pool may hand the connection on
                    conn.commit()
        except BaseException as exc:
            errors.append(exc)
            ready.abort()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(args.connections)]
    for t in threads:
        t.start()
    ready.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    took = time.perf_counter() - started
    if errors:
        raise CliError(f"the write workload failed: {errors[0]}")
    if binlog is None:
        return took, None
    return took, SessionLog(sum(r.binlog_bytes for r in logged), sum(r.handler_prepares for r in logged))
