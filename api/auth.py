"""Bearer tokens and roles of the manager's API (DESIGN.md, Security).

Three roles, each with its own tokens:

* ``admin``: everything (sources, views, tokens, and whatever the other roles may do);
* ``analyst``: read-only: list and show sources and views, read rows, run read-only queries;
* ``wrapper``: bound to one source S: may only post updates of S (``POST /v1/updates``).

A token reads ``pvm_<id>_<secret>``: the id finds its row in the catalog, whose ``hash`` is a
salted PBKDF2-SHA256 of the secret; the secret is shown once, when the token is created
(``pvm token create`` or ``POST /v1/tokens``), and never stored. Revoking a token keeps its
row. A missing, malformed, unknown or revoked token is answered with 401 and a
``WWW-Authenticate: Bearer`` header; a valid token of a role that may not do what it asks,
with 403. Health, readiness, ``/metrics`` and the API docs need no token.

Verified tokens are remembered for ``TokenVerifier.ttl`` seconds (a PBKDF2 hash costs tens
of milliseconds, and wrappers post often): a token revoked through the API stops working at
once, one revoked directly in the catalog (``pvm token revoke --data-dir``) within that time.

The manager's requests to a wrapper carry another secret, the wrapper's ``--manager-token``
(``PVM_MANAGER_TOKEN``), given to the manager when the source is registered (see
``api/wrapper_app.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

ROLES = ("admin", "analyst", "wrapper")
PBKDF2_ITERATIONS = 100_000
_TOKEN = re.compile(r"^pvm_([0-9]{1,18})_([A-Za-z0-9_-]{20,200})$")

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="A token created with `pvm token create --role admin|analyst|wrapper`; "
    "send it as `Authorization: Bearer pvm_<id>_<secret>`.",
)


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: the role of its token and, for a wrapper, its source."""

    role: str
    token_id: int | None = None
    source: str | None = None
    name: str = ""

    def describe(self) -> str:
        who = f"token {self.token_id}" if self.token_id is not None else "this token"
        return f"{who} ({self.role}{' of source ' + repr(self.source) if self.source else ''})"


# -- token strings and hashes ------------------------------------------------------------------
def new_secret() -> str:
    return secrets.token_urlsafe(32)


def format_token(token_id: int, secret: str) -> str:
    return f"pvm_{token_id}_{secret}"


def parse_token(token: str) -> tuple[int, str] | None:
    """``(id, secret)`` of a well-formed token, else None."""
    match = _TOKEN.match(token)
    return None if match is None else (int(match.group(1)), match.group(2))


def hash_secret(secret: str, iterations: int = PBKDF2_ITERATIONS) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", secret.encode(), salt, iterations)
    return f"pbkdf2_sha256${iterations}${salt.hex()}${digest.hex()}"


def check_secret(secret: str, stored: str) -> bool:
    try:
        scheme, iterations, salt, digest = stored.split("$")
        if scheme != "pbkdf2_sha256":
            return False
        got = hashlib.pbkdf2_hmac("sha256", secret.encode(), bytes.fromhex(salt), int(iterations))
    except ValueError:
        return False
    return hmac.compare_digest(got.hex(), digest)


