"""The administrator's and analyst's commands (``pvm token|source|view|query``): each talks to
the manager's HTTP API (``--manager`` / ``PVM_MANAGER``) with a bearer token (``--token`` /
``PVM_TOKEN``), prints listings as tables (``--json`` for scripts) and API errors as
``pvm: error: <the API's message>``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from pvm.cli import CliError
from pvm.secret_options import SecretOption

DEFAULT_MANAGER = "http://127.0.0.1:8000"
MANAGER_ENV = "PVM_MANAGER"
TOKEN_ENV = "PVM_TOKEN"
API_TOKEN = SecretOption("--token", TOKEN_ENV, "bearer token")


def connection_options(parser: argparse.ArgumentParser) -> None:
    """``--manager``, ``--token`` (``--token-file``), ``--timeout`` and ``--json`` on a (sub)command."""
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--manager",
        default=os.environ.get(MANAGER_ENV, DEFAULT_MANAGER),
        help=f"the manager's URL (default: ${MANAGER_ENV} or {DEFAULT_MANAGER})",
    )
    API_TOKEN.add_to(group)
    group.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for an answer (default: 60)")
    parser.add_argument("--json", action="store_true", help="print the API's JSON answer instead of a table")


class Api:
    """A small synchronous client of the manager's API; errors become ``CliError``."""

    def __init__(self, args: argparse.Namespace) -> None:
        import httpx

        token = API_TOKEN.value(args)
        self.base = args.manager.rstrip("/")
        self.has_token = bool(token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.base, headers=headers, timeout=args.timeout)

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise CliError(
                f"cannot reach the manager at {self.base} ({exc}); start it with `pvm serve` or set --manager / ${MANAGER_ENV}"
            ) from exc
        if response.status_code >= 400:
            raise CliError(self._message(response))
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.text

    def _message(self, response) -> str:
        try:
            detail = response.json().get("detail")
        except (ValueError, AttributeError):
            detail = None
        message = str(detail) if detail else f"HTTP {response.status_code}: {response.text[:300]}"
        if response.status_code == 401 and not self.has_token:
            message = f"no token given: use --token-file FILE or set ${TOKEN_ENV} (the first admin token: `pvm token create --role admin --data-dir DIR` on the manager's machine)"
        return message

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.call("GET", path, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        return self.call("POST", path, json=body, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.call("DELETE", path, **kwargs)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def print_table(
    title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], empty: str = "(none)"
) -> None:
    from rich.console import Console
    from rich.table import Table

    rows = list(rows)
    console = Console()
    if not rows:
        console.print(f"{title + ': ' if title else ''}{empty}", highlight=False)
        return
    if title:
        console.print(title, style="bold", highlight=False, soft_wrap=True)
    table = Table()
    for i, c in enumerate(columns):
        table.add_column(c, overflow="fold", no_wrap=i == 0)
    for r in rows:
        table.add_row(*("" if v is None else str(v) for v in r))
    console.print(table)


def print_fields(title: str, fields: Iterable[tuple[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in fields:
        table.add_row(k, "" if v is None else str(v))
    Console().print(table)


def done(message: str) -> None:
    print(message, file=sys.stderr)


def comma_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise CliError("the list names nothing")
    return items
