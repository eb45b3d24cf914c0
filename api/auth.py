"""Bearer tokens and roles of the manager's API (docs/api.md, Roles and tokens).

Three roles, each with its own tokens:

* ``admin``: everything (sources, views, tokens, and whatever the other roles may do);
* ``analyst``: read-only: list and show sources and views, read rows, run read-only queries;
* ``wrapper``: bound to one source S: may only post updates of S (``POST /v1/updates``).

A token reads ``pvm_<id>_<secret>``: the id finds its row in the catalog, whose ``hash`` is
``hmac_sha256$<salt>$<HMAC-SHA256(salt, secret)>`` with a random salt per token; the secret is
shown once, when the token is created (``pvm token create`` or ``POST /v1/tokens``), and never
stored. Revoking a token keeps its row. A missing, malformed, unknown or revoked token is
answered with 401 and a ``WWW-Authenticate: Bearer`` header; a valid token of a role that may
not do what it asks, with 403. Health, readiness, ``/metrics`` and the API docs need no token.

Verification cannot be used for denial of service:

* **A fast hash.** Secrets are 256-bit random values, not passwords: nobody can guess one, so a
  slow key-derivation function buys nothing and would let anyone with a made-up token burn tens
  of milliseconds of CPU per request. One HMAC costs about a microsecond, on the event loop.
* **No catalog read per request.** The verifier keeps the token table in memory (a row per
  token ever issued, revoked ones too: as many as the administrators made), reloaded in the
  background every ``ttl`` seconds; an id above every id it knows (a token made since) makes
  it read the newer rows, at most every ``fetch_interval`` seconds whoever asks. Unknown and
  known ids take the same path: the secret is compared with the row's hash, or with a dummy
  hash when there is no row, so neither the CPU spent nor the answer's timing tells which of
  the ids it knows exist (ids above them tell only that tokens are numbered in order).
* **Failed attempts are throttled** per client address (an IPv6 client by its /64):
  ``AttemptThrottle`` lets ``rate`` failures a second through (bursts of ``burst``); past that
  every failing attempt, and every one that would need work beyond the in-memory check (an id
  to look up, a legacy hash), is answered 429 with ``Retry-After``. A valid token from the
  same address still passes. The table of addresses has a fixed size: addresses share slots
  by a keyed hash, so it never grows with the number of clients. Behind a reverse proxy every
  client has the proxy's address: throttle at the proxy.
* **Hashes of earlier versions** (``pbkdf2_sha256$…``, 100,000 iterations) still work: such a
  token's first successful use stores its HMAC hash in place of the old one, so a valid token
  costs PBKDF2 once. Until then each check of an old hash costs PBKDF2, so those checks run
  on a thread of their own, only after the cheap checks passed (a known, unrevoked id from a
  client under its failure limit), and at most ``legacy_rate`` a second in the whole process
  (429 beyond that). Old hashes are recognisable by timing; new ones are not.

A token revoked or created through the API takes effect at once; one revoked directly in the
catalog (``pvm token revoke --data-dir``) within ``ttl`` seconds (10).

The manager's requests to a wrapper carry another secret, the wrapper's ``--manager-token``
(``PVM_MANAGER_TOKEN``), given to the manager when the source is registered (see
``api/wrapper_app.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from warehouse.catalog.db import Catalog

if TYPE_CHECKING:
    from warehouse.manager import Manager

log = logging.getLogger(__name__)

ROLES = ("admin", "analyst", "wrapper")
HASH_SCHEME = "hmac_sha256"
LEGACY_SCHEME = "pbkdf2_sha256"  # hashes written by earlier versions; upgraded on first use
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


def hash_secret(secret: str) -> str:
    """The stored form of a new secret: ``hmac_sha256$<salt>$<digest>``.

    >>> stored = hash_secret("s3cret-s3cret-s3cret")
    >>> stored.startswith("hmac_sha256$"), check_secret("s3cret-s3cret-s3cret", stored), check_secret("guess", stored)
    (True, True, False)
    """
    salt = secrets.token_bytes(16)
    return f"{HASH_SCHEME}${salt.hex()}${_mac(salt, secret).hex()}"


def _mac(salt: bytes, secret: str) -> bytes:
    return hmac.digest(salt, secret.encode(), "sha256")


def check_fast(secret: str, stored: str) -> bool:
    """Whether ``secret`` matches an ``hmac_sha256`` hash (False for any other form); about a
    microsecond, in constant time for a given length."""
    scheme, _, rest = stored.partition("$")
    salt, _, digest = rest.partition("$")
    try:
        expected = bytes.fromhex(digest)
        got = _mac(bytes.fromhex(salt), secret)
    except ValueError:
        return False
    return scheme == HASH_SCHEME and hmac.compare_digest(got, expected)


def check_legacy(secret: str, stored: str) -> bool:
    """Whether ``secret`` matches a ``pbkdf2_sha256$<iterations>$<salt>$<digest>`` hash of an
    earlier version: tens of milliseconds of CPU (see ``TokenVerifier``)."""
    try:
        scheme, iterations, salt, digest = stored.split("$")
        if scheme != LEGACY_SCHEME:
            return False
        got = hashlib.pbkdf2_hmac("sha256", secret.encode(), bytes.fromhex(salt), int(iterations))
    except ValueError:
        return False
    return hmac.compare_digest(got.hex(), digest)


def check_secret(secret: str, stored: str) -> bool:
    """Whether ``secret`` matches ``stored``, in either form."""
    return check_legacy(secret, stored) if is_legacy(stored) else check_fast(secret, stored)


def is_legacy(stored: str) -> bool:
    return stored.startswith(LEGACY_SCHEME + "$")


_DUMMY_HASH = hash_secret(secrets.token_urlsafe(32))  # what an unknown id's secret is compared with


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


async def issue(manager: Manager, role: str, source: str | None = None, name: str = "") -> tuple[Any, str]:
    """``issue_token`` through a started ``Manager`` (on its catalog thread)."""
    check_role(role, source)
    secret = new_secret()
    info = await manager.db(Catalog.add_token, role, source, name or _default_name(role, source), hash_secret(secret))
    return info, format_token(info.id, secret)


def ensure_admin_token(catalog: Any) -> str | None:
    """Create an admin token if the catalog has no usable one; the new token, else None."""
    if any(t.role == "admin" and t.revoked_at is None for t in catalog.tokens()):
        return None
    return issue_token(catalog, "admin", name="first admin (created by pvm serve)")[1]


def _default_name(role: str, source: str | None) -> str:
    return f"wrapper of {source}" if role == "wrapper" else role


# -- verifying ------------------------------------------------------------------------------------
class TooManyAttempts(Exception):
    """A client over its failure limit, or old hashes checked too often: answer 429."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Budget:
    """A leaky bucket: ``take()`` succeeds at most ``burst`` times at once and ``rate`` times
    a second on average.

    >>> clock = iter([0.0, 0.0, 0.0, 0.0, 0.5]).__next__  # made at 0; three takes at 0, one at 0.5
    >>> budget = Budget(rate=2.0, burst=2, clock=clock)
    >>> [budget.take(), budget.take(), budget.take(), budget.take()]
    [True, True, False, True]
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._level = 0.0  # takes not drained yet
        self._at = clock()

    def wait(self) -> float:
        """Seconds until the next ``take()`` can succeed (0: now)."""
        now = self._clock()
        self._level = max(0.0, self._level - (now - self._at) * self.rate)
        self._at = now
        return max(0.0, (self._level - self.burst + 1) / self.rate)

    def take(self) -> bool:
        if self.wait() > 0:
            return False
        self._level += 1
        return True


class AttemptThrottle:
    """Failed authentication attempts per client address, in a table of fixed size.

    Each address (an IPv6 one by its /64, which one client can fill with addresses) maps to
    one of ``slots`` leaky buckets by a hash keyed with a secret of this process, so nobody can
    aim at another client's slot, and the table never grows: many clients share a slot, and
    a slot is only ever full of failures.

    >>> throttle = AttemptThrottle(rate=10.0, burst=3)
    >>> [throttle.failed("192.0.2.7") for _ in range(4)][-1] > 0, throttle.retry_after("198.51.100.1")
    (True, 0.0)
    """

    def __init__(self, rate: float = 10.0, burst: int = 10, slots: int = 4096) -> None:
        self.rate = rate
        self.burst = burst
        self._key = secrets.token_bytes(16)
        self._slots = [Budget(rate, burst) for _ in range(slots)]

    def _slot(self, client: str) -> Budget:
        digest = hmac.digest(self._key, client_key(client).encode(), "sha256")
        return self._slots[int.from_bytes(digest[:8], "big") % len(self._slots)]

    def retry_after(self, client: str) -> float:
        """0 while ``client`` is under its limit, else the seconds until it is again."""
        return self._slot(client).wait()

    def failed(self, client: str) -> float:
        """Count a failed attempt of ``client``; the seconds to wait if that put it over."""
        slot = self._slot(client)
        if slot.take():
            return 0.0
        return slot.wait()


def client_key(host: str) -> str:
    """What failures are counted by: the address, or an IPv6 address's /64 network.

    >>> client_key("2001:db8::1") == client_key("2001:db8::ffff:2"), client_key("192.0.2.7")
    (True, '192.0.2.7')
    """
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


_LEGACY_CHECKS = ThreadPoolExecutor(1, thread_name_prefix="pvm-pbkdf2")  # never the loop nor the shared pool


class TokenVerifier:
    """Resolves bearer tokens to principals from an in-memory copy of the token table.

    ``load(after_id)`` reads the catalog's token rows with a larger id (all of them for 0);
    ``store_hash(id, old, new)`` replaces an old-scheme hash once its token was verified.
    See the module's docstring for what each step costs and why.
    """

    def __init__(
        self,
        load: Callable[[int], Awaitable[list[Any]]],
        store_hash: Callable[[int, str, str], Awaitable[Any]],
        *,
        ttl: float = 10.0,
        fetch_interval: float = 0.5,
        throttle: AttemptThrottle | None = None,
        legacy_rate: float = 2.0,
    ) -> None:
        self._load = load
        self._store_hash = store_hash
        self.ttl = ttl
        self.fetch_interval = fetch_interval
        self._fetched_at = -math.inf
        self.throttle = throttle or AttemptThrottle()
        self._legacy = Budget(legacy_rate, burst=max(1, int(legacy_rate)))
        self._tokens: dict[int, Any] = {}  # id -> TokenInfo
        self._max_id = 0
        self._loaded_at: float | None = None
        self._running: dict[str, asyncio.Future] = {}  # catalog reads under way, by kind

    async def verify(self, token: str, client: str) -> Principal | None:
        """The principal of a valid ``token``, None for an invalid one; TooManyAttempts when
        ``client`` is over its failure limit (or old hashes are checked too often)."""
        parsed = parse_token(token)
        if parsed is None:
            self.failed(client)
            return None
        token_id, secret = parsed
        info = await self._row(token_id, client)
        usable = info if info is not None and info.revoked_at is None else None  # None: unknown or revoked
        matches = check_fast(secret, usable.hash if usable is not None else _DUMMY_HASH)  # the same work for any id
        if usable is not None and is_legacy(usable.hash):
            matches = await self._check_legacy(secret, usable, client)
        if usable is None or not matches:
            self.failed(client)
            return None
        return Principal(usable.role, usable.id, usable.source, usable.name)

    def failed(self, client: str) -> None:
        """Count a failed attempt (None: the caller answers 401); TooManyAttempts past the limit."""
        wait = self.throttle.failed(client)
        if wait > 0:
            raise _too_many(wait)
        return None

    def remember(self, info: Any) -> None:
        """Take a token row just written through the API (created, revoked) into account now."""
        self._install([info])

    # -- the in-memory token table -----------------------------------------------------------------
    async def _row(self, token_id: int, client: str) -> Any | None:
        if self._loaded_at is None:
            await asyncio.shield(self._once("all", self._load_all))
        elif time.monotonic() - self._loaded_at > self.ttl:
            self._once("all", self._load_all)  # in the background: answers keep coming from the copy
        info = self._tokens.get(token_id)
        if info is None and token_id > self._max_id:  # a token made since the copy was read?
            self._refuse_if_throttled(client)
            if self._may_fetch():
                await asyncio.shield(self._once("newer", self._load_newer))
                info = self._tokens.get(token_id)
        return info

    def _may_fetch(self) -> bool:
        """Whether to read the tokens made since the copy was: join a read under way, else
        start one if ``fetch_interval`` has passed since the last (so requests with made-up
        ids cause at most a couple of catalog reads a second, however many clients send them)."""
        if "newer" in self._running:
            return True
        now = time.monotonic()
        if now - self._fetched_at < self.fetch_interval:
            return False
        self._fetched_at = now
        return True

    async def _load_all(self) -> None:
        started = time.monotonic()
        self._install(await self._load(0))
        self._loaded_at = started

    async def _load_newer(self) -> None:
        self._install(await self._load(self._max_id))

    def _once(self, name: str, work: Callable[[], Awaitable[None]]) -> asyncio.Future:
        """``work`` running, started unless it already is: one catalog read serves every
        request that arrives meanwhile."""
        task = self._running.get(name)
        if task is None:
            task = asyncio.ensure_future(work())
            self._running[name] = task
            task.add_done_callback(lambda done: self._finished(name, done))
        return task

    def _finished(self, name: str, task: asyncio.Future) -> None:
        self._running.pop(name, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not read the token table from the catalog: %s", task.exception())

    def _install(self, rows: list[Any]) -> None:
        """Take ``rows`` in; a catalog read begun before a revocation or a hash upgrade that
        was already taken in does not undo it (neither is ever reversed)."""
        for info in rows:
            known = self._tokens.get(info.id)
            if known is not None and known.revoked_at is not None and info.revoked_at is None:
                info = replace(info, revoked_at=known.revoked_at)
            if known is not None and is_legacy(info.hash) and not is_legacy(known.hash):
                info = replace(info, hash=known.hash)
            self._tokens[info.id] = info
            self._max_id = max(self._max_id, info.id)

    # -- hashes of earlier versions ------------------------------------------------------------------
    def _refuse_if_throttled(self, client: str) -> None:
        wait = self.throttle.retry_after(client)
        if wait > 0:
            raise _too_many(wait)

    async def _check_legacy(self, secret: str, info: Any, client: str) -> bool:
        self._refuse_if_throttled(client)
        if not self._legacy.take():
            raise TooManyAttempts(
                "this token's hash is of an earlier version and is checked at a limited rate until its first "
                "successful use; try again shortly",
                self._legacy.wait() or 1.0,
            )
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(_LEGACY_CHECKS, check_legacy, secret, info.hash):
            return False
        upgraded = hash_secret(secret)
        await self._store_hash(info.id, info.hash, upgraded)
        self._install([replace(info, hash=upgraded)])
        return True


def _too_many(wait: float) -> TooManyAttempts:
    return TooManyAttempts(
        f"too many failed authentication attempts from this address; try again in {math.ceil(wait)} s", wait
    )


def verifier_for(manager: Manager) -> TokenVerifier:
    """The token verifier of a manager's catalog: one per process, shared by the HTTP API and
    the Spark Connect gateway, so that a token created or revoked through either counts at
    once for both."""
    return TokenVerifier(
        lambda after_id: manager.db(Catalog.tokens, after_id),
        lambda *replaced: manager.db(Catalog.replace_token_hash, *replaced),
    )


# -- FastAPI dependencies ------------------------------------------------------------------------------
def _unauthorized(message: str, error: str | None = None) -> HTTPException:
    challenge = 'Bearer realm="pvm"' + (f', error="{error}"' if error else "")
    return HTTPException(status_code=401, detail=message, headers={"WWW-Authenticate": challenge})


async def authenticate(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Security(bearer)
) -> Principal:
    """The principal of a request's bearer token (401 without a valid one, 429 for a client
    over its failure limit)."""
    verifier: TokenVerifier = request.app.state.auth
    client = request.client.host if request.client is not None else ""
    try:
        if credentials is None:
            if request.headers.get("authorization"):
                verifier.failed(client)
                raise _unauthorized("the Authorization header must read 'Bearer <token>'", "invalid_request")
            raise _unauthorized(
                "this endpoint needs a bearer token (Authorization: Bearer <token>); "
                "create one with `pvm token create --role …`"
            )
        principal = await verifier.verify(credentials.credentials, client)
    except TooManyAttempts as exc:
        raise HTTPException(
            status_code=429, detail=str(exc), headers={"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
        ) from None
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
    "ROLES",
    "AttemptThrottle",
    "Budget",
    "Principal",
    "TokenVerifier",
    "TooManyAttempts",
    "authenticate",
    "bearer",
    "check_role",
    "check_secret",
    "client_key",
    "ensure_admin_token",
    "format_token",
    "hash_secret",
    "issue",
    "issue_token",
    "parse_token",
    "require_role",
    "require_source",
]
