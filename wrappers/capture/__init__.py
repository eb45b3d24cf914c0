"""Change capture, one module per source dialect (see ``base.CaptureDialect``)."""

from __future__ import annotations

import sqlalchemy as sa

from wrappers.capture.base import CaptureDialect
from wrappers.errors import WrapperError


def dialect_for(url: str) -> CaptureDialect:
    """The capture module for the database behind ``url``."""
    try:
        backend = sa.make_url(url).get_backend_name()
    except sa.exc.ArgumentError as exc:
        raise WrapperError(f"not a database URL: {url!r}") from exc
    if backend == "sqlite":
        from wrappers.capture import sqlite

        return sqlite
    raise WrapperError(f"capture is not implemented for {backend} sources (supported: sqlite)")
