"""Prometheus metrics of a manager, collected on scrape from its counters.

Every app gets its own ``CollectorRegistry`` (never the process-wide default), so several
managers in one process (tests, the demo) do not collide. Nothing is counted twice: the
collector reads the receiver, the protocol state and each view's ``ViewCounters`` when
``/metrics`` is scraped; the histograms are the counters' own running bucket counts
(``warehouse/counters.py``), updated when observed.

Scrapes run on the manager's event loop, like maintenance itself, so they see consistent
counters without locks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from warehouse.log_pruning import PruneCounters
from warehouse.manager import change_log_bytes, load_status, view_progress

STATES = ("initializing", "active", "failed")


class ManagerCollector(Collector):
    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        m = self.manager
        received = CounterMetricFamily(
            "pvm_source_updates_received",
            "Updates of a source received, durable and released in seq order",
            labels=["source"],
        )
        held = GaugeMetricFamily(
            "pvm_source_updates_held",
            "Updates of a source received above a gap in seq, waiting for it",
            labels=["source"],
        )
        waiting = GaugeMetricFamily(
            "pvm_source_waiting_for_seq",
            "The first missing seq of a source while updates are held (0: none held)",
            labels=["source"],
        )
        change_log = GaugeMetricFamily(
            "pvm_source_change_log_bytes",
            "Log capture: change log the source's database keeps for the wrapper (a PostgreSQL slot's "
            "retained WAL; the MariaDB binary log not read yet), as its wrapper last reported",
            labels=["source"],
        )
        change_log_warning = GaugeMetricFamily(
            "pvm_source_change_log_warning",
            "1 when pvm_source_change_log_bytes is above the manager's --change-log-warning-mb",
            labels=["source"],
        )
        for source in sorted(m.clients):
            status = m.receiver.status(source)
            received.add_metric([source], status.released_through)
            held.add_metric([source], status.held)
            waiting.add_metric([source], status.waiting_for or 0)
            kept = change_log_bytes(m.source_health.get(source, {}))
            if kept is not None:
                change_log.add_metric([source], kept)
                change_log_warning.add_metric([source], 1.0 if kept > m.change_log_warning_bytes else 0.0)
        yield received
        yield held
        yield waiting
        yield change_log
        yield change_log_warning
        if m.pruner is not None:
            yield from _pruning_metrics(m.pruner.counters)
        if m.store_probe is not None:
            up = GaugeMetricFamily(
                "pvm_store_up", "1 when the view store answered its latest probe (never waited for here)"
            )
            up.add_metric([], 0.0 if m.store_probe.last() else 1.0)
            yield up

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=["view"])

        def gauge(name: str, doc: str, labels: Sequence[str] = ("view",)) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=list(labels))

        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            "received": counter("pvm_view_updates_received", "Source updates routed to the view"),
            "started": counter("pvm_view_units_started", "Maintenance units started (moved from the UMQ into the PPU)"),
            "maintained": counter("pvm_view_units_maintained", "Maintenance units whose effect is computed"),
            "committed": counter(
                "pvm_view_units_committed", "Maintenance units whose effect is committed to the store"
            ),
            "subqueries": counter("pvm_view_subqueries", "Subqueries sent to the sources' wrappers"),
            "compensations": counter("pvm_view_compensations", "Concurrent updates compensated in subquery answers"),
            "compensations_from_log": counter(
                "pvm_view_compensations_from_log",
                "Of the compensated updates, spilled ones read from the update log",
            ),
            "read_back": counter(
                "pvm_view_updates_read_back", "Spilled queued updates read back into memory from the update log"
            ),
            "unit_parts": counter(
                "pvm_view_unit_parts", "Parts of large maintenance units swept and stored one at a time"
            ),
            "retries": counter(
                "pvm_view_retries",
                "Steps repeated after a transient fault (a source unreachable, the store or the catalog failing)",
            ),
            "retrying": gauge(
                "pvm_view_retrying", "Steps (units, the commit) being retried now after a transient fault"
            ),
            "stalled": gauge("pvm_view_stalled", "1 when the watchdog sees work pending and no progress for its limit"),
            "no_progress": gauge(
                "pvm_view_no_progress_seconds", "Seconds with work pending and no unit started, maintained or committed"
            ),
            "pending": gauge("pvm_view_updates_pending", "Updates queued (UMQ) or being maintained (PPU)"),
            "queued": gauge(
                "pvm_view_updates_queued", "Updates received and in no unit yet (UMQ, or the log of a held view)"
            ),
            "spilled": gauge(
                "pvm_view_updates_spilled",
                "Queued updates kept in the update log only (past the queue budget, or held by a paused view)",
            ),
            "queued_changes": gauge(
                "pvm_view_queued_changes", "Changes of the queued updates held in memory (bounded by the queue budget)"
            ),
            "ppu": gauge("pvm_view_ppu_occupancy", "Units being maintained (PPU occupancy)"),
            "ppu_size": gauge("pvm_view_ppu_size", "PPU size p: units maintained at most at once"),
            "retained": gauge("pvm_view_units_retained", "Maintained units kept for compensation (RPU)"),
            "waiting": gauge(
                "pvm_view_units_waiting", "Numbered units waiting for a PPU slot (after a restart or a fault)"
            ),
            "watermark": gauge("pvm_view_watermark", "Visibility watermark W: every order <= W is committed"),
            "lag_updates": gauge("pvm_view_lag_updates", "Updates received but not visible at W yet"),
            "lag_seconds": gauge(
                "pvm_view_lag_seconds",
                "Age in seconds of the oldest update not visible at W (queued, running or above W)",
            ),
            "load_rows": gauge(
                "pvm_view_load_rows_staged", "Rows of the running initial load staged so far (0: none runs)"
            ),
            "load_relations": gauge(
                "pvm_view_load_relations_staged", "Relations of the running initial load staged whole (0: none runs)"
            ),
            "load_rows_expected": gauge(
                "pvm_view_load_rows_expected",
                "Rows the sources estimate the running initial load stages (0: none runs, or not every source estimated)",
            ),
            "load_percent": gauge(
                "pvm_view_load_percent", "How far the running initial load's staging is, in percent (0: none runs)"
            ),
            "load_eta": gauge(
                "pvm_view_load_eta_seconds",
                "Seconds the running initial load's staging should still take at its rate so far (0: unknown or none)",
            ),
            "state": gauge("pvm_view_state", "1 for the state the view is in", ("view", "state")),
        }
        subquery = HistogramMetricFamily(
            "pvm_subquery_seconds", "Latency of maintenance subqueries, by source", labels=["view", "source"]
        )
        groups = HistogramMetricFamily(
            "pvm_commit_group_size", "Effects written to the view store in one commit", labels=["view"]
        )
        for name in sorted(m.views):
            handle = m.views[name]
            maintainer = handle.maintainer
            protocol = maintainer.protocol
            c = maintainer.counters
            progress = view_progress(handle)
            where = protocol.progress()
            load = load_status(maintainer)
            for key, value in (
                ("received", c.updates_received),
                ("started", c.units_started),
                ("maintained", c.units_maintained),
                ("committed", c.units_committed),
                ("subqueries", c.subqueries),
                ("compensations", c.compensations),
                ("compensations_from_log", c.compensations_from_log),
                ("read_back", c.updates_read_back),
                ("unit_parts", c.unit_parts),
                ("retries", c.retries),
                ("retrying", len(maintainer.retrying)),
                ("stalled", 1.0 if m.stalled(handle) else 0.0),
                ("no_progress", maintainer.seconds_without_progress()),
                ("pending", progress["updates_pending"]),
                ("queued", where.queued),
                ("spilled", where.spilled),
                ("queued_changes", where.queued_changes),
                ("ppu", where.running),
                ("ppu_size", protocol.parallelism),
                ("retained", where.retained),
                ("waiting", where.waiting),
                ("watermark", protocol.watermark),
                ("lag_updates", progress["lag_updates"]),
                ("lag_seconds", progress["lag_seconds"]),
                ("load_rows", (load or {}).get("rows_staged", 0)),
                ("load_relations", (load or {}).get("relations_staged", 0)),
                ("load_rows_expected", (load or {}).get("rows_expected") or 0),
                ("load_percent", (load or {}).get("percent", 0)),
                ("load_eta", (load or {}).get("eta_seconds") or 0),
            ):
                families[key].add_metric([name], value)
            state = handle.info.state
            for s in dict.fromkeys((*STATES, state)):
                families["state"].add_metric([name, s], 1.0 if s == state else 0.0)
            for source, histogram in sorted(c.subquery_seconds.items()):
                subquery.add_metric([name, source], histogram.buckets(), histogram.total)
            groups.add_metric([name], c.group_sizes.buckets(), c.group_sizes.total)
        yield from families.values()
        yield subquery
        yield groups
        if m.analysts is not None:
            yield from _analyst_metrics(m.analysts.status())


def _pruning_metrics(c: PruneCounters) -> Iterator[Metric]:
    """The update log's pruning (``warehouse/log_pruning.py``): totals since the start, and
    the log's size as its latest round counted it."""
    yield CounterMetricFamily(
        "pvm_update_log_pruned",
        "Updates removed from the update log once no reader needed them",
        value=c.entries_pruned,
    )
    yield CounterMetricFamily(
        "pvm_unit_records_pruned",
        "Committed unit records removed (folded into their view's record) once no reader needed them",
        value=c.units_pruned,
    )
    if c.last_round_at is not None:
        yield GaugeMetricFamily(
            "pvm_update_log_last_pruned_timestamp_seconds",
            "When the latest pruning round ended (Unix time): a value that stops moving says pruning fails",
            value=c.last_round_at,
        )
    if c.log_entries is not None:
        yield GaugeMetricFamily(
            "pvm_update_log_entries",
            "Updates the update log holds, as the latest pruning round counted them",
            value=c.log_entries,
        )


def _analyst_metrics(status: dict[str, Any]) -> Iterator[Metric]:
    """The analysts' query process (``warehouse/analysts``)."""
    yield GaugeMetricFamily(
        "pvm_analyst_ready", "1 when the analysts' query process takes queries", value=float(status["ready"])
    )
    yield CounterMetricFamily(
        "pvm_analyst_restarts", "Restarts of the analysts' query process", value=status["restarts"]
    )
    yield GaugeMetricFamily(
        "pvm_analyst_queries_running", "Analyst queries and row reads running now", value=status["running"]
    )


def registry_for(manager: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ManagerCollector(manager))
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The text exposition of ``registry`` and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


__all__ = ["ManagerCollector", "registry_for", "render", "view_progress"]
