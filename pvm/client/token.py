"""``pvm token create | list | revoke``: the bearer tokens of the roles (admin, analyst,
wrapper of one source).

Through a running manager with an admin token (``--manager``, ``--token``), or directly on the
catalog database with ``--data-dir DIR`` or ``--catalog URL``: that is how the first admin token
is made, on the manager's machine. ``create`` prints the token alone on stdout (it is shown
only then), so ``export PVM_TOKEN=$(pvm token create --role admin --data-dir var/pvm)`` works.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

from pvm.cli import CliError
from pvm.client import Api, connection_options, done, print_json, print_table
from pvm.serve import CATALOG_URL

ROLES = ("admin", "analyst", "wrapper")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = sub.add_parser(
        "create",
        help="create a token (printed once)",
        description="Create a bearer token; it is printed on stdout, once.",
    )
    create.add_argument(
        "--role",
        required=True,
        choices=ROLES,
        help="admin: everything; analyst: read views and query; wrapper: post one source's updates",
    )
    create.add_argument("--source", default=None, help="for --role wrapper: the source it may post for")
    create.add_argument("--name", default="", help="a label to recognize the token by")
    listing = sub.add_parser(
        "list", help="list tokens (never their secrets)", description="List every token, revoked ones included."
    )
    revoke = sub.add_parser("revoke", help="revoke a token", description="Revoke a token: it stops working.")
    revoke.add_argument("id", type=int, help="the token's id (see `pvm token list`; a token reads pvm_<id>_…)")
    for p in (create, listing, revoke):
        local = p.add_argument_group("directly on the catalog (no running manager needed)")
        local.add_argument("--data-dir", type=Path, default=None, help="the manager's data directory (its catalog.db)")
        local.add_argument(
            "--catalog", default=None, help="SQLAlchemy URL of the catalog database (or --catalog-file FILE)"
        )
        local.add_argument(
            "--catalog-file", type=Path, default=None, metavar="FILE", help="read --catalog from the first line of FILE"
        )
        connection_options(p)


def run(args: argparse.Namespace) -> int:
    if args.token_command == "create" and args.role == "wrapper" and not args.source:
        raise CliError("a wrapper token is bound to one source: give --source")
    if args.token_command == "create" and args.role != "wrapper" and args.source:
        raise CliError("--source is only for --role wrapper")
    # $PVM_CATALOG_URL (pvm serve's) does not count here: with it set, the commands would
    # silently bypass the API
    args.catalog = CATALOG_URL.value(args, environ={})
    if args.data_dir is not None or args.catalog is not None:
        return _on_catalog(args)
    with Api(args) as api:
        if args.token_command == "create":
            body = {"role": args.role, "source": args.source, "name": args.name or None}
            created = api.post("/v1/tokens", body)
            return _created(args, created, created["token"])
        if args.token_command == "list":
            return _list(args, api.get("/v1/tokens"))
        revoked = api.delete(f"/v1/tokens/{args.id}")
        return _revoked(args, revoked)


def _on_catalog(args: argparse.Namespace) -> int:
    from api.auth import issue_token
    from pvm.serve import catalog_url
    from warehouse.catalog.db import Catalog, CatalogError
    from warehouse.catalog.secrets import SealError, key_file_for

    if args.catalog is None and not (args.data_dir / "catalog.db").exists():
        if args.token_command != "create":
            raise CliError(f"no catalog in {args.data_dir} (the manager's --data-dir)")
        done(f"new catalog in {args.data_dir} (the manager's --data-dir)")
    url = catalog_url(args.data_dir, args.catalog)
    try:
        catalog = Catalog(url, key_file_for(url, args.data_dir))
    except SealError as exc:  # an older catalog whose manager tokens this version seals
        raise CliError(str(exc)) from exc
    try:
        if args.token_command == "create":
            info, token = issue_token(catalog, args.role, args.source, args.name)
            return _created(args, _row(info), token)
        if args.token_command == "list":
            return _list(args, [_row(t) for t in catalog.tokens()])
        try:
            return _revoked(args, _row(catalog.revoke_token(args.id)))
        except CatalogError as exc:
            raise CliError(str(exc)) from exc
    finally:
        catalog.close()


def _row(info) -> dict:
    return {k: getattr(info, k) for k in ("id", "role", "source", "name", "created_at", "revoked_at")}


def _created(args: argparse.Namespace, info: dict, token: str) -> int:
    if args.json:
        print_json({**info, "token": token})
        return 0
    print(token)
    bound = f" for source {info['source']}" if info.get("source") else ""
    done(
        f"created token {info['id']} ({info['role']}{bound}); it is shown only now. Use it with --token or PVM_TOKEN"
        + (" (a wrapper: --token or PVM_WRAPPER_TOKEN)." if info["role"] == "wrapper" else ".")
    )
    return 0


def _list(args: argparse.Namespace, tokens: list[dict]) -> int:
    if args.json:
        print_json(tokens)
        return 0
    print_table(
        "tokens",
        ["id", "role", "source", "name", "created", "revoked"],
        [(t["id"], t["role"], t["source"], t["name"], _when(t["created_at"]), _when(t["revoked_at"])) for t in tokens],
    )
    return 0


def _revoked(args: argparse.Namespace, info: dict) -> int:
    if args.json:
        print_json(info)
    else:
        done(f"token {info['id']} ({info['role']}) revoked")
    return 0


def _when(ts: float | None) -> str:
    return "" if ts is None else datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M")
