"""``pvm serve``: the manager (HTTP API, maintenance of every view, the view store).

The API listens at once; the view store (Spark takes 10-35 s), its companions and the
manager start behind it (``start_services``), and until they have, every route but
``/v1/health`` answers 503 with ``Retry-After``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from pvm import config_file
from pvm.cli import CliError
from pvm.heap import arrow_from_the_c_allocator, freeze_long_lived
from pvm.secret_options import SecretOption

DEFAULT_DATA_DIR = Path(os.environ.get("PVM_DATA_DIR", "var/pvm"))
ADMIN_TOKEN_FILE = "admin-token"
CATALOG_URL = SecretOption(
    "--catalog", "PVM_CATALOG_URL",
    "SQLAlchemy URL of the catalog database (default: SQLite file in the data dir)", is_url=True,
)  # fmt: skip
SPARK_AUTH_SECRET = SecretOption(
    "--spark-auth-secret", "PVM_SPARK_AUTH_SECRET",
    "the shared secret of a standalone cluster that authenticates (spark.authenticate.secret)",
    on_command_line=False,
)  # fmt: skip
log = logging.getLogger("pvm.serve")


def configure(parser: argparse.ArgumentParser) -> None:
    from warehouse.log_pruning import DEFAULT_RETENTION_S
    from warehouse.protocol import DEFAULT_QUEUE_BUDGET
    from warehouse.unit_parts import PART_ROWS

    config_file.add_to(parser)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help="catalog and view store files (default: var/pvm or $PVM_DATA_DIR)",
    )
    CATALOG_URL.add_to(parser)
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one (default: 8000)")
    parser.add_argument(
        "--store",
        choices=["memory", "spark"],
        default="spark",
        help="where views live: Spark tables, or in memory for quick runs (default: spark)",
    )
    parser.add_argument(
        "--spark-master",
        default=None,
        help="Spark master URL, e.g. spark://HOST:7077 (default: embedded local[*]); "
        "a spark:// master that does not answer stops the start",
    )
    SPARK_AUTH_SECRET.add_to(parser)
    parser.add_argument(
        "--spark-executor-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="with a spark:// master, how long the start waits for the master to take the application, and then "
        "for the first executor: none by then (no worker registered, or none with the cores and memory asked for) "
        "stops the start with an error (default: 120)",
    )
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the service's session, e.g. spark.driver.memory=4g; repeatable (overrides the service's defaults)",
    )
    parser.add_argument(
        "--connect-port",
        type=int,
        default=-1,
        help="serve Spark Connect to analysts on this port (their analyst tokens required); 0 picks a free one (default: -1, off)",
    )
    parser.add_argument("--connect-host", default=None, help="interface of Spark Connect (default: --host)")
    parser.add_argument(
        "--connect-tls-cert",
        type=Path,
        default=None,
        help="TLS certificate (PEM) for Spark Connect; needed off loopback",
    )
    parser.add_argument("--connect-tls-key", type=Path, default=None, help="TLS private key (PEM) for Spark Connect")
    analysts = parser.add_argument_group("analysts' queries (run in a Spark process of their own)")
    analysts.add_argument(
        "--analyst-memory", default="1g", help="heap of the analysts' Spark process, e.g. 2g (default: 1g)"
    )
    analysts.add_argument(
        "--analyst-master", default="local[2]", help="Spark master of the analysts' process (default: local[2])"
    )
    analysts.add_argument(
        "--analyst-concurrency", type=int, default=4, help="analyst queries run at once, all tokens (default: 4)"
    )
    analysts.add_argument(
        "--analyst-per-token", type=int, default=2, help="analyst queries one token may run at once (default: 2)"
    )
    analysts.add_argument(
        "--query-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="an analyst query is stopped after this long (default: 120)",
    )
    analysts.add_argument(
        "--max-result-bytes",
        type=int,
        default=16 << 20,
        help="size of an analyst query's answer at most (default: 16 MiB)",
    )
    analysts.add_argument(
        "--analyst-user", default=None, help="OS user to run the analysts' process as (pvm serve must run as root)"
    )
    parser.add_argument(
        "--compaction-interval",
        type=float,
        default=30.0,
        help="seconds between checks of the background compaction of the Spark store (default: 30)",
    )
    parser.add_argument(
        "--commit-group-size", type=int, default=1000, help="effects appended to the store per write (default: 1000)"
    )
    parser.add_argument(
        "--commit-linger",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="how long the commit manager waits after an effect is ready, to gather more into the same write (default: 0)",
    )
    parser.add_argument(
        "--stall-after",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="the maintenance watchdog: a view with work pending and no progress this long is reported stalled and makes /v1/ready fail (default: 60)",
    )
    parser.add_argument(
        "--seq-window",
        type=int,
        default=100_000,
        metavar="N",
        help="how far beyond a source's last received seq an update is accepted, held until the gap fills (default: 100000)",
    )
    parser.add_argument(
        "--max-queued-changes",
        type=int,
        default=DEFAULT_QUEUE_BUDGET,
        metavar="N",
        help="the most changes a view's queue of updates not yet maintained holds in memory; past it the queue's tail "
        f"stays in the update log and is read back as maintenance catches up (default: {DEFAULT_QUEUE_BUDGET})",
    )
    parser.add_argument(
        "--unit-part-rows",
        type=int,
        default=PART_ROWS,
        metavar="N",
        help="the most delta rows a maintenance unit sweeps at once: a larger unit (a transaction of many rows, or a "
        "merged backlog) is swept in parts, each part's effect stored as soon as it is computed, and an update "
        "shipped in parts whose delta has more rows stays in the update log, spooled to disk by part when its unit "
        f"runs, so that memory follows the part and not the unit (default: {PART_ROWS})",
    )
    parser.add_argument(
        "--log-retention",
        type=float,
        default=DEFAULT_RETENTION_S,
        metavar="SECONDS",
        help="the update log is pruned of what no view, restart or resent update can need any more, once it is this "
        f"old (received, or its unit committed, so long ago); 0: as soon as nothing needs it (default: {DEFAULT_RETENTION_S:.0f})",
    )
    parser.add_argument(
        "--keep-update-log",
        action="store_true",
        help="never prune the update log and the unit records: the catalog keeps every update for good and grows "
        "without bound (see docs/protocol.md, 'Pruning the update log')",
    )
    parser.add_argument(
        "--max-verifications",
        type=int,
        default=1,
        metavar="N",
        help="view verifications (pvm verify) run at once over all views; more are refused with 429 (default: 1)",
    )
    parser.add_argument(
        "--change-log-warning-mb",
        type=int,
        default=1024,
        metavar="MB",
        help="log capture: warn (health, /metrics pvm_source_change_log_warning) when a source's database keeps "
        "more than this much change log for its wrapper, e.g. a stopped wrapper's PostgreSQL slot (default: 1024)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="stderr log level"
    )


def catalog_url(data_dir: Path, catalog: str | None) -> str:
    if catalog:
        return catalog
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(data_dir / 'catalog.db').resolve()}"


def open_store(
    kind: str,
    data_dir: Path,
    master: str | None,
    catalog_url: str,
    spark_conf: dict[str, str] | None = None,
    retire_after_s: float = 0.0,
    host: str = "127.0.0.1",
    auth_secret: str | None = None,
    executor_timeout_s: float = 120.0,
):
    """The view store; Spark's driver listens on ``host`` (the service's ``--host``). With
    ``auth_secret`` the driver authenticates to the cluster (``spark.authenticate``), the
    secret kept off every command line. On a ``spark://`` master, CliError if no executor
    registers within ``executor_timeout_s`` or one cannot write the store's directory; the
    master's taking the application is given as long (``within_registration``)."""
    if kind == "memory":
        from warehouse.store.memory import MemoryStore

        return MemoryStore()
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from warehouse.catalog.db import Catalog, StoreRecords
    from warehouse.store.file_access import store_files
    from warehouse.store.spark import SparkStore
    from warehouse.store.spark_cluster import within_registration
    from warehouse.store.spark_session import get_spark

    spark_dir = store_files().make_dir(data_dir / "spark")
    conf = dict(spark_conf or {})
    secret = None
    if auth_secret is not None:
        conf["spark.authenticate"] = "true"
        secret = {"spark.authenticate.secret": auth_secret}

    # Spark's own log lines go to <data-dir>/spark.log: the terminal has the service's
    def start() -> SparkSession:
        return get_spark(master, spark_dir / "warehouse", conf=conf, host=host, log_dir=data_dir, secret_conf=secret)

    try:
        if master is not None and master.startswith("spark://"):
            # the master's acceptance takes as long as its executors may (within_registration)
            spark = within_registration(start, lambda: SparkContext._gateway is not None, executor_timeout_s)
        else:
            spark = start()
    except Exception as exc:
        if master is None:
            raise
        # e.g. a port that accepts connections but is no Spark master: Spark would give up
        # after three registrations of 20 s and report only "a stopped SparkContext"
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        # a cluster that authenticates drops an application without its secret, which
        # Spark reports as "All masters are unresponsive"
        hint = (
            "" if auth_secret else "; if the cluster authenticates (spark.authenticate), give --spark-auth-secret-file"
        )
        raise CliError(
            f"--spark-master {master}: Spark did not start on this master ({first_line}); see {data_dir / 'spark.log'}"
            + hint
        ) from exc
    if master is not None and master.startswith("spark://"):
        check_cluster(spark, master, spark_dir, executor_timeout_s, data_dir)
    return SparkStore(spark, spark_dir, StoreRecords(Catalog(catalog_url)), retire_after_s=retire_after_s)


