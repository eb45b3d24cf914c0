"""The wrapper's error types: problems with the source or the configuration, and bad requests."""

from __future__ import annotations


class WrapperError(Exception):
    """The source or the wrapper's configuration cannot be used; the message says why."""


class InvalidRequest(WrapperError):
    """A request names relations or columns the source does not have, or is malformed (HTTP 400)."""
