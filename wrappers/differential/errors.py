"""The error raised for snapshots (and saved differential state) that cannot be differenced."""

from __future__ import annotations

__all__ = ["SnapshotError", "SpillError"]


class SnapshotError(Exception):
    """A snapshot cannot be used: its schema or key changed, a key repeats, or a dump file is
    truncated or unreadable. The message says which and where."""


class SpillError(SnapshotError):
    """A spill or saved-state file is truncated or unreadable."""
