"""Roles and tokens of the manager's API (docs/api.md, Roles and tokens): who may do what, how a
refusal reads, and the life of a token (created once, stored hashed, revoked at once)."""

from __future__ import annotations

import pytest

from api.auth import check_secret, parse_token
from tests.api_support import VIEW, api_env
from warehouse.catalog.db import Catalog

UPDATE_A = {
    "source": "a",
    "updates": [{"seq": 1, "changes": [{"relation": "R", "sign": 1, "row": {"k": 1, "v": "x"}}]}],
}


@pytest.fixture
async def env(tmp_path):
    async with api_env(tmp_path) as e:
        yield e


async def test_each_role_may_do_its_part_only(env):
    c = env.client
    assert (await c.post("/v1/views", json={"sql": VIEW, "name": "v"}, headers=env.auth("admin"))).status_code == 201
    reads = [
        ("GET", "/v1/views"),
        ("GET", "/v1/views/v"),
        ("GET", "/v1/views/v/rows"),
        ("GET", "/v1/sources"),
        ("GET", "/v1/sources/a"),
    ]
    for method, path in reads:
        assert (await c.request(method, path, headers=env.auth("analyst"))).status_code == 200, path
        refused = await c.request(method, path, headers=env.auth("wrapper_a"))
        assert refused.status_code == 403 and "wrapper" in refused.json()["detail"], path

    writes = [
        ("POST", "/v1/views", {"sql": VIEW, "name": "w"}),
        ("DELETE", "/v1/views/v", None),
        ("POST", "/v1/views/v/pause", None),
        ("POST", "/v1/sources", {"name": "c", "wrapper_url": "http://127.0.0.1:9"}),
        ("POST", "/v1/tokens", {"role": "admin"}),
        ("GET", "/v1/tokens", None),
    ]
    for method, path, body in writes:
        for who in ("analyst", "wrapper_a"):
            r = await c.request(method, path, json=body, headers=env.auth(who))
            assert r.status_code == 403, (who, path)
            assert "needs the admin role" in r.json()["detail"]
    assert "v" in env.manager.views  # nothing refused had an effect

    # a wrapper posts for its own source only; the refusal names both sources
    assert (await c.post("/v1/updates", json=UPDATE_A, headers=env.auth("wrapper_a"))).json()["through"] == 1
    r = await c.post("/v1/updates", json={**UPDATE_A, "source": "b"}, headers=env.auth("wrapper_a"))
    assert r.status_code == 403 and "'b'" in r.json()["detail"] and "'a'" in r.json()["detail"]
    assert env.manager.receiver.released_through("b") == 0


async def test_missing_or_bad_tokens_are_401_with_a_challenge(env):
    c = env.client
    for headers in (
        {},
        {"Authorization": "Bearer nope"},
        {"Authorization": "Basic dXNlcjpwdw=="},
        {"Authorization": "Bearer pvm_1_" + "x" * 43},
    ):
        r = await c.get("/v1/views", headers=headers)
        assert r.status_code == 401, headers
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert isinstance(r.json()["detail"], str) and r.json()["detail"]
    for path in ("/v1/health", "/v1/ready", "/metrics", "/openapi.json", "/docs"):
        assert (await c.get(path)).status_code == 200, path


