"""``pvm wrapper run | install | uninstall``: the command line of a source wrapper.

``run`` prints exactly one line on stdout once it accepts requests,
``wrapper NAME listening on http://HOST:PORT``, so a parent process can read the address
(logs go to stderr).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path

from pvm import config_file
from pvm.cli import CliError
from pvm.secret_options import SecretOption

TOKEN_ENV = "PVM_WRAPPER_TOKEN"
APPLICATION_TOKEN_ENV = "PVM_APPLICATION_TOKEN"
SOURCE_URL_ENV = "PVM_SOURCE_URL"
CAPTURE_HELP = """capture methods (--capture):
  trigger      triggers write every committed row change to an outbox table in the source
               (SQLite, PostgreSQL, MariaDB/MySQL InnoDB); sees inserts, updates, deletes and
               key changes of committed transactions only; needs the right to create tables
               and triggers. MariaDB: TRUNCATE is not captured.
  log          reads the database's own change log instead (PostgreSQL: a logical replication
               slot and a publication named --slot, default pvm_<database>_<schema>; needs
               wal_level = logical, the REPLICATION attribute, and ownership of the tables,
               which get REPLICA IDENTITY FULL); no triggers, same guarantees as trigger
               capture. MariaDB: the binary log (log_bin, binlog_format = ROW,
               binlog_row_image = FULL, binlog_row_metadata = FULL; REPLICATION SLAVE and
               BINLOG MONITOR); nothing is created. TRUNCATE stops capture with an error,
               and so does a change of a captured table's columns. A PostgreSQL slot
               retains WAL until the wrapper confirms it: release a source with
               pvm wrapper uninstall --capture log.
  timestamp    polls a last-modified column (--timestamp-column) into a replica kept in the
               state directory (Carnes TS); needs a primary key; installs nothing. Limits:
               TS cannot see deletes (deleted rows stay in the views) and reports a key
               change as an insert of the new key. With --delete-flag-column (Carnes TDI)
               writers flag rows instead of deleting them and deletes are seen. Either way a
               row is missed if its transaction commits more than --settle-seconds after
               stamping it, or if it is stamped below what was already read.
  application  the application posts its committed transactions to POST /v1/changes with
               --application-token (required, or --insecure-no-application-token);
               the source URL is read once for the schema and the initial copy into the
               replica. Needs a primary key; sees what the application reports.
  snapshot     every --snapshot-interval seconds, takes a snapshot of the tables (a SELECT
               of --url in one transaction, or the <table>.csv / <table>.parquet files in
               --dump-dir when they changed), differences it against the previous one and
               ships the inserts, deletes and updates; installs nothing. Needs a key per
               table (the primary key, or --key TABLE=COL[,COL]; dumps always need --key).
               Limits: changes that come and go between two snapshots are never seen, and
               the views trail the source by up to one interval. --diff-algorithm auto uses
               the window algorithm while records stay near their previous positions,
               else the partitioned hash with --checksum-bits checksums (a changed record
               is missed with probability 2**-bits). --diff-algorithm range-checksums
               (Carnes ID/RCS, a live --url with integer keys) keeps one checksum per key
               range of --range-rows rows, computed by the database, and reads and
               differences only the ranges whose checksum changed.
timestamp, application and snapshot capture answer subqueries from the replica, which holds
exactly the shipped updates (see docs/capture.md).

unfit rows: a row holding a value its column's declared type cannot take (text in a REAL
column of SQLite, 2 in a BOOLEAN one) or a text over --max-value-bytes is left out of the
views, in captured updates and in subquery answers alike, and counted under quarantine in
GET /v1/health.