def check_role(role: str, source: str | None) -> None:
    """Raise ValueError with a message unless ``role`` (and its source) make a valid token."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; the roles are {', '.join(ROLES)}")
    if role == "wrapper" and not source:
        raise ValueError("a wrapper token is bound to one source: give the source")
    if role != "wrapper" and source:
        raise ValueError(f"only wrapper tokens are bound to a source, not {role} tokens")


# -- issuing (on the catalog directly, or through a running manager) -----------------------------
def issue_token(catalog: Any, role: str, source: str | None = None, name: str = "") -> tuple[Any, str]:
    """Create a token in ``catalog`` (a ``warehouse.catalog.db.Catalog``); returns its row and
    the token string, which is shown once and cannot be recovered."""
    check_role(role, source)
    secret = new_secret()
    info = catalog.add_token(role, source, name or _default_name(role, source), hash_secret(secret))
    return info, format_token(info.id, secret)


async def issue(manager: Any, role: str, source: str | None = None, name: str = "") -> tuple[Any, str]:
    """``issue_token`` through a started ``Manager`` (on its catalog thread)."""
    check_role(role, source)
    secret = new_secret()
    hashed = await asyncio.to_thread(hash_secret, secret)
    info = await manager.db("add_token", role, source, name or _default_name(role, source), hashed)
    return info, format_token(info.id, secret)


def ensure_admin_token(catalog: Any) -> str | None:
    """Create an admin token if the catalog has no usable one; the new token, else None."""
    if any(t.role == "admin" and t.revoked_at is None for t in catalog.tokens()):
        return None
    return issue_token(catalog, "admin", name="first admin (created by pvm serve)")[1]


def _default_name(role: str, source: str | None) -> str:
    return f"wrapper of {source}" if role == "wrapper" else role


# -- verifying ------------------------------------------------------------------------------------
class TokenVerifier:
    """Resolves bearer tokens to principals through ``lookup(id)`` (a catalog read), keeping
    each answer for ``ttl`` seconds."""

    def __init__(self, lookup: Callable[[int], Awaitable[Any]], ttl: float = 10.0, max_entries: int = 10_000) -> None:
        self._lookup = lookup
        self.ttl = ttl
        self._max = max_entries
        self._cache: dict[str, tuple[float, Principal | None]] = {}

    async def verify(self, token: str) -> Principal | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        principal = await self._resolve(token)
        if len(self._cache) >= self._max:
            self._cache.clear()
        self._cache[key] = (now + self.ttl, principal)
        return principal

    async def _resolve(self, token: str) -> Principal | None:
        parsed = parse_token(token)
        if parsed is None:
            return None
        token_id, secret = parsed
        info = await self._lookup(token_id)
        if info is None or info.revoked_at is not None:
            return None
        if not await asyncio.to_thread(check_secret, secret, info.hash):
            return None
        return Principal(info.role, info.id, info.source, info.name)

    def forget(self, token_id: int) -> None:
        """Drop what is remembered about a token (after it was revoked)."""
        self._cache = {k: v for k, v in self._cache.items() if v[1] is None or v[1].token_id != token_id}


# -- FastAPI dependencies ------------------------------------------------------------------------------
def _unauthorized(message: str, error: str | None = None) -> HTTPException:
    challenge = 'Bearer realm="pvm"' + (f', error="{error}"' if error else "")
    return HTTPException(status_code=401, detail=message, headers={"WWW-Authenticate": challenge})


async def authenticate(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Security(bearer)
) -> Principal:
    """The principal of a request's bearer token (401 without a valid one)."""
    verifier: TokenVerifier = request.app.state.auth
    if credentials is None:
        if request.headers.get("authorization"):
            raise _unauthorized("the Authorization header must read 'Bearer <token>'", "invalid_request")
        raise _unauthorized(
            "this endpoint needs a bearer token (Authorization: Bearer <token>); "
            "create one with `pvm token create --role …`"
        )
    principal = await verifier.verify(credentials.credentials)
    if principal is None:
        raise _unauthorized("the bearer token is unknown, malformed or revoked", "invalid_token")
    request.state.principal = principal
    return principal


def require_role(*roles: str) -> Callable[..., Awaitable[Principal]]:
    """A dependency admitting tokens of ``roles`` (and of ``admin``, which may do anything).

    Use it on a route or a router: ``dependencies=[Depends(require_role("analyst"))]``.
    """
    for role in roles:
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
    allowed = tuple(dict.fromkeys(("admin", *roles)))

    async def dependency(request: Request, principal: Principal = Depends(authenticate)) -> Principal:
        if principal.role not in allowed:
            raise HTTPException(
                status_code=403,
                detail=f"{principal.describe()} may not {request.method} {request.url.path}: "
                f"that needs the {' or '.join(allowed)} role",
            )
        return principal

    dependency.__name__ = f"require_{'_or_'.join(allowed)}"
    return dependency


def require_source(principal: Principal, source: str) -> None:
    """403 unless ``principal`` may post updates of ``source``."""
    if principal.role == "wrapper" and principal.source != source:
        raise HTTPException(
            status_code=403,
            detail=f"{principal.describe()} cannot post updates for source {source!r}: "
            f"it may post only for source {principal.source!r}",
        )


__all__ = [
    "ROLES", "Principal", "TokenVerifier", "authenticate", "bearer", "check_role", "check_secret",
    "ensure_admin_token", "format_token", "hash_secret", "issue", "issue_token", "parse_token",
    "require_role", "require_source",
]
