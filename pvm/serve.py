"""``pvm serve``: the manager (HTTP API, maintenance of every view, the view store)."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from pvm.cli import CliError

DEFAULT_DATA_DIR = Path(os.environ.get("PVM_DATA_DIR", "var/pvm"))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="catalog and view store files (default: var/pvm or $PVM_DATA_DIR)")
    parser.add_argument("--catalog", default=None, help="SQLAlchemy URL of the catalog database (default: SQLite file in the data dir)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one (default: 8000)")
    parser.add_argument("--store", choices=["memory", "spark"], default="memory", help="where views live (default: memory)")
    parser.add_argument("--spark-master", default=None, help="Spark master URL (default: embedded local[*])")
    parser.add_argument("--commit-group-size", type=int, default=1000, help="effects appended to the store per write (default: 1000)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="stderr log level")


def catalog_url(data_dir: Path, catalog: str | None) -> str:
    if catalog:
        return catalog
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(data_dir / 'catalog.db').resolve()}"


def open_store(kind: str, data_dir: Path, master: str | None, catalog_url: str):
    if kind == "memory":
        from warehouse.store.memory import MemoryStore

        return MemoryStore()
    from warehouse.catalog.db import Catalog, StoreRecords
    from warehouse.store.spark import SparkStore
    from warehouse.store.spark_session import get_spark

    spark_dir = data_dir / "spark"
    spark = get_spark(master, spark_dir / "warehouse")
    return SparkStore(spark, spark_dir, StoreRecords(Catalog(catalog_url)))


def run(args: argparse.Namespace) -> int:
    from api.manager_app import create_app
    from pvm.serving import http_url, listen, serve_until_stopped, setup_logging, uvicorn_server
    from warehouse.manager import Manager

    setup_logging(args.log_level)
    if args.commit_group_size < 1:
        raise CliError("--commit-group-size must be at least 1")
    url = catalog_url(args.data_dir, args.catalog)
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc}") from exc
    store = open_store(args.store, args.data_dir, args.spark_master, url)
    manager = Manager(url, store, commit_group_size=args.commit_group_size)
    server = uvicorn_server(create_app(manager))
    return asyncio.run(serve_until_stopped(server, sock, f"manager listening on {http_url(sock)}"))
