"""What the manager refuses, by kind. The core says what went wrong; the HTTP API says it
with a status code (``api/manager_errors.py`` maps each kind in one place).

>>> isinstance(NotFound("unknown view 'v'"), Refused), Busy("later", retry_after=5).retry_after
(True, 5)
"""

from __future__ import annotations


class Refused(Exception):
    """A request the manager will not serve as asked: a name it cannot use, a query analysts
    may not run. The subclasses say more; ``retry_after`` (seconds): when asking again can
    succeed."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Invalid(Refused):
    """Understood, but not acceptable: a setting out of range, an unknown capture method, a
    view definition the manager cannot maintain, an ``as_of`` beyond the watermark."""


class NotFound(Refused):
    """No such view, source or token."""


class Conflict(Refused):
    """Not in the present state of things: a name already taken, a view still initializing
    or failed, a state folded away while it was being read."""


class Busy(Refused):
    """As much of this runs already as the manager allows; ask again after ``retry_after``."""


class Unsupported(Refused):
    """Not with this deployment: it needs the Spark store and its analysts' query process."""


__all__ = ["Busy", "Conflict", "Invalid", "NotFound", "Refused", "Unsupported"]
