"""The error responses the manager's routes document: a description and an example body per
status, and ``AUTH``, the statuses of every route that needs a token."""

from __future__ import annotations

from typing import Any

from api.manager_models import (
    ErrorOut,
)

ERROR_EXAMPLES = {
    400: ("malformed request", "malformed JSON body: Expecting value (at position 0)"),
    401: ("no valid bearer token", "the bearer token is unknown, malformed or revoked"),
    403: ("the token's role may not do this", "token 4 (analyst) may not POST /v1/views: that needs the admin role"),
    404: ("unknown name", "unknown view 'nope'"),
    409: ("conflicts with what exists", "view 'big_orders' already exists"),
    413: ("request body too large", "request body larger than 1048576 bytes"),
    415: (
        "a body of a media type or version the route does not read",
        "update stream version '2': this manager reads application/json, application/vnd.apache.arrow.stream; version=1",
    ),
    422: ("invalid request", "unsupported SQL: aggregates are not supported (COUNT)"),
    429: (
        "too many failed authentication attempts from this address",
        "too many failed authentication attempts from this address; try again in 1 s",
    ),
    502: (
        "the source's wrapper refused or is unreachable",
        "could not read the schema of source 'shop' at http://127.0.0.1:8101: …",
    ),
    503: ("not ready, or still starting (then with `Retry-After`)", "not ready: the view store does not answer: …"),
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries of error responses, each with an example body."""
    return {
        code: {
            "model": ErrorOut,
            "description": ERROR_EXAMPLES[code][0],
            "content": {"application/json": {"example": {"detail": ERROR_EXAMPLES[code][1]}}},
        }
        for code in codes
    }


AUTH = (401, 403, 429)
