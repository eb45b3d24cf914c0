"""``pvm verify VIEW``: recompute a view from its sources and compare it with the stored view.

The running manager does the work (``POST /v1/views/VIEW/verify``): it reads every relation
of the view as a snapshot through its wrapper and takes back the updates the view does not
reflect yet; its analysts' query process runs the view's SELECT in Spark SQL over the result
and compares it with the view as of its watermark. The manager runs at most
``pvm serve --max-verifications`` at once (a refused one exits 2 naming the limit). This command asks for it, shows the differences and exits 0 when
the view is right, 1 when it differs, 2 when it could not be verified.
"""

from __future__ import annotations

import argparse
import os

from pvm.cli import CliError
from pvm.client import API_TOKEN


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("view", metavar="VIEW", help="the view to verify")
    parser.add_argument(
        "--manager",
        default=os.environ.get("PVM_MANAGER", "http://127.0.0.1:8000"),
        help="the manager's URL (default: $PVM_MANAGER or http://127.0.0.1:8000)",
    )
    API_TOKEN.add_to(parser)
    parser.add_argument(
        "--max-differences", type=int, default=20, help="rows listed at most, of each kind (default: 20)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the manager (default: 600)")
    parser.add_argument("--json", action="store_true", help="print the manager's report as JSON instead of tables")


def run(args: argparse.Namespace) -> int:
    import json

    import httpx
    from rich.console import Console

    if args.max_differences < 0:
        raise CliError("--max-differences must be >= 0")
    token = API_TOKEN.value(args)
    console = Console()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{args.manager.rstrip('/')}/v1/views/{args.view}/verify"
    try:
        with console.status(f"verifying {args.view}: snapshots of its sources, recomputation in Spark, comparison…"):
            response = httpx.post(
                url, json={"max_differences": args.max_differences}, headers=headers, timeout=args.timeout
            )
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach the manager at {args.manager}: {exc}") from exc
    if response.status_code >= 400:
        raise CliError(f"the manager refused to verify {args.view!r} ({response.status_code}): {_detail(response)}")
    report = response.json()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        show(console, report)
    return 0 if report["equal"] else 1


def show(console, report: dict) -> None:
    from rich.table import Table

    sources = Table(title=f"{report['view']} as of W = {report['watermark']}: the sources' state")
    for column in ("relation", "reflected through seq", "snapshot at seq", "updates taken back", "rows"):
        sources.add_column(column)
    for cut in report["sources"]:
        sources.add_row(
            f"{cut['source']}.{cut['relation']}",
            str(cut["upto"]),
            str(cut["snapshot_watermark"]),
            str(cut["subtracted_updates"]),
            str(cut["rows"]),
        )
    console.print(sources)
    for note in report.get("notes", []):
        console.print(f"[yellow]note[/yellow]: {note}")
    summary = (
        f"recomputed in {report['engine']}: {report['expected_rows']} rows; stored: {report['stored_rows']} rows "
        f"({report['seconds']:.1f} s)"
    )
    if report["equal"]:
        console.print(f"[green]verified[/green]: {report['view']} equals its recomputation; {summary}")
        return
    console.print(
        f"[red]MISMATCH[/red]: {report['missing_total']} row(s) missing from the view, "
        f"{report['extra_total']} extra; {summary}"
    )
    for kind, title in (("missing", "missing from the view"), ("extra", "in the view but not in the recomputation")):
        rows = report[kind]
        if not rows:
            continue
        total = report[f"{kind}_total"]
        table = Table(title=f"{title} ({len(rows)} of {total} shown)")
        table.add_column("count")
        for name in report["columns"]:
            table.add_column(name)
        for item in rows:
            table.add_row(str(item["count"]), *(repr(v) for v in item["row"]))
        console.print(table)


def _detail(response) -> str:
    try:
        return str(response.json().get("detail", response.text))
    except ValueError:
        return response.text[:500]
