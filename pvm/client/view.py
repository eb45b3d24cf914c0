"""``pvm view define | list | show | rows | drop | pause | resume``: the warehouse's views."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pvm.cli import CliError
from pvm.client import Api, connection_options, done, print_fields, print_json, print_table
from warehouse.protocol import DEFAULT_BATCH_SIZE


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="view_command", required=True, metavar="ACTION")
    define = sub.add_parser(
        "define",
        help="define a view from SQL",
        description="Define an SPJ view: SELECT … FROM src.table [alias], … WHERE … (optionally CREATE VIEW name AS …).",
    )
    sql = define.add_mutually_exclusive_group(required=True)
    sql.add_argument("--sql", help="the view's SQL")
    sql.add_argument("--file", type=Path, help="a file holding the view's SQL")
    define.add_argument("--name", default=None, help="the view's name (default: from CREATE VIEW)")
    define.add_argument("--parallelism", type=int, default=4, help="PPU size p; 1 is SWEEP (default: 4)")
    define.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"at most this many queued updates of one source per unit; a backlog is spread over the free PPU slots (default: {DEFAULT_BATCH_SIZE}; 1: one update per unit)",
    )
    define.add_argument(
        "--commit-mode",
        choices=["out_of_order", "arrival"],
        default="out_of_order",
        help="PVM (out_of_order, default) or PVM-CC (arrival)",
    )
    define.add_argument("--wait", action="store_true", help="show progress until the initial load is committed")
    define.add_argument(
        "--wait-timeout",
        type=float,
        default=3600.0,
        help="with --wait: give up after this many seconds (default: 3600)",
    )

    listing = sub.add_parser(
        "list", help="list views", description="Every view with its state, watermark, lag and rows."
    )
    show = sub.add_parser(
        "show",
        help="show a view's status",
        description="A view's state, watermark W, pending updates, lag, rows, counters.",
    )
    show.add_argument("name")
    rows = sub.add_parser(
        "rows",
        help="read a view's rows",
        description="The view as of its watermark W (default), an earlier order, or latest.",
    )
    rows.add_argument("name")
    rows.add_argument("--as-of", type=int, default=None, help="an order number <= W still stored")
    rows.add_argument("--latest", action="store_true", help="include effects committed out of order")
    rows.add_argument("--limit", type=int, default=20, help="rows to print (default: 20)")
    rows.add_argument("--offset", type=int, default=0, help="rows to skip (default: 0)")
    drop = sub.add_parser("drop", help="drop a view", description="Stop maintaining a view and delete its contents.")
    drop.add_argument("name")
    pause = sub.add_parser(
        "pause", help="pause maintenance of a view", description="Updates keep being queued; none is maintained."
    )
    pause.add_argument("name")
    resume = sub.add_parser(
        "resume", help="resume maintenance of a view", description="Maintain the queued updates again."
    )
    resume.add_argument("name")
    for p in (define, listing, show, rows, drop, pause, resume):
        connection_options(p)


def run(args: argparse.Namespace) -> int:
    with Api(args) as api:
        command = args.view_command
        if command == "define":
            return _define(api, args)
        if command == "list":
            views = api.get("/v1/views")
            if args.json:
                print_json(views)
            else:
                print_table(
                    "views",
                    ["name", "state", "W", "pending", "lag", "rows", "p", "mode"],
                    [
                        (
                            v["name"],
                            v["state"],
                            v["watermark"],
                            v["updates_pending"],
                            f"{v['lag_updates']} upd, {v['lag_seconds']:.1f} s",
                            v["row_count"],
                            v["parallelism"],
                            v["commit_mode"],
                        )
                        for v in views
                    ],
                )
            return 0
        if command == "show":
            view = api.get(f"/v1/views/{args.name}")
            print_json(view) if args.json else _show(view)
            return 0
        if command == "rows":
            if args.limit < 1 or args.offset < 0:
                raise CliError("--limit must be at least 1 and --offset not negative")
            params = {"limit": args.limit, "offset": args.offset, "latest": str(args.latest).lower()}
            if args.as_of is not None:
                params["as_of"] = args.as_of
            page = api.get(f"/v1/views/{args.name}/rows", params=params)
            if args.json:
                print_json(page)
            else:
                state = "latest" if page["as_of"] is None else f"as of {page['as_of']} (W = {page['watermark']})"
                shown = f"{page['offset'] + 1}-{page['offset'] + len(page['rows'])}" if page["rows"] else "none"
                print_table(
                    f"{page['view']} {state}: rows {shown} of {page['total']}",
                    page["columns"],
                    page["rows"],
                    empty="(no rows)",
                )
            return 0
        if command == "drop":
            api.delete(f"/v1/views/{args.name}")
            done(f"view {args.name} dropped")
            return 0
        view = api.post(f"/v1/views/{args.name}/{command}")
        print_json(view) if args.json else done(f"view {view['name']}: {'paused' if view['paused'] else 'maintaining'}")
        return 0


def _define(api: Api, args: argparse.Namespace) -> int:
    if args.file is not None:
        try:
            sql = args.file.read_text()
        except OSError as exc:
            raise CliError(f"cannot read {args.file}: {exc}") from exc
    else:
        sql = args.sql
    body = {
        "sql": sql,
        "name": args.name,
        "parallelism": args.parallelism,
        "batch_size": args.batch_size,
        "commit_mode": args.commit_mode,
    }
    view = api.post("/v1/views", body)
    name = view["name"]
    if args.wait:
        view = wait_initialized(api, name, args.wait_timeout)
    if args.json:
        print_json(view)
    elif view["state"] == "failed":
        raise CliError(f"view {name} failed: {view['error']}")
    else:
        done(
            f"view {name} defined: {view['state']}" + ("" if args.wait else f" (follow it with `pvm view show {name}`)")
        )
    return 0


def wait_initialized(api: Api, name: str, timeout: float, interval: float = 0.5) -> dict:
    """Poll the view's status with a progress display until its initial load is committed."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    deadline = time.monotonic() + timeout
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), transient=False
    ) as progress:
        task = progress.add_task(f"materializing {name}", total=None)
        while True:
            view = api.get(f"/v1/views/{name}")
            loading = f", {load_line(view['load'])}" if view.get("load") else ""
            progress.update(
                task,
                description=f"materializing {name}: {view['state']}{loading}, {view['updates_queued']} updates "
                f"queued, {view['units_running']} running",
            )
            if view["state"] != "initializing":
                progress.update(
                    task,
                    total=1,
                    completed=1,
                    description=f"{name}: {view['state']}, W = {view['watermark']}, {view['row_count']} rows",
                )
                return view
            if time.monotonic() > deadline:
                raise CliError(f"view {name} is still initializing after {timeout:.0f} s (see `pvm view show {name}`)")
            time.sleep(interval)


