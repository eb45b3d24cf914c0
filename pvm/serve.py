"""``pvm serve``: the manager (HTTP API, maintenance of every view, the view store)."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
from pathlib import Path

from pvm.cli import CliError

DEFAULT_DATA_DIR = Path(os.environ.get("PVM_DATA_DIR", "var/pvm"))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="catalog and view store files (default: var/pvm or $PVM_DATA_DIR)")
    parser.add_argument("--catalog", default=None, help="SQLAlchemy URL of the catalog database (default: SQLite file in the data dir)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one (default: 8000)")
    parser.add_argument("--store", choices=["memory", "spark"], default="spark", help="where views live: Spark tables, or in memory for quick runs (default: spark)")
    parser.add_argument("--spark-master", default=None, help="Spark master URL (default: embedded local[*])")
    parser.add_argument(
        "--spark-conf", action="append", default=[], metavar="KEY=VALUE",
        help="a Spark setting for the service's session, e.g. spark.driver.memory=4g; repeatable (overrides the service's defaults)",
    )
    parser.add_argument("--connect-host", default=None, help="interface of the Spark Connect server for analysts (default: --host)")
    parser.add_argument("--connect-port", type=int, default=15002, help="Spark Connect port; 0 picks a free one, -1 starts no server (default: 15002)")
    parser.add_argument("--compaction-interval", type=float, default=30.0, help="seconds between checks of the background compaction of the Spark store (default: 30)")
    parser.add_argument("--commit-group-size", type=int, default=1000, help="effects appended to the store per write (default: 1000)")
    parser.add_argument(
        "--commit-linger", type=float, default=0.0, metavar="SECONDS",
        help="how long the commit manager waits after an effect is ready, to gather more into the same write (default: 0)",
    )
    parser.add_argument(
        "--seq-window", type=int, default=100_000, metavar="N",
        help="how far beyond a source's last received seq an update is accepted, held until the gap fills (default: 100000)",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="stderr log level")


def catalog_url(data_dir: Path, catalog: str | None) -> str:
    if catalog:
        return catalog
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(data_dir / 'catalog.db').resolve()}"


def open_store(kind: str, data_dir: Path, master: str | None, catalog_url: str, spark_conf: dict[str, str] | None = None):
    if kind == "memory":
        from warehouse.store.memory import MemoryStore

        return MemoryStore()
    from warehouse.catalog.db import Catalog, StoreRecords
    from warehouse.store.spark import SparkStore
    from warehouse.store.spark_session import get_spark

    spark_dir = data_dir / "spark"
    spark = get_spark(master, spark_dir / "warehouse", conf=spark_conf)
    return SparkStore(spark, spark_dir, StoreRecords(Catalog(catalog_url)), retire_after_s=retention_s())


# Beyond the query timeout: cancelling a Spark job takes effect between tasks, not at once.
RETENTION_MARGIN_S = 60.0


def retention_s() -> float:
    """How long a compacted-away table version stays on disk: an analyst's REST query planned
    on it before the swap runs at most ``QUERY_TIMEOUT_S`` before it is cancelled."""
    from api.analyst import QUERY_TIMEOUT_S

    return QUERY_TIMEOUT_S + RETENTION_MARGIN_S


def announce_first_admin_token(url: str) -> None:
    """On a catalog without a usable admin token, create one and show it (once, on stderr)."""
    import sys

    from api.auth import ensure_admin_token
    from warehouse.catalog.db import Catalog

    catalog = Catalog(url)
    try:
        token = ensure_admin_token(catalog)
    finally:
        catalog.close()
    if token is not None:
        print(
            "pvm serve: the catalog had no admin token, so one was created. It is shown only now:\n"
            f"  export PVM_TOKEN={token}\n"
            "More tokens: pvm token create --role admin|analyst|wrapper [--source S]",
            file=sys.stderr,
            flush=True,
        )


def run(args: argparse.Namespace) -> int:
    from api.manager_app import create_app
    from pvm.serving import http_url, listen, serve_until_stopped, setup_logging, uvicorn_server
    from warehouse.manager import Manager

    spark_conf = check_options(args)  # before anything starts: a refusal leaves nothing behind
    setup_logging(args.log_level)
    url = catalog_url(args.data_dir, args.catalog)
    announce_first_admin_token(url)
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc}") from exc
    store = open_store(args.store, args.data_dir, args.spark_master, url, spark_conf)
    background = start_spark_services(store, args) if args.store == "spark" else []
    try:
        manager = Manager(
            url, store, commit_group_size=args.commit_group_size, commit_linger=args.commit_linger, seq_window=args.seq_window
        )
        server = uvicorn_server(create_app(manager))
        return asyncio.run(serve_until_stopped(server, sock, f"manager listening on {http_url(sock)}"))
    finally:
        for stop in reversed(background):
            stop()
        sock.close()


CONNECT_TOKEN_ENV = "PVM_CONNECT_TOKEN"


def check_options(args: argparse.Namespace) -> dict[str, str]:
    """CliError naming the first option that cannot work; starts nothing. Returns the
    ``--spark-conf`` settings."""
    spark_conf = spark_settings(args.spark_conf)
    if args.commit_group_size < 1:
        raise CliError("--commit-group-size must be at least 1")
    if args.seq_window < 1:
        raise CliError("--seq-window must be at least 1")
    if not (math.isfinite(args.commit_linger) and args.commit_linger >= 0):
        raise CliError("--commit-linger must be a number of seconds, 0 or more")
    if args.store == "spark":
        if not (math.isfinite(args.compaction_interval) and args.compaction_interval > 0):
            raise CliError("--compaction-interval must be positive")
        check_connect_exposure(args)
    return spark_conf


def spark_settings(pairs: list[str]) -> dict[str, str]:
    """``--spark-conf`` values as settings; CliError for one that is not ``spark.…=value``."""
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key.startswith("spark.") or not value:
            raise CliError(f"--spark-conf {pair!r}: expected spark.<setting>=<value>")
        settings[key] = value
    return settings


def check_connect_exposure(args: argparse.Namespace) -> None:
    """Refuse a Spark Connect server reachable from other machines without a token."""
    from warehouse.store.spark_connect import exposure_problem

    if args.connect_port < 0:
        return
    host = args.connect_host or args.host
    problem = exposure_problem(host, os.environ.get(CONNECT_TOKEN_ENV) or None)
    if problem is not None:
        raise CliError(
            f"{problem}. Set {CONNECT_TOKEN_ENV}=<secret> to require a token from clients, "
            "or keep it on loopback with --connect-host 127.0.0.1, or start no server with --connect-port -1"
        )


def start_spark_services(store, args: argparse.Namespace) -> list:
    """The Spark store's companions: background compaction, and the Spark Connect server
    analysts query the views through (its address goes to stdout). Returns their stoppers.
    ``check_options`` has vetted ``args``."""
    from warehouse.store.compaction import Compactor
    from warehouse.store.spark_connect import ConnectError, start_connect_server, stop_connect_server

    compactor = Compactor(store, interval_s=args.compaction_interval)
    compactor.start()
    stoppers = [compactor.stop]
    if args.connect_port >= 0:
        host = args.connect_host or args.host
        try:
            connect = start_connect_server(store.spark, host, args.connect_port, os.environ.get(CONNECT_TOKEN_ENV) or None)
        except ConnectError as exc:
            compactor.stop()
            raise CliError(f"{exc} (--connect-port -1 runs without Spark Connect)") from exc
        stoppers.append(lambda: stop_connect_server(store.spark))
        print(f"spark connect on {connect.url}", flush=True)
    return stoppers