def check_cluster(spark, master: str, store_dir: Path, timeout_s: float, data_dir: Path) -> None:
    """CliError unless an executor of the cluster registers within ``timeout_s`` and every
    executor can write ``store_dir`` (``warehouse.store.spark_cluster``)."""
    from warehouse.store.spark_cluster import store_problem, wait_for_executors

    started = time.monotonic()
    executors = wait_for_executors(spark, timeout_s)
    if not executors:
        asked = {
            k: spark.conf.get(k, None) for k in ("spark.executor.memory", "spark.executor.cores", "spark.cores.max")
        }
        shown = ", ".join(f"{k}={v}" for k, v in asked.items() if v)
        raise CliError(
            f"--spark-master {master}: no executor registered in {timeout_s:g} s: no worker has joined the master, "
            f"or none has the free cores and memory this application asks for ({shown or 'Spark defaults'}); see the "
            f"master's web UI and {data_dir / 'spark.log'}"
        )
    log.info("%d Spark executor(s) after %.1f s", executors, time.monotonic() - started)
    problem = store_problem(spark, store_dir)
    if problem is not None:
        raise CliError(
            f"--spark-master {master}: the executors cannot write the view store's directory {store_dir} ({problem}): "
            "every worker needs it at the same path (a shared file system), writable by the user the worker runs as"
        )


