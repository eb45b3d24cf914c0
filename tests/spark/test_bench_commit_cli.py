"""``pvm bench commit`` end to end at toy sizes: both commit rates, and freshness traced from
source transactions through the update log to the publishes (real numbers come from a
manual run, see docs/spark.md)."""

from __future__ import annotations

import json

import pytest

from pvm.cli import main

pytestmark = pytest.mark.spark


def test_bench_commit_measures_rates_and_freshness(spark, tmp_path) -> None:
    out = tmp_path / "commit.json"
    code = main([
        "bench", "commit", "--rate", "30", "--seconds", "2", "--rows", "20", "--poll-interval", "0.2",
        "--effects-per-group", "3", "--rows-per-effect", "2", "--groups", "1", "--single-effects", "2",
        "--data-dir", str(tmp_path / "data"), "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    figures = json.loads(out.read_text())
    assert figures["commit"]["grouped_rows_per_s"] > 0 and figures["commit"]["speedup"] > 0
    fresh = figures["freshness"]
    assert fresh["transactions"] == 60 and fresh["measured"] == 60  # every one traced to a publish
    assert 0 < fresh["p50_s"] <= fresh["p99_s"] <= fresh["max_s"] < 60
    polled = fresh["polled"]
    assert polled["seen_before_publish"] == 0 and polled["never_seen"] == 0
    assert polled["measured"] + polled["superseded_unseen"] == 60
    stages = fresh["stages"]  # the legs of a transaction's way add up to the whole
    assert list(stages) == ["shipped to the manager", "queued for a unit", "maintained and appended", "published"]
    assert all(0 <= leg["p50_s"] <= leg["p99_s"] for leg in stages.values())
    assert sum(leg["p50_s"] for leg in stages.values()) <= fresh["max_s"]
