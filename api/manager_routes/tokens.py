"""The manager's routes of bearer tokens: create, list and revoke them (administrators only)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Path

from api.auth import ROLES, Principal, check_role, issue
from api.manager_models import (
    TokenCreated,
    TokenIn,
    TokenOut,
)
from api.manager_routes.error_docs import AUTH, errors
from api.manager_routes.roles import ADMIN
from warehouse.catalog.db import Catalog, CatalogError
from warehouse.errors import Invalid, NotFound
from warehouse.manager import Manager


def router_for(manager: Manager, app: FastAPI) -> APIRouter:
    router = APIRouter(tags=["tokens"])

    def out(info: Any) -> TokenOut:
        return TokenOut(
            id=info.id,
            role=info.role,
            source=info.source,
            name=info.name,
            created_at=info.created_at,
            revoked_at=info.revoked_at,
        )

    @router.post(
        "/v1/tokens",
        status_code=201,
        response_model=TokenCreated,
        summary="Create a token",
        description=f"Create a bearer token of a role ({', '.join(ROLES)}); a wrapper token is bound to one source "
        "(which need not be registered yet). The token is in the answer and nowhere else: only its salted hash "
        "is stored. Admin only.",
        responses=errors(*AUTH, 413, 422),
    )
    async def create_token(body: TokenIn, _: Principal = Depends(ADMIN)) -> TokenCreated:
        try:
            check_role(body.role, body.source)
        except ValueError as exc:
            raise Invalid(str(exc)) from exc
        info, token = await issue(manager, body.role, body.source, body.name or "")
        app.state.auth.remember(info)
        return TokenCreated(**out(info).model_dump(), token=token)

    @router.get(
        "/v1/tokens",
        response_model=list[TokenOut],
        summary="List tokens",
        description="Every token, revoked ones included; never the secrets. Admin only.",
        responses=errors(*AUTH),
    )
    async def list_tokens(_: Principal = Depends(ADMIN)) -> list[TokenOut]:
        return [out(t) for t in await manager.db(Catalog.tokens)]

    @router.delete(
        "/v1/tokens/{token_id}",
        response_model=TokenOut,
        summary="Revoke a token",
        description="The token stops working at once; its row stays listed with `revoked_at`. Admin only.",
        responses=errors(*AUTH, 404),
    )
    async def revoke_token(token_id: int = Path(ge=1, le=2**62), _: Principal = Depends(ADMIN)) -> TokenOut:
        try:
            info = await manager.db(Catalog.revoke_token, token_id)
        except CatalogError as exc:
            raise NotFound(str(exc)) from exc
        app.state.auth.remember(info)
        return out(info)

    return router