def load_line(load: dict) -> str:
    """A running initial load for a person.

    >>> load_line({"phase": "staging", "relations": 3, "relations_staged": 1, "rows_staged": 120000,
    ...            "percent": 33.3, "seconds": 4.2})
    'staging: 1 of 3 relations (33%), 120,000 rows, 4 s'
    >>> load_line({"phase": "staging", "relations": 3, "relations_staged": 1, "rows_staged": 120000,
    ...            "rows_expected": 300000, "percent": 40.0, "eta_seconds": 6.3, "seconds": 4.2})
    'staging: 1 of 3 relations, 120,000 of ~300,000 rows (40%), 4 s, about 6 s left'
    """
    expected = load.get("rows_expected")
    if expected is None:  # the sources sent no estimates (or an older manager)
        done = f"({load['percent']:.0f}%), {load['rows_staged']:,} rows"
    else:
        done = f"{load['rows_staged']:,} of ~{expected:,} rows ({load['percent']:.0f}%)"
    eta = load.get("eta_seconds")
    left = "" if eta is None else f", about {eta:.0f} s left"
    return (
        f"{load['phase']}: {load['relations_staged']} of {load['relations']} relations"
        + ("" if expected is None else ",")
        + f" {done}, {load['seconds']:.0f} s{left}"
    )


def _trouble(view: dict) -> list[tuple[str, str]]:
    """Lines for a view retrying a transient fault or stalled (absent from older managers)."""
    lines = []
    if load := view.get("load"):
        lines.append(("loading", load_line(load)))
    if retry := view.get("retrying"):
        lines.append(("retrying", f"{retry['steps']} step(s), attempt {retry['attempts']}: {retry['error']}"))
    if view.get("stalled"):
        lines.append(("stalled", f"no progress for {view['no_progress_seconds']:.0f} s"))
    return lines


def _frontier(view: dict) -> list[tuple[str, str]]:
    """Per source, the seqs the view as of W shows it at (absent from older managers)."""
    frontier = view.get("frontier")
    if not frontier:
        return []
    shown = ", ".join(f"{s} {lo}" if lo == hi else f"{s} {lo}-{hi}" for s, (lo, hi) in sorted(frontier.items()))
    return [("sources as of W (seq)", shown)]


def _show(view: dict) -> None:
    c = view["counters"]
    print_fields(
        f"view {view['name']}",
        [
            (
                "state",
                view["state"]
                + (f": {view['error']}" if view.get("error") else "")
                + (" (paused)" if view["paused"] else ""),
            ),
            *_trouble(view),
            ("watermark W", view["watermark"]),
            *_frontier(view),
            ("rows", f"{view['row_count']} (as of {view['row_count_as_of']})"),
            (
                "updates pending",
                f"{view['updates_pending']} ({view['updates_queued']} queued, {view['units_running']} of {view['parallelism']} PPU slots busy)",
            ),
            ("lag", f"{view['lag_updates']} updates, {view['lag_seconds']:.2f} s"),
            ("updates received", c["updates_received"]),
            ("units maintained / committed", f"{c['units_maintained']} / {c['units_committed']}"),
            ("subqueries / compensations", f"{c['subqueries']} / {c['compensations']}"),
            ("commit groups / peak PPU", f"{c['commit_groups']} / {c['peak_running']}"),
            ("options", f"parallelism {view['parallelism']}, batch size {view['batch_size']}, {view['commit_mode']}"),
            ("sql", view["sql"]),
        ],
    )