updates: every --poll-interval the wrapper reads, in one snapshot, everything committed since
its previous read and ships it as ONE update: whole source transactions only (a transaction
is never split), but all those one read sees are merged, so an update may hold several
(PostgreSQL names the transaction, txid, when an update holds exactly one). A PostgreSQL
backlog above --part-changes / 2 rows becomes several updates, cut between transactions only;
SQLite and MariaDB name no transaction, so a read is one update however large. An update is
read, stored and shipped in parts of one seq, at most --part-changes changes and --part-bytes
bytes each, so the wrapper's memory does not grow with it; the manager puts the parts
together before any view sees it. Timestamp and snapshot capture make one
update of each pull (every change that pull saw); application capture merges the
transactions posted since the previous read. While the manager is down, capture goes on
(trigger changes wait in the outbox, pulls and application posts go into the replica) and
everything ships, in seq order, once it is back."""
MANAGER_TOKEN_ENV = "PVM_MANAGER_TOKEN"
log = logging.getLogger(__name__)

# Secrets, and the source's URL (it may hold a password): also from a file or the environment.
SOURCE_URL = SecretOption(
    "--url", SOURCE_URL_ENV,
    "SQLAlchemy URL of the source database, e.g. sqlite:///shop.db, postgresql://user@host/db, "
    "mysql://user@host/db (every method but snapshot capture of --dump-dir)",
    is_url=True,
)  # fmt: skip
WRAPPER_TOKEN = SecretOption("--token", TOKEN_ENV, "bearer token of this source's wrapper role at the manager")
MANAGER_TOKEN = SecretOption(
    "--manager-token", MANAGER_TOKEN_ENV,
    "secret the manager must send to query this wrapper; give the same value when registering the source "
    "(without one the wrapper answers anyone)",
)  # fmt: skip
APPLICATION_TOKEN = SecretOption(
    "--application-token",
    APPLICATION_TOKEN_ENV,
    "application capture: secret the application must send with its changes",
)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _int_between(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:,} and {high:,}, got {value:,}")
        return value

    return parse


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _table_option(text: str) -> tuple[str, str]:
    table, sep, value = text.partition("=")
    if not sep or not table.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected TABLE=VALUE, got {text!r}")
    return table.strip(), value.strip()


def _source_arguments(parser: argparse.ArgumentParser) -> None:
    SOURCE_URL.add_to(parser)
    parser.add_argument(
        "--tables", required=True, help="comma-separated tables whose changes are captured, e.g. orders,customers"
    )
    parser.add_argument(
        "--capture",
        default="trigger",
        choices=["trigger", "log", "timestamp", "application", "snapshot"],
        help="how changes are captured (default: trigger; see below)",
    )
    parser.add_argument(
        "--slot", help="log capture: the replication slot and publication (default: pvm_<database>_<schema>)"
    )
    parser.add_argument("--timestamp-column", help="timestamp capture: the last-modified column of every table")
    parser.add_argument("--delete-flag-column", help="timestamp capture (TDI): the column writers set to delete a row")
    parser.add_argument(
        "--settle-seconds",
        type=_non_negative_float,
        default=5.0,
        help="timestamp capture: longest time between stamping a row and committing it (default: 5)",
    )
    from wrappers.capture.snapshots import ALGORITHMS

    snapshot = parser.add_argument_group("snapshot capture")
    snapshot.add_argument(
        "--dump-dir", type=Path, help="read <table>.csv or <table>.parquet dumps from this directory instead of --url"
    )
    snapshot.add_argument(
        "--key", type=_table_option, action="append", default=[], metavar="TABLE=COL[,COL]",
        help="key columns of a table (default: its primary key); repeat for each table",
    )  # fmt: skip
    snapshot.add_argument(
        "--dump-types", type=_table_option, action="append", default=[], metavar="TABLE=COL:TYPE[,COL:TYPE]",
        help="CSV dumps: column types (integer, float, boolean, date, text; default text)",
    )  # fmt: skip
    snapshot.add_argument(
        "--snapshot-interval", type=_positive_float, help="seconds between two snapshots (default: 60)"
    )
    snapshot.add_argument(
        "--diff-algorithm", choices=ALGORITHMS,
        help="the differential algorithm (default: auto)",
    )  # fmt: skip
    snapshot.add_argument(
        "--range-rows", type=_positive_int, help="range-checksums: rows per key range (default: 10000)"
    )
    snapshot.add_argument(
        "--diff-memory-mb",
        type=_positive_int,
        help="memory of a differential, beyond which it spills to disk (default: 256)",
    )
    snapshot.add_argument(
        "--aging-records", type=_positive_int, help="window algorithm: records each aging buffer holds (default: 65536)"
    )
    snapshot.add_argument(
        "--checksum-bits", type=_positive_int, help="partitioned hash: bits of each record's checksum (default: 64)"
    )
    parser.epilog = CAPTURE_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def configure(parser: argparse.ArgumentParser) -> None:
    from contract.schemas import MAX_CHANGES_PER_UPDATE
    from wrappers.parts import DEFAULT_PART_BYTES, DEFAULT_PART_CHANGES, MAX_PART_BYTES
    from wrappers.quarantine import DEFAULT_MAX_VALUE_BYTES
    from wrappers.standing_snapshot import STANDING_SECONDS

    parser.epilog = CAPTURE_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="wrapper_command", required=True, metavar="ACTION")

    run_p = sub.add_parser(
        "run",
        help="serve the wrapper of one source (installs capture if needed)",
        description="Capture committed changes of the source, ship them to the manager in seq order, "
        "and answer maintenance subqueries over HTTP.",
    )
    config_file.add_to(run_p)
    run_p.add_argument("--source", required=True, help="the source's name as registered in the manager")
    _source_arguments(run_p)
    run_p.add_argument("--manager", required=True, help="base URL of the manager, e.g. http://127.0.0.1:8000")
    WRAPPER_TOKEN.add_to(run_p)
    MANAGER_TOKEN.add_to(run_p)
    APPLICATION_TOKEN.add_to(run_p)
    run_p.add_argument(
        "--insecure-no-application-token",
        action="store_true",
        help="application capture: take changes from anyone who reaches the wrapper (a trusted network only)",
    )
    run_p.add_argument(
        "--max-value-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_VALUE_BYTES,
        help="a row holding a larger value (text in UTF-8 bytes) is left out of the views and counted as quarantined "
        f"(default: {DEFAULT_MAX_VALUE_BYTES}, 16 MiB)",
    )
    run_p.add_argument(
        "--update-encoding",
        choices=("auto", "json"),  # wrappers.shipper.UPDATE_ENCODINGS, without importing pyarrow for --help
        default="auto",
        help="how updates are posted to the manager: auto, batches of 100 changes or more as an Arrow update stream "
        "and smaller ones as JSON (JSON from the first refusal of a stream by a manager that does not read it); "
        "json, always JSON (default: auto)",
    )
    run_p.add_argument(
        "--part-changes",
        type=_int_between(2, MAX_CHANGES_PER_UPDATE),
        default=DEFAULT_PART_CHANGES,
        help="the most changes of an update the wrapper holds in memory while it captures or ships it: an update "
        "of any size is read, stored and posted in parts of at most this many changes, and a post of whole "
        f"updates carries at most as many; consecutive transactions merge into updates of half as many rows "
        f"(default: {DEFAULT_PART_CHANGES:,})",
    )
    run_p.add_argument(
        "--part-bytes",
        type=_int_between(1, MAX_PART_BYTES),
        default=DEFAULT_PART_BYTES,
        help="the most bytes of changes, as JSON, in one part or post: keep it well under a MariaDB catalog's "
        f"max_allowed_packet (default: {DEFAULT_PART_BYTES:,}, 8 MiB)",
    )
    run_p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    run_p.add_argument("--port", type=int, default=0, help="port to listen on; 0 picks a free one (default: 0)")
    run_p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="directory of the wrapper's durable state (seqs, unacknowledged updates, interest); "
        "default: $XDG_STATE_HOME/pvm/wrappers",
    )
    run_p.add_argument(
        "--poll-interval",
        type=_positive_float,
        default=0.05,
        help="seconds between two reads of the captured changes (default: 0.05)",
    )
    run_p.add_argument(
        "--standing-snapshot-seconds",
        type=_non_negative_float,
        default=STANDING_SECONDS,
        help="how long the newest snapshot whose updates the manager holds answers later subqueries "
        "(wrappers/standing_snapshot.py; 0: each subquery takes a snapshot of its own; SQLite sources keep none) "
        f"(default: {STANDING_SECONDS})",
    )
    run_p.add_argument(
        "--query-delay-ms",
        type=_non_negative_float,
        default=0.0,
        help="experiments: extra milliseconds spent in every subquery evaluation, inside its snapshot (default: 0)",
    )
    run_p.add_argument(
        "--max-concurrent-queries",
        type=_positive_int,
        default=1,
        help="experiments: subqueries evaluated at the same time, q in the paper's cost model (default: 1)",
    )
    run_p.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="stderr log level"
    )

    for name, text in (
        ("install", "create the outbox and the capture triggers of the tables (idempotent); "
         "other capture methods: check that the tables can be captured"),
        ("uninstall", "drop the capture triggers of the tables, and the outbox once none is left (idempotent)"),
    ):  # fmt: skip
        _source_arguments(sub.add_parser(name, help=text, description=text))


def _tables(text: str) -> tuple[str, ...]:
    tables = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not tables:
        raise CliError("--tables names no table")
    return tables


_SNAPSHOT_FLAGS = {
    "dump_dir": "dump_dir", "snapshot_interval": "interval", "diff_algorithm": "algorithm",
    "diff_memory_mb": "memory_mb", "aging_records": "aging_records", "checksum_bits": "checksum_bits",
    "range_rows": "range_rows",
}  # fmt: skip


def _capture_config(args: argparse.Namespace):
    from wrappers.capture import CaptureConfig
    from wrappers.capture.snapshots import SnapshotOptions

    given = {option: getattr(args, flag) for flag, option in _SNAPSHOT_FLAGS.items() if getattr(args, flag) is not None}
    snapshot = None
    if args.capture == "snapshot":
        keys = {table: tuple(c.strip() for c in cols.split(",") if c.strip()) for table, cols in args.key}
        types = {table: _column_types(table, spec) for table, spec in args.dump_types}
        snapshot = SnapshotOptions(keys=keys, dump_types=types, **given)
        if (snapshot.dump_dir is None) == (args.url is None):
            raise CliError(
                f"snapshot capture reads either --url (--url-file, ${SOURCE_URL_ENV}) or --dump-dir: give exactly one"
            )
    elif given or args.key or args.dump_types:
        raise CliError(
            "--dump-dir, --key, --dump-types and the snapshot and differential options need --capture snapshot"
        )
    elif args.url is None:
        raise CliError(f"{args.capture} capture needs --url (or --url-file, or ${SOURCE_URL_ENV})")
    return CaptureConfig(
        args.capture, args.timestamp_column, args.delete_flag_column, args.settle_seconds, snapshot, args.slot
    )


def _column_types(table: str, spec: str) -> dict[str, str]:
    out = {}
    for item in spec.split(","):
        column, sep, type_name = item.partition(":")
        if not sep or not column.strip() or not type_name.strip():
            raise CliError(f"--dump-types {table}=...: expected COLUMN:TYPE items, got {item!r}")
        out[column.strip()] = type_name.strip().lower()
    return out


def run(args: argparse.Namespace) -> int:
    from wrappers.errors import WrapperError

    try:
        if args.wrapper_command == "run":
            return _serve(args)
        from wrappers.capture import check_source, dialect_for

        SOURCE_URL.resolve(args)

        config = _capture_config(args)
        if config.method == "log":
            return _install_log(config, args)
        if config.method != "trigger":
            tables = _tables(args.tables)
            if args.wrapper_command == "install":
                check_source(config, args.url, tables)
                print(f"{config.method} capture can capture {', '.join(tables)}; it installs nothing in the source")
            else:
                print(f"{config.method} capture installs nothing in the source")
            return 0

        dialect = dialect_for(args.url)
        engine = dialect.open_engine(args.url)
        try:
            tables = _tables(args.tables)
            if args.wrapper_command == "install":
                dialect.install(engine, tables)
                print(f"capture installed for {', '.join(tables)}")
            else:
                dialect.uninstall(engine, tables)
                print(f"capture removed for {', '.join(tables)}")
        finally:
            engine.dispose()
        return 0
    except WrapperError as exc:
        raise CliError(str(exc)) from exc


def _install_log(config, args: argparse.Namespace) -> int:
    """``install`` / ``uninstall`` of log capture."""
    from wrappers.capture import dialect_for, install_log, uninstall_log

    engine = dialect_for(args.url).open_engine(args.url)
    try:
        tables = _tables(args.tables)
        if args.wrapper_command == "install":
            slot = install_log(config, engine, tables)
            where = f"slot and publication {slot}" if slot else "from the binary log; nothing is created"
            print(f"log capture installed for {', '.join(tables)} ({where})")
        else:
            slot = uninstall_log(config, engine, tables)
            where = f"slot {slot} goes with the last table" if slot else "nothing was created"
            print(f"log capture removed for {', '.join(tables)} ({where})")
    finally:
        engine.dispose()
    return 0


def _application_token(args: argparse.Namespace) -> str | None:
    """The secret application capture requires; a CLI error without one, unless the wrapper
    is explicitly started insecure (which is logged as a warning)."""
    if args.capture != "application":
        if args.insecure_no_application_token:
            raise CliError("--insecure-no-application-token belongs to --capture application")
        return args.application_token
    if args.application_token and args.insecure_no_application_token:
        raise CliError("give either --application-token or --insecure-no-application-token, not both")
    if args.application_token:
        return args.application_token
    if not args.insecure_no_application_token:
        raise CliError(
            f"application capture needs --application-token (or --application-token-file, or ${APPLICATION_TOKEN_ENV}): the secret the "
            "application sends with its changes; --insecure-no-application-token takes changes from anyone"
        )
    log.warning(
        "wrapper of %s takes application changes from anyone who reaches it (--insecure-no-application-token)",
        args.source,
    )
    return None


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from api.wrapper_app import create_app
    from contract.file_modes import restrict_umask
    from pvm.heap import arrow_from_the_c_allocator
    from pvm.http_server import http_url, listen, serve_until_stopped, setup_logging, uvicorn_server
    from wrappers.parts import PartLimits
    from wrappers.state import default_state_dir
    from wrappers.wrapper import Wrapper, WrapperConfig

    setup_logging(args.log_level)
    for option in (SOURCE_URL, WRAPPER_TOKEN, MANAGER_TOKEN, APPLICATION_TOKEN):
        option.resolve(args)
    restrict_umask()  # before anything is written: state, outbox and replica hold source data
    application_token = _application_token(args)
    tables, capture = _tables(args.tables), _capture_config(args)  # refused before the socket
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc}") from exc
    config = WrapperConfig(
        source=args.source,
        url=args.url,
        tables=tables,
        manager_url=args.manager,
        token=args.token,
        state_dir=args.state_dir or default_state_dir(),
        poll_interval=args.poll_interval,
        query_delay_ms=args.query_delay_ms,
        max_concurrent_queries=args.max_concurrent_queries,
        capture=capture,
        max_value_bytes=args.max_value_bytes,
        update_encoding=args.update_encoding,
        part_limits=PartLimits(args.part_changes, args.part_bytes),
        standing_seconds=args.standing_snapshot_seconds,
    )
    arrow_from_the_c_allocator()  # as the manager does (pvm/heap.py)
    try:
        wrapper = Wrapper(config)
    except BaseException:
        sock.close()
        raise
    server = uvicorn_server(create_app(wrapper, manager_token=args.manager_token, application_token=application_token))
    return asyncio.run(serve_until_stopped(server, sock, f"wrapper {args.source} listening on {http_url(sock)}"))
