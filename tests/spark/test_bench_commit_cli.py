"""``pvm bench commit`` end to end at toy sizes: both commit rates, and freshness traced from
source transactions through the update log to the publishes (real numbers come from a
manual run, see docs/spark.md).

Its SQL readers query the run's analysts' query process (the ``analysts`` fixture), which
shows the bench's view as a query process of the bench's own would: a JVM and warm-up fewer.
``running_analysts`` itself starts and stops one in tests/spark/test_bench_abuse_cli.py."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

import pvm.bench.commit
from pvm.bench.commit import STAGES, Freshness, Trace, _quantile
from pvm.cli import main
from warehouse.analysts.supervisor import AnalystProcess, AnalystSettings

pytestmark = pytest.mark.spark


def test_bench_commit_measures_rates_and_freshness(spark, analysts, tmp_path, monkeypatch) -> None:
    asked: list[AnalystSettings] = []

    @asynccontextmanager
    async def the_runs_analysts(store, settings: AnalystSettings) -> AsyncIterator[AnalystProcess]:
        asked.append(settings)
        store.subscribe(analysts.publish)
        try:
            yield analysts
        finally:
            store.unsubscribe(analysts.publish)

    monkeypatch.setattr(pvm.bench.commit, "running_analysts", the_runs_analysts)
    traced: list[tuple[float, Trace]] = []  # per transaction traced: its commit at the source, its way
    figures_of = Freshness._figures

    def keep_traces(self: Freshness, writer: dict, status: dict, visible: dict) -> dict:
        ledger = self.ledger
        markers = [
            *((("order", k), m) for k, m in ledger.orders.items()),
            *((("name", k), m) for k, m in ledger.names.items()),
        ]
        traced.extend((m.committed_at, visible[k]) for k, m in markers if k in visible)
        return figures_of(self, writer, status, visible)

    monkeypatch.setattr(Freshness, "_figures", keep_traces)
    out = tmp_path / "commit.json"
    code = main([
        "bench", "commit", "--rate", "30", "--seconds", "2", "--rows", "20", "--poll-interval", "0.2",
        "--effects-per-group", "3", "--rows-per-effect", "2", "--groups", "1", "--single-effects", "2",
        "--data-dir", str(tmp_path / "data"), "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    [settings] = asked  # a process of its own would run on one core, in the run's data directory
    assert settings.master == "local[1]" and settings.work_dir == tmp_path / "data" / "analysts"
    figures = json.loads(out.read_text())
    assert figures["commit"]["grouped_rows_per_s"] > 0 and figures["commit"]["speedup"] > 0
    fresh = figures["freshness"]
    assert fresh["transactions"] == 60 and fresh["measured"] == 60  # every one traced to a publish
    assert 0 < fresh["p50_s"] <= fresh["p99_s"] <= fresh["max_s"] < 60
    polled = fresh["polled"]
    assert polled["seen_before_publish"] == 0 and polled["never_seen"] == 0
    assert polled["measured"] + polled["superseded_unseen"] == 60
    stages = fresh["stages"]
    assert list(stages) == ["shipped to the manager", "queued for a unit", "maintained and appended", "published"]
    assert all(0 <= leg["p50_s"] <= leg["p99_s"] for leg in stages.values())
    # Per transaction, the legs are the steps between the instants of its way, in the order they
    # happen, so they add up to its freshness. The three in the manager are positive: a unit is
    # numbered and recorded after its updates are durable, its commit is recorded after its
    # subqueries and Spark append, and W is published after the commit is recorded. (The first
    # leg starts at the writer's clock reading just after its commit, which a thread switch could
    # in principle delay past the receipt: it is held to the sum only.)
    assert len(traced) == fresh["measured"] == 60
    legs: dict[str, list[float]] = {name: [] for name, _, _ in STAGES}
    for committed_at, trace in traced:
        instants = [committed_at, trace.received, trace.started, trace.committed, trace.published]
        steps = [later - earlier for earlier, later in itertools.pairwise(instants)]
        assert all(step > 0 for step in steps[1:]), instants
        way = {
            name: getattr(trace, end) - (committed_at if start == "source" else getattr(trace, start))
            for name, start, end in STAGES
        }
        assert list(way.values()) == steps, (way, instants)
        assert sum(way.values()) == pytest.approx(trace.published - committed_at, abs=1e-6)
        for name, leg in way.items():
            legs[name].append(leg)
    # and the figures reported are these legs' quantiles, and the whole way's
    for name, values in legs.items():
        values.sort()
        assert stages[name] == {
            "p50_s": round(_quantile(values, 0.5), 3),
            "p99_s": round(_quantile(values, 0.99), 3),
        }, name
    totals = sorted(trace.published - committed_at for committed_at, trace in traced)
    assert (fresh["p50_s"], fresh["max_s"]) == (round(_quantile(totals, 0.5), 3), round(totals[-1], 3))