# Beyond the query timeout and its grace: cancelling a Spark job takes effect between tasks.
RETENTION_MARGIN_S = 60.0


def query_timeout_s(args: argparse.Namespace) -> float:
    from api.analyst import QUERY_TIMEOUT_S

    return QUERY_TIMEOUT_S if getattr(args, "query_timeout", None) is None else args.query_timeout


def retention_s(args: argparse.Namespace) -> float:
    """How long a compacted-away table version stays on disk: an analyst's query planned on
    it before the swap runs at most the query timeout, and its grace, before it is ended."""
    from warehouse.analysts.supervisor import AnalystSettings

    return query_timeout_s(args) + AnalystSettings.grace_s + RETENTION_MARGIN_S


def analyst_settings(args: argparse.Namespace, spark_conf: dict[str, str]):
    """How the analysts' query process runs, from ``pvm serve``'s options."""
    from warehouse.analysts.supervisor import AnalystSettings

    return AnalystSettings(
        work_dir=args.data_dir / "analysts",
        master=args.analyst_master,
        memory=args.analyst_memory,
        concurrency=args.analyst_concurrency,
        per_principal=args.analyst_per_token,
        timeout_s=query_timeout_s(args),
        max_result_bytes=args.max_result_bytes,
        connect_port=0 if args.connect_port >= 0 else -1,
        user=args.analyst_user,
        spark_conf={k: v for k, v in spark_conf.items() if k == "spark.sql.shuffle.partitions"},
    )


def secure_data_dir(data_dir: Path, analyst_user: str | None = None) -> None:
    """Owner-only from here on: the umask for everything this process (Spark's JVM included)
    creates, and the modes of what an earlier run left: the data directory 0700, the catalog
    key and the admin token file 0600, the view store's files ``store_files()``. (An SQLite
    catalog file sees to its own, wherever it is.) With ``analyst_user`` (``--analyst-user``)
    the store is readable by that user's group, which may pass through the data directory
    (0710) but read nothing else in it."""
    import grp
    import pwd

    from contract.file_modes import PRIVATE, FileModes, restrict_umask
    from warehouse.catalog.secrets import KEY_FILE
    from warehouse.store.file_access import share_with_group, store_files

    restrict_umask()
    if analyst_user is None:
        PRIVATE.make_dir(data_dir)
    else:
        group = grp.getgrgid(pwd.getpwnam(analyst_user).pw_gid).gr_name
        share_with_group(group)
        FileModes(dir_mode=0o710, file_mode=0o600, group=group).make_dir(data_dir)
    PRIVATE.secure(data_dir / KEY_FILE, data_dir / ADMIN_TOKEN_FILE)
    store_files().secure(data_dir / "spark")


