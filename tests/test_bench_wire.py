"""``pvm bench wire`` at toy sizes: both formats of both messages are timed, their rows come
back equal, and the figures, ratios and plot are written. (The numbers: docs/benchmarks.md.)"""

from __future__ import annotations

import json

from pvm.bench.wire import MESSAGES, rows_of
from pvm.cli import main


def test_bench_wire_times_both_formats_and_checks_the_rows(tmp_path, capsys) -> None:
    out = tmp_path / "wire.json"
    argv = ["bench", "wire", "--rows", "1,40", "--repeat", "2", "--ship", "150", "--json", str(out)]
    assert main([*argv, "--captured", "150", "--wrapper-args", "--part-changes 40"]) == 0
    figures = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert [r["rows"] for r in figures["runs"]] == [1, 40]
    for run in figures["runs"]:
        for message in MESSAGES:
            m = run[message]
            assert m["equal"] is True
            assert m["json"]["bytes"] > 0 and m["arrow"]["bytes"] > 0
            assert m["arrow_over_json"] == round(m["arrow"]["total_s"] / m["json"]["total_s"], 3)
    # a message of 40 rows is larger than one of 1, in both formats
    small, large = figures["runs"]
    assert all(large[m][f]["bytes"] > small[m][f]["bytes"] for m in MESSAGES for f in ("json", "arrow"))
    (shipped,) = figures["shipped"]  # one update of 150 changes, shipped to a manager both ways
    assert shipped["changes"] == 150 and shipped["stream"]["stream"] and not shipped["json"]["stream"]
    assert shipped["stream"]["bytes"] < shipped["json"]["bytes"]
    assert shipped["stream_over_json"] == round(shipped["stream"]["seconds"] / shipped["json"]["seconds"], 3)
    (captured,) = figures["captured"]  # one transaction of 150 rows, captured by a wrapper process, in 4 parts
    assert captured["changes"] == 150 and captured["acknowledged_s"] > 0 and figures["wrapper_args"]
    assert 0 < captured["held"]["capturing_peak"] <= 40 and 0 < captured["held"]["shipping_peak"] <= 40
    assert captured["wrapper"]["peak_mib"] >= captured["wrapper"]["start_mib"] > 0
    assert (
        captured["wrapper"]["hwm_mib"] >= captured["wrapper"]["peak_mib"] - 1 and captured["manager"]["start_mib"] > 0
    )
    out = capsys.readouterr().out
    assert "Arrow/JSON" in out and "stream/JSON" in out and "captured and shipped by a wrapper process" in out


def test_the_rows_are_every_kind_of_value_a_source_hands_out() -> None:
    (row,) = rows_of(1)
    assert [type(v) for v in row] == [int, int, str, float, str, str]


def test_bad_sizes_are_refused(capsys) -> None:
    assert main(["bench", "wire", "--rows", "ten"]) == 2
    assert main(["bench", "wire", "--repeat", "0"]) == 2
    assert main(["bench", "wire", "--ship", "0"]) == 2
    assert main(["bench", "wire", "--captured", "x"]) == 2
    err = capsys.readouterr().err
    assert "--rows takes comma-separated row counts, not 'ten'" in err and "--repeat must be at least 1" in err
    assert "--ship takes comma-separated change counts (at least 1) or 'none', not '0'" in err
    assert "--captured takes comma-separated change counts (at least 1) or 'none', not 'x'" in err
