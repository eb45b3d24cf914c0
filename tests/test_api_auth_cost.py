"""Authentication cannot be used for denial of service (api/auth.py): a failed verification
costs microseconds whatever the id, nothing tells known ids from unknown ones, failures are
throttled per client address with 429 and Retry-After, revocation stays immediate, and hashes
written by earlier versions (PBKDF2) still work and are replaced on first use."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Callable

import httpx
import pytest

from api import auth
from api.auth import AttemptThrottle, TokenVerifier, format_token, hash_secret, issue_token, parse_token
from tests.api_support import LiveManager, api_env
from warehouse.catalog.db import Catalog


@pytest.fixture
async def env(tmp_path):
    async with api_env(tmp_path) as e:
        yield e


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def client_from(env, address: str) -> httpx.AsyncClient:
    """A client of ``env``'s app whose requests come from ``address``."""
    transport = httpx.ASGITransport(app=env.app, client=(address, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://pvm.test")


def wrong_secret(token: str) -> str:
    token_id, _ = parse_token(token)
    return format_token(token_id, secrets.token_urlsafe(32))


def pbkdf2_hash(secret: str, iterations: int = 100_000) -> str:
    """A hash as versions before the HMAC scheme stored them."""
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", secret.encode(), salt, iterations)
    return f"pbkdf2_sha256${iterations}${salt.hex()}${digest.hex()}"


async def test_a_failed_verification_costs_about_as_much_as_a_valid_one(env):
    env.app.state.auth.throttle = AttemptThrottle(rate=1e9, burst=10**9)  # cost alone, not throttling
    c, analyst = env.client, env.tokens["analyst"]
    assert (await c.get("/v1/sources", headers=bearer(analyst))).status_code == 200

    async def mean_seconds(token: Callable[[], str], status: int, n: int = 100) -> float:
        started = time.perf_counter()
        for _ in range(n):
            assert (await c.get("/v1/sources", headers=bearer(token()))).status_code == status
        return (time.perf_counter() - started) / n

    valid = await mean_seconds(lambda: analyst, 200)
    failed = await mean_seconds(lambda: wrong_secret(analyst), 401)  # a new guess every time
    print(f"valid token {valid * 1e3:.2f} ms, wrong secret of a known id {failed * 1e3:.2f} ms per request")
    # A PBKDF2 check alone took ~64 ms; now a refused request is no dearer than an admitted one.
    assert failed < 0.01 and failed < 3 * valid + 0.002


async def test_known_and_unknown_ids_take_the_same_path(env, monkeypatch):
    c, analyst = env.client, env.tokens["analyst"]
    with env.manager.catalog.engine.begin() as conn:  # a row far above the others: ids between are unknown
        conn.exec_driver_sql(
            "INSERT INTO tokens (id, role, source, name, hash, created_at) VALUES (100, 'analyst', NULL, 'far', ?, 0)",
            (hash_secret(secrets.token_urlsafe(32)),),
        )
    made = (await c.post("/v1/tokens", json={"role": "analyst"}, headers=env.auth("admin"))).json()  # reads the table
    assert (await c.delete(f"/v1/tokens/{made['id']}", headers=env.auth("admin"))).status_code == 200

    macs: list[bytes] = []
    reads: list[int] = []
    real_mac, real_load = auth._mac, env.app.state.auth._load
    monkeypatch.setattr(auth, "_mac", lambda salt, secret: macs.append(salt) or real_mac(salt, secret))
    monkeypatch.setattr(env.app.state.auth, "_load", lambda after: reads.append(after) or real_load(after))
    attempts = {
        "known id, wrong secret": wrong_secret(analyst),
        "unknown id": format_token(50, secrets.token_urlsafe(32)),
        "revoked token": made["token"],
    }
    for what, token in attempts.items():
        macs.clear()
        r = await c.get("/v1/sources", headers=bearer(token))
        assert r.status_code == 401, what
        assert r.json()["detail"] == "the bearer token is unknown, malformed or revoked", what
        assert len(macs) == 1, (what, "one HMAC, with the row's salt or a dummy one")
    assert reads == [], "no catalog read for any of them"


async def test_failed_attempts_are_throttled_per_address(env):
    good, bad = env.auth("wrapper_a"), bearer(wrong_secret(env.tokens["wrapper_a"]))
    async with client_from(env, "203.0.113.5") as attacker, client_from(env, "198.51.100.9") as other:
        statuses = [(await attacker.get("/v1/sources", headers=bad)).status_code for _ in range(10)]
        assert statuses == [401] * 10  # a burst of 10
        for _ in range(50):  # past it, 10 a second: a slow machine may drain one or two meanwhile
            r = await attacker.get("/v1/sources", headers=bad)
            if r.status_code == 429:
                break
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert "too many failed authentication attempts" in r.json()["detail"]
        # a malformed token counts as a failure too, and is refused the same way
        assert (await attacker.get("/v1/sources", headers=bearer("pvm_x"))).status_code == 429
        # a valid token from the same address still works; another address is not throttled
        assert (await attacker.get("/v1/sources", headers=env.auth("analyst"))).status_code == 200
        assert (
            await attacker.post("/v1/updates", json={"source": "a", "updates": []}, headers=good)
        ).status_code == 200
        assert (await other.get("/v1/sources", headers=bad)).status_code == 401
        await asyncio.sleep(0.15)  # 10 failures a second drain
        assert (await attacker.get("/v1/sources", headers=bad)).status_code == 401


def test_throttling_over_real_http(tmp_path):
    with LiveManager(tmp_path) as live:
        bad = bearer(wrong_secret(live.tokens["analyst"]))
        with httpx.Client(base_url=live.url) as c:
            statuses = [c.get("/v1/views", headers=bad).status_code for _ in range(40)]
            assert statuses[:10] == [401] * 10 and 429 in statuses[10:]
            refused = c.get("/v1/views", headers=bad)
            assert refused.status_code == 429 and refused.headers["retry-after"].isdigit()
            assert c.get("/v1/views", headers=live.auth("analyst")).status_code == 200


def test_the_throttle_table_never_grows():
    throttle = AttemptThrottle(rate=10.0, burst=10, slots=64)
    slots = list(throttle._slots)
    for i in range(20_000):
        throttle.failed(f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}")
        throttle.failed(f"2001:db8:{i:x}::1")
    assert throttle._slots == slots and len(throttle._slots) == 64
    # one IPv6 client with many addresses in its /64 fills one slot
    many = AttemptThrottle(rate=10.0, burst=10)
    waits = [many.failed(f"2001:db8:1:2::{i:x}") for i in range(11)]
    assert waits[:10] == [0.0] * 10 and waits[10] > 0


async def test_revocation_stays_immediate(env):
    c, admin = env.client, env.auth("admin")
    made = (await c.post("/v1/tokens", json={"role": "analyst"}, headers=admin)).json()
    assert (await c.get("/v1/views", headers=bearer(made["token"]))).status_code == 200  # works at once
    assert (await c.delete(f"/v1/tokens/{made['id']}", headers=admin)).status_code == 200
    assert (await c.get("/v1/views", headers=bearer(made["token"]))).status_code == 401  # and stops at once

    # revoked directly in the catalog (pvm token revoke --data-dir): within the verifier's ttl
    env.app.state.auth.ttl = 0.2
    await env.manager.db(Catalog.revoke_token, parse_token(env.tokens["analyst"])[0])
    deadline = time.monotonic() + 5
    while (await c.get("/v1/views", headers=env.auth("analyst"))).status_code == 200:
        assert time.monotonic() < deadline, "a revocation in the catalog was never noticed"
        await asyncio.sleep(0.05)
    assert (await c.get("/v1/views", headers=admin)).status_code == 200


async def test_a_token_made_directly_in_the_catalog_works_at_once(env):
    from warehouse.catalog.db import Catalog

    assert (await c_get(env, env.auth("admin"))).status_code == 200  # the verifier has read the table
    catalog = Catalog(env.manager.catalog_url)  # as `pvm token create --data-dir` does, beside the manager
    try:
        _, token = issue_token(catalog, "analyst")
    finally:
        catalog.close()
    assert (await c_get(env, bearer(token))).status_code == 200


async def c_get(env, headers: dict[str, str]) -> httpx.Response:
    return await env.client.get("/v1/views", headers=headers)


async def test_a_read_begun_before_a_revocation_does_not_undo_it():
    from warehouse.catalog.db import TokenInfo

    row = TokenInfo(1, "analyst", None, "a", 0.0, None, hash_secret("s" * 43))
    release = asyncio.Event()

    async def load(after_id: int) -> list:
        await release.wait()
        return [row] if after_id < 1 else []

    async def store_hash(*_: object) -> None:
        raise AssertionError("no hash to replace")

    verifier = TokenVerifier(load, store_hash, ttl=0.0)
    release.set()
    assert await verifier.verify(format_token(1, "s" * 43), "192.0.2.1") is not None
    release.clear()
    assert await verifier.verify(format_token(1, "s" * 43), "192.0.2.1") is not None  # stale: a reload starts
    verifier.remember(TokenInfo(1, "analyst", None, "a", 0.0, 5.0, row.hash))  # revoked through the API
    release.set()
    await asyncio.sleep(0.01)  # the reload returns the row as it was before the revocation
    assert await verifier.verify(format_token(1, "s" * 43), "192.0.2.1") is None


async def test_hashes_of_earlier_versions_work_once_slowly_then_fast(env, monkeypatch):
    secret = secrets.token_urlsafe(32)
    info = await env.manager.db(Catalog.add_token, "analyst", None, "from an earlier version", pbkdf2_hash(secret))
    token = format_token(info.id, secret)
    c = env.client
    assert (await c.get("/v1/views", headers=bearer(token))).status_code == 200
    stored = (await env.manager.db(Catalog.token, info.id)).hash
    assert stored.startswith("hmac_sha256$") and auth.check_secret(secret, stored)

    def no_pbkdf2(*_: object) -> bool:
        raise AssertionError("PBKDF2 ran again after the hash was replaced")

    monkeypatch.setattr(auth, "check_legacy", no_pbkdf2)
    assert (await c.get("/v1/views", headers=bearer(token))).status_code == 200


async def test_old_hashes_are_checked_at_a_bounded_rate(env):
    env.app.state.auth.throttle = AttemptThrottle(rate=1e9, burst=10**9)  # many clients, as it were
    secret = secrets.token_urlsafe(32)
    info = await env.manager.db(Catalog.add_token, "analyst", None, "old", pbkdf2_hash(secret))
    guess = bearer(format_token(info.id, secrets.token_urlsafe(32)))
    started = time.perf_counter()
    statuses = [(await env.client.get("/v1/views", headers=guess)).status_code for _ in range(20)]
    elapsed = time.perf_counter() - started
    assert statuses.count(401) <= 4 and statuses.count(429) >= 16, statuses  # two a second, in a burst of two
    assert elapsed < 2.0, f"20 guesses took {elapsed:.1f} s: PBKDF2 ran for each"
    r = await env.client.get("/v1/views", headers=guess)
    assert r.status_code == 429 and "earlier version" in r.json()["detail"] and r.headers["retry-after"].isdigit()
