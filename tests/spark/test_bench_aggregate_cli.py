"""``pvm bench aggregate`` end to end at toy sizes: every update timed both ways, the view
maintained incrementally equal to the recompute after each, and a broken operator caught
(real numbers come from a manual run, see docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest

from contract.zset import ZSet
from pvm.bench import aggregate as bench
from pvm.cli import main

pytestmark = pytest.mark.spark


def test_bench_aggregate_times_and_verifies_each_update(spark, tmp_path) -> None:
    out = tmp_path / "aggregate.json"
    code = main([
        "bench", "aggregate", "--rows", "40,80", "--groups", "5", "--updates", "4",
        "--data-dir", str(tmp_path / "data"), "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    figures = json.loads(out.read_text())
    assert figures["groups"] == 5 and figures["incremental_growth"] > 0
    assert [r["rows"] for r in figures["runs"]] == [40, 80]
    for run in figures["runs"]:
        assert run["body_rows"] == run["rows"]  # the join keeps every order
        # one summary row per region, one multiset row per (region, amount): amounts repeat little
        assert run["rows"] < run["stored_rows_loaded"] <= run["rows"] + 5 + 1
        assert run["verified"] and run["initial_equal"]
        updates = run["updates"]
        kinds = ["insert", "delete max", "update", "delete min"]
        assert [u["kind"] for u in updates] == kinds
        for u in updates:
            assert u["equal"] and u["differences"] == {} and u["view_rows"] == 5
            assert len(u["groups"]) == 1 and u["incremental_s"] > 0 and u["recompute_s"] > 0
            parts = u["incremental_parts_s"]
            assert list(parts) == ["encode", "commit", "publish"] and min(parts.values()) >= 0
            assert sum(parts.values()) == pytest.approx(u["incremental_s"], abs=1e-3)
            # O(changed groups): one summary row, and one multiset row per changed value
            assert u["stored_rows_written"] == (3 if u["kind"] == "update" else 2)
        assert run["ratio"] == round(run["recompute_s"]["median"] / run["incremental_s"]["median"], 1)
        assert set(run["by_kind"]) == set(kinds)
    assert out.with_suffix(".png").stat().st_size > 0


def test_bench_aggregate_fails_when_the_operator_loses_the_extremes(spark, tmp_path, monkeypatch) -> None:
    """An operator that keeps no MIN/MAX multiset rows for updates: deleting a region's
    extreme leaves it shown, and the bench reports the difference and exits 1."""

    real = bench.encode

    def without_multisets(s, body: ZSet) -> ZSet:
        return real(s, body).filter(lambda row: row[1] is None)  # summary rows only

    monkeypatch.setattr(bench, "encode", without_multisets)
    out = tmp_path / "broken.json"
    code = main([
        "bench", "aggregate", "--rows", "40", "--groups", "5", "--updates", "2",
        "--data-dir", str(tmp_path / "data"), "--json", str(out),
    ])  # fmt: skip
    assert code == 1
    run = json.loads(out.read_text())["runs"][0]
    assert run["initial_equal"] and not run["verified"]
    insert, delete_max = run["updates"]
    assert insert["equal"]  # an inserted amount between the region's planted extremes
    assert not delete_max["equal"] and delete_max["differences"]["extra"]  # the deleted MAX still shown
