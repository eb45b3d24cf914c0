"""``POST /v1/changes`` of a wrapper with application capture: the application reports one of
its committed transactions; the wrapper applies it to its replica and ships it as an update.

The application sends keys and new values only; the wrapper takes old values from its
replica. The answer comes once the transaction is durable in the replica (Carnes's helper
queue: the application may forget it then). A change the replica cannot take (unknown
relation or column, missing key, duplicate insert, update or delete of a missing row)
refuses the whole transaction with 400 and nothing of it is applied; so does a NaN, which
the replica (SQLite) would store as NULL.
"""

from __future__ import annotations

import hmac
from typing import Literal

from fastapi import FastAPI, Header, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from contract.schemas import MAX_CHANGES_PER_UPDATE, Scalar
from wrappers.replica import RowChange
from wrappers.wrapper import Wrapper


class ApplicationChange(BaseModel):
    """One row change; see ``wrappers.replica.RowChange`` for what each operation needs."""

    model_config = ConfigDict(extra="forbid")
    relation: str = Field(min_length=1, max_length=200, examples=["orders"])
    op: Literal["insert", "update", "delete"]
    key: dict[str, Scalar] | None = Field(default=None, description="primary key of the row (update, delete)")
    row: dict[str, Scalar] | None = Field(
        default=None, description="new values (insert: the row; update: what changes)"
    )


class ApplicationTransaction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    changes: list[ApplicationChange] = Field(min_length=1, max_length=MAX_CHANGES_PER_UPDATE // 2)


class ApplicationAck(BaseModel):
    applied: int


def add_routes(app: FastAPI, wrapper: Wrapper, token: str | None) -> None:
    """Add ``POST /v1/changes``; with ``token``, only requests bearing it are taken."""

    @app.post("/v1/changes", response_model=ApplicationAck, summary="Report one application transaction")
    async def changes(body: ApplicationTransaction, authorization: str | None = Header(default=None)) -> ApplicationAck:
        if token and not hmac.compare_digest((authorization or "").encode(), f"Bearer {token}".encode()):
            raise HTTPException(status_code=401, detail="send the wrapper's --application-token as a bearer token")
        for i, change in enumerate(body.changes):
            nan = [column for column, value in (change.row or {}).items() if value != value]
            if nan:  # SQLite would store it as NULL: refused rather than changed
                raise HTTPException(
                    status_code=400, detail=f"change {i}: the replica cannot hold NaN (column {nan[0]!r})"
                )
        await wrapper.post_changes([RowChange(c.relation, c.op, c.key, c.row) for c in body.changes])
        return ApplicationAck(applied=len(body.changes))
