"""``pvm bench load`` end to end at a toy size: three real sources (PostgreSQL, MariaDB,
SQLite) behind wrapper processes, the view loaded in Spark, its JSON and plot written (real
numbers come from a manual run, see docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest

from pvm.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.servers]


def test_bench_load_writes_its_figures(spark, tmp_path) -> None:
    out = tmp_path / "load.json"
    data = str(tmp_path / "data")
    code = main(["bench", "load", "--rows", "120", "--warm-up", "60", "--data-dir", data, "--json", str(out)])
    assert code == 0
    figures = json.loads(out.read_text())
    assert [run["rows"] for run in figures["runs"]] == [120]
    assert figures["warm_up"]["rows"] == 60  # reported apart, never among the measured runs
    for run in [figures["warm_up"], *figures["runs"]]:
        pvm = run["pvm"]
        assert pvm["engine_load"] is True  # loaded in Spark, not through subqueries
        assert pvm["seconds"] > 0 and pvm["rows_per_s"] > 0
        assert 0 < pvm["view_rows"] < run["rows"]  # the local predicates leave some out
        assert pvm["manager_rss_start_mib"] <= pvm["manager_rss_peak_mib"]
        jdbc = run["jdbc"]
        if "seconds" in jdbc:  # the session of this test run may have started without the drivers
            assert jdbc["view_rows"] == pvm["view_rows"]
        else:
            assert jdbc["skipped"]
    assert out.with_suffix(".png").stat().st_size > 0
