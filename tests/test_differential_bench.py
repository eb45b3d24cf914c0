"""``pvm bench diff`` in quick mode, through the real command line entry point."""

from __future__ import annotations

import importlib
import json

import pytest

import pvm.cli as cli


@pytest.fixture
def diff_cli(monkeypatch):
    """The CLI with subcommands whose modules cannot be imported here left out (each
    subcommand's parser is built from its module)."""
    for table in ("COMMANDS", "BENCHMARKS"):
        entries = dict(getattr(cli, table))
        for name, (module, _) in list(entries.items()):
            try:
                importlib.import_module(module)
            except Exception:
                del entries[name]
        monkeypatch.setattr(cli, table, entries)
    assert "diff" in cli.BENCHMARKS
    return cli


def test_bench_diff_quick_writes_json_and_png(diff_cli, tmp_path, capsys):
    out, png = tmp_path / "diff.json", tmp_path / "diff.png"
    rc = diff_cli.main(
        ["bench", "diff", "--quick", "--records", "4000", "--repeat", "1", "--json", str(out), "--plot", str(png)]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert {"config", "floor", "algorithms", "window_sweep", "goals", "expected_changes", "environment"} <= set(report)
    algs = report["algorithms"]
    assert set(algs) == {
        "window",
        "partitioned_hash",
        "partitioned_hash_kb",
        "partitioned_hash_kbp",
        "sort_merge",
        "sort_merge_kb",
        "sort_merge_kbp",
    }
    for a in algs.values():
        assert {
            "seconds",
            "cpu_seconds",
            "ratio_to_floor",
            "bytes_read",
            "changes",
            "extra_messages",
            "correct",
        } <= set(a)
        assert a["correct"] and a["seconds"] > 0 and a["bytes_read"] > 0
    assert report["floor"]["bytes_read"] == report["files"]["old_bytes"] + report["files"]["new_bytes"]
    assert algs["partitioned_hash_kb"]["bytes_read"] < report["floor"]["bytes_read"]
    assert report["expected_changes"] == {"insert": 20, "delete": 20, "update": 20}
    sweep = report["window_sweep"]
    assert sweep["points"] and all("extra_messages" in p and "aging_records" in p for p in sweep["points"])
    assert sweep["points"][0]["extra_messages"] > 0
    assert report["goals"]["no_extra_messages_once_aging_covers_displacement"]
    assert report["goals"]["all_outputs_correct"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "floor" in capsys.readouterr().out


def test_bench_diff_rejects_bad_options(diff_cli, capsys):
    assert diff_cli.main(["bench", "diff", "--quick", "--change-rate", "2"]) == 2
    assert "change-rate" in capsys.readouterr().err
    assert diff_cli.main(["bench", "diff", "--records", "10"]) == 2