def announce_first_admin_token(url: str, data_dir: Path, key_file: Path | None = None) -> None:
    """On a catalog without a usable admin token, create one and put it in the 0600 file
    ``<data-dir>/admin-token``; stderr, a log, only says where it is."""
    import shlex
    import sys

    from api.auth import ensure_admin_token
    from contract.file_modes import write_private_file
    from warehouse.catalog.db import Catalog
    from warehouse.catalog.secrets import SealError

    try:
        catalog = Catalog(url, key_file)
    except SealError as exc:  # the key file cannot be read, or is not one
        raise CliError(str(exc)) from exc
    try:
        token = ensure_admin_token(catalog)
    finally:
        catalog.close()
    if token is not None:
        path = shlex.quote(str(write_private_file(data_dir / ADMIN_TOKEN_FILE, f"{token}\n").resolve()))
        print(
            f"pvm serve: the catalog had no admin token, so one was created; it is in {path}, readable by this user only:\n"
            f"  export PVM_TOKEN=$(cat {path})   # or: pvm … --token-file {path}\n"
            "More tokens: pvm token create --role admin|analyst|wrapper [--source S]",
            file=sys.stderr,
            flush=True,
        )


def run(args: argparse.Namespace) -> int:
    from api.auth import verifier_for
    from api.manager_app import create_app
    from pvm.http_server import http_url, listen, serve_until_stopped, setup_logging, uvicorn_server
    from warehouse.catalog.secrets import key_file_for
    from warehouse.log_pruning import LogPruning
    from warehouse.manager import Manager

    setup_logging(args.log_level)
    arrow_from_the_c_allocator()  # memory Arrow frees goes back (pvm/heap.py)
    spark_conf = check_options(args)  # before anything starts: a refusal leaves nothing behind
    secure_data_dir(args.data_dir, args.analyst_user if args.store == "spark" else None)
    url = catalog_url(args.data_dir, args.catalog)
    key_file = key_file_for(url, args.data_dir)
    announce_first_admin_token(url, args.data_dir, key_file)
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc}") from exc
    stoppers: list[Callable[[], None]] = []
    failures: list[BaseException] = []
    try:
        manager = Manager(
            url,
            None,
            commit_group_size=args.commit_group_size,
            commit_linger=args.commit_linger,
            stall_after_s=args.stall_after,
            catalog_key_file=key_file,
            seq_window=args.seq_window,
            max_queued_changes=args.max_queued_changes,
            unit_part_rows=args.unit_part_rows,
            max_verifications=args.max_verifications,
            change_log_warning_bytes=args.change_log_warning_mb << 20,
            log_pruning=None if args.keep_update_log else LogPruning(retention_s=args.log_retention),
        )
        verifier = verifier_for(manager)

        async def startup() -> None:
            try:
                await start_services(args, manager, verifier, url, spark_conf, stoppers)
            except Exception as exc:  # raised below, once the server has stopped
                failures.append(exc)
                server.should_exit = True

        server = uvicorn_server(create_app(manager, startup=startup, verifier=verifier))
        code = asyncio.run(
            serve_until_stopped(server, sock, f"manager listening on {http_url(sock)}", own_signals=True)
        )
        if failures:
            raise failures[0]
        return code
    finally:
        for stop in reversed(stoppers):
            stop()
        sock.close()


