"""``pvm query "SELECT …"``: a read-only SQL query over the views (POST /v1/query)."""

from __future__ import annotations

import argparse
import sys

from pvm.cli import CliError
from pvm.client import Api, connection_options, print_json, print_table


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sql",
        help='one SELECT over views, e.g. "SELECT region, COUNT(*) FROM order_details GROUP BY region"; - reads stdin',
    )
    parser.add_argument("--limit", type=int, default=None, help="at most this many rows")
    connection_options(parser)


def run(args: argparse.Namespace) -> int:
    sql = sys.stdin.read() if args.sql == "-" else args.sql
    if not sql.strip():
        raise CliError("the query is empty")
    body = {"sql": sql}
    if args.limit is not None:
        body["limit"] = args.limit
    with Api(args) as api:
        try:
            answer = api.post("/v1/query", body)
        except CliError as exc:
            if str(exc) == "Not Found":
                raise CliError(f"the manager at {api.base} has no query endpoint (POST /v1/query)") from exc
            raise
    if args.json or not isinstance(answer, dict) or "rows" not in answer:
        print_json(answer)
        return 0
    columns = answer.get("columns") or [f"c{i}" for i in range(len(answer["rows"][0]) if answer["rows"] else 0)]
    rows = [r if isinstance(r, list) else [r.get(c) for c in columns] for r in answer["rows"]]
    print_table(None, columns, rows, empty="(no rows)")
    return 0
