"""``pvm bench workload`` at a tiny size: one low rate for a few seconds, the memory store,
the local PostgreSQL and MariaDB and an SQLite file, each behind its wrapper process, one
writer process. It runs, its JSON has every figure, the views were verified against the live
databases, every source transaction the views saw was traced to its commit, and the PNG was
written; bad options are refused with one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pvm.bench.tpcc import VIEWS
from pvm.cli import main as pvm_main

PHASE_KEYS = {
    "target_rate", "reached_rate", "transactions", "source_transactions", "mix", "writer_errors",
    "max_behind_schedule_s", "writing_s", "catch_up_s", "bounded", "views", "manager_cpu_pct_mean",
    "manager_rss_mb_max", "manager_rss_growth_after_1min_pct", "jvm_cpu_pct_mean", "jvm_rss_mb_max", "samples",
}  # fmt: skip
VIEW_KEYS = {
    "source_transactions", "freshness_p50_s", "freshness_p99_s", "freshness_max_s", "lag_max_s",
    "lag_growth_s_per_s", "batching", "counters",
}  # fmt: skip


@pytest.mark.servers
def test_bench_workload_writes_its_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "figures" / "workload.json"
    argv = [
        "bench", "workload", "--store", "memory", "--rates", "15", "--seconds", "3", "--warehouses", "1",
        "--writers", "1", "--customers", "8", "--items", "50", "--sample-interval", "0.25", "--json", str(out),
    ]  # fmt: skip
    assert pvm_main(argv) == 0
    printed = capsys.readouterr().out
    assert "highest rate with bounded freshness" in printed and f"wrote {out}" in printed
    assert out.with_suffix(".png").stat().st_size > 10_000

    figures = json.loads(out.read_text())
    assert set(figures) == {"machine", "settings", "initial_load_s", "phases", "highest_bounded_rate", "verified"}
    assert figures["verified"] == dict.fromkeys(VIEWS, True)
    assert figures["settings"]["store"] == "memory" and figures["settings"]["batch_size"] == 1000
    (phase,) = figures["phases"]
    assert set(phase) == PHASE_KEYS
    assert phase["target_rate"] == 15 and phase["transactions"] == 45 and phase["reached_rate"] > 0
    assert sum(phase["mix"].values()) == 45 and phase["writer_errors"] == []
    assert phase["source_transactions"] > phase["transactions"]  # a New-Order commits in three databases
    # the manager runs in this process here: the JVM it counts is the suite's own Spark, if started
    assert phase["manager_rss_mb_max"] > 50 and phase["jvm_rss_mb_max"] >= 0
    assert phase["manager_rss_growth_after_1min_pct"] is None  # a phase of 3 s has no settled size
    assert figures["highest_bounded_rate"] in (None, 15)
    assert set(phase["views"]) == set(VIEWS)
    for name, view in phase["views"].items():
        assert set(view) == VIEW_KEYS, name
        assert view["source_transactions"] > 0, name
        p50, p99, worst = view["freshness_p50_s"], view["freshness_p99_s"], view["freshness_max_s"]
        assert 0 < p50 <= p99 <= worst < 120, (name, p50, p99, worst)
        assert math.isfinite(view["lag_growth_s_per_s"]) and view["lag_max_s"] >= 0
        assert view["counters"]["units_committed"] >= 1
    samples = phase["samples"]
    assert samples and {s["stage"] for s in samples} <= {"writing", "catching up"}
    assert all(set(VIEWS) <= set(s) for s in samples)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--rates", "fast"], "--rates 'fast': expected numbers"),
        (["--rates", "0,100"], "expected positive numbers"),
        (["--views", "nope"], "--views: unknown nope"),
        (["--writers", "3", "--warehouses", "2"], "--writers must not exceed --warehouses"),
        (["--seconds", "0"], "--seconds and --sample-interval must be positive"),
    ],
)
def test_bad_options_are_refused(options: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert pvm_main(["bench", "workload", *options]) == 2
    assert message in capsys.readouterr().err
