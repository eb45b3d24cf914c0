"""Waits between attempts: the one shape the manager's retries and the analysts' process
restarts share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Waits between attempts after a transient fault: ``first_s``, doubling up to ``max_s``;
    attempts go on for as long as the fault lasts.

    >>> b = Backoff(first_s=1.0, max_s=5.0)
    >>> [b.after(wait) for wait in (1.0, 2.0, 4.0)]
    [2.0, 4.0, 5.0]
    """

    first_s: float = 0.5
    max_s: float = 30.0

    def after(self, previous_s: float) -> float:
        """The wait that follows a wait of ``previous_s``."""
        return min(previous_s * 2, self.max_s)


__all__ = ["Backoff"]
