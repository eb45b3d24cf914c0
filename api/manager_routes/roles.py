"""The role a route of the manager needs, as FastAPI dependencies (``api/auth.py``)."""

from __future__ import annotations

from api.auth import require_role

ADMIN = require_role("admin")
ANALYST = require_role("analyst")  # analysts and administrators
WRAPPER = require_role("wrapper")  # wrappers (of the batch's source) and administrators