async def start_services(
    args: argparse.Namespace, manager, verifier, url: str, spark_conf: dict[str, str], stoppers: list
) -> None:
    """The startup phase, run while the API already answers (503 but for health until it
    returns): the view store, its companions (the analysts' query process, compaction, Spark
    Connect; their stoppers go to ``stoppers``), then the manager (catalog, recovery of every
    view). Nothing here blocks the event loop."""
    started = time.perf_counter()
    # the analysts' query process starts first: its JVM and warm-up (half a minute on a busy
    # machine) overlap the store's Spark session instead of following it
    analysts = start_analysts(args, spark_conf, stoppers) if args.store == "spark" else None
    store = await asyncio.to_thread(
        open_store, args.store, args.data_dir, args.spark_master, url, spark_conf, retention_s(args), args.host,
        args.spark_auth_secret, args.spark_executor_timeout,
    )  # fmt: skip
    if analysts is not None:
        manager.analysts = await asyncio.to_thread(start_spark_services, store, analysts, args, stoppers)
        if args.connect_port >= 0:
            await asyncio.to_thread(start_connect_gateway, manager, manager.analysts, verifier, args, stoppers)
    await manager.start(store)
    frozen = freeze_long_lived()  # startup's objects: out of every full collection (pvm/heap.py)
    log.info("manager started in %.1f s (%d long-lived objects frozen)", time.perf_counter() - started, frozen)


SPARK_MASTER_CONNECT_TIMEOUT_S = 10.0


