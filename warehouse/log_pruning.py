"""Pruning the update log: removing what no reader can need any more.

The update log holds every update every wrapper shipped, and the unit records say which of
them each view maintained in which unit. Kept forever, a manager that runs for months grows
its catalog without bound. The rule (docs/protocol.md, "Pruning the update log"): an update
may go once every view over its source reflects it at its recorded watermark W, and a unit
record once its view's W is past it (the newest ``keep_units`` of those stay, for a restart
to rebuild the view's record of units from). What decides it is in the catalog
(``Catalog.prune``); what this module adds is when and how much: a round every
``interval_s``, in transactions of at most ``batch`` rows each, and never an update the
receiver has not released, and nothing before a view's recorded W but what it does not read
(the manager's ``PruneReach``, read on the event loop, where views come and go: a source
with a view being defined is left alone, since what that view will need is not recorded
yet).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from warehouse.seq_history import MAX_SPANS

if TYPE_CHECKING:  # the settings are read by ``pvm serve --help``, which does not load SQLAlchemy
    from warehouse.catalog.db import CatalogCall, Pruned, PruneReach

log = logging.getLogger(__name__)

DEFAULT_RETENTION_S = 3600.0
"""How long ``pvm serve`` keeps an update (and a unit record) after it was received (or
committed) even once no reader needs it: recent history to look at, at the cost of an hour
of updates."""


@dataclass(frozen=True)
class LogPruning:
    """``retention_s``: what is younger stays; ``interval_s``: between rounds; ``batch``: the
    most log entries, and unit records, one transaction removes; ``keep_units``: committed
    unit records at or below W that each view keeps (a restart rebuilds the record of the
    view's newest units from them, for consistent cuts reading back before W)."""

    retention_s: float = DEFAULT_RETENTION_S
    interval_s: float = 60.0
    batch: int = 5000
    keep_units: int = MAX_SPANS


@dataclass
class PruneCounters:
    """Running totals since the manager started, and the log's size after the last round."""

    rounds: int = 0
    entries_pruned: int = 0
    units_pruned: int = 0
    log_entries: int | None = None  # None: not counted yet
    last_round_at: float | None = None


class LogPruner:
    """Prunes the catalog's update log and unit records, a round at a time. ``reach``: what
    the manager's memory allows, taken anew for every transaction (``Manager._prunable``)."""

    def __init__(self, db: CatalogCall, reach: Callable[[], PruneReach], settings: LogPruning) -> None:
        self.db = db
        self.reach = reach
        self.settings = settings
        self.counters = PruneCounters()

    async def run(self) -> None:
        """A round every ``interval_s``, for good; a failed round is tried again next time."""
        while True:
            await asyncio.sleep(self.settings.interval_s)
            try:
                await self.round()
            except Exception:  # the catalog failing: nothing is lost by pruning later
                log.warning("could not prune the update log", exc_info=True)

    async def round(self, now: float | None = None) -> Pruned:
        """Prune, a transaction of at most ``batch`` rows of each kind after another, until a
        transaction finds less than that to remove; then count what the log holds."""
        from warehouse.catalog.db import Catalog, Pruned

        before = (time.time() if now is None else now) - self.settings.retention_s
        total = Pruned()
        while True:
            pruned = await self.db(Catalog.prune, self.reach(), before, self.settings.batch, self.settings.keep_units)
            total += pruned
            self.counters.entries_pruned += pruned.entries
            self.counters.units_pruned += pruned.units
            if pruned.entries < self.settings.batch and pruned.units < self.settings.batch:
                break
        self.counters.rounds += 1
        self.counters.last_round_at = time.time()
        self.counters.log_entries = await self.db(Catalog.log_size)
        if total.entries or total.units:
            log.info(
                "pruned %d update(s) and %d unit record(s) no reader needs; the log holds %d",
                total.entries,
                total.units,
                self.counters.log_entries,
            )
        return total


__all__ = ["DEFAULT_RETENTION_S", "LogPruner", "LogPruning", "PruneCounters"]
