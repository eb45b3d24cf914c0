"""When to compact the Spark store's views, and a thread that does it in the background.

Every commit adds a small parquet file to a view's z-log and every read sums the whole
z-log, so reads slow down as it grows; compaction folds it into the base. It costs a few
Spark jobs, so it runs off the commit path, when a view's z-log is big, fragmented or old.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warehouse.store.spark import SparkStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ZlogStats:
    """What a compaction policy looks at."""

    files: int
    rows: int
    oldest_age_s: float
    watermark: int
    compacted_through: int


@dataclass(frozen=True)
class CompactionPolicy:
    max_rows: int = 1_000_000
    max_files: int = 100
    max_age_s: float = 600.0

    def due(self, stats: ZlogStats) -> bool:
        """Too many files is worth a rewrite on its own (it merges them); rows and age only
        when the watermark has moved, since otherwise nothing can be folded."""
        if stats.files == 0:
            return False
        if stats.files >= self.max_files:
            return True
        can_fold = stats.watermark > stats.compacted_through
        return can_fold and (stats.rows >= self.max_rows or stats.oldest_age_s >= self.max_age_s)


class Compactor:
    """Checks every view of a store each ``interval_s`` and compacts those that are due."""

    def __init__(
        self,
        store: SparkStore,
        policy: CompactionPolicy | None = None,
        interval_s: float = 30.0,
    ) -> None:
        self._store = store
        self._policy = policy or CompactionPolicy()
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> list[str]:
        """Compact the views that are due; returns their names. A failing view is logged and
        retried next round rather than stopping the others."""
        done: list[str] = []
        for view in self._store.views():
            try:
                if self._policy.due(self._store.zlog_stats(view)) and self._store.compact(view):
                    done.append(view)
            except Exception:
                log.exception("compaction of view %s failed", view)
        return done

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="pvm-compactor", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.run_once()
