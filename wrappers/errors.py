"""The wrapper's error types: problems with the source or the configuration, and bad requests."""

from __future__ import annotations

import re

_PASSWORD = re.compile(r"(//[^/:@\s]*:)[^@/\s]*@")


class WrapperError(Exception):
    """The source or the wrapper's configuration cannot be used; the message says why."""


class InvalidRequest(WrapperError):
    """A request names relations or columns the source does not have, or is malformed (HTTP 400)."""


def masked_url(url: str) -> str:
    """``url`` as error messages and logs show it: without its password (if it has one),
    even when it is too malformed for SQLAlchemy to parse.

    >>> masked_url("postgresql://pvm:s3cret@db/shop")
    'postgresql://pvm:***@db/shop'
    >>> masked_url("postgres//pvm:s3cret@db/shop")
    'postgres//pvm:***@db/shop'
    >>> masked_url("sqlite:///shop.db")
    'sqlite:///shop.db'
    """
    return _PASSWORD.sub(r"\1***@", url)