async def test_token_created_once_stored_hashed_and_revoked_at_once(env):
    c = env.client
    r = await c.post("/v1/tokens", json={"role": "analyst", "name": "bi"}, headers=env.auth("admin"))
    assert r.status_code == 201
    created = r.json()
    token = created["token"]
    token_id, secret = parse_token(token)
    assert token_id == created["id"]
    stored = await env.manager.db(Catalog.token, token_id)
    assert (
        secret not in stored.hash and check_secret(secret, stored.hash) and not check_secret(secret + "x", stored.hash)
    )

    bearer = {"Authorization": f"Bearer {token}"}
    assert (await c.get("/v1/views", headers=bearer)).status_code == 200
    listed = (await c.get("/v1/tokens", headers=env.auth("admin"))).json()
    assert {"id": token_id, "role": "analyst", "name": "bi"}.items() <= next(
        t for t in listed if t["id"] == token_id
    ).items()
    assert all("token" not in t and "hash" not in t for t in listed)

    revoked = await c.delete(f"/v1/tokens/{token_id}", headers=env.auth("admin"))
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert (await c.get("/v1/views", headers=bearer)).status_code == 401

    r = await c.post("/v1/tokens", json={"role": "wrapper"}, headers=env.auth("admin"))
    assert r.status_code == 422 and "source" in r.json()["detail"]
    r = await c.post("/v1/tokens", json={"role": "analyst", "source": "a"}, headers=env.auth("admin"))
    assert r.status_code == 422
    r = await c.delete("/v1/tokens/999", headers=env.auth("admin"))
    assert r.status_code == 404 and "999" in r.json()["detail"]


def _schema_of(spec: dict, schema: dict) -> dict:
    """The component a body or response schema refers to (directly, as list items, or as
    the non-null member of an optional body), else the schema itself."""
    for candidate in (schema, schema.get("items", {}), *schema.get("anyOf", ())):
        if "$ref" in candidate:
            return spec["components"]["schemas"][candidate["$ref"].rsplit("/", 1)[1]]
    return schema


def _has_example(spec: dict, media: dict) -> bool:
    return "example" in media or "examples" in media or "examples" in _schema_of(spec, media.get("schema", {}))


async def test_every_operation_is_documented_with_an_example(env):
    spec = env.app.openapi()
    assert spec["components"]["securitySchemes"]["token"]["scheme"] == "bearer"
    seen = set()
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            where = f"{method.upper()} {path}"
            seen.add(where)
            assert op.get("summary") and op.get("description"), where
            body = op.get("requestBody")
            if body is not None:  # what to send
                assert _has_example(spec, next(iter(body["content"].values()))), (where, "request body")
            ok = next(v for k, v in op["responses"].items() if k.startswith("2"))
            content = ok.get("content")
            if content is not None:  # else 204: no body
                assert _has_example(spec, next(iter(content.values()))), where
            for code, response in op["responses"].items():
                if (code.startswith("4") and code != "422") or code.startswith("5"):
                    assert "example" in next(iter(response["content"].values())), (where, code)
            if path.startswith("/v1/") and path not in ("/v1/health", "/v1/ready"):
                assert {"401", "403"} <= set(op["responses"]), (where, "token refusals")
    # the analyst routes are covered too, their bodies' examples declared on the models; each
    # example is a request the route accepts (it gets past validation to the handler: no view
    # store for queries, no such view to verify)
    assert {"POST /v1/query", "POST /v1/views/{name}/verify"} <= seen
    analyst_bodies = [
        ("/v1/query", "/v1/query", "QueryIn", 501),
        ("/v1/views/{name}/verify", "/v1/views/nope/verify", "VerifyIn", 404),
    ]
    for documented, posted, model, status in analyst_bodies:
        media = spec["paths"][documented]["post"]["requestBody"]["content"]["application/json"]
        schema = _schema_of(spec, media["schema"])
        assert schema is spec["components"]["schemas"][model] and schema["examples"], documented
        for example in schema["examples"]:
            r = await env.client.post(posted, json=example, headers=env.auth("analyst"))
            assert r.status_code == status, (posted, example, r.text)
    assert spec["components"]["schemas"]["VerifyIn"]["examples"] == [{"max_differences": 20}]
    # and the document served is the one checked
    served = (await env.client.get("/openapi.json")).json()
    assert served["components"]["schemas"]["QueryIn"] == spec["components"]["schemas"]["QueryIn"]
    assert (
        served["paths"]["/v1/views/{name}/verify"]["post"]["requestBody"]
        == spec["paths"]["/v1/views/{name}/verify"]["post"]["requestBody"]
    )
