"""A smoke test of ``pvm bench capture`` with tiny sizes against the local PostgreSQL and
MariaDB: it runs, its JSON file has every figure, and the ratios are positive numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pvm.cli import main as pvm_main

WRITE_COST_KEYS = {
    "seconds_without_capture",
    "seconds_with_capture",
    "transactions_per_second_without",
    "transactions_per_second_with",
    "ratio",
}
FRESHNESS_KEYS = {
    "source_transactions_committed",
    "marker_transactions",
    "writing_seconds",
    "converged_seconds_after_writers",
    "watermarks_checked_by_oracle",
    "oracle",
    "compensations",
    "freshness_seconds",
}


def positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@pytest.mark.servers
def test_bench_capture_writes_its_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "figures" / "capture.json"
    argv = [
        "bench", "capture", "--transactions", "12", "--statements", "2", "--connections", "2", "--rows", "40",
        "--rounds", "1", "--view-transactions", "12", "--marker-interval", "0.02", "--json", str(out),
    ]  # fmt: skip
    assert pvm_main(argv) == 0
    printed = capsys.readouterr().out
    assert "time ratio" in printed and f"wrote {out}" in printed

    results = json.loads(out.read_text())
    assert set(results) == {"settings", "write_cost", "freshness"}
    assert results["settings"]["transactions"] == "12" and results["settings"]["rounds"] == "1"
    assert set(results["write_cost"]) == {"postgresql", "mariadb"}
    for name, cost in results["write_cost"].items():
        assert set(cost) == WRITE_COST_KEYS, name
        assert positive(cost["ratio"]), (name, cost["ratio"])
        assert positive(cost["transactions_per_second_without"]) and positive(cost["transactions_per_second_with"])
        assert len(cost["seconds_without_capture"]) == len(cost["seconds_with_capture"]) == 1
        assert all(positive(s) for s in cost["seconds_without_capture"] + cost["seconds_with_capture"])
        median_ratio = cost["seconds_with_capture"][0] / cost["seconds_without_capture"][0]
        assert math.isclose(cost["ratio"], median_ratio), name

    fresh = results["freshness"]
    assert set(fresh) == FRESHNESS_KEYS
    assert fresh["oracle"] == "passed" and fresh["watermarks_checked_by_oracle"] >= 1
    assert fresh["source_transactions_committed"] >= 1 and fresh["marker_transactions"] >= 1
    assert positive(fresh["writing_seconds"]) and fresh["converged_seconds_after_writers"] >= 0
    assert fresh["freshness_seconds"] and set(fresh["freshness_seconds"]) <= {"pg", "my", "lite"}
    for source, lag in fresh["freshness_seconds"].items():
        assert set(lag) == {"p50", "p95", "max"}, source
        assert all(positive(v) for v in lag.values()) and lag["p50"] <= lag["p95"] <= lag["max"], source


@pytest.mark.servers
def test_bench_capture_measures_log_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "capture-log.json"
    argv = [
        "bench", "capture", "--method", "log", "--transactions", "12", "--statements", "2", "--connections", "2",
        "--rows", "40", "--rounds", "1", "--skip-freshness", "--json", str(out),
    ]  # fmt: skip
    assert pvm_main(argv) == 0
    assert "write cost (log capture)" in capsys.readouterr().out
    results = json.loads(out.read_text())
    assert results["settings"]["method"] == "log" and set(results) == {"settings", "write_cost"}
    for name, cost in results["write_cost"].items():
        assert set(cost) == WRITE_COST_KEYS and positive(cost["ratio"]), name