def spark_master_addresses(master: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` of each master of a ``spark://`` URL (several with standby
    masters, ``spark://h1:7077,h2:7077``); CliError for a URL Spark could not parse either.

    >>> spark_master_addresses("spark://10.0.0.5:7077,[::1]:7078")
    [('10.0.0.5', 7077), ('::1', 7078)]
    """
    addresses = []
    for part in master.removeprefix("spark://").split(","):
        host, sep, port = part.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536) or "/" in part:
            raise CliError(f"--spark-master {master}: expected spark://HOST:PORT (or spark://HOST:PORT,HOST:PORT,…)")
        addresses.append((host, int(port)))
    return addresses


def check_spark_master(master: str | None, timeout_s: float = SPARK_MASTER_CONNECT_TIMEOUT_S) -> None:
    """CliError naming the URL unless some master of a ``spark://`` URL accepts a connection
    within ``timeout_s``: Spark itself would try to register for a minute, then fail with
    "Cannot call methods on a stopped SparkContext". Other masters (``local[…]``, ``yarn``,
    ``k8s://…``) are left to Spark."""
    import socket

    if not master or not master.startswith("spark://"):
        return
    problems = []
    for host, port in spark_master_addresses(master):
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            return
        except OSError as exc:
            problems.append(f"{host}:{port}: {exc.strerror or exc}")
    raise CliError(f"--spark-master {master}: no Spark master answers ({'; '.join(problems)})")


def check_options(args: argparse.Namespace) -> dict[str, str]:
    """CliError naming the first option that cannot work; starts nothing. Returns the
    ``--spark-conf`` settings; ``args.catalog`` holds the catalog URL, from wherever it was
    given."""
    CATALOG_URL.resolve(args)
    SPARK_AUTH_SECRET.resolve(args)
    spark_conf = spark_settings(args.spark_conf)
    if args.spark_auth_secret is not None and args.store != "spark":
        raise CliError("--spark-auth-secret-file needs the Spark store (--store spark)")
    if not (math.isfinite(args.spark_executor_timeout) and args.spark_executor_timeout > 0):
        raise CliError("--spark-executor-timeout must be a positive number of seconds")
    if args.commit_group_size < 1:
        raise CliError("--commit-group-size must be at least 1")
    if args.seq_window < 1:
        raise CliError("--seq-window must be at least 1")
    if args.max_queued_changes < 1:
        raise CliError("--max-queued-changes must be at least 1")
    if args.unit_part_rows < 1:
        raise CliError("--unit-part-rows must be at least 1")
    if args.max_verifications < 1:
        raise CliError("--max-verifications must be at least 1")
    if not (math.isfinite(args.log_retention) and args.log_retention >= 0):
        raise CliError("--log-retention must be a number of seconds, 0 or more")
    if args.change_log_warning_mb < 1:
        raise CliError("--change-log-warning-mb must be at least 1")
    if not (math.isfinite(args.commit_linger) and args.commit_linger >= 0):
        raise CliError("--commit-linger must be a number of seconds, 0 or more")
    if not (math.isfinite(args.stall_after) and args.stall_after > 0):
        raise CliError("--stall-after must be a positive number of seconds")
    if args.store == "spark":
        if not (math.isfinite(args.compaction_interval) and args.compaction_interval > 0):
            raise CliError("--compaction-interval must be positive")
        check_analyst_options(args)
        check_connect_exposure(args)
        check_spark_master(args.spark_master)
    elif args.connect_port >= 0:
        raise CliError("--connect-port needs the Spark store (--store spark)")
    return spark_conf


def check_analyst_options(args: argparse.Namespace) -> None:
    if args.analyst_concurrency < 1 or args.analyst_per_token < 1:
        raise CliError("--analyst-concurrency and --analyst-per-token must be at least 1")
    if args.query_timeout is not None and not (math.isfinite(args.query_timeout) and args.query_timeout > 0):
        raise CliError("--query-timeout must be a positive number of seconds")
    if args.max_result_bytes < 1024:
        raise CliError("--max-result-bytes must be at least 1024")
    if args.analyst_user is not None:
        import pwd

        try:
            pwd.getpwnam(args.analyst_user)
        except KeyError:
            raise CliError(f"--analyst-user {args.analyst_user!r}: no such OS user") from None
        if os.geteuid() != 0:
            raise CliError(
                "--analyst-user needs pvm serve to run as root (it starts the analysts' process as that user)"
            )


SECRET_SPARK_SETTINGS = frozenset({"spark.authenticate.secret"})


def spark_settings(pairs: list[str]) -> dict[str, str]:
    """``--spark-conf`` values as settings; CliError for one that is not ``spark.…=value``."""
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if key in SECRET_SPARK_SETTINGS:
            raise CliError(
                f"--spark-conf {key}: a secret is not given on the command line or in a configuration file; "
                f"use {SPARK_AUTH_SECRET.file_flag} FILE or ${SPARK_AUTH_SECRET.env}"
            )
        if not sep or not key.startswith("spark.") or not value:
            raise CliError(f"--spark-conf {pair!r}: expected spark.<setting>=<value>")
        settings[key] = value
    return settings


def check_connect_exposure(args: argparse.Namespace) -> None:
    """Refuse Spark Connect off loopback without TLS: clients would not send their tokens."""
    from warehouse.store.spark_connect import is_loopback

    if args.connect_port < 0:
        return
    host = args.connect_host or args.host
    if (args.connect_tls_cert is None) != (args.connect_tls_key is None):
        raise CliError("--connect-tls-cert and --connect-tls-key go together")
    for path in (args.connect_tls_cert, args.connect_tls_key):
        if path is not None and not path.is_file():
            raise CliError(f"{path}: no such file")
    if not is_loopback(host) and args.connect_tls_cert is None:
        raise CliError(
            f"Spark Connect on {host!r} (not loopback) needs TLS: clients send their tokens only over TLS or to "
            "localhost. Give --connect-tls-cert and --connect-tls-key, or --connect-host 127.0.0.1"
        )


def start_analysts(args: argparse.Namespace, spark_conf: dict[str, str], stoppers: list):
    """The analysts' query process, started in the background (``check_options`` has vetted
    ``args``); its stopper goes to ``stoppers``. It shows the store's views once
    ``start_spark_services`` subscribes it to the store."""
    from warehouse.analysts.supervisor import AnalystProcess

    analysts = AnalystProcess(analyst_settings(args, spark_conf))
    analysts.start()
    stoppers.append(analysts.stop)
    return analysts


def start_spark_services(store, analysts, args: argparse.Namespace, stoppers: list):
    """The Spark store's companions: background compaction, and the analysts' query process
    (``start_analysts``), which shows the store's views to analysts from now on. Stoppers go
    to ``stoppers``; returns the query process."""
    from warehouse.store.compaction import Compactor

    compactor = Compactor(store, interval_s=args.compaction_interval)
    compactor.start()
    stoppers.append(compactor.stop)
    store.subscribe(analysts.publish)
    return analysts


def start_connect_gateway(manager, analysts, verifier, args: argparse.Namespace, stoppers: list) -> None:
    """Spark Connect for analysts (``api/connect_gateway.py``); its address goes to stdout."""
    from api.connect_gateway import ConnectGateway, GatewayError, GatewaySettings

    settings = GatewaySettings(
        host=args.connect_host or args.host,
        port=args.connect_port,
        timeout_s=query_timeout_s(args),
        tls_cert=args.connect_tls_cert,
        tls_key=args.connect_tls_key,
    )
    gateway = ConnectGateway(settings, verifier.verify, analysts, lambda: list(manager.views))
    try:
        address = gateway.start()
    except GatewayError as exc:
        raise CliError(f"{exc} (without --connect-port, Spark Connect stays off)") from exc
    stoppers.append(gateway.stop)
    print(f"spark connect on {address} (analysts add ;token=<their token>)", flush=True)
