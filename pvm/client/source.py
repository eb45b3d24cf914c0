"""``pvm source add | list | show``: the sources and their wrappers."""

from __future__ import annotations

import argparse
import time

from rich.markup import escape

from contract.schemas import CAPTURE_METHODS, wrapper_url_problem
from pvm.cli import CliError
from pvm.client import Api, comma_list, connection_options, done, print_fields, print_json, print_table
from pvm.secret_options import SecretOption

MANAGER_TOKEN = SecretOption(
    "--manager-token", "PVM_MANAGER_TOKEN", "the secret the wrapper was started with (its --manager-token)"
)


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="source_command", required=True, metavar="ACTION")
    add = sub.add_parser(
        "add",
        help="register a source whose wrapper runs",
        description="Register a source: the manager reads the schema of its captured tables from the wrapper "
        "(which must be running) and checks that the wrapper runs the capture method given.",
    )
    add.add_argument("name", help="the source's name (as the wrapper's --source)")
    add.add_argument(
        "--url",
        "--wrapper-url",
        dest="wrapper_url",
        metavar="URL",
        required=True,
        help="the wrapper's HTTP address, e.g. http://127.0.0.1:8101 (not the source database's URL, "
        "which only the wrapper is given: `pvm wrapper run --url`)",
    )
    add.add_argument(
        "--capture",
        default="trigger",
        choices=CAPTURE_METHODS,
        help="the wrapper's capture method (default: trigger); refused if the wrapper reports another",
    )
    add.add_argument("--tables", default=None, help="comma-separated tables to use (default: every captured table)")
    MANAGER_TOKEN.add_to(add)
    listing = sub.add_parser(
        "list", help="list sources", description="Every source: wrapper, capture, relations, last seq received."
    )
    show = sub.add_parser(
        "show", help="show a source and its wrapper's health", description="One source and its wrapper's health."
    )
    show.add_argument("name")
    for p in (add, listing, show):
        connection_options(p)


def run(args: argparse.Namespace) -> int:
    with Api(args) as api:
        if args.source_command == "add":
            problem = wrapper_url_problem(args.wrapper_url, "--url")
            if problem is not None:
                raise CliError(problem)
            body = {
                "name": args.name,
                "wrapper_url": args.wrapper_url,
                "capture": args.capture,
                "tables": comma_list(args.tables),
            }
            manager_token = MANAGER_TOKEN.value(args)
            if manager_token:
                body["manager_token"] = manager_token
            source = api.post("/v1/sources", body)
            if args.json:
                print_json(source)
            else:
                done(f"source {source['name']} registered: {', '.join(sorted(source['relations'])) or 'no tables'}")
            return 0
        if args.source_command == "list":
            sources = api.get("/v1/sources")
            if args.json:
                print_json(sources)
            else:
                print_table(
                    "sources",
                    ["name", "wrapper", "capture", "relations", "last seq"],
                    [
                        (s["name"], s["wrapper_url"], s["capture"], ", ".join(sorted(s["relations"])), s["last_seq"])
                        for s in sources
                    ],
                )
            return 0
        source = api.get(f"/v1/sources/{args.name}")
        if args.json:
            print_json(source)
            return 0
        health = source.get("health") or {}
        if health.get("reachable"):
            wrapper = f"reachable; last seq {health.get('last_seq')}, acknowledged through {health.get('acked_through')}, {health.get('pending')} pending"
        else:
            wrapper = f"[red]unreachable[/red]: {health.get('error')}"
        print_fields(
            f"source {source['name']}",
            [
                ("wrapper", source["wrapper_url"]),
                ("capture", source["capture"]),
                ("last seq received", source["last_seq"]),
                ("held above a gap", _held(source)),
                ("wrapper health", wrapper),
                *(("capture blocked", text) for text in [_failing(health.get("blocked"))] if text),
                *(("shipping failing", text) for text in [_failing(health.get("shipping_error"))] if text),
                *(("change log", log) for log in [_change_log(health.get("capture"))] if log),
                *((f"table {t}", ", ".join(cols)) for t, cols in sorted(source["relations"].items())),
            ],
        )
        return 0


def _failing(record: object, now: float | None = None) -> str | None:
    """A capture loop, or the wrapper's posts of updates, failing again and again: the last
    error, how many attempts and since how long; None while nothing fails.

    >>> _failing({"error": "HTTP 413: update too large", "status": 413, "since": 100.0, "attempts": 7}, now=160.0)
    '[red]HTTP 413: update too large[/red] (7 attempts in 60 s)'
    >>> _failing(None) is None
    True
    """
    if not isinstance(record, dict):
        return None
    elapsed = max(0.0, (time.time() if now is None else now) - float(record.get("since") or 0.0))
    return f"[red]{escape(str(record.get('error')))}[/red] ({record.get('attempts')} attempts in {elapsed:.0f} s)"


def _change_log(capture: object) -> str | None:
    """Log capture: what the source keeps of its log for the wrapper, and how far behind it is.

    >>> _change_log({"method": "log", "slot": "pvm_shop", "retained_wal_bytes": 3 << 20, "unread_wal_bytes": 512})
    'slot pvm_shop retains 3.0 MiB of WAL; 512 bytes not read yet'
    >>> _change_log({"method": "log", "position": "mysql-bin.000003:1187", "unread_binlog_bytes": 5 << 20})
    'binary log read through mysql-bin.000003:1187; 5.0 MiB not read yet'
    >>> _change_log({"method": "trigger"}) is None
    True
    """
    if not isinstance(capture, dict):
        return None
    if "retained_wal_bytes" in capture:
        retained = _size(capture["retained_wal_bytes"])
        return f"slot {capture.get('slot')} retains {retained} of WAL; {_size(capture.get('unread_wal_bytes'))} not read yet"
    if "unread_binlog_bytes" in capture:
        unread = _size(capture["unread_binlog_bytes"])
        return f"binary log read through {capture.get('position')}; {unread} not read yet"
    return None


def _size(value: object) -> str:
    size = value if isinstance(value, int) else 0
    return f"{size / (1 << 20):.1f} MiB" if size >= 1 << 20 else f"{size} bytes"


def _held(source: dict) -> str:
    """The updates a source has above a gap in its seq, and the seq they wait for."""
    if not source.get("held"):
        return "none"
    return (
        f"[yellow]{source['held']} update(s), seqs up to {source.get('held_through')}, "
        f"waiting for seq {source.get('waiting_for_seq')}[/yellow]"
    )
