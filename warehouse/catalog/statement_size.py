"""The bound a MariaDB (or MySQL) catalog puts on one statement, checked before it is sent.

The server refuses a statement longer than its ``max_allowed_packet`` (16 MiB by default on
MariaDB) and drops the connection. The changes of an update, or of one part of an update
that arrived in parts, are one JSON value of one INSERT (``update_log.changes``,
``staged_parts.changes``): so the catalog measures every JSON value it writes as the driver
sends it (PyMySQL quotes it, a backslash before each ``"``, ``\\`` and ``'``) and refuses one
that would not leave room for the rest of its statement with ``StatementTooLarge``, naming
the sizes, before anything is sent. Other databases have no such bound (``limit`` None).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Engine

HEADROOM = 64 << 10
"""Bytes of a statement left for everything but its largest JSON value (the SQL text, the
other columns)."""


class StatementTooLarge(Exception):
    """A JSON value the catalog's database would refuse in one statement."""

    def __init__(self, size: int, packet: int) -> None:
        super().__init__(
            f"its changes take {size:,} bytes in the catalog's INSERT, more than the catalog's MariaDB takes in "
            f"one statement (max_allowed_packet {packet:,} bytes, less {HEADROOM:,} for the rest of it)"
        )
        self.size = size
        self.packet = packet


def sent_bytes(text: str) -> int:
    """The length of ``text`` (ASCII JSON: the catalog writes ``\\u`` escapes) as a quoted
    literal of PyMySQL's.

    >>> sent_bytes('{"k": "it is"}')
    18
    """
    return len(text) + text.count('"') + text.count("\\") + text.count("'")


class BoundedJson:
    """The catalog's JSON serializer (``dump``), refusing a value longer than ``packet`` less
    ``HEADROOM`` bytes once ``packet`` is known (``measure``)."""

    def __init__(self, dump: Callable[[Any], str]) -> None:
        self._dump = dump
        self.packet: int | None = None

    def measure(self, engine: Engine) -> None:
        """Read the server's ``max_allowed_packet`` (MariaDB and MySQL; nothing elsewhere)."""
        if engine.dialect.name in ("mysql", "mariadb"):
            with engine.connect() as conn:
                self.packet = int(conn.exec_driver_sql("SELECT @@max_allowed_packet").scalar_one())

    def __call__(self, value: Any) -> str:
        text = self._dump(value)
        if self.packet is not None and (size := sent_bytes(text)) > self.packet - HEADROOM:
            raise StatementTooLarge(size, self.packet)
        return text
